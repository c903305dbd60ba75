package farmem

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// local answers, from the agent itself, the requests its caches serve: a
// read that hits the static or the dynamic cache, a hint, and a static
// load (queued for the loaders, or refused StatusUnavailable when the
// queue is full). It returns false for what goes on to a memory node
// (forwardLocked, which also refuses writes into static ranges). Call with
// w.mu held, from the run loop: the lines it logs wait in w.logLater.
func (w *hostWorker) local(ctx context.Context, q *request) bool {
	a := w.a
	rec := &q.rec
	switch rec.Op {
	case OpRead:
		return w.readLocked(ctx, q, false)
	case OpHint:
		hr := hostReq{w: w, src: q.src, tenant: q.tenant, id: rec.ID}
		reply := Record{Op: OpHint, Region: rec.Region}
		ranges, err := parseRanges(rec.Data)
		var pf *Prefetcher
		if p := Prefetcher(rec.Aux&0xff) - 1; rec.Aux&0xff != 0 {
			if p >= numPrefetchers {
				err = fmt.Errorf("%w: prefetcher %d", ErrBadRequest, p)
			}
			pf = &p
		}
		if rec.Aux&^(HintDynamic|0xff) != 0 {
			err = fmt.Errorf("%w: hint flags %#x", ErrBadRequest, rec.Aux)
		}
		switch {
		case err != nil:
		case rec.Aux&HintDynamic != 0:
			if err = a.cache.setDynamic(q.tenant, rec.Region, ranges); err == nil && pf != nil {
				_, err = a.cache.hint(q.tenant, rec.Region, nil, pf)
			}
		default:
			var n int
			n, err = a.cache.hint(q.tenant, rec.Region, ranges, pf)
			reply.Aux = uint32(n)
		}
		if err != nil {
			a.hintsRefused.Add(1)
			if ok, held := a.hintLog.allow(time.Now()); ok {
				region, tenant := rec.Region, q.tenant
				w.logLater = append(w.logLater, func() {
					a.log.Info("farmem: agent: hint refused; further refusals within a minute are only counted (lovelock mem stats --json: refused)",
						"region", region, "tenant", tenant, "err", err, "refused_unlogged", held)
				})
			}
			reply.Status = statusOf(err)
		}
		w.replyLocked(&hr, reply, nil)
		return true
	case OpStatic:
		hr := &hostReq{w: w, src: q.src, tenant: q.tenant, id: rec.ID}
		if rec.Aux != 0 {
			// A drop takes the cache's lock only: no loader needed.
			reply := Record{Op: OpStatic, Region: rec.Region}
			ranges, err := parseRanges(rec.Data)
			if err == nil && rec.Aux != StaticDrop {
				err = fmt.Errorf("%w: static flags %#x", ErrBadRequest, rec.Aux)
			}
			if err != nil {
				reply.Status = statusOf(err)
			} else {
				reply.Aux = uint32(a.cache.dropStatic(q.tenant, rec.Region, ranges))
			}
			w.replyLocked(hr, reply, nil)
			return true
		}
		job := staticJob{hr: hr, region: rec.Region, data: rec.Data, arrived: time.Now()}
		if a.staticPending.Add(1) <= staticQueue+staticLoaders {
			select {
			case a.statics <- job:
				return true
			default: // full: the loaders are between jobs, or Run is ending
			}
		}
		a.staticPending.Add(-1)
		a.staticRefused.Add(1)
		if ok, held := a.staticLog.allow(time.Now()); ok {
			region, tenant := rec.Region, q.tenant
			w.logLater = append(w.logLater, func() {
				a.log.Info("farmem: agent: static load refused, too many queued; further refusals within a minute are only counted (lovelock mem stats --json: overload)",
					"region", region, "tenant", tenant, "queued", staticQueue+staticLoaders, "refused_unlogged", held)
			})
		}
		w.replyLocked(hr, Record{Op: OpStatic, Region: rec.Region, Status: StatusUnavailable}, nil)
		return true
	}
	return false
}

// The hosts' static loads: staticLoaders load at once, from one queue of
// staticQueue; a load beyond both is refused (StatusUnavailable: the host
// tries again). A load of a region the agent does not know waits for a
// refresh, seconds with a silent memory node: a goroutine per load would
// let a host park thousands (one per record).
const (
	staticLoaders = 4
	staticQueue   = 64
)

// refusalLogEvery is how often a refused hint or static load is logged at
// most (per kind); the others are counted (AgentStats.Refused, Overload).
const refusalLogEvery = time.Minute

// staticJob is a host's static load, queued.
type staticJob struct {
	hr      *hostReq
	region  uint32
	data    []byte // the ranges, not parsed yet
	arrived time.Time
}

// staticLoop is a static loader: it carries out the hosts' static loads
// from the queue, one at a time, and answers each.
func (a *Agent) staticLoop(ctx context.Context) {
	for {
		var j staticJob
		select {
		case <-ctx.Done():
			return
		case j = <-a.statics:
		}
		reply := Record{Op: OpStatic, Region: j.region}
		ranges, err := parseRanges(j.data)
		if err == nil {
			err = a.loadStatic(ctx, j.hr.tenant, j.region, ranges, j.arrived)
		}
		a.staticPending.Add(-1)
		if err != nil {
			if ctx.Err() != nil {
				return // no answer: the host asks the agent's next run
			}
			a.staticFailed.Add(1)
			if ok, held := a.staticLog.allow(time.Now()); ok {
				a.log.Info("farmem: agent: static load refused; further refusals within a minute are only counted (lovelock mem stats --json: refused)",
					"region", j.region, "tenant", j.hr.tenant, "err", err, "refused_unlogged", held)
			}
			reply.Status = statusOf(err)
		} else {
			reply.Aux = uint32(len(ranges))
		}
		w := j.hr.w
		w.mu.Lock()
		w.replyLocked(j.hr, reply, nil)
		w.flushLocked()
		w.mu.Unlock()
	}
}

// readLocked answers a read from the caches, or parks it on its entry
// while the entry fills (true: handled); false sends it on to the memory
// node. retry is set when a parked read is served again: it waits no more.
// Call with w.mu held.
func (w *hostWorker) readLocked(ctx context.Context, q *request, retry bool) bool {
	a, rec := w.a, &q.rec
	var wait *fillWaiter
	if !retry {
		wait = &fillWaiter{ctx: ctx, w: w, q: *q}
	}
	data, ref, hit, waiting := a.cache.lookup(q.tenant, rec, wait, retry)
	if waiting {
		return true
	}
	if !hit {
		return false
	}
	hr := hostReq{w: w, src: q.src, tenant: q.tenant, id: rec.ID}
	w.replyLocked(&hr, Record{Op: OpRead, Region: rec.Region, Offset: rec.Offset, Size: rec.Size}, data)
	a.cache.release(ref)
	a.readBytes.Add(uint64(len(data)))
	return true
}

// retryWaiters serves the reads that waited for a fill, each worker's on a
// goroutine of its own: the caller is a fill's completion path, which must
// not wait for a worker's lock or the fabric's window.
func (a *Agent) retryWaiters(ws []fillWaiter) {
	byWorker := map[*hostWorker][]fillWaiter{}
	for _, fw := range ws {
		byWorker[fw.w] = append(byWorker[fw.w], fw)
	}
	for w, ws := range byWorker {
		go w.retryReads(ws)
	}
}

// retryReads serves parked reads again: from their entry now, or from the
// memory node when the fill failed.
func (w *hostWorker) retryReads(ws []fillWaiter) {
	var calls, misses []*call
	w.mu.Lock()
	for i := range ws {
		if w.readLocked(ws[i].ctx, &ws[i].q, true) {
			continue
		}
		calls, misses = w.forwardLocked(&ws[i].q, calls, misses)
	}
	w.flushLocked()
	w.mu.Unlock()
	if len(ws) == 0 {
		return
	}
	ctx := ws[0].ctx
	if len(misses) > 0 {
		go w.resolve(ctx, misses, time.Now())
	}
	if len(calls) > 0 {
		_ = w.a.forward(ctx, w.fab, calls)
	}
}

// staticMeta is the data of an open reply through the agent: the region's
// static ranges, so that the host knows what it need not hint. Ranges
// beyond room bytes, one datagram to the host, are left out (the host then
// only hints more).
func (a *Agent) staticMeta(region uint32, room int) []byte {
	rs := a.cache.staticRanges(region)
	if len(rs) == 0 {
		return nil
	}
	return appendRanges(nil, rs[:min(len(rs), room/RangeLen)])
}

// fill is an entry fill in flight: one read per chunk of the entry.
type fill struct {
	job     fillJob
	pending atomic.Int32
	failed  atomic.Bool
	tokens  chan struct{} // the fill loop's pacing window: one per chunk read on the fabric
}

func (f *fill) part(c *cache, k *call) {
	if k.err != nil || k.reply.Status != StatusOK {
		f.failed.Store(true)
	}
	<-f.tokens
	if f.pending.Add(-1) == 0 {
		c.fillDone(f.job, !f.failed.Load())
	}
}

// fillLoop issues the entry fills the prefetchers and hints queue, off the
// workers' loops: the reads of an entry go out as the agent's own requests
// (tenant 0), each straight into the entry's slot, at most FillInflight
// bytes of them on the fabric at once.
func (a *Agent) fillLoop(ctx context.Context) {
	chunk := uint64(a.cfg.ChunkSize)
	tokens := make(chan struct{}, max(1, uint64(a.cfg.Cache.WithDefaults().FillInflight)/chunk))
	for {
		var j fillJob
		select {
		case <-ctx.Done():
			return
		case j = <-a.cache.fills:
		}
		rec := Record{Op: OpRead, Region: j.key.region}
		srv, ok := a.route(&rec)
		if !ok {
			a.cache.fillDone(j, false)
			continue
		}
		f := &fill{job: j, tokens: tokens}
		buf := a.cache.fillBuf(j)
		base := j.key.idx * a.cache.esz
		var calls []*call
		for lo := uint64(0); lo < uint64(j.n); lo += chunk {
			hi := min(uint64(j.n), lo+chunk)
			calls = append(calls, &call{rec: Record{Op: OpRead, Region: j.key.region, Offset: base + lo, Size: uint32(hi - lo), Aux: ReadCaches},
				buf: buf[lo:hi], dst: a.cfg.Servers[srv].Addr, user: f})
		}
		f.pending.Store(int32(len(calls)))
		fab := a.fabric[a.fillRR%len(a.fabric)]
		a.fillRR++
		// Issue the reads as the pacing window lets them go: wait for
		// room for one, then take what other room there is.
		for len(calls) > 0 {
			select {
			case tokens <- struct{}{}:
			case <-ctx.Done():
				return
			}
			n := 1
		room:
			for n < len(calls) {
				select {
				case tokens <- struct{}{}:
					n++
				default:
					break room
				}
			}
			_ = fab.issue(ctx, calls[:n])
			calls = calls[n:]
		}
	}
}

// loadStatic reads ranges of region (size 0: the whole region) from its
// memory node as tenant and installs them in the static cache. The memory
// node checks the tenant; the static budget bounds the bytes. A region the
// agent does not know waits for a refresh that started after since (the
// load's arrival: loads queued behind one refresh share it).
func (a *Agent) loadStatic(ctx context.Context, tenant, region uint32, ranges []Range, since time.Time) error {
	rec := Record{Op: OpRead, Region: region}
	srv, ok := a.route(&rec)
	size := a.cache.regionSize(region)
	if !ok || size == 0 {
		all := a.refresh(ctx, since)
		srv, ok = a.route(&rec)
		size = a.cache.regionSize(region)
		if (!ok || size == 0) && !all {
			// The region may be on the silent node: not "unknown".
			return fmt.Errorf("%w: region %d: a memory node did not answer the agent's list of its regions; try again once it is reachable", ErrUnavailable, region)
		}
	}
	if !ok || size == 0 {
		return fmt.Errorf("%w: region %d", ErrUnknownRegion, region)
	}
	if a.cache.foreign(tenant, region) {
		// Before any claim: a claimed range refuses its owner's writes
		// (read-only) until the memory node refuses this load's read.
		return fmt.Errorf("%w: region %d is another tenant's; load static ranges as its owner", ErrWrongTenant, region)
	}
	// All or nothing: the host hears one status for the whole load and
	// takes none of its ranges for static on a failure, so those loaded
	// before it go again (else they would refuse its writes read-only).
	var loaded []Range
	fail := func(err error) error {
		a.cache.dropStatic(tenant, region, loaded)
		return err
	}
	for _, r := range ranges {
		off, n := r.Offset, r.Size
		if n == 0 && off == 0 {
			n = size
		}
		if n == 0 || off > size || n > size-off {
			return fail(fmt.Errorf("%w: static range %d+%d of a %d-byte region", ErrOutOfRange, off, n, size))
		}
		if !a.cache.reserveStatic(n) {
			return fail(fmt.Errorf("%w: static range of %d bytes beyond static_size %v", ErrNoSpace, n, a.cache.cfg.StaticSize))
		}
		if err := a.loadRange(ctx, tenant, region, srv, off, n); err != nil {
			a.cache.unreserveStatic(n)
			return fail(err)
		}
		loaded = append(loaded, Range{off, n})
	}
	return nil
}

// loadRange reads [off, off+n) of region and installs it as a static
// range. The range is claimed first, so that writes into it are refused
// from then on, and read once the writes already in flight into it are
// answered: a write cannot land between the read and the install.
func (a *Agent) loadRange(ctx context.Context, tenant, region uint32, srv int, off, n uint64) error {
	ld, err := a.cache.beginStatic(tenant, region, off, n)
	if err != nil {
		return err
	}
	// Writes end within the fabric's retry budget, and static loads are
	// rare: polling is simpler than a wake-up in every endWrite.
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !ld.writesDone() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			_ = ld.install(nil)
			return ctx.Err()
		}
	}
	if ld.freed() {
		_ = ld.install(nil)
		return fmt.Errorf("%w: region %d was freed while its static range waited for writes into it", ErrUnknownRegion, region)
	}
	buf := make([]byte, n)
	if err := a.readInto(ctx, tenant, region, srv, off, buf); err != nil {
		_ = ld.install(nil)
		return err
	}
	return ld.install(buf)
}

// readInto reads buf at off of region from memory node srv, chunk by
// chunk, as the agent's own requests.
func (a *Agent) readInto(ctx context.Context, tenant, region uint32, srv int, off uint64, buf []byte) error {
	chunk := uint64(a.cfg.ChunkSize)
	var calls []*call
	for lo := uint64(0); lo < uint64(len(buf)); lo += chunk {
		hi := min(uint64(len(buf)), lo+chunk)
		calls = append(calls, &call{rec: Record{Op: OpRead, Region: region, Offset: off + lo, Size: uint32(hi - lo), Aux: ReadCaches},
			buf: buf[lo:hi], dst: a.cfg.Servers[srv].Addr, tenant: tenant, done: make(chan struct{})})
	}
	// Issue in window-sized groups so that a large range does not hold
	// the whole window while it waits.
	step := max(1, a.cfg.Window/4)
	var errs []error
	for i := 0; i < len(calls); i += step {
		group := calls[i:min(len(calls), i+step)]
		_ = a.fabric[0].issue(ctx, group)
		for _, k := range group {
			select {
			case <-k.done:
			case <-ctx.Done():
				return ctx.Err()
			}
			switch {
			case k.err != nil:
				errs = append(errs, k.err)
			case k.reply.Status != StatusOK:
				errs = append(errs, k.reply.Status.Err())
			}
		}
		if len(errs) > 0 {
			return fmt.Errorf("farmem: agent: static load of region %d: %w", region, errors.Join(errs...))
		}
	}
	return nil
}

// loadConfiguredStatic loads the static ranges of the agent's config, as
// tenant 0, each region's one after another (loadConfiguredRange).
func (a *Agent) loadConfiguredStatic(ctx context.Context) {
	var wg sync.WaitGroup
	for _, r := range a.cache.cfg.Regions {
		if len(r.Static) == 0 {
			continue
		}
		wg.Go(func() {
			for _, rg := range r.Static {
				a.loadConfiguredRange(ctx, r.Region, rg)
			}
		})
	}
	wg.Wait()
}

// Backoff between tries of a configured static range whose memory node
// does not answer (each try also waits out the fabric's retry budget).
const (
	staticRetryMin = 500 * time.Millisecond
	staticRetryMax = 30 * time.Second
)

// loadConfiguredRange loads one configured static range. While its memory
// node does not answer (it may come up after the DPU) it tries again, with
// backoff, until ctx ends; any other failure is logged and left: the
// range's reads then go to the memory node.
func (a *Agent) loadConfiguredRange(ctx context.Context, region uint32, r Range) {
	wait, logged := staticRetryMin, false
	for {
		err := a.loadStatic(ctx, 0, region, []Range{r}, time.Now())
		switch {
		case err == nil:
			a.log.Info("farmem: agent: static range loaded", "region", region, "offset", r.Offset, "size", r.Size)
			return
		case ctx.Err() != nil:
			return
		case !errors.Is(err, ErrUnavailable):
			a.log.Warn("farmem: agent: static range not loaded; its reads go to the memory node (fix the config's far_memory.cache.regions)",
				"region", region, "offset", r.Offset, "size", r.Size, "err", err)
			return
		case !logged:
			a.log.Warn("farmem: agent: static range not loaded yet, its memory node does not answer; trying again until it does",
				"region", region, "offset", r.Offset, "size", r.Size, "err", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, staticRetryMax)
	}
}

// regionsEvery is how often the agent lists the memory nodes while its
// caches hold bytes: at most about this long after a region is freed past
// the agent, its cached bytes stop being served even if no read misses.
const regionsEvery = 2 * time.Second

// watchRegions lists the memory nodes every regionsEvery while the caches
// hold bytes, so that a region freed on its node directly (`lovelock mem
// free`), whose reads all hit, is forgotten (refresh) all the same.
func (a *Agent) watchRegions(ctx context.Context) {
	t := time.NewTicker(regionsEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if a.cache.holdsBytes() {
			a.refresh(ctx, time.Now())
		}
	}
}

// knownRegions are the regions the agent routes or caches, for refresh to
// find those no memory node lists any more.
func (a *Agent) knownRegions() []uint32 {
	a.mu.RLock()
	ids := make([]uint32, 0, len(a.regions))
	for id := range a.regions {
		ids = append(ids, id)
	}
	a.mu.RUnlock()
	return append(ids, a.cache.learnedRegions()...)
}

// forgetRegion drops a region that its memory node no longer has (freed
// there, past the agent): its route, and its static ranges and entries,
// which would otherwise be served, and hold the static budget, for good.
// A region the cache has not learnt keeps its per-region settings: it may
// be one that the config names before it is created. It reports whether
// there was anything to drop.
func (a *Agent) forgetRegion(id uint32, why string) bool {
	a.mu.Lock()
	_, routed := a.regions[id]
	delete(a.regions, id)
	a.markFreedLocked(id)
	a.mu.Unlock()
	cached := a.cache.regionSize(id) > 0
	if cached {
		a.cache.forget(id)
	}
	if routed || cached {
		a.log.Info("farmem: agent: region gone from its memory node; dropped from the agent's routes and caches", "region", id, "why", why)
	}
	return routed || cached
}

// regionFreed takes a memory node's notice that it freed a region (OpFreed,
// from a fabric receive loop): the region's route, static ranges and
// entries go at once, so that the next read of it gets the memory node's
// "unknown region" instead of the freed bytes. Only the memory node that
// serves the region may say so: a notice from any other address (a host
// that forges one to evict another tenant's bytes), or of a version or
// length this agent does not know, is refused and counted. That is the
// check the agent makes of the node's replies, by source address.
func (a *Agent) regionFreed(from netip.AddrPort, rec *Record) {
	a.noticesIn.Add(1)
	srv, ok := a.route(&Record{Op: OpRead, Region: rec.Region})
	valid := rec.Aux == NoticeVersion && len(rec.Data) == 0 && rec.Status == StatusOK
	if !ok || !valid || a.cfg.Servers[srv].Addr != from {
		if a.noticesRefused.Add(1) == 1 {
			a.log.Warn("farmem: agent: refused a notice that a region was freed: not from the memory node that serves it, "+
				"or of an unknown version; further ones are only counted (lovelock mem stats)",
				"region", rec.Region, "from", from, "version", rec.Aux, "known", ok)
		}
		return
	}
	if a.forgetRegion(rec.Region, "its memory node sent notice that it was freed") {
		a.noticesDropped.Add(1)
	}
}
