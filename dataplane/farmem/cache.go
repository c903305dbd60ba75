package farmem

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/farmem/fmap"
)

// cache is the DPU agent's static and dynamic cache (docs/farmem.md, "DPU
// caches"). One mutex guards the index, the slots' states and reference
// counts, the per-region state and the counters; the bytes of a valid
// entry are read outside it while the reader holds a reference, and an
// entry with references is never evicted or reused.
type cache struct {
	cfg   CacheConfig
	chunk uint64
	esz   uint64 // entry size

	mu      sync.Mutex
	arena   []byte
	slots   []slot
	free    []int32
	index   map[entryKey]int32
	regions map[uint32]*regionCache
	rng     *rand.Rand

	hist  []access // ring of the last cfg.History reads
	histN int      // reads recorded (the ring's next position is histN % len)

	// The adaptive switch (SODA eq. 3).
	on                bool
	probing           bool
	winReads, winHits int
	offReads          int
	lastRate          float64
	windows           uint64 // windows ended (evaluateLocked): lastRate means nothing before the first
	bnet, bintra      float64
	bnetMeasured      bool
	bintraMeasured    bool
	events            []SwitchEvent
	switches          uint64

	staticUsed uint64
	dropped    uint64 // fills dropped: fill queue full, or no slot free (a hint: once, where it stopped)
	fills      chan fillJob
	// onFill serves again the reads that waited for a fill (fillWaiter);
	// the agent sets it. Called without mu, on the fill's completion path:
	// it must not block.
	onFill func([]fillWaiter)
}

type entryKey struct {
	region uint32
	idx    uint64
}

const (
	slotFree = iota
	slotFilling
	slotValid
)

type slot struct {
	key        entryKey
	state      uint8
	dead       bool // out of the index; freed when the last reference goes
	used       bool // a read hit it
	prefetched bool
	hinted     bool // loaded for a hint: spared by eviction until read
	refs       int32
	gen        uint64 // the region's write generation when the fill started
	n          int    // valid bytes (an entry at the region's end is short)
	started    time.Time
	waiters    []fillWaiter // reads of the entry that arrived while it filled
}

// fillWaiter is a host read that found its entry still filling: it waits
// for the fill instead of going to the memory node a second time, and is
// served again (retry) when the fill ends, from the entry or, if the fill
// failed, from the memory node.
type fillWaiter struct {
	ctx context.Context
	w   *hostWorker
	q   request
}

type access struct {
	region uint32
	off    uint64
}

// regionCache is what the cache knows of one region.
type regionCache struct {
	size        uint64
	tenant      uint32
	tenantKnown bool
	pf          Prefetcher
	gen         uint64  // bumped by every write the agent forwards
	writes      []Range // writes forwarded and not yet answered
	static      []staticRange
	loading     []Range // static ranges being read: writes into them are refused already
	dynamic     []Range // the ranges the dynamic cache holds, sorted; nil: all of the region
	configured  bool    // the config names the region (CacheConfig.Regions): its settings stay
	ctr         RegionCacheStats
}

type staticRange struct {
	off    uint64
	data   []byte
	tenant uint32 // whose load installed it: only that tenant drops it (StaticDrop)
}

// fillJob is one entry to load: a slot in the filling state.
type fillJob struct {
	slot int32
	key  entryKey
	n    int
}

// SwitchEvent is one turn of the adaptive switch.
type SwitchEvent struct {
	Time time.Time `json:"time"`
	// On is the dynamic cache's state after the event.
	On        bool    `json:"on"`
	HitRate   float64 `json:"hit_rate"`
	Threshold float64 `json:"threshold"`
	Reason    string  `json:"reason"`
}

// RegionCacheStats are one region's cache counters. Hits, Misses and the
// prefetch counters concern the dynamic cache; StaticHits reads served
// from static ranges; Bypassed reads not looked up while the switch had
// the dynamic cache off.
type RegionCacheStats struct {
	Region         uint32 `json:"region"`
	Prefetcher     string `json:"prefetcher"`
	StaticRanges   int    `json:"static_ranges"`
	StaticBytes    uint64 `json:"static_bytes"`
	StaticHits     uint64 `json:"static_hits"`
	Hits           uint64 `json:"hits"`
	Misses         uint64 `json:"misses"`
	Bypassed       uint64 `json:"bypassed"`
	PrefetchIssued uint64 `json:"prefetch_issued"`
	PrefetchUsed   uint64 `json:"prefetch_used"`
	EvictedUnused  uint64 `json:"evicted_unused"`
	Invalidated    uint64 `json:"invalidated"`
	Hinted         uint64 `json:"hinted"`
	// DynamicRanges is the number of ranges the dynamic cache is limited
	// to (0: all of the region), OutsideDynamic the reads outside them,
	// which go on to the memory node uncounted by Hits and Misses.
	DynamicRanges  int    `json:"dynamic_ranges"`
	OutsideDynamic uint64 `json:"outside_dynamic"`
	// Waited counts reads that found their entry still filling and waited
	// for it; each is also counted as a hit, or as a miss if the fill
	// failed or was made useless meanwhile (the switch turned the cache
	// off, a scope left the entry out, the prefetcher was set off), when
	// it is served.
	Waited uint64 `json:"waited"`
	// Accuracy is PrefetchUsed / PrefetchIssued, Coverage Hits / (Hits +
	// Misses).
	Accuracy float64 `json:"accuracy"`
	Coverage float64 `json:"coverage"`
}

// Counted is the number of reads the region's counters saw: static hits,
// dynamic hits and misses, reads bypassed by the switch and reads outside
// the dynamic cache's ranges. With the prefetcher off, a read outside the
// static ranges is counted nowhere.
func (s RegionCacheStats) Counted() uint64 {
	return s.StaticHits + s.Hits + s.Misses + s.Bypassed + s.OutsideDynamic
}

// HitRate is the share of a region's reads at the DPU agent that its
// caches served, (static + dynamic hits) / reads, and the reads. A read
// that meets no cache (prefetcher off, outside the static ranges) is
// counted nowhere, so the reads are at least the chunks the mapping
// fetched from the region (host: fmap.Stats.Fetched, the faults and the
// read-ahead, one read each). The rate is 0 without reads.
func HitRate(c RegionCacheStats, host fmap.Stats) (rate float64, reads uint64) {
	reads = max(c.Counted(), host.Fetched())
	if reads == 0 {
		return 0, 0
	}
	return float64(c.StaticHits+c.Hits) / float64(reads), reads
}

// Since returns the counters of s less those of an earlier reading b of
// the same region (a run's share), with s's settings and its accuracy and
// coverage computed over the difference.
func (s RegionCacheStats) Since(b RegionCacheStats) RegionCacheStats {
	d := s
	d.StaticHits -= b.StaticHits
	d.Hits -= b.Hits
	d.Misses -= b.Misses
	d.Bypassed -= b.Bypassed
	d.OutsideDynamic -= b.OutsideDynamic
	d.Waited -= b.Waited
	d.PrefetchIssued -= b.PrefetchIssued
	d.PrefetchUsed -= b.PrefetchUsed
	d.EvictedUnused -= b.EvictedUnused
	d.Invalidated -= b.Invalidated
	d.Hinted -= b.Hinted
	d.Accuracy, d.Coverage = 0, 0
	if d.PrefetchIssued > 0 {
		d.Accuracy = float64(d.PrefetchUsed) / float64(d.PrefetchIssued)
	}
	if d.Hits+d.Misses > 0 {
		d.Coverage = float64(d.Hits) / float64(d.Hits+d.Misses)
	}
	return d
}

// CacheStats are the agent's cache state and counters.
type CacheStats struct {
	// Dynamic says whether an arena is configured, On whether the
	// adaptive switch has it on now.
	Dynamic    bool   `json:"dynamic"`
	On         bool   `json:"on"`
	ArenaBytes uint64 `json:"arena_bytes"`
	EntrySize  uint64 `json:"entry_size"`
	Entries    int    `json:"entries"`
	Valid      int    `json:"valid"`
	Filling    int    `json:"filling"`
	InUse      int    `json:"in_use"`
	// StaticBytes of StaticLimit hold static ranges.
	StaticBytes uint64 `json:"static_bytes"`
	StaticLimit uint64 `json:"static_limit"`
	// BNet and BIntra in bytes per second, and whether each was
	// measured; Threshold is BNet/BIntra, the hit rate below which the
	// dynamic cache costs more than it saves (SODA eq. 3). A measured
	// BNet is 0 until the first entry fill ends (not measured yet), and
	// Threshold is 0 while either is: the switch then stays on.
	BNet           float64 `json:"b_net"`
	BIntra         float64 `json:"b_intra"`
	BNetMeasured   bool    `json:"b_net_measured"`
	BIntraMeasured bool    `json:"b_intra_measured"`
	Threshold      float64 `json:"threshold"`
	// WindowHitRate is the last complete window's hit rate, Window its
	// length in reads, Windows how many have ended: while none has,
	// WindowHitRate is 0 and means nothing.
	WindowHitRate float64 `json:"window_hit_rate"`
	Window        int     `json:"window"`
	Windows       uint64  `json:"windows"`
	Switches      uint64  `json:"switches"`
	// Events are the last switch events, oldest first.
	Events []SwitchEvent `json:"events,omitempty"`
	// Dropped counts the entry fills that a prefetcher wanted and that
	// found the fill queue full or no slot to be had, and the hints that
	// stopped so (once each: a hint looks no further).
	Dropped uint64             `json:"prefetch_dropped"`
	Regions []RegionCacheStats `json:"regions,omitempty"`
}

const maxEvents = 16

func newCache(cfg CacheConfig, chunk int) *cache {
	cfg = cfg.WithDefaults()
	c := &cache{cfg: cfg, chunk: uint64(chunk), esz: uint64(cfg.EntrySize),
		index: make(map[entryKey]int32), regions: make(map[uint32]*regionCache),
		rng:  rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x50da)),
		hist: make([]access, cfg.History), fills: make(chan fillJob, cfg.Queue)}
	if n := uint64(cfg.Size) / c.esz; n > 0 {
		c.arena = make([]byte, n*c.esz)
		c.slots = make([]slot, n)
		for i := int(n) - 1; i >= 0; i-- {
			c.free = append(c.free, int32(i))
		}
		c.on = true
	}
	c.bnet, c.bintra = float64(cfg.BNet), float64(cfg.BIntra)
	if c.bintra == 0 && c.slots != nil {
		c.bintra, c.bintraMeasured = measureIntra(), true
	}
	c.bnetMeasured = c.bnet == 0
	for _, r := range cfg.Regions {
		rc := c.region(r.Region)
		rc.configured = true
		if r.Prefetcher != nil {
			rc.pf = *r.Prefetcher
		}
	}
	return c
}

// measureIntra times a short copy loop: the DPU's memory bandwidth, which
// stands in for the host↔DPU bandwidth where no DMA engine is measured.
func measureIntra() float64 {
	const block, total = 1 << 20, 64 << 20
	src, dst := make([]byte, block), make([]byte, block)
	for i := range src {
		src[i] = byte(i)
	}
	start := time.Now()
	for range total / block {
		copy(dst, src)
	}
	d := time.Since(start)
	if d <= 0 {
		d = time.Nanosecond
	}
	return float64(total) / d.Seconds()
}

// region returns the state of region id, creating it. Call with mu held.
func (c *cache) region(id uint32) *regionCache {
	rc := c.regions[id]
	if rc == nil {
		rc = &regionCache{pf: c.cfg.Prefetcher}
		rc.ctr.Region = id
		c.regions[id] = rc
	}
	return rc
}

// learn records a region's size and, when known, its owner.
func (c *cache) learn(id uint32, size uint64, tenant uint32, tenantKnown bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rc := c.region(id)
	rc.size = size
	if tenantKnown {
		rc.tenant, rc.tenantKnown = tenant, true
	}
}

// forget drops a freed region: its entries and static ranges.
func (c *cache) forget(id uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rc := c.regions[id]
	if rc == nil {
		return
	}
	c.invalidateLocked(id, rc, 0, ^uint64(0))
	for _, s := range rc.static {
		c.staticUsed -= uint64(len(s.data))
	}
	delete(c.regions, id)
}

// learnedRegions are the regions whose size the cache has learnt: the
// only ones it may serve.
func (c *cache) learnedRegions() []uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []uint32
	for id, rc := range c.regions {
		if rc.size > 0 {
			ids = append(ids, id)
		}
	}
	return ids
}

// holdsBytes says whether either cache holds bytes of any region.
func (c *cache) holdsBytes() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.staticUsed > 0 || len(c.index) > 0
}

// threshold is B_net / B_intra, or 0 while either is unknown.
func (c *cache) threshold() float64 {
	if c.bnet <= 0 || c.bintra <= 0 {
		return 0
	}
	return c.bnet / c.bintra
}

// allowed says whether tenant may read rc from the cache: the owner, or
// tenant 0 (the infrastructure), as the memory node decides.
func (rc *regionCache) allowed(tenant uint32) bool {
	return tenant == 0 || rc.tenantKnown && rc.tenant == tenant
}

// foreign says whether region is known to be another tenant's than
// tenant's (tenant 0 may use any): the memory node would refuse tenant.
func (c *cache) foreign(tenant, region uint32) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	rc := c.regions[region]
	return rc != nil && rc.tenantKnown && !rc.allowed(tenant)
}

// staticFind returns the static bytes of [off, off+n), if one range holds
// them all.
func (rc *regionCache) staticFind(off, n uint64) []byte {
	i, _ := slices.BinarySearchFunc(rc.static, off, func(s staticRange, off uint64) int {
		switch {
		case s.off+uint64(len(s.data)) <= off:
			return -1
		case s.off > off:
			return 1
		}
		return 0
	})
	if i < len(rc.static) {
		s := rc.static[i]
		if s.off <= off && off+n <= s.off+uint64(len(s.data)) {
			return s.data[off-s.off : off-s.off+n]
		}
	}
	return nil
}

// inDynamic says whether the dynamic cache holds any of [off, off+n).
func (rc *regionCache) inDynamic(off, n uint64) bool {
	if rc.dynamic == nil {
		return true
	}
	for _, r := range rc.dynamic {
		if off < r.Offset+r.Size && r.Offset < off+n {
			return true
		}
	}
	return false
}

func (rc *regionCache) staticOverlaps(off, n uint64) bool {
	for _, s := range rc.static {
		if off < s.off+uint64(len(s.data)) && s.off < off+n {
			return true
		}
	}
	return false
}

// read serves a read of tenant from the static or the dynamic cache. On a
// hit it returns the bytes and a reference to release once they are copied
// (-1: static bytes, nothing to release). Every read of a region with
// caching on goes through the history and may start prefetches.
func (c *cache) read(tenant uint32, rec *Record) (data []byte, ref int32, hit bool) {
	data, ref, hit, _ = c.lookup(tenant, rec, nil, false)
	return data, ref, hit
}

// lookup is read, and more: with wait, a read of an entry still filling is
// parked on the entry (waiting true) and wait's worker serves it again when
// the fill ends; such a second call has retry set, and is counted as a hit
// or a miss but not again as an access (history, prefetch, window).
func (c *cache) lookup(tenant uint32, rec *Record, wait *fillWaiter, retry bool) (data []byte, ref int32, hit, waiting bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rc := c.regions[rec.Region]
	off, n := rec.Offset, uint64(rec.Size)
	if rc == nil || rc.size == 0 || !rc.allowed(tenant) || off > rc.size || n > rc.size-off || n == 0 {
		return nil, 0, false, false // the memory node decides
	}
	if b := rc.staticFind(off, n); b != nil {
		rc.ctr.StaticHits++
		return b, -1, true, false
	}
	if retry && (!c.on || rc.pf == PrefetchOff || !rc.inDynamic(off, n)) {
		// Waited for a fill that the switch, a new scope or the
		// prefetcher set off made useless: the read was counted as an
		// access when it arrived (Waited, and a hit of the switch's
		// window), so now it is the miss Waited promises; not bypassed,
		// nor counted towards the next probe.
		rc.ctr.Misses++
		return nil, 0, false, false
	}
	if c.slots == nil || rc.pf == PrefetchOff {
		return nil, 0, false, false
	}
	if !rc.inDynamic(off, n) {
		rc.ctr.OutsideDynamic++
		return nil, 0, false, false
	}
	if !c.on {
		rc.ctr.Bypassed++
		c.offReads++
		if c.offReads >= c.cfg.Probe {
			c.offReads, c.on, c.probing = 0, true, true
			c.winReads, c.winHits = 0, 0
			c.event(true, c.lastRate, "probe: trying the dynamic cache again for a window")
		}
		return nil, 0, false, false
	}
	idx := off / c.esz
	ref = -1
	if (off+n-1)/c.esz == idx {
		if i, ok := c.index[entryKey{rec.Region, idx}]; ok {
			s := &c.slots[i]
			if s.state == slotFilling && !s.dead && wait != nil && off-idx*c.esz+n <= uint64(s.n) {
				s.waiters = append(s.waiters, *wait)
				waiting = true
			}
			if s.state == slotValid && !s.dead && off-idx*c.esz+n <= uint64(s.n) {
				s.refs++
				if !s.used {
					s.used = true
					if s.prefetched {
						rc.ctr.PrefetchUsed++
					}
				}
				base := uint64(i)*c.esz + off - idx*c.esz
				data, ref, hit = c.arena[base:base+n:base+n], i, true
			}
		}
	}
	switch {
	case waiting:
		// Counted as a hit or a miss when served; for the switch's window
		// a hit now (a fill rarely fails), since the retry is no access.
		rc.ctr.Waited++
		c.winHits++
	case hit:
		rc.ctr.Hits++
		if !retry {
			c.winHits++
		}
	default:
		rc.ctr.Misses++
	}
	if retry {
		return data, ref, hit, false
	}
	c.winReads++
	c.hist[c.histN%len(c.hist)] = access{rec.Region, off}
	c.histN++
	c.prefetchLocked(rec.Region, rc, off, idx)
	if c.winReads >= c.cfg.Window {
		c.evaluateLocked()
	}
	return data, ref, hit, waiting
}

// release drops a reference read returned.
func (c *cache) release(ref int32) {
	if ref < 0 {
		return
	}
	c.mu.Lock()
	s := &c.slots[ref]
	s.refs--
	if s.refs == 0 && s.dead {
		c.freeLocked(ref)
	}
	c.mu.Unlock()
}

// evaluateLocked ends a window: SODA's eq. 3 turns the dynamic cache off
// when the hit rate is below B_net/B_intra.
func (c *cache) evaluateLocked() {
	h := float64(c.winHits) / float64(c.winReads)
	c.lastRate = h
	c.windows++
	c.winReads, c.winHits = 0, 0
	thr := c.threshold()
	switch {
	case thr > 0 && h < thr:
		c.on, c.offReads = false, 0
		why := fmt.Sprintf("hit rate %.3f < B_net/B_intra %.3f", h, thr)
		if c.probing {
			why = "probe failed: " + why
		}
		c.probing = false
		c.event(false, h, why)
		c.dropAllLocked()
	case c.probing:
		c.probing = false
		c.event(true, h, fmt.Sprintf("probe succeeded: hit rate %.3f >= B_net/B_intra %.3f", h, thr))
	}
}

func (c *cache) event(on bool, h float64, why string) {
	c.switches++
	if len(c.events) == maxEvents {
		c.events = append(c.events[:0], c.events[1:]...)
	}
	c.events = append(c.events, SwitchEvent{Time: time.Now(), On: on, HitRate: h, Threshold: c.threshold(), Reason: why})
}

// dropAllLocked empties the arena when the switch turns it off; entries
// being read or filled go when their readers or fills finish.
func (c *cache) dropAllLocked() {
	for k, i := range c.index {
		delete(c.index, k)
		c.dropSlotLocked(i, false)
	}
}

// dropSlotLocked takes slot i out of use: at once when nothing holds it,
// else when the last reader or the fill is done.
func (c *cache) dropSlotLocked(i int32, invalidated bool) {
	s := &c.slots[i]
	if rc := c.regions[s.key.region]; rc != nil && s.state == slotValid {
		switch {
		case invalidated:
			rc.ctr.Invalidated++
		case s.prefetched && !s.used:
			rc.ctr.EvictedUnused++
		}
	}
	if s.refs == 0 && s.state != slotFilling {
		c.freeLocked(i)
		return
	}
	s.dead = true
}

func (c *cache) freeLocked(i int32) {
	c.slots[i] = slot{}
	c.free = append(c.free, i)
}

// allocLocked returns a free slot, evicting a random unreferenced valid
// entry when none is free, one that is not an unread hinted entry if it
// can; false when every entry is in use or filling.
func (c *cache) allocLocked() (int32, bool) {
	if n := len(c.free); n > 0 {
		i := c.free[n-1]
		c.free = c.free[:n-1]
		return i, true
	}
	n := len(c.slots)
	start := c.rng.IntN(n)
	for j := range 2 * n {
		i := int32((start + j) % n)
		s := &c.slots[i]
		// First pass: spare hinted entries not read yet (the program named
		// them as about to be read); the second takes any.
		if s.state != slotValid || s.refs != 0 || s.dead || j < n && s.hinted && !s.used {
			continue
		}
		delete(c.index, s.key)
		c.dropSlotLocked(i, false)
		// dropSlotLocked freed it (no references, not filling).
		k := len(c.free) - 1
		c.free = c.free[:k]
		return i, true
	}
	return 0, false
}

// prefetchLocked asks the region's prefetcher for the entries to load
// after a read at off (entry idx) and starts their fills.
func (c *cache) prefetchLocked(region uint32, rc *regionCache, off, idx uint64) {
	switch rc.pf {
	case PrefetchAdjacent:
		for d := uint64(1); d <= uint64(c.cfg.Depth); d++ {
			c.startFillLocked(region, rc, idx+d, true)
		}
	case PrefetchStride:
		delta, ok := c.strideLocked(region)
		if !ok {
			return
		}
		got := 0
		last := idx
		for k := int64(1); k <= 64 && got < c.cfg.Depth; k++ {
			o := int64(off) + k*delta
			if o < 0 || uint64(o) >= rc.size {
				break
			}
			e := uint64(o) / c.esz
			if e == last || e == idx {
				continue
			}
			last = e
			got++
			c.startFillLocked(region, rc, e, true)
		}
	}
}

// strideLocked is Leap's trend detector over the history, made to see
// through interleaving: each of the region's newest reads (up to 64)
// gives one delta, to the nearest of the region's strideLookback reads
// before it (the smallest |delta|), where Leap takes the read just before
// it. Two workers that each scan their own block then still show their
// common stride (Leap's consecutive deltas alternate between the blocks
// and find no majority). Then, newest first, in windows of 4, 8, 16, …
// deltas, the first window with a majority delta (Boyer-Moore vote, then a
// count) gives the trend.
func (c *cache) strideLocked(region uint32) (int64, bool) {
	var offs [64 + strideLookback]uint64
	no := 0
	for j := 0; j < len(c.hist) && j < c.histN && no < len(offs); j++ {
		if a := c.hist[(c.histN-1-j)%len(c.hist)]; a.region == region {
			offs[no] = a.off
			no++
		}
	}
	var deltas [64]int64
	nd := 0
	for i := 0; i+1 < no && nd < len(deltas); i++ {
		var best int64
		for k := i + 1; k < no && k <= i+strideLookback; k++ {
			if d := int64(offs[i]) - int64(offs[k]); d != 0 && (best == 0 || absDelta(d) < absDelta(best)) {
				best = d
			}
		}
		deltas[nd] = best
		nd++
	}
	for w := 4; ; w *= 2 {
		w = min(w, nd)
		if w < 2 {
			return 0, false
		}
		cand, votes := int64(0), 0
		for _, d := range deltas[:w] {
			switch {
			case votes == 0:
				cand, votes = d, 1
			case d == cand:
				votes++
			default:
				votes--
			}
		}
		count := 0
		for _, d := range deltas[:w] {
			if d == cand {
				count++
			}
		}
		if count*2 > w && cand != 0 {
			return cand, true
		}
		if w == nd {
			return 0, false
		}
	}
}

// strideLookback is how many earlier reads the stride detector compares
// each read with: enough for a few interleaved streams.
const strideLookback = 8

func absDelta(d int64) int64 {
	if d < 0 {
		return -d
	}
	return d
}

// fillResult is what startFillLocked did with an entry.
type fillResult uint8

const (
	// fillSkipped: nothing to do (the entry is cached or filling, past
	// the region, static, outside the dynamic cache's ranges, or writes
	// to the region are in flight).
	fillSkipped fillResult = iota
	fillStarted
	// fillDropped: the fill queue is full or every slot is in use or
	// filling; counted in dropped.
	fillDropped
)

// startFillLocked claims a slot for entry idx of region and queues its
// fill. Nothing happens when the entry is cached or filling, lies past the
// region, wholly in a static range or wholly outside the dynamic cache's
// ranges, or while writes to the region are in flight (a fill could read
// bytes the write is about to replace). When the fill queue is full or no
// slot can be had the fill is dropped and counted; the queue's room is
// checked first, so that no entry is evicted for a fill that cannot be
// queued.
func (c *cache) startFillLocked(region uint32, rc *regionCache, idx uint64, prefetched bool) fillResult {
	if idx*c.esz >= rc.size || len(rc.writes) > 0 || !c.on {
		return fillSkipped
	}
	key := entryKey{region, idx}
	if _, ok := c.index[key]; ok {
		return fillSkipped
	}
	n := min(c.esz, rc.size-idx*c.esz)
	if rc.staticFind(idx*c.esz, n) != nil || !rc.inDynamic(idx*c.esz, n) {
		return fillSkipped
	}
	// Only startFillLocked sends on c.fills, under mu: room seen here is
	// still there for the send below (the fill loop only takes jobs).
	if len(c.fills) == cap(c.fills) {
		c.dropped++
		return fillDropped
	}
	i, ok := c.allocLocked()
	if !ok {
		c.dropped++
		return fillDropped
	}
	c.slots[i] = slot{key: key, state: slotFilling, prefetched: prefetched, gen: rc.gen, n: int(n), started: time.Now()}
	c.fills <- fillJob{slot: i, key: key, n: int(n)}
	c.index[key] = i
	rc.ctr.PrefetchIssued++
	return fillStarted
}

// fillBuf is where fill j's bytes go.
func (c *cache) fillBuf(j fillJob) []byte {
	base := uint64(j.slot) * c.esz
	return c.arena[base : base+uint64(j.n)]
}

// fillDone completes fill j: the entry becomes valid unless the fill
// failed or a write to its region arrived meanwhile.
func (c *cache) fillDone(j fillJob, ok bool) {
	c.mu.Lock()
	s := &c.slots[j.slot]
	waiters := s.waiters
	s.waiters = nil
	c.fillDoneLocked(j, ok)
	c.mu.Unlock()
	if len(waiters) > 0 && c.onFill != nil {
		c.onFill(waiters)
	}
}

func (c *cache) fillDoneLocked(j fillJob, ok bool) {
	s := &c.slots[j.slot]
	rc := c.regions[j.key.region]
	if s.dead || !ok || rc == nil || rc.gen != s.gen {
		if c.index[j.key] == j.slot && !s.dead {
			delete(c.index, j.key)
		}
		c.freeLocked(j.slot)
		return
	}
	s.state = slotValid
	if c.bnetMeasured {
		if d := time.Since(s.started); d > 0 {
			c.bnet = max(c.bnet, float64(s.n)/d.Seconds())
		}
	}
}

// writeStart is what beginWrite made of a write.
type writeStart uint8

const (
	// writeHeld: the write goes on to the memory node and is held in
	// flight in its region's record: endWrite once it is answered.
	writeHeld writeStart = iota
	// writeReadOnly: the write is into a static range or one being
	// loaded; it is answered read-only, not forwarded.
	writeReadOnly
	// writeForeign: the region is known to be another tenant's; the
	// write goes on to the memory node, which refuses it, and the cache
	// is left as it is (no endWrite).
	writeForeign
)

// beginWrite is called before tenant's write is forwarded. A write to a
// region whose owner the cache knows to be another tenant (and tenant is
// not 0, the infrastructure, which may write any region) touches nothing:
// the memory node refuses it. Otherwise it refuses a write into a static
// range or one being loaded, or invalidates the overlapping entries and
// holds off fills of the region until endWrite. It makes a record for a
// region the cache does not know (endWrite drops it again if the region
// is still not learnt), so that a region learnt while the write is in
// flight starts no fill before it.
func (c *cache) beginWrite(tenant, region uint32, off, n uint64) writeStart {
	c.mu.Lock()
	defer c.mu.Unlock()
	rc := c.regions[region]
	if rc == nil {
		rc = c.region(region)
	}
	if rc.tenantKnown && !rc.allowed(tenant) {
		return writeForeign
	}
	if rc.staticOverlaps(off, n) || overlaps(rc.loading, off, n) {
		return writeReadOnly
	}
	rc.writes = append(rc.writes, Range{off, n})
	rc.gen++
	c.invalidateLocked(region, rc, off, n)
	return writeHeld
}

// endWrite is called with the range of a write that beginWrite held when
// the memory node answered it (or the agent gave up on it), before the
// host is answered. A record
// that beginWrite made for a region the cache has not learnt (its size is
// 0) goes with the last such write, unless a static load claims part of it
// or the config names it: a host writing to region IDs that do not exist
// would otherwise leave a record for each.
func (c *cache) endWrite(region uint32, off, n uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rc := c.regions[region]
	if rc == nil {
		return
	}
	if i := slices.Index(rc.writes, Range{off, n}); i >= 0 {
		rc.writes = slices.Delete(rc.writes, i, i+1)
		rc.gen++
	}
	if rc.size == 0 && len(rc.writes) == 0 && len(rc.loading) == 0 && len(rc.static) == 0 && !rc.configured {
		delete(c.regions, region)
	}
}

// invalidateLocked drops the entries of region overlapping [off, off+n).
func (c *cache) invalidateLocked(region uint32, rc *regionCache, off, n uint64) {
	if c.slots == nil || n == 0 {
		return
	}
	first := off / c.esz
	last := (min(off+n, rc.size+c.esz) - 1) / c.esz
	if off+n < off { // the whole region
		last = ^uint64(0)
	}
	if last-first > uint64(len(c.slots)) {
		for k, i := range c.index {
			if k.region == region && k.idx >= first && k.idx <= last {
				delete(c.index, k)
				c.dropSlotLocked(i, true)
			}
		}
		return
	}
	for e := first; e <= last; e++ {
		k := entryKey{region, e}
		if i, ok := c.index[k]; ok {
			delete(c.index, k)
			c.dropSlotLocked(i, true)
		}
	}
}

// hint starts fills for the entries overlapping ranges; it returns how
// many it started. It looks at most at as many entries as the arena holds
// (those already cached or filling, static or outside the dynamic cache's
// ranges count too), and stops at the first fill it has to drop (the fill
// queue is full, or every slot is in use or filling: the entries after it
// would be dropped as well), so a hint costs at most the arena's entries
// of work under mu and the worker's lock whatever ranges it names. A
// prefetcher setting, when not nil, becomes the region's. A region the
// agent has not learnt, or another tenant's, is refused as setDynamic
// refuses it: the hint goes no further, so no memory node would check it,
// and an answer of success would say the region is there and the
// prefetcher set.
func (c *cache) hint(tenant, region uint32, ranges []Range, pf *Prefetcher) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rc := c.regions[region]
	switch {
	case rc == nil || rc.size == 0:
		return 0, fmt.Errorf("%w: region %d is not known to the agent yet (open it through the agent first)", ErrUnknownRegion, region)
	case !rc.allowed(tenant):
		return 0, fmt.Errorf("%w: region %d is not tenant %d's, or the agent has not learnt its owner yet (open it through the agent as that tenant)", ErrWrongTenant, region, tenant)
	}
	if pf != nil {
		rc.pf = *pf
	}
	if c.slots == nil || rc.pf == PrefetchOff || !c.on || len(rc.writes) > 0 {
		return 0, nil
	}
	started, budget := 0, len(c.slots)
walk:
	for _, r := range ranges {
		if r.Size == 0 || r.Offset >= rc.size {
			continue
		}
		end := min(rc.size, r.Offset+r.Size)
		if end < r.Offset {
			end = rc.size
		}
		for e := r.Offset / c.esz; e*c.esz < end; e++ {
			if budget == 0 {
				break walk
			}
			budget--
			switch c.startFillLocked(region, rc, e, true) {
			case fillStarted:
				c.slots[c.index[entryKey{region, e}]].hinted = true
				started++
				rc.ctr.Hinted++
			case fillDropped:
				break walk
			}
		}
	}
	return started, nil
}

// setDynamic limits region's dynamic cache to ranges (none: all of the
// region) and drops its entries wholly outside them. Ranges of size 0 or
// past the region are refused, and so is a tenant other than the owner or
// a region the agent has not learnt: unlike a hint, this is a setting, and
// an answer of success must mean that it holds.
func (c *cache) setDynamic(tenant, region uint32, ranges []Range) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	rc := c.regions[region]
	switch {
	case rc == nil || rc.size == 0:
		return fmt.Errorf("%w: region %d is not known to the agent yet (open it through the agent first)", ErrUnknownRegion, region)
	case !rc.allowed(tenant):
		return fmt.Errorf("%w: region %d is not tenant %d's, or the agent has not learnt its owner yet (open it through the agent as that tenant)", ErrWrongTenant, region, tenant)
	}
	var scope []Range
	for _, r := range ranges {
		if r.Size == 0 || r.Offset >= rc.size || r.Size > rc.size-r.Offset {
			return fmt.Errorf("%w: dynamic cache range %d+%d of region %d (%d bytes)", ErrBadRequest, r.Offset, r.Size, region, rc.size)
		}
		scope = append(scope, r)
	}
	slices.SortFunc(scope, func(a, b Range) int { return cmp.Compare(a.Offset, b.Offset) })
	rc.dynamic = scope
	for k, i := range c.index {
		if k.region == region && !rc.inDynamic(k.idx*c.esz, c.esz) {
			delete(c.index, k)
			c.dropSlotLocked(i, true) // counted as invalidated: no read can use it now
		}
	}
	return nil
}

// staticLoad is a static range being loaded: from beginStatic on, writes
// into it are refused; once writesDone, its bytes may be read from the
// memory node and installed.
type staticLoad struct {
	c      *cache
	rc     *regionCache // a forget since beginStatic replaces it: the load is void
	region uint32
	tenant uint32
	r      Range
}

// beginStatic claims [off, off+n) of region for tenant's static load. It
// fails if a static range or another load overlaps it.
func (c *cache) beginStatic(tenant, region uint32, off, n uint64) (*staticLoad, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rc := c.region(region)
	if rc.staticOverlaps(off, n) || overlaps(rc.loading, off, n) {
		return nil, fmt.Errorf("%w: static range %d+%d of region %d overlaps one loaded", ErrBadRequest, off, n, region)
	}
	rc.loading = append(rc.loading, Range{off, n})
	return &staticLoad{c: c, rc: rc, region: region, tenant: tenant, r: Range{off, n}}, nil
}

// writesDone says whether no write into the range is in flight any more,
// or the region was forgotten (freed) since beginStatic: then its writes
// in flight may never be ended in the record the load holds (endWrite
// finds none, or another), and the load is void (freed). Writes begun
// after beginStatic are refused, so once this holds, a read of the range
// sees every write acknowledged into it.
func (l *staticLoad) writesDone() bool {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	return l.c.regions[l.region] != l.rc || !overlaps(l.rc.writes, l.r.Offset, l.r.Size)
}

// freed says whether the region was forgotten since beginStatic: install
// would fail.
func (l *staticLoad) freed() bool {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	return l.c.regions[l.region] != l.rc
}

// install ends the load with its bytes (nil: the load failed): they are
// served from here from now on, and writes to them are refused. It fails
// if the region was forgotten (freed) meanwhile.
func (l *staticLoad) install(data []byte) error {
	c, rc := l.c, l.rc
	c.mu.Lock()
	defer c.mu.Unlock()
	if i := slices.Index(rc.loading, l.r); i >= 0 {
		rc.loading = slices.Delete(rc.loading, i, i+1)
	}
	if data == nil {
		return nil
	}
	if c.regions[l.region] != rc {
		return fmt.Errorf("%w: region %d was freed while its static range loaded", ErrUnknownRegion, l.region)
	}
	c.invalidateLocked(l.region, rc, l.r.Offset, l.r.Size)
	rc.static = append(rc.static, staticRange{l.r.Offset, data, l.tenant})
	slices.SortFunc(rc.static, func(a, b staticRange) int { return cmp.Compare(a.off, b.off) })
	return nil
}

// dropStatic removes the static ranges rs of region that tenant's loads
// installed (a range of size 0 at offset 0: the whole region), and gives
// their budget back: those of a load that failed later, or of a client's
// earlier requests (StaticDrop). A range not there as named, or another
// tenant's, is skipped (after a forget, which gave the budget back, none
// is there). It returns how many it removed.
func (c *cache) dropStatic(tenant, region uint32, rs []Range) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	rc := c.regions[region]
	if rc == nil {
		return 0
	}
	dropped := 0
	for _, r := range rs {
		if r.Offset == 0 && r.Size == 0 {
			r.Size = rc.size
		}
		i := slices.IndexFunc(rc.static, func(s staticRange) bool {
			return s.off == r.Offset && uint64(len(s.data)) == r.Size && s.tenant == tenant
		})
		if i < 0 {
			continue
		}
		rc.static = slices.Delete(rc.static, i, i+1)
		c.staticUsed -= r.Size
		dropped++
	}
	return dropped
}

// overlaps says whether any of rs overlaps [off, off+n).
func overlaps(rs []Range, off, n uint64) bool {
	for _, r := range rs {
		if off < r.Offset+r.Size && r.Offset < off+n {
			return true
		}
	}
	return false
}

// reserveStatic takes n bytes of the static budget (false: no room);
// unreserveStatic gives them back after a failed load.
func (c *cache) reserveStatic(n uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.staticUsed+n > uint64(c.cfg.StaticSize) {
		return false
	}
	c.staticUsed += n
	return true
}

func (c *cache) unreserveStatic(n uint64) {
	c.mu.Lock()
	c.staticUsed -= n
	c.mu.Unlock()
}

// staticRanges lists the static ranges of region, for the open reply.
func (c *cache) staticRanges(region uint32) []Range {
	c.mu.Lock()
	defer c.mu.Unlock()
	rc := c.regions[region]
	if rc == nil {
		return nil
	}
	out := make([]Range, 0, len(rc.static))
	for _, s := range rc.static {
		out = append(out, Range{s.off, uint64(len(s.data))})
	}
	return out
}

// regionSize returns a region's size, 0 when unknown.
func (c *cache) regionSize(region uint32) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rc := c.regions[region]; rc != nil {
		return rc.size
	}
	return 0
}

func (c *cache) stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := CacheStats{Dynamic: c.slots != nil, On: c.on && c.slots != nil, ArenaBytes: uint64(len(c.arena)),
		EntrySize: c.esz, Entries: len(c.slots), StaticBytes: c.staticUsed, StaticLimit: uint64(c.cfg.StaticSize),
		BNet: c.bnet, BIntra: c.bintra, BNetMeasured: c.bnetMeasured, BIntraMeasured: c.bintraMeasured,
		Threshold: c.threshold(), WindowHitRate: c.lastRate, Window: c.cfg.Window, Windows: c.windows, Switches: c.switches,
		Events: slices.Clone(c.events), Dropped: c.dropped}
	for i := range c.slots {
		s := &c.slots[i]
		switch s.state {
		case slotValid:
			st.Valid++
		case slotFilling:
			st.Filling++
		}
		if s.refs > 0 {
			st.InUse++
		}
	}
	for _, rc := range c.regions {
		r := rc.ctr
		r.Prefetcher = rc.pf.String()
		r.StaticRanges = len(rc.static)
		r.DynamicRanges = len(rc.dynamic)
		for _, s := range rc.static {
			r.StaticBytes += uint64(len(s.data))
		}
		st.Regions = append(st.Regions, r.Since(RegionCacheStats{}))
	}
	slices.SortFunc(st.Regions, func(a, b RegionCacheStats) int { return int(a.Region) - int(b.Region) })
	return st
}
