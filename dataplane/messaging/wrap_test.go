package messaging

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging/bundle"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// TestWindowWrap drives an outLink and a receiver back to back across the
// sequence wrap (base 2^32-5), one message per bundle, losing the first
// send of seq 2^32-2: every bundle is taken exactly once, nothing is
// dropped, and the link is never reset, for windows that do not divide
// 2^32 (3, 12) as for one that does (4). Before, slots were indexed by
// seq % window: with window 3, seqs 2^32-1 and 0 shared a slot on both
// sides, so 0 overwrote 2^32-1 in the sender's in-flight slots and in the
// receiver's held ones; 2^32-1 was never resent, the window stayed full,
// and the live peer was declared dead (window 3: 4 of 9 bundles taken, 2
// counted dead_peer, 3 counted nowhere; window 12: 3 of 36, 21 and 12).
func TestWindowWrap(t *testing.T) {
	for _, window := range []int{3, 4, 12} {
		t.Run(fmt.Sprintf("window%d", window), func(t *testing.T) { windowWrap(t, window) })
	}
}

func windowWrap(t *testing.T, window int) {
	const rto, peerTO = int64(time.Millisecond), int64(100 * time.Millisecond)
	const start, lose = uint32(1<<32 - 5), uint32(1<<32 - 2)
	n := 3 * window
	cfg := Defaults()
	cfg.Tenant, cfg.BuffersPerDest = 7, window
	cfg.RetransmitTimeout, cfg.PeerTimeout = Duration(rto), Duration(peerTO)
	sctr, rctr := &counters{}, &counters{}
	out := newOutLink("peer", netip.MustParseAddrPort("127.0.0.1:9"), 7, AgentEndpoint(0, 0), AgentEndpoint(1, 0), 256, window, sctr)
	out.base, out.nextSeq, out.limit = start, start, start+uint32(window)
	owner := &wrapOwner{got: map[string]int{}}
	var pkts, credits batch
	r := newReceiver(&cfg, 0, rctr, owner, &credits)

	lost, next := false, 0
	var p progress
	now := int64(1)
	for ; next < n || out.busy(); now += rto / 4 {
		if now > 4*peerTO {
			t.Errorf("still busy after 4 peer timeouts: base %d, next seq %d", out.base, out.nextSeq)
			break
		}
		for next < n {
			res := out.write(1, []byte(fmt.Sprintf("message %d", next)), &p, now, &pkts, func(*outLink) {})
			if res == writeWait {
				break
			}
			out.close(flushExplicit, now, &pkts)
			next, p = next+1, progress{} // dropped ones count in dead_peer
		}
		// Bundles to the receiver, credits back, until nothing moves.
		for pkts.len() > 0 {
			for i := range pkts.pkts {
				d := pkts.pkts[i]
				if h, _, err := wire.Decode(d.Data); err == nil && h.Type == wire.TypeBundle && h.Seq == lose && !lost {
					lost = true
					continue
				}
				r.handle(&d, now)
			}
			pkts.reset()
			out.settle()
			r.credits()
			for _, d := range credits.pkts {
				h, payload, err := wire.Decode(d.Data)
				if err != nil {
					t.Fatal(err)
				}
				c, err := bundle.ParseCredit(payload)
				if err != nil {
					t.Fatal(err)
				}
				out.onCredit(h.Seq, c, now, rto, &pkts)
			}
			credits.reset()
			r.recycle()
		}
		out.settle() // what the last credits acknowledged: nothing is left unsent
		r.forget(now)
		out.maintain(now, rto, peerTO, &pkts)
	}

	if !lost || rctr.outOfOrder.Load() == 0 {
		t.Fatalf("seq %d lost %v, %d bundles held out of order: the loss was not exercised", lose, lost, rctr.outOfOrder.Load())
	}
	taken, wrong := 0, []int(nil)
	for i := range n {
		if owner.got[fmt.Sprintf("message %d", i)] == 1 {
			taken++
		} else {
			wrong = append(wrong, i)
		}
	}
	if len(wrong) > 0 || len(owner.got) != n {
		t.Errorf("messages %v not taken exactly once; %d distinct taken, want %d", wrong, len(owner.got), n)
	}
	if dead, stale, resets := sctr.drops[dropDeadPeer].Load(), rctr.drops[dropStaleGap].Load(), out.st.resets.Load(); taken != n || dead != 0 || stale != 0 || resets != 0 {
		t.Errorf("%d of %d bundles taken, dead_peer %d, stale_gap %d, resets %d; want all, 0, 0, 0", taken, n, dead, stale, resets)
	}
}

// wrapOwner is an rxTestOwner that records each message it takes.
type wrapOwner struct {
	rxTestOwner
	got map[string]int
}

func (o *wrapOwner) inOrder(l *inLink, item rxWork, _ *transport.Packet) {
	for rec, ok := item.r.Next(); ok; rec, ok = item.r.Next() {
		o.got[string(rec.Data)]++
	}
	l.consumed.Add(1)
}
