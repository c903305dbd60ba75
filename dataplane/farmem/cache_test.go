package farmem

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// fillAll completes every queued fill of c with pattern bytes.
func fillAll(t *testing.T, c *cache, pattern func(key entryKey, i int) byte) int {
	t.Helper()
	n := 0
	for {
		select {
		case j := <-c.fills:
			b := c.fillBuf(j)
			for i := range b {
				b[i] = pattern(j.key, i)
			}
			c.fillDone(j, true)
			n++
		default:
			return n
		}
	}
}

// TestCacheEvictionHoldsReferences fills the arena, holds a reference to
// every entry and asks for more: no held entry is evicted or overwritten,
// an invalidated held entry keeps its bytes until released, and released
// slots are reused.
func TestCacheEvictionHoldsReferences(t *testing.T) {
	const esz, entries = 4096, 4
	c := newCache(CacheConfig{Size: esz * entries, EntrySize: esz, BNet: 1, BIntra: 2, Prefetcher: PrefetchHints, Window: 1 << 20}, esz)
	c.learn(1, 64*esz, 0, true)
	pat := func(k entryKey, i int) byte { return byte(k.idx*7 + uint64(i)) }
	if n, _ := c.hint(0, 1, []Range{{0, entries * esz}}, nil); n != entries {
		t.Fatalf("hint started %d fills, want %d", n, entries)
	}
	if got := fillAll(t, c, pat); got != entries {
		t.Fatalf("%d fills, want %d", got, entries)
	}
	held := make([][]byte, entries)
	refs := make([]int32, entries)
	for e := range entries {
		data, ref, hit := c.read(0, &Record{Op: OpRead, Region: 1, Offset: uint64(e * esz), Size: esz})
		if !hit {
			t.Fatalf("entry %d: miss after fill", e)
		}
		held[e], refs[e] = data, ref
	}
	// Over-full: every slot is referenced, so nothing may be evicted.
	if n, _ := c.hint(0, 1, []Range{{entries * esz, 8 * esz}}, nil); n != 0 {
		t.Fatalf("hint started %d fills with every entry in use", n)
	}
	if st := c.stats(); st.InUse != entries || st.Valid != entries || st.Dropped == 0 {
		t.Fatalf("stats %+v: want %d in use and valid, prefetches dropped", st, entries)
	}
	// A write invalidates entry 0 while it is held: its bytes stay.
	if c.beginWrite(0, 1, 0, 100) != writeHeld {
		t.Fatal("write refused")
	}
	c.endWrite(1, 0, 100)
	if _, _, hit := c.read(0, &Record{Op: OpRead, Region: 1, Offset: 0, Size: esz}); hit {
		t.Fatal("hit on an invalidated entry")
	}
	for e := range entries {
		for i, b := range held[e] {
			if b != pat(entryKey{1, uint64(e)}, i) {
				t.Fatalf("held entry %d changed at byte %d", e, i)
			}
		}
	}
	for _, r := range refs {
		c.release(r)
	}
	// Released: entry 0's slot is free, the others evictable.
	if n, _ := c.hint(0, 1, []Range{{8 * esz, 3 * esz}}, nil); n != 3 {
		t.Fatalf("hint after release started %d fills, want 3", n)
	}
	fillAll(t, c, pat)
	st := c.stats()
	if st.Valid != entries || st.InUse != 0 {
		t.Fatalf("stats %+v", st)
	}
	r := st.Regions[0]
	if r.Invalidated != 1 || r.EvictedUnused != 0 || r.PrefetchUsed != entries {
		t.Fatalf("region stats %+v: want 1 invalidated, none evicted unused, %d used", r, entries)
	}
	// Four more: the arena holds three never-read entries and one read
	// one, so three evictions are of unused prefetches.
	if n, _ := c.hint(0, 1, []Range{{16 * esz, 4 * esz}}, nil); n != 4 {
		t.Fatalf("hint started %d fills, want 4", n)
	}
	fillAll(t, c, pat)
	if r := c.stats().Regions[0]; r.EvictedUnused != 3 || r.PrefetchIssued != 11 {
		t.Fatalf("region stats %+v: want 3 evicted unused of 11 issued", r)
	}
}

// TestEvictionSparesUnreadHints: with the arena full, new fills evict
// entries already read before hinted ones not read yet, and only when
// none is left any entry.
func TestEvictionSparesUnreadHints(t *testing.T) {
	const esz, entries = 4096, 4
	c := newCache(CacheConfig{Size: esz * entries, EntrySize: esz, BNet: 1, BIntra: 2, Prefetcher: PrefetchHints, Window: 1 << 20}, esz)
	c.learn(1, 64*esz, 0, true)
	pat := func(k entryKey, i int) byte { return byte(k.idx) }
	read := func(e int) bool {
		data, ref, hit := c.read(0, &Record{Op: OpRead, Region: 1, Offset: uint64(e * esz), Size: 16})
		c.release(ref)
		return hit && data[0] == byte(e)
	}
	for trial := range 20 { // eviction is random: repeat
		c.forget(1)
		c.learn(1, 64*esz, 0, true)
		c.hint(0, 1, []Range{{0, entries * esz}}, nil)
		fillAll(t, c, pat)
		if !read(0) || !read(1) {
			t.Fatal("entries 0 and 1: miss after fill")
		}
		// Two new hints must evict the read entries 0 and 1.
		if n, _ := c.hint(0, 1, []Range{{8 * esz, 2 * esz}}, nil); n != 2 {
			t.Fatalf("trial %d: hint started %d fills, want 2", trial, n)
		}
		fillAll(t, c, pat)
		for _, e := range []int{2, 3, 8, 9} {
			if !read(e) {
				t.Fatalf("trial %d: entry %d evicted, want the read entries 0 and 1 evicted first", trial, e)
			}
		}
		// Now every entry has been read: a hint evicts any.
		if n, _ := c.hint(0, 1, []Range{{16 * esz, esz}}, nil); n != 1 {
			t.Fatalf("trial %d: hint with a full arena of read entries started %d fills", trial, n)
		}
		fillAll(t, c, pat)
	}
}

// TestHintBounded sends one hint naming a region of 4096 entries as many
// times as a datagram holds ranges (556, each the whole region) to a cache
// of 8 slots with a fill queue of 4 (in the audit a 16 GiB region of 1 MiB
// entries held the cache's and the worker's locks for 6.9 s and counted
// 9,073,920 drops). The hint starts what the queue takes and stops at the
// first fill it must drop, counted once; it evicts no entry for a fill it
// cannot queue; it looks at no more entries than the arena holds; and with
// every slot filling it stops at its first entry.
func TestHintBounded(t *testing.T) {
	const esz, entries, queue, regionEntries = 4096, 8, 4, 4096
	c := newCache(CacheConfig{Size: esz * entries, EntrySize: esz, BNet: 1, BIntra: 2, Prefetcher: PrefetchHints,
		Window: 1 << 20, Queue: queue}, esz)
	c.learn(1, regionEntries*esz, 0, true)
	c.learn(2, entries*esz, 0, true)
	c.learn(3, entries*esz, 0, true)
	pat := func(k entryKey, i int) byte { return byte(k.idx) }
	region := func(id uint32) RegionCacheStats {
		for _, r := range c.stats().Regions {
			if r.Region == id {
				return r
			}
		}
		return RegionCacheStats{}
	}
	// The arena full of region 2's entries, valid and unread.
	for e := 0; e < entries; e += queue {
		if n, _ := c.hint(0, 2, []Range{{uint64(e * esz), queue * esz}}, nil); n != queue {
			t.Fatalf("hint of region 2 started %d fills, want %d", n, queue)
		}
		fillAll(t, c, pat)
	}
	room := (DefaultMaxDatagram - 24 - PreambleLen - RecordHdrLen) / RangeLen
	whole := slices.Repeat([]Range{{0, 1 << 63}}, room)
	n, _ := c.hint(0, 1, whole, nil)
	st := c.stats()
	t.Logf("one hint of %d ranges: %d fills started, %d dropped; %d valid, %d filling", room, n, st.Dropped, st.Valid, st.Filling)
	if n != queue || st.Dropped != 1 {
		t.Fatalf("hint started %d fills and dropped %d, want %d started (the queue) and one drop, where it stopped", n, st.Dropped, queue)
	}
	if st.Valid != entries-queue || st.Filling != queue || region(2).EvictedUnused != queue {
		t.Fatalf("after the hint %d valid, %d filling, %d of region 2 evicted: want %d valid and %d evicted, one per fill queued (none for a fill dropped)",
			st.Valid, st.Filling, region(2).EvictedUnused, entries-queue, queue)
	}
	// Issue the queued fills (the fill loop takes them) and leave them in
	// flight; a second hint passes entries 0-3 (filling), queues 4-7,
	// evicting the rest of region 2, and has looked at the arena's 8.
	var held []fillJob
	take := func() {
		for len(c.fills) > 0 {
			held = append(held, <-c.fills)
		}
	}
	take()
	if n, _ := c.hint(0, 1, whole, nil); n != queue || c.stats().Dropped != 1 {
		t.Fatalf("second hint started %d fills, %d dropped in all; want %d and still 1", n, c.stats().Dropped, queue)
	}
	take()
	// Every slot is filling, entries 0-7 of region 1, and the queue is
	// empty. A third hint looks at those eight (the arena's size) and no
	// further: entry 8, which finds no slot, is never reached.
	if n, _ := c.hint(0, 1, whole, nil); n != 0 || c.stats().Dropped != 1 {
		t.Fatalf("hint over filling entries started %d fills, %d dropped in all; want none and still 1 (it stops after the arena's entries)", n, c.stats().Dropped)
	}
	// With no slot to be had, a hint of another region stops at its first
	// entry, one drop.
	if n, _ := c.hint(0, 3, whole, nil); n != 0 || c.stats().Dropped != 2 {
		t.Fatalf("hint with every slot filling started %d fills, %d dropped in all; want none and 2", n, c.stats().Dropped)
	}
	for _, j := range held {
		c.fillDone(j, true)
	}
	if n, _ := c.hint(0, 3, []Range{{0, queue * esz}}, nil); n != queue {
		t.Fatalf("hint after the fills ended started %d, want %d", n, queue)
	}
}

// TestStrideDetector feeds strided reads and checks the prefetched entries
// follow the majority delta, also with noise in between.
// TestDynamicScope limits a region's dynamic cache to a range: reads
// outside it pass without taking an entry or prefetching, counted; the
// adjacent prefetcher stops at its end; entries outside a new scope are
// dropped; ranges past the region are refused; no ranges mean all of it.
func TestDynamicScope(t *testing.T) {
	const esz = 4096
	c := newCache(CacheConfig{Size: esz * 8, EntrySize: esz, BNet: 1, BIntra: 2, Prefetcher: PrefetchAdjacent, Depth: 2, Window: 1 << 20}, esz)
	c.learn(1, 16*esz, 0, true)
	pat := func(k entryKey, i int) byte { return byte(k.idx*3 + uint64(i)) }
	read := func(e uint64) bool {
		t.Helper()
		data, ref, hit := c.read(0, &Record{Op: OpRead, Region: 1, Offset: e * esz, Size: esz})
		if hit {
			for i, b := range data {
				if b != pat(entryKey{1, e}, i) {
					t.Fatalf("entry %d: byte %d is %d", e, i, b)
				}
			}
			c.release(ref)
		}
		return hit
	}
	// A warm-up read fills entries 1 and 2 (adjacent, depth 2).
	read(0)
	fillAll(t, c, pat)
	if err := c.setDynamic(0, 1, []Range{{4 * esz, 4 * esz}}); err != nil {
		t.Fatal(err)
	}
	if st := c.stats(); st.Valid != 0 || st.Regions[0].DynamicRanges != 1 {
		t.Fatalf("after limiting the scope to entries 4-7: %+v, want entries 1 and 2 dropped, 1 range", st)
	}
	if read(1) || read(2) {
		t.Fatal("hit outside the dynamic cache's range")
	}
	if n := fillAll(t, c, pat); n != 0 {
		t.Fatalf("reads outside the range started %d fills", n)
	}
	// Reads inside: entry 6's prefetch may load 7 but not 8.
	read(6)
	if n := fillAll(t, c, pat); n != 1 {
		t.Fatalf("read of entry 6 started %d fills, want 1 (entry 7; 8 is outside)", n)
	}
	if !read(7) {
		t.Fatal("entry 7: miss after its prefetch")
	}
	rc := c.stats().Regions[0]
	if rc.OutsideDynamic != 2 || rc.Hits != 1 || rc.Misses != 2 {
		t.Fatalf("counters %+v: want 2 reads outside, 1 hit, 2 misses", rc)
	}
	for _, bad := range [][]Range{{{0, 0}}, {{15 * esz, 2 * esz}}, {{16 * esz, 1}}} {
		if err := c.setDynamic(0, 1, bad); !errors.Is(err, ErrBadRequest) {
			t.Errorf("scope %v: err %v, want ErrBadRequest", bad, err)
		}
	}
	c.learn(2, 16*esz, 7, true)
	if err := c.setDynamic(8, 2, nil); !errors.Is(err, ErrWrongTenant) {
		t.Errorf("another tenant's region: %v, want ErrWrongTenant", err)
	}
	if err := c.setDynamic(0, 3, nil); !errors.Is(err, ErrUnknownRegion) {
		t.Errorf("a region not learnt: %v, want ErrUnknownRegion", err)
	}
	if err := c.setDynamic(0, 1, nil); err != nil {
		t.Fatal(err)
	}
	read(1)
	if n := fillAll(t, c, pat); n != 2 {
		t.Fatalf("whole region again: read of entry 1 started %d fills, want 2", n)
	}
}

// TestStrideDetector feeds the trend detector reads (in entries of 4 KiB,
// each read 512 bytes) and checks that it loads the trend's next entries,
// and nothing without a trend.
func TestStrideDetector(t *testing.T) {
	const esz = 4096
	for _, tc := range []struct {
		name string
		offs []uint64 // entries, oldest first
		want []uint64 // entries it must have loaded (depth 2)
	}{
		{"one stream with an outlier", []uint64{0, 5, 10, 300, 15, 20}, []uint64{25, 30}},
		// Two workers scanning their own blocks: consecutive deltas
		// alternate (+500, -499) and have no majority; each read's
		// nearest earlier read is its own stream's last.
		{"two interleaved streams", []uint64{0, 500, 1, 501, 2, 502, 3, 503, 4, 504}, []uint64{505, 506}},
		{"no trend", []uint64{7, 90, 3, 400, 51, 12, 260, 33}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCache(CacheConfig{Size: 64 * esz, EntrySize: esz, BNet: 1, BIntra: 2, Prefetcher: PrefetchStride, Depth: 2, Window: 1 << 20}, esz)
			c.learn(1, 1024*esz, 0, true)
			var got []uint64
			for _, o := range tc.offs {
				c.read(0, &Record{Op: OpRead, Region: 1, Offset: o * esz, Size: 512})
				for len(c.fills) > 0 {
					j := <-c.fills
					got = append(got, j.key.idx)
					c.fillDone(j, true)
				}
			}
			for _, w := range tc.want {
				if !slices.Contains(got, w) {
					t.Errorf("fills %v: want %d among them", got, w)
				}
			}
			if tc.want == nil && got != nil {
				t.Errorf("fills %v without a trend", got)
			}
		})
	}
}

func patWord(c, i int, v uint64) uint64 { return uint64(c)<<40 ^ uint64(i)*0x9e3779b97f4a7c15 + v }

func fillChunk(p []byte, c int, v uint64) {
	for i := 0; i < len(p)/8; i++ {
		binary.LittleEndian.PutUint64(p[i*8:], patWord(c, i, v))
	}
}

// startCachingAgent runs an agent with cc in front of server srv.
func startCachingAgent(t testing.TB, srv *Server, cc CacheConfig) *Agent {
	t.Helper()
	cfg := AgentConfig{Config: testConfig(), Servers: []ServerSpec{{Addr: srv.Addr()}}, Cache: cc}
	a, err := NewAgent(cfg, AgentOptions{HostTransports: []transport.Transport{listen(t, loopback)}, FabricTransports: []transport.Transport{listen(t, loopback)}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, a.Run)
	return a
}

// TestCachesExactUnderWrites: two clients (two host processes, in-process
// here) read a region through a caching agent, concurrently, while a
// third writes its non-static chunks. Every word a reader gets is of a
// version at least as new as the last write acknowledged before the read
// began (no stale data from either cache), and a write into the static
// range is refused.
func TestCachesExactUnderWrites(t *testing.T) {
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	const esz, chunk, nchunks, nstatic = 256 << 10, 64 << 10, 64, 8
	// The adaptive switch is kept out of this test (TestAdaptiveSwitch has
	// it): a window that no read hits would turn the cache off, and a
	// loaded machine can make one.
	a := startCachingAgent(t, srv, CacheConfig{Size: 8 * esz, EntrySize: esz, BNet: 1, BIntra: 1 << 40, Window: 1 << 30})
	wc := newClient(t, a.Addr(), 5)
	w, err := wc.Alloc(context.Background(), nchunks*chunk)
	if err != nil {
		t.Fatal(err)
	}
	var acked, started [nchunks]atomic.Uint64
	p := make([]byte, chunk)
	for c := range nchunks {
		fillChunk(p, c, 1)
		if _, err := w.WriteAt(p, int64(c*chunk)); err != nil {
			t.Fatal(err)
		}
		acked[c].Store(1)
		started[c].Store(1)
	}
	readers := []*Client{newClient(t, a.Addr(), 5), newClient(t, a.Addr(), 5)}
	var regs []*Region
	for _, rc := range readers {
		r, err := rc.Open(context.Background(), w.ID(), false)
		if err != nil {
			t.Fatal(err)
		}
		regs = append(regs, r)
	}
	if ok, err := regs[0].LoadStatic([]Range{{0, nstatic * chunk}}); err != nil || !ok {
		t.Fatalf("LoadStatic: %v, %v", ok, err)
	}
	if _, err := w.WriteAt(p[:100], 10); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("write into a static range: %v, want ErrReadOnly", err)
	}
	if _, err := regs[1].Hint([]Range{{nstatic * chunk, 4 * esz}}); err != nil {
		t.Fatal(err)
	}
	r2, err := readers[1].Open(context.Background(), w.ID(), false)
	if err != nil {
		t.Fatal(err)
	}
	if s := r2.Static(); len(s) != 1 || s[0] != (Range{0, nstatic * chunk}) {
		t.Fatalf("open through the agent: static ranges %v", s)
	}

	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	wg.Add(1)
	go func() { // the writer: whole chunks outside the static range
		defer wg.Done()
		defer close(done)
		rng := rand.New(rand.NewPCG(1, 2))
		buf := make([]byte, chunk)
		for range 150 {
			c := nstatic + rng.IntN(nchunks-nstatic)
			v := started[c].Add(1)
			fillChunk(buf, c, v)
			if _, err := w.WriteAt(buf, int64(c*chunk)); err != nil {
				errs <- err
				return
			}
			acked[c].Store(v)
		}
	}()
	for g, r := range []*Region{regs[0], regs[0], regs[1], regs[1]} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			buf := make([]byte, chunk)
			for i := 0; ; i++ {
				select {
				case <-done:
					if i > 50 {
						return
					}
				default:
				}
				c := i % nchunks // sequential scans on even readers
				if g%2 == 1 {
					c = rng.IntN(nchunks)
				}
				floor := acked[c].Load()
				if _, err := r.ReadAt(buf, int64(c*chunk)); err != nil {
					errs <- err
					return
				}
				ceil := started[c].Load()
				for k := 0; k < chunk/8; k++ {
					v := binary.LittleEndian.Uint64(buf[k*8:]) - patWord(c, k, 0)
					if v < floor || v > ceil {
						errs <- fmt.Errorf("reader %d: chunk %d word %d: version %d, want %d..%d", g, c, k, v, floor, ceil)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := a.Stats().Cache
	var reg RegionCacheStats
	for _, r := range st.Regions {
		if r.Region == w.ID() {
			reg = r
		}
	}
	t.Logf("cache: %+v", reg)
	if reg.StaticHits == 0 || reg.PrefetchIssued == 0 {
		t.Fatalf("region stats %+v: want static hits and prefetches", reg)
	}
	if st.InUse != 0 {
		t.Fatalf("%d entries still referenced after every read finished", st.InUse)
	}
	if reg.Hits == 0 || reg.Invalidated == 0 {
		// The readers above did not hit, or the writer did not meet a
		// valid entry (a loaded machine can order them so): read one
		// the cache is known to hold, then write over it.
		requireInvalidation(t, a, w, regs[1], nchunks-1, chunk, esz)
	}
}

// requireInvalidation hints chunk c's entry, reads c through r until the
// agent serves it from the cache (a hit), writes c through w and requires
// the write to have invalidated the entry. A prefetch may evict the entry
// between the hit and the write, so it tries a few times.
func requireInvalidation(t *testing.T, a *Agent, w, r *Region, c, chunk, esz int) {
	t.Helper()
	stats := func() RegionCacheStats {
		for _, rs := range a.Stats().Cache.Regions {
			if rs.Region == w.ID() {
				return rs
			}
		}
		return RegionCacheStats{}
	}
	buf := make([]byte, chunk)
	deadline := time.Now().Add(30 * time.Second)
	for try := 0; time.Now().Before(deadline); try++ {
		if _, err := r.Hint([]Range{{uint64(c * chunk / esz * esz), uint64(esz)}}); err != nil {
			t.Fatal(err)
		}
		for hits := stats().Hits; stats().Hits == hits && time.Now().Before(deadline); {
			if _, err := r.ReadAt(buf, int64(c*chunk)); err != nil {
				t.Fatal(err)
			}
		}
		before := stats().Invalidated
		fillChunk(buf, c, uint64(1000+try))
		if _, err := w.WriteAt(buf, int64(c*chunk)); err != nil {
			t.Fatal(err)
		}
		if stats().Invalidated > before {
			return
		}
	}
	t.Fatalf("no write invalidated a cached entry: region stats %+v", stats())
}

// TestAdaptiveSwitch: random reads have a hit rate below B_net/B_intra
// (1/2 here), so the agent turns its dynamic cache off; after Probe reads
// it tries again, and a sequential scan keeps it on.
func TestAdaptiveSwitch(t *testing.T) {
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	const esz, chunk, size = 256 << 10, 64 << 10, 16 << 20
	a := startCachingAgent(t, srv, CacheConfig{Size: 8 * esz, EntrySize: esz, BNet: 1, BIntra: 2, Window: 32, Probe: 200})
	c := newClient(t, a.Addr(), 3)
	r, err := c.Alloc(context.Background(), size)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, chunk)
	rng := rand.New(rand.NewPCG(7, 7))
	for range 3 * 32 {
		if _, err := r.ReadAt(buf, int64(rng.IntN(size/chunk)*chunk)); err != nil {
			t.Fatal(err)
		}
	}
	st := a.Stats().Cache
	if st.On || len(st.Events) == 0 || st.Events[0].On {
		t.Fatalf("after random reads: on=%v events %+v; want off", st.On, st.Events)
	}
	t.Logf("off: %+v", st.Events[0])
	on := false
	for i := 0; i < 20*size/chunk && !on; i++ {
		if _, err := r.ReadAt(buf, int64(i%(size/chunk)*chunk)); err != nil {
			t.Fatal(err)
		}
		st = a.Stats().Cache
		last := st.Events[len(st.Events)-1]
		on = st.On && last.On && strings.HasPrefix(last.Reason, "probe succeeded")
	}
	if !on {
		t.Fatalf("sequential reads did not turn the cache on again: %+v", st.Events)
	}
	t.Logf("on: %+v", st.Events[len(st.Events)-1])
	if !bytes.Equal(buf, make([]byte, chunk)) {
		t.Fatal("anonymous region read back non-zero bytes")
	}
}

// TestSetDynamicRanges sets a region's dynamic cache scope through a real
// agent: a range past the region is refused with ErrBadRequest, a good
// one shows in the stats, reads outside it are counted apart and still
// return the server's bytes, and a memory node accepts and ignores it.
func TestSetDynamicRanges(t *testing.T) {
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	const esz, chunk, size = 256 << 10, 64 << 10, 4 << 20
	a := startCachingAgent(t, srv, CacheConfig{Size: 8 * esz, EntrySize: esz, BNet: 1, BIntra: 2})
	c := newClient(t, a.Addr(), 3)
	ctx := context.Background()
	r, err := c.Alloc(ctx, size)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetDynamicRanges([]Range{{size - chunk, 2 * chunk}}); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("range past the region: %v, want ErrBadRequest", err)
	}
	if err := r.SetDynamicRanges([]Range{{size / 2, size / 2}}); err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{0x5a}, chunk)
	if _, err := r.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, chunk)
	for off := int64(0); off < size; off += chunk {
		if _, err := r.ReadAt(buf, off); err != nil {
			t.Fatal(err)
		}
		if off == 0 && !bytes.Equal(buf, want) {
			t.Fatal("chunk 0 read back other bytes than written")
		}
	}
	var rc RegionCacheStats
	for _, x := range a.Stats().Cache.Regions {
		if x.Region == r.ID() {
			rc = x
		}
	}
	// A read retransmitted just as its reply left is read again (read
	// replies are not kept): on a loaded machine a read may count twice.
	n, re := uint64(size/chunk/2), c.Stats().Link.Retransmits
	if rc.DynamicRanges != 1 || rc.OutsideDynamic < n || rc.Hits+rc.Misses < n || rc.OutsideDynamic+rc.Hits+rc.Misses > 2*n+re {
		t.Fatalf("stats %+v: want 1 range, %d reads outside it and %d in it (%d retransmitted reads may count again)", rc, n, n, re)
	}
	direct := newClient(t, srv.Addr(), 3)
	rd, err := direct.Open(ctx, r.ID(), false)
	if err != nil {
		t.Fatal(err)
	}
	if err := rd.SetDynamicRanges([]Range{{0, chunk}}); err != nil {
		t.Fatalf("a memory node should accept and ignore a dynamic cache scope: %v", err)
	}
}

// writtenRegion allocates a region of size bytes through c and writes a
// pattern into it, chunk bytes a write; it returns the region and the bytes.
func writtenRegion(t *testing.T, c *Client, size, chunk int) (*Region, []byte) {
	t.Helper()
	r, err := c.Alloc(context.Background(), uint64(size))
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(i*7 + i>>12)
	}
	for off := 0; off < len(want); off += chunk {
		if _, err := r.WriteAt(want[off:off+chunk], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	return r, want
}

// TestFillPacing loads hinted entries through an agent whose fill window
// is a single chunk read: every fill completes, one read at a time, and
// the entries then serve the server's bytes.
func TestFillPacing(t *testing.T) {
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	const chunk, esz, entries = 64 << 10, 4 * 64 << 10, 6 // the default chunk size
	a := startCachingAgent(t, srv, CacheConfig{Size: Size(entries * esz), EntrySize: Size(esz), BNet: 1, BIntra: 2,
		Prefetcher: PrefetchHints, FillInflight: Size(chunk)})
	c := newClient(t, a.Addr(), 3)
	r, want := writtenRegion(t, c, entries*esz, chunk)
	if n, err := r.Hint([]Range{{0, uint64(len(want))}}); err != nil || n != entries {
		t.Fatalf("hint: %d fills started, %v; want %d", n, err, entries)
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.Stats().Cache.Valid < entries {
		if time.Now().After(deadline) {
			t.Fatalf("fills did not complete through a one-chunk window: %+v", a.Stats().Cache)
		}
		time.Sleep(5 * time.Millisecond)
	}
	got := make([]byte, chunk)
	for off := 0; off < len(want); off += chunk {
		if _, err := r.ReadAt(got, int64(off)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want[off:off+chunk]) {
			t.Fatalf("chunk at %d: other bytes than written", off)
		}
	}
	// A read retransmitted just as its reply left is read again (read
	// replies are not kept): on a loaded machine a read may count twice.
	n, re := uint64(len(want)/chunk), c.Stats().Link.Retransmits
	for _, rc := range a.Stats().Cache.Regions {
		if rc.Region == r.ID() && (rc.Hits < n || rc.Hits > n+re || rc.Misses != 0) {
			t.Fatalf("cache %+v: want every read a hit (%d reads, %d retransmitted)", rc, n, re)
		}
	}
}

// TestReadWaitsForFill reads an entry while its fill is in flight: the
// read is parked, not counted as a miss (nor, when served, again as an
// access), and served again when the fill ends: a hit with the filled
// bytes, or a miss when the fill failed. A read that cannot wait (the
// entry spans a boundary, or it is a retry) is a miss as before.
func TestReadWaitsForFill(t *testing.T) {
	const esz = 4096
	for _, tc := range []struct {
		name   string
		fillOK bool
		// meanwhile runs while the entry fills; a fill it voids serves
		// the parked read from the memory node: a miss.
		meanwhile func(c *cache)
	}{
		{"fill succeeds", true, nil},
		{"fill fails", false, nil},
		// The switch's window ends below the threshold: the arena is
		// dropped and the cache off when the parked read is served. It
		// was an access of the window that did so, not one with the cache
		// off: not bypassed, and not counted towards the next probe.
		{"switch turns off", true, func(c *cache) {
			c.mu.Lock()
			c.winReads, c.winHits = c.cfg.Window, 0
			c.evaluateLocked()
			c.mu.Unlock()
		}},
		{"prefetcher set off", true, func(c *cache) {
			off := PrefetchOff
			if _, err := c.hint(0, 1, nil, &off); err != nil {
				t.Fatal(err)
			}
		}},
		{"scope leaves the entry out", true, func(c *cache) {
			if err := c.setDynamic(0, 1, []Range{{8 * esz, esz}}); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCache(CacheConfig{Size: 4 * esz, EntrySize: esz, BNet: 1, BIntra: 2, Prefetcher: PrefetchHints, Window: 1 << 20}, esz)
			var woken []fillWaiter
			c.onFill = func(ws []fillWaiter) { woken = append(woken, ws...) }
			c.learn(1, 16*esz, 0, true)
			if n, _ := c.hint(0, 1, []Range{{0, esz}}, nil); n != 1 {
				t.Fatalf("hint started %d fills, want 1", n)
			}
			rec := Record{Op: OpRead, Region: 1, Offset: 100, Size: 200}
			wait := &fillWaiter{q: request{rec: rec}}
			if _, _, hit, waiting := c.lookup(0, &rec, wait, false); hit || !waiting {
				t.Fatalf("read of a filling entry: hit %v, waiting %v; want it parked", hit, waiting)
			}
			// A read across the entry's end cannot be served by it: a miss.
			across := Record{Op: OpRead, Region: 1, Offset: esz - 10, Size: 20}
			if _, _, hit, waiting := c.lookup(0, &across, wait, false); hit || waiting {
				t.Fatalf("read across entries: hit %v, waiting %v; want a miss", hit, waiting)
			}
			histN := c.histN
			if tc.meanwhile != nil {
				tc.meanwhile(c)
			}
			served := tc.fillOK && tc.meanwhile == nil
			j := <-c.fills
			b := c.fillBuf(j)
			for i := range b {
				b[i] = byte(i * 3)
			}
			c.fillDone(j, tc.fillOK)
			if len(woken) != 1 || woken[0].q.rec.Offset != rec.Offset || woken[0].q.rec.Size != rec.Size {
				t.Fatalf("fill ended with %d reads served again, want the parked one", len(woken))
			}
			data, ref, hit, waiting := c.lookup(0, &woken[0].q.rec, nil, true)
			if waiting || hit != served {
				t.Fatalf("served again: hit %v, waiting %v; want hit %v", hit, waiting, served)
			}
			if hit {
				for i, v := range data {
					if v != byte((100+i)*3) {
						t.Fatalf("byte %d of the read: %d, want %d", i, v, byte((100+i)*3))
					}
				}
				c.release(ref)
			}
			if c.histN != histN {
				t.Errorf("the retry was recorded as an access again (history %d → %d)", histN, c.histN)
			}
			r := c.stats().Regions[0]
			wantHits, wantMisses := uint64(1), uint64(1) // the parked read; the read across entries
			if !served {
				wantHits, wantMisses = 0, 2
			}
			if r.Waited != 1 || r.Hits != wantHits || r.Misses != wantMisses || r.Bypassed != 0 || r.OutsideDynamic != 0 {
				t.Errorf("region stats %+v: want 1 waited, %d hits, %d misses, none bypassed or outside the dynamic ranges", r, wantHits, wantMisses)
			}
			if c.offReads != 0 {
				t.Errorf("%d reads counted towards the next probe: want none (the parked read was counted when it arrived)", c.offReads)
			}
		})
	}
}

// TestReadsWaitForFills holds the memory node's replies, starts the fills
// of a region's entries and reads every chunk from several goroutines: each
// read finds its entry filling and waits for it instead of reading from the
// memory node again. Once the replies go, every read returns the written
// bytes as a hit, and the memory node has read each byte once.
func TestReadsWaitForFills(t *testing.T) {
	gate := &gatedTransport{Transport: listen(t, loopback)}
	srv, _ := startServer(t, t.TempDir(), gate)
	const chunk, esz, entries = 64 << 10, 4 * 64 << 10, 6
	a := startCachingAgent(t, srv, CacheConfig{Size: Size(entries * esz), EntrySize: Size(esz), BNet: 1, BIntra: 2,
		Prefetcher: PrefetchHints})
	r, want := writtenRegion(t, newClient(t, a.Addr(), 3), entries*esz, chunk)
	region := func() RegionCacheStats {
		for _, x := range a.Stats().Cache.Regions {
			if x.Region == r.ID() {
				return x
			}
		}
		return RegionCacheStats{}
	}
	before, retrans := srv.Stats().ReadBytes, a.Stats().Fabric.Retransmits
	release := gate.hold()
	if n, err := r.Hint([]Range{{0, uint64(len(want))}}); err != nil || n != entries {
		release()
		t.Fatalf("hint: %d fills started, %v; want %d", n, err, entries)
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(want)/chunk)
	for off := 0; off < len(want); off += chunk {
		wg.Go(func() {
			got := make([]byte, chunk)
			if _, err := r.ReadAt(got, int64(off)); err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(got, want[off:off+chunk]) {
				errs <- fmt.Errorf("chunk at %d: other bytes than written", off)
			}
		})
	}
	deadline := time.Now().Add(5 * time.Second)
	for region().Waited < uint64(len(want)/chunk) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	waited := region().Waited
	release()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	rc := region()
	read := srv.Stats().ReadBytes - before
	retrans = a.Stats().Fabric.Retransmits - retrans // the fills' reads, sent again while the replies were held
	t.Logf("cache %+v; the memory node read %d bytes for a region of %d; %d fill reads retransmitted", rc, read, len(want), retrans)
	if waited != uint64(len(want)/chunk) {
		t.Errorf("%d of %d reads waited for their entry's fill", waited, len(want)/chunk)
	}
	// A read retransmitted while it waits is a duplicate the agent drops;
	// one that crosses its reply is read again (a hit): read replies are
	// not kept, reads being idempotent.
	if rc.Hits < uint64(len(want)/chunk) || rc.Misses != 0 {
		t.Errorf("cache %+v: want every read a hit", rc)
	}
	if read < uint64(len(want)) || read > uint64(len(want))+retrans*chunk {
		t.Errorf("the memory node read %d bytes, want the region's %d once (plus %d retransmitted chunks at most)", read, len(want), retrans)
	}
}

// gatedTransport holds Send while a hold is on.
type gatedTransport struct {
	transport.Transport
	mu   sync.Mutex
	gate chan struct{} // nil: open
}

// hold makes Send wait until the returned release is called.
func (g *gatedTransport) hold() (release func()) {
	ch := make(chan struct{})
	g.mu.Lock()
	g.gate = ch
	g.mu.Unlock()
	return sync.OnceFunc(func() {
		g.mu.Lock()
		g.gate = nil
		g.mu.Unlock()
		close(ch)
	})
}

func (g *gatedTransport) Send(pkts []transport.Packet) (int, error) {
	g.mu.Lock()
	ch := g.gate
	g.mu.Unlock()
	if ch != nil {
		<-ch
	}
	return g.Transport.Send(pkts)
}

// TestStaticLoadRacesWrite starts a static load whose reads the memory
// node has executed but not answered yet (its replies are held), then
// writes into the range: the write must either be refused (ErrReadOnly,
// the range is being loaded) or, once acknowledged, be what every later
// read through the agent returns; never the bytes from before it.
func TestStaticLoadRacesWrite(t *testing.T) {
	gate := &gatedTransport{Transport: listen(t, loopback)}
	srv, _ := startServer(t, t.TempDir(), gate)
	const chunk, size = 64 << 10, 4 << 20
	a := startCachingAgent(t, srv, CacheConfig{})
	r, old := writtenRegion(t, newClient(t, a.Addr(), 3), size, chunk)
	before := srv.Stats().ReadBytes
	release := gate.hold()
	t.Cleanup(release)
	loaded := make(chan error, 1)
	go func() {
		_, err := r.LoadStatic([]Range{{0, size}})
		loaded <- err
	}()
	// The node has read chunk 0 (the load's first read) and waits to
	// send it.
	deadline := time.Now().Add(5 * time.Second)
	for srv.Stats().ReadBytes == before {
		if time.Now().After(deadline) {
			t.Fatal("the memory node did not read the static range")
		}
		time.Sleep(time.Millisecond)
	}
	fresh := bytes.Repeat([]byte{0xa5}, chunk)
	written := make(chan error, 1)
	go func() {
		_, err := r.WriteAt(fresh, 0)
		written <- err
	}()
	time.Sleep(20 * time.Millisecond) // let the write reach the agent
	release()
	werr := <-written
	if err := <-loaded; err != nil {
		t.Fatalf("LoadStatic: %v", err)
	}
	want := fresh
	switch {
	case werr == nil:
	case errors.Is(werr, ErrReadOnly):
		want = old[:chunk]
	default:
		t.Fatalf("write during the static load: %v, want success or ErrReadOnly", werr)
	}
	got := make([]byte, chunk)
	if _, err := r.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	t.Logf("write during the static load: %v", werr)
	if !bytes.Equal(got, want) {
		what := "other"
		if bytes.Equal(got, old[:chunk]) {
			what = "the pre-write"
		}
		t.Fatalf("write during the static load returned %v; chunk 0 then read back %s bytes", werr, what)
	}
	if _, err := r.WriteAt(fresh, 0); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("write into the loaded static range: %v, want ErrReadOnly", err)
	}
}

// TestStaticLoadWaitsForWrites: a static range being loaded refuses new
// writes into it at once, waits for the writes into it already in flight
// (not for others into the region), and after a failed load takes writes
// again.
func TestStaticLoadWaitsForWrites(t *testing.T) {
	c := newCache(CacheConfig{}, 4096)
	c.learn(1, 1<<20, 0, true)
	if c.beginWrite(0, 1, 100, 200) != writeHeld || c.beginWrite(0, 1, 1<<19, 4096) != writeHeld {
		t.Fatal("write refused")
	}
	ld, err := c.beginStatic(0, 1, 0, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.beginStatic(0, 1, 4096, 4096); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("second load of an overlapping range: %v, want ErrBadRequest", err)
	}
	if c.beginWrite(0, 1, 60<<10, 8<<10) != writeReadOnly {
		t.Fatal("a write into a range being loaded was taken")
	}
	if c.beginWrite(0, 1, 64<<10, 4096) != writeHeld {
		t.Fatal("a write next to the range being loaded was refused")
	}
	if ld.writesDone() {
		t.Fatal("load sees no writes in flight while one into its range is")
	}
	c.endWrite(1, 100, 200)
	if !ld.writesDone() {
		t.Fatal("load still waits after the write into its range ended (others are into other ranges)")
	}
	if err := ld.install(nil); err != nil {
		t.Fatal(err)
	}
	if c.beginWrite(0, 1, 0, 4096) != writeHeld {
		t.Fatal("write refused after the load failed")
	}
}

// TestForeignStaticLoad: tenant 9 asks the agent to load tenant 3's region
// into the static cache while tenant 3 has a write into it in flight (the
// memory node's replies held). The agent knows the owner (the create came
// through it), so it refuses the load at once (ErrWrongTenant, counted),
// as the memory node would: it claims no range, reserves no static budget,
// and the owner's next write into the range is taken, not refused as
// read-only. Before, the load claimed the range and reserved the budget
// while it waited for the owner's write, and the owner's writes into it
// were answered ErrReadOnly until the node refused the load's read.
func TestForeignStaticLoad(t *testing.T) {
	gate := &gatedTransport{Transport: listen(t, loopback)}
	srv, _ := startServer(t, t.TempDir(), gate)
	const chunk, size = 64 << 10, 1 << 20
	a := startCachingAgent(t, srv, CacheConfig{})
	r, _ := writtenRegion(t, newClient(t, a.Addr(), 3), size, chunk)
	id := r.ID()
	claimed := func() (writes, loading int) {
		a.cache.mu.Lock()
		defer a.cache.mu.Unlock()
		if rc := a.cache.regions[id]; rc != nil {
			return len(rc.writes), len(rc.loading)
		}
		return 0, 0
	}
	release := gate.hold()
	t.Cleanup(release)
	fresh := bytes.Repeat([]byte{0x5a}, chunk)
	written := make(chan error, 2)
	go func() {
		_, err := r.WriteAt(fresh, 0)
		written <- err
	}()
	waitFor(t, "the owner's write to be in flight", func() bool { w, _ := claimed(); return w > 0 })

	p := rawPeer{t: t, tr: listen(t, loopback), to: a.Addr()}
	p.send(AppendDatagram(nil, wire.Header{Type: OpStatic.requestType(), Tenant: 9, Dst: id}, 0,
		Record{Op: OpStatic, Region: id, ID: 1, Data: appendRanges(nil, []Range{{0, size}})}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	replied := make(chan Record, 1)
	go func() {
		pkts := []transport.Packet{{Data: make([]byte, 65536)}}
		if _, err := p.tr.Recv(ctx, pkts); err == nil {
			if _, _, recs, err := Decode(pkts[0].Data, nil); err == nil && len(recs) > 0 {
				replied <- recs[0]
			}
		}
	}()
	var rec Record
	for deadline := time.Now().Add(10 * time.Second); ; {
		select {
		case rec = <-replied:
		case <-time.After(time.Millisecond):
			if _, loading := claimed(); loading > 0 || a.Stats().Cache.StaticBytes > 0 {
				t.Fatalf("tenant 9's static load of tenant 3's region claimed the range (%d loading, %d static bytes reserved): the owner's writes into it are refused read-only",
					loading, a.Stats().Cache.StaticBytes)
			}
			if time.Now().After(deadline) {
				t.Fatal("no answer to tenant 9's static load")
			}
			continue
		}
		break
	}
	if rec.Status != StatusWrongTenant {
		t.Fatalf("tenant 9's static load of tenant 3's region: %v, want ErrWrongTenant", rec.Status.Err())
	}
	go func() {
		_, err := r.WriteAt(fresh, chunk)
		written <- err
	}()
	release()
	for range 2 {
		if err := <-written; err != nil {
			t.Fatalf("owner's write while tenant 9's static load was refused: %v", err)
		}
	}
	if st := a.Stats(); st.Cache.StaticBytes != 0 || st.Refused.StaticLoads != 1 {
		t.Fatalf("after the refused load: %d static bytes, %d static loads refused; want 0 and 1", st.Cache.StaticBytes, st.Refused.StaticLoads)
	}
}

// TestOpenStaticRangesFitHostDatagram: the agent's host transport carries
// 1472-byte datagrams (MTU 1500) while max_datagram is left at its 8972-byte
// default. A region with more static ranges than one such datagram holds
// is opened through the agent: the open reply carries as many ranges as
// fit the host's datagram and the open succeeds. Before, the ranges were
// cut to max_datagram's room, the reply did not fit the host's datagram and
// was never sent, and every open of the region failed "no answer".
func TestOpenStaticRangesFitHostDatagram(t *testing.T) {
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	const mtu1500, chunk, size, nranges = 1472, 64 << 10, 1 << 20, 100
	small := func() transport.Transport {
		c, err := udp.Listen(loopback, udp.Options{MaxPayload: mtu1500})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	cfg := AgentConfig{Config: testConfig(), Servers: []ServerSpec{{Addr: srv.Addr()}}}
	a, err := NewAgent(cfg, AgentOptions{HostTransports: []transport.Transport{small()}, FabricTransports: []transport.Transport{listen(t, loopback)}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, a.Run)
	client := func(tries int) *Client {
		cc := testConfig()
		cc.Tries = tries
		c, err := NewClient(ClientOptions{Config: cc, Server: a.Addr(), Tenant: 3, Transport: small()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	r, _ := writtenRegion(t, client(40), size, chunk)
	var ranges []Range
	for i := range nranges {
		ranges = append(ranges, Range{Offset: uint64(i) * 8192, Size: 4096})
	}
	if ok, err := r.LoadStatic(ranges); err != nil || !ok {
		t.Fatalf("LoadStatic of %d ranges: %v, %v", nranges, ok, err)
	}
	// Few tries: before the fix this open is never answered.
	o, err := client(6).Open(context.Background(), r.ID(), false)
	if err != nil {
		t.Fatalf("open of a region with %d static ranges through an agent with %d-byte host datagrams: %v", nranges, mtu1500, err)
	}
	got := o.Static()
	room := (mtu1500 - wire.HeaderLen - PreambleLen - RecordHdrLen) / RangeLen
	if len(got) == 0 || len(got) > room {
		t.Fatalf("open reply lists %d static ranges, want 1 to %d (one datagram's room)", len(got), room)
	}
	for _, g := range got {
		if !slices.Contains(ranges, g) {
			t.Fatalf("open reply lists static range %+v, which was not loaded", g)
		}
	}
}

// TestStaticLoadAllOrNothing: a static load whose later range fails (it
// overlaps an earlier one, or lies past the region) fails as a whole: the
// ranges it loaded before are dropped again with their budget, so that
// nothing the host was told failed stays static and refuses its writes.
// Before, the earlier ranges stayed loaded, held the budget and refused
// the owner's writes (ErrReadOnly), while the host, told the load failed,
// did not count them static.
func TestStaticLoadAllOrNothing(t *testing.T) {
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	const chunk, size = 64 << 10, 1 << 20
	a := startCachingAgent(t, srv, CacheConfig{})
	r, _ := writtenRegion(t, newClient(t, a.Addr(), 3), size, chunk)
	// More ranges than one request carries, the last past the region:
	// the client's LoadStatic sends two, and the second fails after the
	// first loaded (before, the first's ranges stayed loaded).
	per := r.c.req.pk.room() / RangeLen
	if 128*per >= size {
		t.Fatalf("%d ranges a request: too many for the test's region", per)
	}
	var twoRequests []Range
	for i := range per {
		twoRequests = append(twoRequests, Range{uint64(128 * i), 64})
	}
	twoRequests = append(twoRequests, Range{size, 4096})
	for _, tc := range []struct {
		name   string
		ranges []Range
		want   error
	}{
		{"second overlaps the first", []Range{{0, chunk}, {4096, 4096}}, ErrBadRequest},
		{"second past the region", []Range{{0, chunk}, {size, 4096}}, ErrOutOfRange},
		{"third overlaps the first", []Range{{0, chunk}, {2 * chunk, chunk}, {chunk - 1, 2}}, ErrBadRequest},
		{"second request's range past the region", twoRequests, ErrOutOfRange},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := r.LoadStatic(tc.ranges); !errors.Is(err, tc.want) {
				t.Fatalf("LoadStatic(%v): %v, want %v", tc.ranges, err, tc.want)
			}
			if st := a.Stats().Cache; st.StaticBytes != 0 {
				t.Fatalf("after the failed load: %d static bytes held, want 0", st.StaticBytes)
			}
			if _, err := r.WriteAt(make([]byte, 16), 0); err != nil {
				t.Fatalf("owner's write into the first range of the failed load: %v", err)
			}
		})
	}
}

// TestStaticDropOwnLoads: a static drop (what LoadStatic sends to undo its
// earlier requests) removes only ranges named exactly as loaded, and only
// the requesting tenant's loads: another tenant's drop, or one of a range
// not loaded so, leaves the range loaded and its budget held.
func TestStaticDropOwnLoads(t *testing.T) {
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	const chunk, size = 64 << 10, 1 << 20
	a := startCachingAgent(t, srv, CacheConfig{})
	owner := newClient(t, a.Addr(), 3)
	r, _ := writtenRegion(t, owner, size, chunk)
	if ok, err := r.LoadStatic([]Range{{0, chunk}}); err != nil || !ok {
		t.Fatalf("LoadStatic: %v, %v", ok, err)
	}
	drop := func(c *Client, rs []Range) uint32 {
		t.Helper()
		k := &call{rec: Record{Op: OpStatic, Region: r.ID(), Aux: StaticDrop}, data: appendRanges(nil, rs)}
		if err := c.do(context.Background(), k); err != nil {
			t.Fatalf("drop %v: %v", rs, err)
		}
		return k.reply.Aux
	}
	for _, tc := range []struct {
		name   string
		c      *Client
		ranges []Range
		want   uint32
	}{
		{"another tenant's", newClient(t, a.Addr(), 4), []Range{{0, chunk}}, 0},
		{"tenant 0's", newClient(t, a.Addr(), 0), []Range{{0, chunk}}, 0},
		{"part of the range", owner, []Range{{0, 4096}}, 0},
		{"the whole region", owner, []Range{{0, 0}}, 0},
		{"the range as loaded", owner, []Range{{0, chunk}}, 1},
	} {
		before := a.Stats().Cache.StaticBytes
		if n := drop(tc.c, tc.ranges); n != tc.want {
			t.Fatalf("%s drop: %d ranges dropped, want %d", tc.name, n, tc.want)
		}
		if got, want := a.Stats().Cache.StaticBytes, before-uint64(tc.want)*chunk; got != want {
			t.Fatalf("after %s drop: %d static bytes, want %d", tc.name, got, want)
		}
	}
	if _, err := r.WriteAt(make([]byte, 16), 0); err != nil {
		t.Fatalf("owner's write into the dropped range: %v", err)
	}
}

// TestFreedRegionForgotten frees regions on the memory node directly (as
// `lovelock mem free` does), past the agent that caches them, and loses
// every notice of the free the node sends (TestFreedRegionNotice has
// them arrive). Once the agent hears of the free all the same (a forwarded
// read answered "unknown region", or its periodic list of the node), no
// read of the region's static range or of its cached entry returns the old
// bytes, and the static budget is given back.
func TestFreedRegionForgotten(t *testing.T) {
	lossy := &dropNotices{Transport: listen(t, loopback)}
	srv, _ := startServer(t, t.TempDir(), lossy)
	const chunk, esz, size = 64 << 10, 256 << 10, 1 << 20
	a := startCachingAgent(t, srv, CacheConfig{Size: 4 * esz, EntrySize: esz, BNet: 1, BIntra: 1 << 40, Window: 1 << 30,
		Prefetcher: PrefetchHints})
	c := newClient(t, a.Addr(), 3)
	// cached sets up a region with a static range (its first entry) and a
	// filled dynamic entry (its second), each read once as a hit.
	cached := func() *Region {
		w, _ := writtenRegion(t, c, size, chunk)
		// A reader: a writer's lease renewals would tell the agent too.
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		r, err := c.Open(context.Background(), w.ID(), false)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := r.LoadStatic([]Range{{0, esz}}); err != nil || !ok {
			t.Fatalf("LoadStatic: %v, %v", ok, err)
		}
		if n, err := r.Hint([]Range{{esz, esz}}); err != nil || n != 1 {
			t.Fatalf("hint: %d, %v", n, err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for a.Stats().Cache.Valid == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the hinted entry did not fill")
			}
			time.Sleep(time.Millisecond)
		}
		buf := make([]byte, chunk)
		for _, off := range []int64{0, esz} {
			if _, err := r.ReadAt(buf, off); err != nil {
				t.Fatal(err)
			}
		}
		for _, rs := range a.Stats().Cache.Regions {
			if rs.Region == r.ID() && (rs.StaticHits == 0 || rs.Hits == 0) {
				t.Fatalf("region stats %+v: want a static and a dynamic hit", rs)
			}
		}
		return r
	}
	readGone := func(r *Region, off int64) error {
		_, err := r.ReadAt(make([]byte, chunk), off)
		if !errors.Is(err, ErrUnknownRegion) {
			return fmt.Errorf("read at %d of freed region %d: %v, want ErrUnknownRegion", off, r.ID(), err)
		}
		return nil
	}

	// A miss of the freed region tells the agent.
	r := cached()
	if err := srv.Free(0, r.ID()); err != nil {
		t.Fatal(err)
	}
	if err := readGone(r, 3*esz); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, esz} {
		if err := readGone(r, off); err != nil {
			t.Fatal(err)
		}
	}
	if st := a.Stats().Cache; st.StaticBytes != 0 || st.Valid != 0 {
		t.Fatalf("cache after the free: %d static bytes, %d valid entries; want none", st.StaticBytes, st.Valid)
	}

	// Without a miss the agent's periodic list of the node tells it.
	r = cached()
	if err := srv.Free(0, r.ID()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for readGone(r, 0) != nil || readGone(r, esz) != nil {
		if time.Since(start) > 5*regionsEvery {
			t.Fatalf("after %v the agent still serves freed region %d from its caches", time.Since(start), r.ID())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("the agent served the freed region for %v", time.Since(start))
	if st := a.Stats().Cache; st.StaticBytes != 0 {
		t.Fatalf("cache after the free: %d static bytes; want none", st.StaticBytes)
	}
	if lossy.dropped.Load() == 0 || a.Stats().FreedNotices.Received != 0 {
		t.Fatalf("%d notices lost, %+v received: want every notice sent and lost", lossy.dropped.Load(), a.Stats().FreedNotices)
	}
}

// TestConfiguredStaticRetries starts an agent whose config names a static
// range while the memory node does not answer (its replies are held, as
// when mem0 comes up after the DPU): the load fails as "no answer", not
// "unknown region", and is tried again until it succeeds once the node
// answers.
func TestConfiguredStaticRetries(t *testing.T) {
	gate := &gatedTransport{Transport: listen(t, loopback)}
	srv, _ := startServer(t, t.TempDir(), gate)
	const size = 1 << 20
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(i*13 + i>>10)
	}
	file := t.TempDir() + "/preload"
	if err := os.WriteFile(file, want, 0o600); err != nil {
		t.Fatal(err)
	}
	ri, err := srv.Create(3, 0, false, file)
	if err != nil {
		t.Fatal(err)
	}
	release := gate.hold()
	t.Cleanup(release)
	// A short retry budget: each list of the silent node fails fast.
	cfg := AgentConfig{Config: testConfig(), Servers: []ServerSpec{{Addr: srv.Addr()}},
		Cache: CacheConfig{Regions: []CacheRegion{{Region: ri.ID, Static: []Range{{0, 0}}}}}}
	cfg.Tries, cfg.MaxRetransmitTimeout = 4, Duration(10*time.Millisecond)
	var logged testenv.SyncBuffer
	a, err := NewAgent(cfg, AgentOptions{HostTransports: []transport.Transport{listen(t, loopback)},
		FabricTransports: []transport.Transport{listen(t, loopback)}, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	run(t, a.Run)
	// Two lists timed out: the agent's first, and the static load's.
	deadline := time.Now().Add(10 * time.Second)
	for a.Stats().Fabric.Timeouts < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the agent's lists of the silent node did not time out")
		}
		time.Sleep(time.Millisecond)
	}
	release()
	for a.Stats().Cache.StaticBytes != size || !strings.Contains(logged.String(), "static range loaded") {
		if time.Now().After(deadline) {
			t.Fatalf("the configured static range was not loaded after the node answered: %+v", a.Stats().Cache)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if log := logged.String(); strings.Count(log, "not loaded yet") != 1 || strings.Count(log, "static range loaded") != 1 ||
		strings.Contains(log, "unknown region") {
		t.Fatalf("want one line that the range waits for the node (not that its region is unknown), one that it loaded; the log:\n%s", log)
	}
	r, err := newClient(t, a.Addr(), 3).Open(context.Background(), ri.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	checkRegion(t, r, want)
	for _, rs := range a.Stats().Cache.Regions {
		if rs.Region == ri.ID && rs.StaticHits == 0 {
			t.Fatalf("region stats %+v: want the reads served from the static range", rs)
		}
	}
}

// TestRunWaitsForConfiguredStatic stops an agent while its configured
// static range waits for a silent memory node: Run returns only once that
// load has stopped. The load is caught in its log line ("not loaded yet"),
// which returns only when Run has (a late load) or a second has passed.
// (Before, the first refresh and the configured loads ran on a goroutine
// Run did not wait for, and Run returned at once.)
func TestRunWaitsForConfiguredStatic(t *testing.T) {
	gate := &gatedTransport{Transport: listen(t, loopback)}
	srv, _ := startServer(t, t.TempDir(), gate)
	ri, err := srv.Create(3, 1<<20, false, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gate.hold())
	cfg := AgentConfig{Config: testConfig(), Servers: []ServerSpec{{Addr: srv.Addr()}},
		Cache: CacheConfig{Regions: []CacheRegion{{Region: ri.ID, Static: []Range{{0, 0}}}}}}
	cfg.Tries, cfg.MaxRetransmitTimeout = 4, Duration(10*time.Millisecond)
	runDone := make(chan struct{})
	h := &blockingLog{match: "not loaded yet", entered: make(chan struct{}), left: make(chan struct{}), runDone: runDone}
	a, err := NewAgent(cfg, AgentOptions{HostTransports: []transport.Transport{listen(t, loopback)},
		FabricTransports: []transport.Transport{listen(t, loopback)}, Logger: slog.New(h)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		defer close(runDone)
		if err := a.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	select {
	case <-h.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the configured static range never logged that it waits for its node")
	}
	cancel()
	<-runDone
	<-h.left
	if h.late.Load() {
		t.Fatal("Run returned while its configured static load was still running")
	}
}

// blockingLog is a slog.Handler that holds the first record whose message
// contains match until runDone is closed (then it notes late) or a second
// has passed; entered is closed when it starts holding, left when it
// stops.
type blockingLog struct {
	match   string
	entered chan struct{}
	left    chan struct{}
	runDone chan struct{}
	once    sync.Once
	late    atomic.Bool
}

func (b *blockingLog) Enabled(context.Context, slog.Level) bool { return true }
func (b *blockingLog) WithAttrs([]slog.Attr) slog.Handler       { return b }
func (b *blockingLog) WithGroup(string) slog.Handler            { return b }
func (b *blockingLog) Handle(_ context.Context, r slog.Record) error {
	if !strings.Contains(r.Message, b.match) {
		return nil
	}
	b.once.Do(func() {
		close(b.entered)
		select {
		case <-b.runDone:
			b.late.Store(true)
		case <-time.After(time.Second):
		}
		close(b.left)
	})
	return nil
}

// TestHintRefused: a hint (or a prefetcher setting, which rides on op
// hint) of another tenant's region or of a region the agent does not know
// is refused, as the memory node would refuse it (ErrWrongTenant,
// ErrUnknownRegion), and counted in Refused.Hints; the owner's hint is
// taken. Before, the agent answered both "OK, 0 fills", counted nothing,
// and a foreign tenant's prefetcher setting was answered OK but not set.
func TestHintRefused(t *testing.T) {
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	const esz, size = 256 << 10, 1 << 20
	a := startCachingAgent(t, srv, CacheConfig{Size: 4 * esz, EntrySize: esz, BNet: 1, BIntra: 2, Prefetcher: PrefetchHints})
	r, err := newClient(t, a.Addr(), 3).Alloc(context.Background(), size)
	if err != nil {
		t.Fatal(err)
	}
	id := r.ID()
	ranges := appendRanges(nil, []Range{{0, esz}})
	p := rawPeer{t: t, tr: listen(t, loopback), to: a.Addr()}
	refused := 0
	for i, tc := range []struct {
		name   string
		tenant uint32
		rec    Record
		want   Status
	}{
		{"another tenant's hint", 9, Record{Op: OpHint, Region: id, Data: ranges}, StatusWrongTenant},
		{"another tenant's prefetcher", 9, Record{Op: OpHint, Region: id, Aux: uint32(PrefetchOff) + 1}, StatusWrongTenant},
		{"a region no node has", 3, Record{Op: OpHint, Region: id + 1000, Data: ranges}, StatusUnknownRegion},
		{"the owner's hint", 3, Record{Op: OpHint, Region: id, Data: ranges}, StatusOK},
	} {
		tc.rec.ID = uint64(i + 1)
		p.send(AppendDatagram(nil, wire.Header{Type: OpHint.requestType(), Tenant: tc.tenant, Dst: tc.rec.Region}, 0, tc.rec))
		got := p.reply()
		if got.Status != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got.Status.Err(), tc.want.Err())
		}
		if tc.want != StatusOK {
			refused++
		} else if got.Aux != 1 {
			t.Errorf("%s: %d fills started, want 1", tc.name, got.Aux)
		}
	}
	st := a.Stats()
	if st.Refused.Hints != uint64(refused) {
		t.Errorf("refused %+v: want %d hints", st.Refused, refused)
	}
	for _, rc := range st.Cache.Regions {
		if rc.Region == id && rc.Prefetcher != PrefetchHints.String() {
			t.Errorf("region %d's prefetcher is %s after tenant 9 set it: want %s", id, rc.Prefetcher, PrefetchHints)
		}
	}
}

// TestLatencyIsForwarding: through a caching agent, a host's creates,
// opens and writes are forwarded while the agent's static load, hinted
// fills and region lists are its own requests. The forwarding latency
// counts the forwarded round trips only, one sample each, and the agent's
// own are counted apart. Before, every fabric round trip went into the
// forwarding latency, fills and lists included.
func TestLatencyIsForwarding(t *testing.T) {
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	const esz, chunk, size = 256 << 10, 64 << 10, 1 << 20
	a := startCachingAgent(t, srv, CacheConfig{Size: 2 * esz, EntrySize: esz, BNet: 1, BIntra: 2, Prefetcher: PrefetchHints})
	r, _ := writtenRegion(t, newClient(t, a.Addr(), 3), size, chunk)
	if ok, err := r.LoadStatic([]Range{{0, esz}}); !ok || err != nil {
		t.Fatalf("static load: %v, %v", ok, err)
	}
	if n, err := r.Hint([]Range{{2 * esz, 2 * esz}}); n != 2 || err != nil {
		t.Fatalf("hint started %d fills, %v; want 2", n, err)
	}
	var st AgentStats
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st = a.Stats()
		if st.Latency.Count == st.Forwarded+st.FanOut && st.OwnLatency.Count == st.OwnRequests && st.Cache.Filling == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("latency samples: %d forwarding, %d own; want one per forwarded request (%d) and one per own request (%d)",
				st.Latency.Count, st.OwnLatency.Count, st.Forwarded+st.FanOut, st.OwnRequests)
		}
	}
	if own := uint64(3 * esz / chunk); st.Forwarded == 0 || st.OwnRequests < own {
		t.Errorf("%d forwarded and %d own requests: want the host's requests and at least the static load's and fills' reads", st.Forwarded, st.OwnRequests)
	}
}

// TestSwitchWindows: the cache's stats count the adaptive switch's
// completed windows, so that a last window's hit rate of 0 before the
// first one ends reads as none yet; and B_net, measured, is 0 until the
// first entry fill ends.
func TestSwitchWindows(t *testing.T) {
	const esz, window = 4096, 4
	c := newCache(CacheConfig{Size: 4 * esz, EntrySize: esz, BIntra: 2, Prefetcher: PrefetchHints, Window: window}, esz)
	c.learn(1, 16*esz, 0, true)
	if st := c.stats(); st.Windows != 0 || !st.BNetMeasured || st.BNet != 0 || st.Threshold != 0 {
		t.Fatalf("new cache: %d windows, B_net %v (measured %v), threshold %v; want none and 0 until a fill", st.Windows, st.BNet, st.BNetMeasured, st.Threshold)
	}
	for i := range 2*window - 1 {
		rec := Record{Op: OpRead, Region: 1, Offset: uint64(i) * esz, Size: 100}
		c.read(0, &rec)
	}
	if st := c.stats(); st.Windows != 1 {
		t.Fatalf("after %d reads of %d-read windows: %d windows, want 1", 2*window-1, window, st.Windows)
	}
	if n, _ := c.hint(0, 1, []Range{{0, esz}}, nil); n != 1 || fillAll(t, c, func(entryKey, int) byte { return 1 }) != 1 {
		t.Fatalf("hint started %d fills, want 1", n)
	}
	if st := c.stats(); st.BNet <= 0 {
		t.Fatalf("B_net %v after a fill, want it measured", st.BNet)
	}
}
