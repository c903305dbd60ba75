package farmem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// The geometry of the freed-region tests: a region of four entries of
// four chunks.
const freedChunk, freedEsz, freedSize = 64 << 10, 256 << 10, 1 << 20

// freedCache is the cache of the freed-region tests' agents: the first
// entry of a region goes to the static cache, the second is hinted into
// the dynamic one; the adaptive switch stays on.
var freedCache = CacheConfig{Size: 4 * freedEsz, EntrySize: freedEsz, BNet: 1, BIntra: 1 << 40, Window: 1 << 30,
	Prefetcher: PrefetchHints}

// cacheRegion opens region id through c, a client of agent a, loads its
// first entry into a's static cache and its second into a dynamic entry,
// and reads a chunk of each as a hit.
func cacheRegion(t *testing.T, a *Agent, c *Client, id uint32, want []byte) *Region {
	t.Helper()
	r, err := c.Open(context.Background(), id, false)
	if err != nil {
		t.Fatal(err)
	}
	valid := a.Stats().Cache.Valid
	if ok, err := r.LoadStatic([]Range{{0, freedEsz}}); err != nil || !ok {
		t.Fatalf("LoadStatic: %v, %v", ok, err)
	}
	if n, err := r.Hint([]Range{{freedEsz, freedEsz}}); err != nil || n != 1 {
		t.Fatalf("hint: %d, %v", n, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.Stats().Cache.Valid == valid {
		if time.Now().After(deadline) {
			t.Fatal("the hinted entry did not fill")
		}
		time.Sleep(time.Millisecond)
	}
	buf := make([]byte, freedChunk)
	for _, off := range []int{0, freedEsz} {
		if _, err := r.ReadAt(buf, int64(off)); err != nil || !bytes.Equal(buf, want[off:off+freedChunk]) {
			t.Fatalf("read at %d: %v, bytes equal %v", off, err, bytes.Equal(buf, want[off:off+freedChunk]))
		}
	}
	for _, rs := range a.Stats().Cache.Regions {
		if rs.Region == id && (rs.StaticHits == 0 || rs.Hits == 0) {
			t.Fatalf("region stats %+v: want a static and a dynamic hit", rs)
		}
	}
	return r
}

// freedRegion makes a written region through c and closes the writer: a
// reader's handle keeps no lease, whose renewals would tell the agent.
func freedRegion(t *testing.T, c *Client) (uint32, []byte) {
	t.Helper()
	w, want := writtenRegion(t, c, freedSize, freedChunk)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return w.ID(), want
}

// goneWithin waits until reads of the static and of the dynamic entry of r
// both fail as a lost region (ErrUnknownRegion), and fails the test if
// either still returns bytes after limit.
func goneWithin(t *testing.T, r *Region, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	buf := make([]byte, freedChunk)
	for _, off := range []int64{0, freedEsz} {
		for {
			_, err := r.ReadAt(buf, off)
			if errors.Is(err, ErrUnknownRegion) && Lost(err) {
				break
			}
			if err != nil && !errors.Is(err, ErrUnknownRegion) {
				t.Fatalf("read at %d of freed region %d: %v, want ErrUnknownRegion", off, r.ID(), err)
			}
			if d := time.Since(start); d > limit {
				t.Fatalf("%v after region %d was freed, a read at %d still returns its bytes from the agent's cache", d, r.ID(), off)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	return time.Since(start)
}

// TestFreedRegionNotice: a region that a DPU agent holds in its static and
// dynamic caches is freed on the memory node directly (`lovelock mem
// free`, Server.Free), past the agent. The node tells the agent, which
// drops the region at once, on the notice (counted as dropped by one;
// not at the 2 s of its periodic list): the next read gets "unknown
// region", as a miss would, instead of the cached bytes. A free through one agent is seen at once by that agent and
// told to another agent that caches the region; the freeing agent is not
// told what it knows.
func TestFreedRegionNotice(t *testing.T) {
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	a := startCachingAgent(t, srv, freedCache)
	b := startCachingAgent(t, srv, freedCache)
	ca, cb := newClient(t, a.Addr(), 3), newClient(t, b.Addr(), 3)

	// Freed on the memory node.
	id, want := freedRegion(t, ca)
	r := cacheRegion(t, a, ca, id, want)
	if err := srv.Free(0, id); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitNotices(t, a, func(n NoticeStats) bool { return n.Dropped == 1 })
	t.Logf("freed on the memory node: agent dropped it on the notice after %v", time.Since(start))
	goneWithin(t, r, 0)
	if st := a.Stats(); st.FreedNotices.Dropped != 1 || st.FreedNotices.Refused != 0 || st.Cache.StaticBytes != 0 || st.Cache.Valid != 0 {
		t.Fatalf("agent after the free: notices %+v, %d static bytes, %d valid entries; want one region dropped by a notice, an empty cache",
			st.FreedNotices, st.Cache.StaticBytes, st.Cache.Valid)
	}
	if n := srv.Stats().FreedNotices; n != 1 {
		t.Fatalf("memory node sent %d freed notices, want 1 (one agent cached the region)", n)
	}

	// Freed through agent a while b caches it too.
	id, want = freedRegion(t, ca)
	ra := cacheRegion(t, a, ca, id, want)
	rb := cacheRegion(t, b, cb, id, want)
	waitNotices(t, a, func(n NoticeStats) bool { return n.Received == 3 }) // the first free's repeats
	receivedA := a.Stats().FreedNotices.Received
	if err := ca.Free(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	goneWithin(t, ra, 0) // at once: the agent forgets before it answers the free
	start = time.Now()
	waitNotices(t, b, func(n NoticeStats) bool { return n.Dropped == 1 })
	t.Logf("freed through agent a: agent b dropped it on the notice after %v", time.Since(start))
	goneWithin(t, rb, 0)
	// The notice and its two repeats.
	waitNotices(t, b, func(n NoticeStats) bool { return n.Dropped == 1 && n.Received == 3 })
	if st := b.Stats(); st.FreedNotices.Dropped != 1 || st.Cache.StaticBytes != 0 || st.Cache.Valid != 0 {
		t.Fatalf("agent b after the free: notices %+v, %d static bytes, %d valid entries; want one region dropped by a notice, an empty cache",
			st.FreedNotices, st.Cache.StaticBytes, st.Cache.Valid)
	}
	// a freed it: the node told only b (in the same sends as a's would
	// have been), and a's notices did not change.
	if st := a.Stats(); st.FreedNotices.Received != receivedA || st.FreedNotices.Refused != 0 {
		t.Fatalf("agent a's notices %+v: want no notice for the region it freed itself", st.FreedNotices)
	}
	if st := b.Stats(); st.FreedNotices.Received != 3 || st.FreedNotices.Refused != 0 {
		t.Fatalf("agent b's notices %+v: want the notice and its two repeats, none refused", st.FreedNotices)
	}
}

// waitNotices waits until a's notice counters satisfy ok.
func waitNotices(t *testing.T, a *Agent, ok func(NoticeStats) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok(a.Stats().FreedNotices) {
		if time.Now().After(deadline) {
			t.Fatalf("notices %+v", a.Stats().FreedNotices)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestForgedFreedNotice: a notice that a region was freed that does not
// come from the memory node serving the region is refused, and the cached
// region stays served: a host (any address but the node's) cannot evict
// another tenant's bytes from the agent's caches by forging one, nor can
// another memory node, nor a notice of an unknown version.
func TestForgedFreedNotice(t *testing.T) {
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	fabric := listen(t, loopback)
	a, err := NewAgent(AgentConfig{Config: testConfig(), Servers: []ServerSpec{{Addr: srv.Addr()}}, Cache: freedCache},
		AgentOptions{HostTransports: []transport.Transport{listen(t, loopback)}, FabricTransports: []transport.Transport{fabric}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, a.Run)
	c := newClient(t, a.Addr(), 3)
	id, want := freedRegion(t, c)
	r := cacheRegion(t, a, c, id, want)

	// A host sends the notice to the agent's fabric side and to its
	// host side, as the memory node would send it.
	forger := rawPeer{t: t, tr: listen(t, loopback), to: fabric.LocalAddr()}
	notice := AppendDatagram(nil, wire.Header{Type: wire.TypeMemReply, Dst: id}, 0, Record{Op: OpFreed, Region: id, Aux: NoticeVersion})
	hostMalformed := a.Stats().Host.Malformed
	forger.send(notice)
	forger.to = a.Addr()
	forger.send(notice)
	deadline := time.Now().Add(5 * time.Second)
	for st := a.Stats(); st.FreedNotices.Received == 0 || st.Host.Malformed == hostMalformed; st = a.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("the forged notices did not arrive: %+v, host malformed %d", st.FreedNotices, st.Host.Malformed)
		}
		time.Sleep(time.Millisecond)
	}
	// The memory node's own address with a version this agent does not
	// know (a later protocol's notice) is refused as well.
	a.regionFreed(srv.Addr(), &Record{Op: OpFreed, Region: id, Aux: NoticeVersion + 1})
	a.regionFreed(srv.Addr(), &Record{Op: OpFreed, Region: id, Aux: NoticeVersion, Data: []byte{1}})
	if st := a.Stats().FreedNotices; st.Received != 3 || st.Refused != 3 || st.Dropped != 0 {
		t.Fatalf("notices %+v: want three received, three refused, nothing dropped", st)
	}
	before := a.Stats().Cache
	buf := make([]byte, freedChunk)
	for _, off := range []int{0, freedEsz} {
		if _, err := r.ReadAt(buf, int64(off)); err != nil || !bytes.Equal(buf, want[off:off+freedChunk]) {
			t.Fatalf("read at %d after forged notices: %v, bytes equal %v", off, err, bytes.Equal(buf, want[off:off+freedChunk]))
		}
	}
	after := a.Stats().Cache
	hits := func(cs CacheStats) (s, d uint64) {
		for _, rs := range cs.Regions {
			if rs.Region == id {
				return rs.StaticHits, rs.Hits
			}
		}
		return 0, 0
	}
	s0, d0 := hits(before)
	s1, d1 := hits(after)
	if s1 != s0+1 || d1 != d0+1 || after.StaticBytes != freedEsz {
		t.Fatalf("after forged notices: static hits %d → %d, dynamic hits %d → %d, %d static bytes; want both served from the caches",
			s0, s1, d0, d1, after.StaticBytes)
	}
}

// TestFreedNoticeFromOtherNode: with two memory nodes, a notice about a
// region from the node that does not serve it is refused; from the node
// that does, the region is dropped.
func TestFreedNoticeFromOtherNode(t *testing.T) {
	one := netip.MustParseAddrPort("127.0.0.1:9")
	two := netip.MustParseAddrPort("127.0.0.2:9")
	a, err := NewAgent(AgentConfig{Config: testConfig(), Servers: []ServerSpec{{Addr: one, Regions: []uint32{7}}, {Addr: two, Regions: []uint32{8}}}},
		AgentOptions{HostTransports: []transport.Transport{listen(t, loopback)}, FabricTransports: []transport.Transport{listen(t, loopback)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	a.regionFreed(two, &Record{Op: OpFreed, Region: 7, Aux: NoticeVersion})
	a.regionFreed(one, &Record{Op: OpFreed, Region: 9, Aux: NoticeVersion}) // a region no node serves
	if _, ok := a.route(&Record{Op: OpRead, Region: 7}); !ok {
		t.Fatal("a notice from the memory node that does not serve region 7 dropped it")
	}
	a.regionFreed(one, &Record{Op: OpFreed, Region: 7, Aux: NoticeVersion})
	if _, ok := a.route(&Record{Op: OpRead, Region: 7}); ok {
		t.Fatal("the notice of region 7's memory node did not drop it")
	}
	if st := a.Stats().FreedNotices; st != (NoticeStats{Received: 3, Dropped: 1, Refused: 2}) {
		t.Fatalf("notices %+v: want 3 received, 1 dropped, 2 refused", st)
	}
}

// TestFreedNoticeWire: the notice is a reply-side record; a request
// datagram carrying it is malformed (a memory node never executes it).
func TestFreedNoticeWire(t *testing.T) {
	rec := Record{Op: OpFreed, Region: 5, Aux: NoticeVersion}
	h, _, recs, err := Decode(AppendDatagram(nil, wire.Header{Type: wire.TypeMemReply, Dst: 5}, 0, rec), nil)
	if err != nil || h.Type != wire.TypeMemReply || len(recs) != 1 || recs[0].Op != OpFreed || recs[0].Region != 5 || recs[0].Aux != NoticeVersion {
		t.Fatalf("decoded %v %+v, %v", h, recs, err)
	}
	for _, typ := range []wire.Type{wire.TypeMemRead, wire.TypeMemWrite} {
		if _, _, _, err := Decode(AppendDatagram(nil, wire.Header{Type: typ, Dst: 5}, 0, rec), nil); !errors.Is(err, ErrMalformed) {
			t.Fatalf("a notice in a %v datagram: %v, want ErrMalformed", typ, err)
		}
	}
	if OpFreed.String() != "freed" {
		t.Fatalf("OpFreed is %q", OpFreed.String())
	}
}

// TestCachersBounded: a region remembers at most maxCachers peers, the
// most recent readers; a read after the free is refused, so that no peer
// keeps bytes that the free's notice did not reach.
func TestCachersBounded(t *testing.T) {
	var r region
	peer := func(i int) netip.AddrPort { return netip.MustParseAddrPort(fmt.Sprintf("10.0.0.%d:61440", i+1)) }
	for i := range maxCachers + 4 {
		if !r.noteCacher(peer(i)) {
			t.Fatal("noteCacher refused a peer of a live region")
		}
	}
	r.noteCacher(peer(5)) // read again: the most recent
	got := r.takeCachers()
	if len(got) != maxCachers || got[len(got)-1] != peer(5) || got[0] != peer(4) || got[1] != peer(6) {
		t.Fatalf("cachers %v: want the %d most recent, peer 5 last", got, maxCachers)
	}
	if r.noteCacher(peer(0)) {
		t.Fatal("noteCacher took a peer after the free")
	}
}

// dropNotices is a memory node's transport that loses every freed notice
// (on loopback, where sends do not fail, so n need not be mapped back).
type dropNotices struct {
	transport.Transport
	dropped atomic.Uint64
}

func (d *dropNotices) Send(pkts []transport.Packet) (int, error) {
	kept := make([]transport.Packet, 0, len(pkts))
	for _, p := range pkts {
		if _, _, recs, err := Decode(p.Data, nil); err == nil && recs[0].Op == OpFreed {
			d.dropped.Add(1)
			continue
		}
		kept = append(kept, p)
	}
	n, err := d.Transport.Send(kept)
	if err != nil {
		return n, err
	}
	return len(pkts), nil
}

// dropWrites is a DPU agent's fabric transport that loses the write
// datagrams it sends while drop is set, and counts them.
type dropWrites struct {
	transport.Transport
	drop    atomic.Bool
	dropped atomic.Uint64
}

func (d *dropWrites) Send(pkts []transport.Packet) (int, error) {
	if !d.drop.Load() {
		return d.Transport.Send(pkts)
	}
	kept := make([]transport.Packet, 0, len(pkts))
	for _, p := range pkts {
		if h, _, _, err := Decode(p.Data, nil); err == nil && h.Type == wire.TypeMemWrite {
			d.dropped.Add(1)
			continue
		}
		kept = append(kept, p)
	}
	n, err := d.Transport.Send(kept)
	if err != nil {
		return n, err
	}
	return len(pkts), nil
}

// TestStaticLoadOfFreedRegion: a static load waits for a write into its
// range that is in flight (the agent's write datagrams are lost for a
// while), and the region is freed on the memory node meanwhile: the agent
// learns it from the write's answer ("unknown region"), or from the
// node's notice while the write is still in flight. The load fails with
// ErrUnknownRegion, its place in the loaders' queue and its static budget
// are given back, and the next static load is carried out. Before, the
// loader polled the freed region's record, whose write was never ended,
// until the agent stopped: the host's load got "no answer", static_queued
// stayed 1 and the budget was never given back (four such loads stopped
// every static load of every tenant).
func TestStaticLoadOfFreedRegion(t *testing.T) {
	for _, tc := range []struct {
		name   string
		notice bool // the agent caches the region already: the node's notice arrives while the write is in flight
	}{{"write answered unknown region", false}, {"notice while the write is in flight", true}} {
		t.Run(tc.name, func(t *testing.T) {
			srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
			fab := &dropWrites{Transport: listen(t, loopback)}
			cfg := AgentConfig{Config: testConfig(), Servers: []ServerSpec{{Addr: srv.Addr()}}}
			a, err := NewAgent(cfg, AgentOptions{HostTransports: []transport.Transport{listen(t, loopback)},
				FabricTransports: []transport.Transport{fab}})
			if err != nil {
				t.Fatal(err)
			}
			run(t, a.Run)
			c := newClient(t, a.Addr(), 3)
			r, _ := writtenRegion(t, c, freedSize, freedChunk)
			id := r.ID()
			if tc.notice {
				// A static range elsewhere in the region: the node notes
				// the agent as one that caches it.
				if ok, err := r.LoadStatic([]Range{{freedEsz, freedEsz}}); err != nil || !ok {
					t.Fatalf("LoadStatic: %v, %v", ok, err)
				}
			}
			fab.drop.Store(true)
			written := make(chan error, 1)
			go func() {
				_, err := r.WriteAt(make([]byte, freedChunk), 0)
				written <- err
			}()
			waitFor(t, "the agent to send the write", func() bool { return fab.dropped.Load() > 0 })
			loaded := make(chan error, 1)
			go func() {
				_, err := r.LoadStatic([]Range{{0, freedChunk}})
				loaded <- err
			}()
			waitFor(t, "the static load to claim its range", func() bool {
				a.cache.mu.Lock()
				defer a.cache.mu.Unlock()
				rc := a.cache.regions[id]
				return rc != nil && len(rc.loading) > 0
			})
			if err := srv.Free(0, id); err != nil {
				t.Fatal(err)
			}
			if tc.notice {
				waitNotices(t, a, func(n NoticeStats) bool { return n.Dropped == 1 })
			}
			fab.drop.Store(false)
			if err := <-written; !errors.Is(err, ErrUnknownRegion) {
				t.Errorf("write into the freed region: %v, want ErrUnknownRegion", err)
			}
			if err := <-loaded; !errors.Is(err, ErrUnknownRegion) {
				t.Fatalf("static load of the region freed while it waited for a write: %v, want ErrUnknownRegion", err)
			}
			waitFor(t, "the static load to leave the queue", func() bool { return a.Stats().Overload.StaticQueued == 0 })
			if st := a.Stats().Cache; st.StaticBytes != 0 {
				t.Fatalf("static bytes %d after the region was freed, want the budget given back", st.StaticBytes)
			}
			// The loaders take the next load.
			r2, _ := writtenRegion(t, c, freedSize, freedChunk)
			if ok, err := r2.LoadStatic([]Range{{0, freedChunk}}); err != nil || !ok {
				t.Fatalf("next LoadStatic: %v, %v", ok, err)
			}
			if st := a.Stats(); st.Overload.StaticQueued != 0 || st.Cache.StaticBytes != freedChunk {
				t.Fatalf("after the next load: %d queued, %d static bytes; want 0 and %d", st.Overload.StaticQueued, st.Cache.StaticBytes, freedChunk)
			}
		})
	}
}

// replyRecords reads reply records from p until it has n of them (or 10 s
// passed).
func replyRecords(t *testing.T, p rawPeer, n int) []Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []Record
	pkts := []transport.Packet{{Data: make([]byte, 65536)}}
	for len(out) < n {
		pkts[0].Data = pkts[0].Data[:cap(pkts[0].Data)]
		if _, err := p.tr.Recv(ctx, pkts); err != nil {
			t.Fatalf("%d of %d replies: %v", len(out), n, err)
		}
		_, _, recs, err := Decode(pkts[0].Data, nil)
		if err != nil {
			t.Fatalf("bad reply: %v", err)
		}
		out = append(out, recs...)
	}
	return out
}

// TestForeignWriteLeavesCache: tenant 9 writes into tenant 3's region,
// which the agent holds in its static and dynamic caches. The memory node
// refuses both writes (ErrWrongTenant), and the owner's caches are as
// before: no entry invalidated, the static range not revealed (a write
// into it was refused as read-only, which only the owner may learn), and
// both still serve the owner's reads. Before, the agent invalidated the
// owner's entry before forwarding the write the node then refused, and
// while such writes were in flight no fill of the region started.
func TestForeignWriteLeavesCache(t *testing.T) {
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	a := startCachingAgent(t, srv, freedCache)
	c := newClient(t, a.Addr(), 3)
	id, want := freedRegion(t, c)
	r := cacheRegion(t, a, c, id, want)
	region := func() RegionCacheStats {
		for _, rs := range a.Stats().Cache.Regions {
			if rs.Region == id {
				return rs
			}
		}
		t.Fatalf("region %d not in the agent's cache", id)
		return RegionCacheStats{}
	}
	before, valid := region(), a.Stats().Cache.Valid
	p := rawPeer{t: t, tr: listen(t, loopback), to: a.Addr()}
	p.send(AppendDatagram(nil, wire.Header{Type: wire.TypeMemWrite, Tenant: 9}, 0,
		Record{Op: OpWrite, Region: id, ID: 1, Offset: freedEsz, Size: 1, Data: []byte{0xff}}, // the dynamic entry
		Record{Op: OpWrite, Region: id, ID: 2, Offset: 0, Size: 1, Data: []byte{0xff}}))       // the static range
	for _, rec := range replyRecords(t, p, 2) {
		if rec.Status != StatusWrongTenant {
			t.Errorf("tenant 9's write %d into tenant 3's region: %v, want ErrWrongTenant", rec.ID, rec.Status.Err())
		}
	}
	after := region()
	if after.Invalidated != before.Invalidated || a.Stats().Cache.Valid != valid {
		t.Fatalf("after another tenant's refused writes: %d invalidated (before %d), %d entries valid (before %d); want the owner's cache untouched",
			after.Invalidated, before.Invalidated, a.Stats().Cache.Valid, valid)
	}
	buf := make([]byte, freedChunk)
	for _, off := range []int{0, freedEsz} {
		if _, err := r.ReadAt(buf, int64(off)); err != nil || !bytes.Equal(buf, want[off:off+freedChunk]) {
			t.Fatalf("owner's read at %d: %v, bytes equal %v", off, err, bytes.Equal(buf, want[off:off+freedChunk]))
		}
	}
	if rs := region(); rs.StaticHits != after.StaticHits+1 || rs.Hits != after.Hits+1 || rs.Misses != after.Misses {
		t.Fatalf("region stats %+v after %+v: want the owner's two reads a static and a dynamic hit", rs, after)
	}

	// In the cache: another tenant's write in flight holds off none of
	// the owner's fills; tenant 0's (the infrastructure may write any
	// region) and the owner's do.
	const esz = 4096
	cc := newCache(CacheConfig{Size: 4 * esz, EntrySize: esz, BNet: 1, BIntra: 2, Prefetcher: PrefetchHints, Window: 1 << 20}, esz)
	cc.learn(1, 16*esz, 3, true)
	if got := cc.beginWrite(9, 1, 0, esz); got != writeForeign {
		t.Fatalf("tenant 9's write into tenant 3's region: %v, want it forwarded untouched (%v)", got, writeForeign)
	}
	if n, _ := cc.hint(3, 1, []Range{{0, esz}}, nil); n != 1 {
		t.Fatalf("owner's hint with another tenant's write in flight started %d fills, want 1", n)
	}
	for _, tenant := range []uint32{0, 3} {
		if got := cc.beginWrite(tenant, 1, esz, esz); got != writeHeld {
			t.Fatalf("tenant %d's write: %v, want it held in flight (%v)", tenant, got, writeHeld)
		}
		if n, _ := cc.hint(3, 1, []Range{{2 * esz, esz}}, nil); n != 0 {
			t.Fatalf("hint with tenant %d's write in flight started %d fills, want none", tenant, n)
		}
		cc.endWrite(1, esz, esz)
	}
}

// holdLists is a memory node's transport that, while armed, keeps its list
// answers instead of sending them, until release sends them on.
type holdLists struct {
	transport.Transport
	mu     sync.Mutex // one Send at a time, the held ones' too
	armed  bool
	held   []transport.Packet
	caught chan struct{} // closed when the first answer is held
}

func (h *holdLists) arm() {
	h.mu.Lock()
	h.armed, h.caught = true, make(chan struct{})
	h.mu.Unlock()
}

// release sends the held answers and disarms.
func (h *holdLists) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed = false
	if len(h.held) > 0 {
		h.Transport.Send(h.held)
	}
	h.held = nil
}

func (h *holdLists) Send(pkts []transport.Packet) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	kept := make([]transport.Packet, 0, len(pkts))
	for _, p := range pkts {
		if _, _, recs, err := Decode(p.Data, nil); h.armed && err == nil && recs[0].Op == OpList {
			if len(h.held) == 0 {
				close(h.caught)
			}
			h.held = append(h.held, transport.Packet{Addr: p.Addr, Data: bytes.Clone(p.Data)})
			continue
		}
		kept = append(kept, p)
	}
	n, err := h.Transport.Send(kept)
	if err != nil {
		return n, err
	}
	return len(pkts), nil
}

// TestRefreshDoesNotResurrect: the agent's refresh asks the memory node
// for its list, the node answers with a region, and the region is freed
// before the agent takes the answer in (the answer is held): the agent
// must not learn the freed region again, neither its route nor a cache
// record. Before, it did, until the next refresh or a request for it.
func TestRefreshDoesNotResurrect(t *testing.T) {
	for _, tc := range []struct {
		name string
		free func(t *testing.T, srv *Server, c *Client, r *Region)
	}{
		{"freed through the agent", func(t *testing.T, _ *Server, c *Client, r *Region) {
			if err := c.Free(context.Background(), r.ID()); err != nil {
				t.Fatal(err)
			}
		}},
		{"freed on the node, learnt from a read", func(t *testing.T, srv *Server, _ *Client, r *Region) {
			if err := srv.Free(0, r.ID()); err != nil {
				t.Fatal(err)
			}
			if _, err := r.ReadAt(make([]byte, freedChunk), 0); !errors.Is(err, ErrUnknownRegion) {
				t.Fatalf("read of the freed region: %v, want ErrUnknownRegion", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lists := &holdLists{Transport: listen(t, loopback)}
			srv, _ := startServer(t, t.TempDir(), lists)
			a := startCachingAgent(t, srv, freedCache)
			c := newClient(t, a.Addr(), 3)
			r, _ := writtenRegion(t, c, freedSize, freedChunk)
			id := r.ID()
			// The agent's first refresh, from Run, is over once it has
			// started and the refresh lock is free again.
			deadline := time.Now().Add(10 * time.Second)
			for {
				a.refreshMu.Lock()
				started := !a.lastRefresh.IsZero()
				a.refreshMu.Unlock()
				if started {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the agent's first refresh did not run")
				}
				time.Sleep(time.Millisecond)
			}

			lists.arm()
			t.Cleanup(lists.release)
			refreshed := make(chan struct{})
			go func() {
				defer close(refreshed)
				a.refresh(context.Background(), time.Now())
			}()
			<-lists.caught // the node listed the region; the agent has not heard
			tc.free(t, srv, c, r)
			a.mu.RLock()
			_, routed := a.regions[id]
			a.mu.RUnlock()
			if routed || a.cache.regionSize(id) != 0 {
				t.Fatalf("region %d still known after its free (routed %v, cache size %d)", id, routed, a.cache.regionSize(id))
			}
			lists.release()
			<-refreshed
			a.mu.RLock()
			_, routed = a.regions[id]
			pending := len(a.freedAt)
			a.mu.RUnlock()
			if routed || a.cache.regionSize(id) != 0 {
				t.Errorf("region %d learnt again from a list answered before its free (routed %v, cache size %d)", id, routed, a.cache.regionSize(id))
			}
			if pending != 0 {
				t.Errorf("%d freed regions still kept with no list in flight", pending)
			}
		})
	}
}
