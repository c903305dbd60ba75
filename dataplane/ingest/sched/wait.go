package sched

import (
	"math"
	"math/bits"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
)

// This file holds Lovelock's waiting: reservations of slots that free up
// before a request's latest start, their queueing, backfilling into them,
// and the index of when each profile's soonest slot frees.

// Waiting reports whether request id was told to wait and holds a
// reservation.
func (s *Scheduler) Waiting(id uint64) bool {
	_, ok := s.waiting[id]
	return ok
}

// ReservedAt returns when the slot reserved for waiting request id is
// expected to free up.
func (s *Scheduler) ReservedAt(id uint64) (time.Duration, bool) {
	rv, ok := s.waiting[id]
	return rv.at, ok
}

// reservedBusy reports whether request id holds a reservation whose slices
// still hold instances.
func (s *Scheduler) reservedBusy(id uint64) bool {
	rv, ok := s.waiting[id]
	return ok && s.gpus[rv.gpu].st.Used()&rv.mask != 0
}

// Withdraw forgets a request that was told to wait and will not be placed
// (the client gave up), freeing the slices reserved for it.
func (s *Scheduler) Withdraw(id uint64) { s.unreserve(id) }

func (s *Scheduler) reserve(id uint64, g int, pl mig.Placement, at, dur, latest time.Duration) {
	m := s.cards[s.gpus[g].card].card.Profiles[pl.Profile].Mask(pl.Start)
	s.waiting[id] = reservation{gpu: g, pl: pl, mask: m, at: at, end: at + s.cfg.Reconfig + dur, latest: latest}
	s.gpus[g].resvIDs = append(s.gpus[g].resvIDs, id)
	s.resummarise(g)
}

// resummarise recomputes GPU g's reserved slices and their times from its
// waiting requests, then the indexes.
func (s *Scheduler) resummarise(g int) {
	gs := &s.gpus[g]
	var m uint8
	for i := range gs.resvAt {
		gs.resvAt[i], gs.resvEnd[i] = math.MaxInt64, 0
	}
	for _, id := range gs.resvIDs {
		rv := s.waiting[id]
		m |= rv.mask
		for i := 0; i < mig.MemorySlices; i++ {
			if rv.mask&(1<<i) != 0 {
				gs.resvAt[i] = min(gs.resvAt[i], rv.at)
				gs.resvEnd[i] = max(gs.resvEnd[i], rv.end)
			}
		}
	}
	s.move(g, func() { gs.resv = m })
	inSet := s.resvGPUs.words[g>>6]&(1<<(g&63)) != 0
	switch {
	case m != 0 && !inSet:
		s.resvGPUs.add(g)
	case m == 0 && inSet:
		s.resvGPUs.del(g)
	}
	s.refresh(g)
}

// queuedAhead reports whether another waiting request on the same GPU and
// overlapping slices is due to start before rv (ties: the lower id).
func (s *Scheduler) queuedAhead(id uint64, rv reservation) bool {
	for _, o := range s.gpus[rv.gpu].resvIDs {
		ov := s.waiting[o]
		if o != id && ov.mask&rv.mask != 0 && (ov.at < rv.at || (ov.at == rv.at && o < id)) {
			return true
		}
	}
	return false
}

// yields reports whether work on slices m of GPU g until end leaves every
// waiting request there on time: it ends before they start, or the one
// request reserved there (with nobody queued behind it) can start later and
// still by its latest start.
func (s *Scheduler) yields(g int, m uint8, end time.Duration) bool {
	gs := &s.gpus[g]
	for _, id := range gs.resvIDs {
		rv := s.waiting[id]
		if rv.mask&m == 0 || end <= rv.at {
			continue
		}
		if end > rv.latest {
			return false
		}
		for _, o := range gs.resvIDs {
			if o != id && s.waiting[o].mask&rv.mask != 0 {
				return false // a chain: shifting one would shift the others
			}
		}
	}
	return true
}

// yield moves the waiting requests on GPU g whose slices overlap pl's until
// end, when the backfilled work there is expected to end.
func (s *Scheduler) yield(g int, pl mig.Placement, end time.Duration) {
	gs := &s.gpus[g]
	m := s.cards[gs.card].card.Profiles[pl.Profile].Mask(pl.Start)
	moved := false
	for _, id := range gs.resvIDs {
		rv := s.waiting[id]
		if rv.mask&m != 0 && end > rv.at {
			rv.end += end - rv.at
			rv.at = end
			s.waiting[id] = rv
			moved = true
		}
	}
	if moved {
		s.resummarise(g)
	}
}

// backfill finds a GPU in use where the request fits now in slices that are
// free of instances, using reserved slices only if it ends before their
// waiting request starts (EASY backfilling) or that request can yield
// (yields).
func (s *Scheduler) backfill(prof []int, r *Request, now time.Duration) (int, int) {
	end := now + s.cfg.Reconfig + r.Duration
	for wi, w := range s.resvGPUs.words {
		if w == 0 {
			continue
		}
		if g, st := s.backfillWord(prof, wi, w, end); g >= 0 {
			return g, st
		}
	}
	return -1, 0
}

func (s *Scheduler) backfillWord(prof []int, wi int, w uint64, end time.Duration) (int, int) {
	for ; w != 0; w &= w - 1 {
		g := wi<<6 | bits.TrailingZeros64(w)
		gs := &s.gpus[g]
		p := prof[gs.card]
		if p < 0 || gs.resv == 0 || gs.st.Instances() == 0 {
			continue
		}
		pr := &s.cards[gs.card].card.Profiles[p]
		if gs.me && pr.Max == 1 && pr.MemSlices == 1 {
			continue
		}
		for _, st := range pr.Starts {
			m := pr.Mask(st)
			if m&gs.st.Used() == 0 && s.yields(g, m, end) {
				return g, st
			}
		}
	}
	return -1, 0
}

func (s *Scheduler) unreserve(id uint64) {
	rv, ok := s.waiting[id]
	if !ok {
		return
	}
	gs := &s.gpus[rv.gpu]
	for k, o := range gs.resvIDs {
		if o == id {
			gs.resvIDs = append(gs.resvIDs[:k], gs.resvIDs[k+1:]...)
			break
		}
	}
	delete(s.waiting, id)
	s.resummarise(rv.gpu)
}

// refresh recomputes, for Lovelock, when each profile's soonest slot frees
// on GPU g, after any change to its instances, ends or reservations.
func (s *Scheduler) refresh(g int) {
	gs := &s.gpus[g]
	cs := &s.cards[gs.card]
	if cs.soon == nil {
		return
	}
	for p := range cs.card.Profiles {
		v := time.Duration(math.MaxInt64)
		if gs.st.Instances() > 0 {
			_, v = s.soonestOn(g, p)
		}
		cs.soon[p].set(gs.idx, v)
	}
}

// soonestOn returns the start of profile p that frees soonest on GPU g
// (avoiding slices reserved for others) and when, from the running
// requests' ends.
func (s *Scheduler) soonestOn(g, p int) (int, time.Duration) {
	gs := &s.gpus[g]
	pr := &s.cards[gs.card].card.Profiles[p]
	best, bestT := -1, time.Duration(math.MaxInt64)
	if gs.me && pr.Max == 1 && pr.MemSlices == 1 {
		return best, bestT // frees only with the +me instance; rare, ignored
	}
	for _, st := range pr.Starts {
		t := time.Duration(0)
		for i := st; i < st+pr.MemSlices; i++ {
			t = max(t, gs.ends[i])
			if gs.resv&(1<<i) != 0 {
				t = max(t, gs.resvEnd[i]) // queue behind the waiting requests
			}
		}
		if t < bestT {
			best, bestT = st, t
		}
	}
	return best, bestT
}

// earliest returns the GPU in use, placement and time at which a slot for
// the request's profile frees up soonest.
func (s *Scheduler) earliest(prof []int, now time.Duration) (int, mig.Placement, time.Duration, bool) {
	bestG, bestPl, best := -1, mig.Placement{}, time.Duration(math.MaxInt64)
	for ci := range s.cards {
		cs := &s.cards[ci]
		p := prof[ci]
		if p < 0 || cs.soon == nil {
			continue
		}
		t, idx := cs.soon[p].min()
		if t == math.MaxInt64 || t >= best {
			continue
		}
		g := cs.gpus[idx]
		bestG, bestPl, best = g, mig.Placement{Profile: p, Start: s.quietStart(g, p, t)}, t
	}
	return bestG, bestPl, max(best, now), bestG >= 0
}

// quietStart returns, among the starts of profile p that free on GPU g at
// time t, the one that leaves the GPU least fragmented at t.
func (s *Scheduler) quietStart(g, p int, t time.Duration) int {
	gs := &s.gpus[g]
	cs := &s.cards[gs.card]
	pr := &cs.card.Profiles[p]
	// The GPU as it will be at t: slices still busy or reserved then.
	state := s.state(g) & meBit
	for i := 0; i < mig.MemorySlices; i++ {
		if gs.ends[i] > t || (gs.resv&(1<<i) != 0 && gs.resvEnd[i] > t) {
			state |= 1 << i
		}
	}
	best, bestF := -1, 0.0
	for _, st := range pr.Starts {
		tt := time.Duration(0)
		for i := st; i < st+pr.MemSlices; i++ {
			tt = max(tt, gs.ends[i])
			if gs.resv&(1<<i) != 0 {
				tt = max(tt, gs.resvEnd[i])
			}
		}
		if tt != t {
			continue
		}
		if f := cs.tie[state|int(pr.Mask(st))]; best < 0 || f < bestF-1e-9 {
			best, bestF = st, f
		}
	}
	return best
}
