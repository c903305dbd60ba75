package farmem

import (
	"net/netip"
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// respWrite has r execute one single-fragment write with id from src above
// floor: accept hands it over as a request, finish caches its reply. It
// returns what accept answered instead when it did not hand it over.
func respWrite(t *testing.T, r *responder, src netip.AddrPort, floor, id uint64) ([]request, []resend) {
	t.Helper()
	rec := Record{Op: OpWrite, Region: 1, ID: id, Size: FragUnit, Data: make([]byte, FragUnit)}
	reqs, dups := r.accept(src, wire.Header{Type: wire.TypeMemWrite}, floor, []Record{rec}, nil, nil)
	if len(reqs) == 1 {
		r.finish(src, Record{Op: OpWrite, Region: 1, ID: id, Aux: uint32(id)})
	}
	return reqs, dups
}

func respSrc(i int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 61440)
}

// cachedTotal counts the replies r caches over all its requesters.
func cachedTotal(r *responder) int {
	n := 0
	for _, s := range r.sources {
		n += len(s.replies)
	}
	return n
}

// checkReplyLists checks that r's list of all cached replies, its byte
// total and its requesters' maps and lists agree.
func checkReplyLists(t *testing.T, r *responder) {
	t.Helper()
	var all int
	var bytes uint64
	for c := r.replies.oldest; c != nil; c = c.link[allReplies].newer {
		all++
		bytes += replyCost(&c.rec)
		if c.src.replies[c.rec.ID] != c {
			t.Fatalf("reply %d on the list of all is not its requester's", c.rec.ID)
		}
	}
	own := 0
	for _, s := range r.sources {
		for c := s.order.oldest; c != nil; c = c.link[ownReplies].newer {
			own++
		}
	}
	if n := cachedTotal(r); all != n || own != n || bytes != r.bytes {
		t.Fatalf("%d replies on the list of all, %d on the requesters' lists, %d in their maps; %d bytes counted, %d on the list",
			all, own, n, r.bytes, bytes)
	}
}

// TestReplyCacheBounded: many requesters that each finish many writes
// (their floors never passing them) leave at most reply_cache_bytes of
// replies cached in all, not sources x reply_cache; the newest replies still
// answer duplicates, the oldest were dropped (counted) and a late duplicate
// of one is dropped as stale once its requester's floor passed it.
func TestReplyCacheBounded(t *testing.T) {
	for _, tc := range []struct {
		name             string
		sources, writes  int
		perSource, bytes int // config
	}{
		{"global bound", 64, 512, 4096, int(MinReplyCacheBytes)},
		{"per-source bound", 4, 512, 100, int(MinReplyCacheBytes)},
		{"both", 300, 40, 32, int(MinReplyCacheBytes)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Defaults()
			cfg.ReplyCache, cfg.ReplyCacheBytes = tc.perSource, Size(tc.bytes)
			var ctr linkCounters
			r := newResponder(cfg, &ctr)
			// Round by round, so that the oldest replies are every
			// requester's first ones.
			for w := 1; w <= tc.writes; w++ {
				for i := range tc.sources {
					if reqs, _ := respWrite(t, r, respSrc(i), 0, uint64(w)); len(reqs) != 1 {
						t.Fatalf("source %d write %d: %d requests, want it executed", i, w, len(reqs))
					}
				}
			}
			limit := min(tc.bytes/replyCostOverhead, tc.sources*tc.perSource)
			total := tc.sources * tc.writes
			if got := cachedTotal(r); got != limit {
				t.Fatalf("%d replies cached, want %d (%d bytes, %d per requester)", got, limit, tc.bytes, tc.perSource)
			}
			checkReplyLists(t, r)
			if got := ctr.snapshot().RepliesEvicted; got != uint64(total-limit) {
				t.Fatalf("replies evicted %d, want %d", got, total-limit)
			}
			// The newest reply of each requester answers its duplicate.
			for i := range tc.sources {
				reqs, dups := respWrite(t, r, respSrc(i), 0, uint64(tc.writes))
				if len(reqs) != 0 || len(dups) != 1 || dups[0].rec.ID != uint64(tc.writes) || dups[0].rec.Aux != uint32(tc.writes) {
					t.Fatalf("source %d: duplicate of its newest write got %d requests, resends %+v; want its cached reply", i, len(reqs), dups)
				}
			}
			// The oldest was dropped: below the floor its duplicate is
			// stale, above it executed again.
			stale := ctr.stale.Load()
			if reqs, dups := respWrite(t, r, respSrc(0), 2, 1); len(reqs) != 0 || len(dups) != 0 || ctr.stale.Load() != stale+1 {
				t.Fatalf("duplicate below the floor: %d requests, %d resends, stale %d; want it dropped as stale", len(reqs), len(dups), ctr.stale.Load()-stale)
			}
			if reqs, _ := respWrite(t, r, respSrc(1), 0, 1); len(reqs) != 1 {
				t.Fatalf("duplicate of an evicted reply: %d requests, want it executed again", len(reqs))
			}
			checkReplyLists(t, r)
		})
	}
}

// TestReplyCacheForgetSource: a requester forgotten for maxSources takes
// its cached replies out of the total, so they do not crowd out the live
// requesters' replies.
func TestReplyCacheForgetSource(t *testing.T) {
	cfg := Defaults()
	var ctr linkCounters
	r := newResponder(cfg, &ctr)
	const writes = 3
	for i := range maxSources + 10 {
		for w := 1; w <= writes; w++ {
			respWrite(t, r, respSrc(i), 0, uint64(w))
		}
	}
	if len(r.sources) != maxSources {
		t.Fatalf("%d requesters kept, want %d", len(r.sources), maxSources)
	}
	checkReplyLists(t, r)
	if got, want := ctr.snapshot().RepliesEvicted, uint64(10*writes); got != want {
		t.Fatalf("replies evicted %d, want %d (the forgotten requesters')", got, want)
	}
}
