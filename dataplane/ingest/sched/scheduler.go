package sched

import (
	"fmt"
	"math/bits"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
)

// Placer is the scheduler's decision interface: Place for each arrival,
// Release for each completion. *Scheduler implements it. The ingest agent
// drives a Dispatcher (one per pool), which adds the queue of requests that
// found no room or were told to wait, retries them, and plans small windows
// exactly.
type Placer interface {
	Place(r *Request, now time.Duration) (Assignment, error)
	Release(id uint64) error
}

// Assignment is where a request runs.
type Assignment struct {
	GPU       int           // index in the fleet, in Config.Fleet order
	Card      string        // the GPU's card
	Profile   string        // the MIG profile of its instance
	Placement mig.Placement // profile index and memory start slot
	Start     time.Duration // when work starts: now plus the reconfiguration time
	End       time.Duration // Start plus the request's duration
}

type cardState struct {
	card    mig.Card
	buckets [numStates]bucket
	frag    [numStates]float64 // fragTable: what Fragmentation reports
	tie     [numStates]float64 // Config.Frag's measure: Lovelock's tie-breaker
	fit     [][numStates]uint8 // per profile
	gpus    []int              // fleet index of each of the card's GPUs
	soon    []*soonest         // per profile, Lovelock only
}

// reservation holds the slices a waiting request will take when the
// instances on them end; nothing else is placed there meanwhile.
type reservation struct {
	gpu    int
	pl     mig.Placement
	mask   uint8
	at     time.Duration // expected start
	end    time.Duration // expected end
	latest time.Duration // its latest start: it may yield to backfill until then
	// planned by the windowed planner: it waits for this slot even past its
	// latest start (the plan priced that miss) instead of deciding anew.
	planned bool
}

type gpuState struct {
	card int
	idx  int // index among the GPUs of its card
	st   *mig.GPU
	me   bool
	resv uint8 // slices reserved for waiting requests
	// resvAt is when the first waiting request on each reserved slice will
	// start: until then shorter work may use it (backfilling). resvEnd is
	// when the last one will end: a new one queues behind it.
	resvAt  [mig.MemorySlices]time.Duration
	resvEnd [mig.MemorySlices]time.Duration
	resvIDs []uint64                        // the waiting requests holding slices here
	ends    [mig.MemorySlices]time.Duration // when each memory slice frees up
}

type running struct {
	gpu   int
	pl    mig.Placement
	share int
}

// Scheduler places requests on a fleet of MIG GPUs with one policy. Decisions
// cost O(cards × states), independent of the number of GPUs, except Lovelock's
// decision to wait, which scans the GPUs in use. A Scheduler is not safe for
// concurrent use: the ingest agent serialises calls (one scheduling goroutine).
type Scheduler struct {
	cfg     Config
	cards   []cardState
	gpus    []gpuState
	running map[uint64]running
	inUse   int
	shares  int     // requested GPU share of running requests, thousandths
	fragSum float64 // Σ fragmentation of GPUs in use, in memory slices
	freeSum int     // Σ free memory slices of GPUs in use (not held, not reserved)

	waiting  map[uint64]reservation // told to wait (ErrWait), not placed since
	resvGPUs bucket                 // GPUs with reserved slices

	plans PlanStats

	learn     bool
	mixCount  []float64
	arrivals  int
	profOfBuf []int
}

// New returns a scheduler for cfg.Fleet, every GPU empty. It refuses a
// configuration Config.Validate refuses.
func New(cfg Config) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Scheduler{cfg: cfg, running: map[uint64]running{}, waiting: map[uint64]reservation{}}
	total := 0
	for _, f := range cfg.Fleet {
		total += f.Count
	}
	words := (total + 63) / 64
	for _, f := range cfg.Fleet {
		ci := -1
		for i := range s.cards {
			if s.cards[i].card.Name == f.Card {
				ci = i
			}
		}
		if ci < 0 {
			c, err := mig.CardByName(f.Card)
			if err != nil {
				return nil, fmt.Errorf("scheduler: %w", err)
			}
			s.cards = append(s.cards, cardState{card: c})
			ci = len(s.cards) - 1
			cs := &s.cards[ci]
			for st := range cs.buckets {
				cs.buckets[st].words = make([]uint64, words)
			}
			for p := range c.Profiles {
				cs.fit = append(cs.fit, fitTable(&cs.card, p))
			}
		}
		for n := 0; n < f.Count; n++ {
			g := len(s.gpus)
			cs := &s.cards[ci]
			s.gpus = append(s.gpus, gpuState{card: ci, idx: len(cs.gpus)})
			cs.gpus = append(cs.gpus, g)
			cs.buckets[0].add(g)
		}
	}
	for i := range s.gpus {
		s.gpus[i].st = mig.NewGPU(&s.cards[s.gpus[i].card].card)
	}
	s.resvGPUs = bucket{words: make([]uint64, words)}
	if cfg.Policy == Lovelock {
		for i := range s.cards {
			cs := &s.cards[i]
			for range cs.card.Profiles {
				cs.soon = append(cs.soon, newSoonest(len(cs.gpus)))
			}
		}
	}
	mix := cfg.Mix
	if mix == nil {
		s.learn = true
		// A prior of 16 requests spread evenly keeps the first arrivals
		// from deciding the mix alone.
		mix = uniformMix(&s.cards[0].card)
		s.mixCount = make([]float64, len(mix))
		for i, w := range mix {
			s.mixCount[i] = 16 * w
		}
	}
	s.setMix(normalise(mix))
	s.profOfBuf = make([]int, len(s.cards))
	return s, nil
}

// strandedAfter is the number of arrivals after which a learned mix drives
// the stranded measure: four times the prior's 16 requests.
const strandedAfter = 64

func (s *Scheduler) setMix(mix []float64) {
	for i := range s.cards {
		cs := &s.cards[i]
		cs.frag = fragTable(&cs.card, mix)
		cs.tie = cs.frag
		// Stranding is relative to the workload's profiles: while the
		// learned mix is mostly its even prior, nothing is known to be
		// stranded, and FGD's measure decides.
		if s.cfg.Frag.resolve() == FragStranded && (!s.learn || s.arrivals >= strandedAfter) {
			cs.tie = strandedTable(&cs.card, mix, &cs.frag)
		}
	}
	s.fragSum, s.freeSum = 0, 0
	for g := range s.gpus {
		if s.gpus[g].st.Instances() > 0 {
			s.fragSum += s.cards[s.gpus[g].card].frag[s.state(g)]
			s.freeSum += freeSlices(s.state(g))
		}
	}
}

// GPUs returns the number of GPUs in the fleet.
func (s *Scheduler) GPUs() int { return len(s.gpus) }

// InUse returns the number of GPUs holding at least one instance.
func (s *Scheduler) InUse() int { return s.inUse }

// Running returns the number of requests placed and not yet released.
func (s *Scheduler) Running() int { return len(s.running) }

// Shares returns the GPU share requested by the running requests, in
// thousandths of a GPU.
func (s *Scheduler) Shares() int { return s.shares }

// Fragmentation returns the summed fragmentation of the GPUs in use: the
// expected number of their free memory slices a typical request (drawn from
// the mix) cannot use, FGD's measure (FragNext) whatever Config.Frag is.
// Divided by Free it is FGD's fragmentation rate, Result.Frag.
func (s *Scheduler) Fragmentation() float64 { return s.fragSum }

// Free returns the free memory slices of the GPUs in use: held by no
// instance and reserved for no waiting request.
func (s *Scheduler) Free() int { return s.freeSum }

// freeSlices returns the memory slices free in a GPU state.
func freeSlices(state int) int { return mig.MemorySlices - bits.OnesCount8(uint8(state)) }

// Layout returns the instances on GPU g and its card.
func (s *Scheduler) Layout(g int) (mig.Card, mig.Layout) {
	var l mig.Layout
	for _, r := range s.running {
		if r.gpu == g {
			l = append(l, r.pl)
		}
	}
	return s.cards[s.gpus[g].card].card, l
}

func (s *Scheduler) state(g int) int {
	st := int(s.gpus[g].st.Used() | s.gpus[g].resv)
	if s.gpus[g].me {
		st |= meBit
	}
	return st
}

// resolve fills s.profOfBuf with the profile of r on each card (-1: none).
func (s *Scheduler) resolve(r *Request) ([]int, error) {
	var firstErr error
	ok := false
	for i := range s.cards {
		p, err := Resolve(&s.cards[i].card, r, s.cfg.Speeds)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		if err == nil && s.cfg.Policy == Naive {
			p = len(s.cards[i].card.Profiles) - 1 // the whole GPU
		}
		s.profOfBuf[i] = p
		ok = ok || err == nil
	}
	if !ok {
		return nil, firstErr
	}
	return s.profOfBuf, nil
}

// Place decides where r runs and reserves its instance. It returns an error
// wrapping ErrUnfit if no card of the fleet can ever serve r, ErrNoCapacity
// if nothing fits now, ErrWait if the policy (Lovelock) prefers to wait for a
// running request to finish rather than open another GPU (r still meets its
// deadline), or ErrDuplicate. The caller retries refused requests after a
// Release, and a waiting one by its latest start, LatestStart.
func (s *Scheduler) Place(r *Request, now time.Duration) (Assignment, error) {
	if _, dup := s.running[r.ID]; dup {
		return Assignment{}, fmt.Errorf("request %d: %w", r.ID, ErrDuplicate)
	}
	prof, err := s.resolve(r)
	if err != nil {
		return Assignment{}, err
	}
	if rv, ok := s.waiting[r.ID]; ok {
		// Its slot must be free of instances and of requests queued on it
		// before this one.
		busy := s.gpus[rv.gpu].st.Used()&rv.mask != 0 || s.queuedAhead(r.ID, rv)
		if busy && (rv.planned || s.LatestStart(r, now) > now) {
			return Assignment{}, fmt.Errorf("request %d: its slot on GPU %d is still busy: %w", r.ID, rv.gpu, ErrWait)
		}
		s.unreserve(r.ID)
		if !busy {
			return s.commit(rv.gpu, rv.pl, r, now)
		}
	}
	s.observe(prof)
	var g, start int
	switch s.cfg.Policy {
	case Naive:
		g, start = s.chooseEmpty(prof, false)
	case FirstFit:
		g, start = s.chooseFirst(prof)
	case BestFit:
		g, start = s.chooseBest(prof)
	case Lovelock:
		g, start = s.chooseLovelock(prof, false)
		if g < 0 && len(s.waiting) > 0 {
			g, start = s.backfill(prof, r, now)
			if g >= 0 {
				a, err := s.commit(g, mig.Placement{Profile: prof[s.gpus[g].card], Start: start}, r, now)
				if err == nil {
					s.yield(g, a.Placement, a.End)
				}
				return a, err
			}
		}
		if g < 0 {
			// Wait, holding the slices, when a slot frees on a GPU in
			// use before the request's latest start: no GPU opened, no miss.
			if latest := s.LatestStart(r, now); latest > now {
				// WaitMargin keeps part of the slack for the bursts that
				// arrive while this request waits.
				limit := latest - time.Duration(s.cfg.WaitMargin*float64(latest-now))
				if g, pl, t, ok := s.earliest(prof, now); ok && t <= limit {
					s.reserve(r.ID, g, pl, t, r.Duration, latest)
					return Assignment{}, fmt.Errorf("request %d: GPU %d slot %d frees at %v, before its latest start %v: %w", r.ID, g, pl.Start, t, latest, ErrWait)
				}
			}
			g, start = s.chooseLovelock(prof, true)
			if g < 0 {
				// Too late to meet the deadline and no GPU to open: queue
				// behind the soonest slot anyway, or requests that can
				// still wait would take every slot ahead of this one.
				if wg, pl, t, ok := s.earliest(prof, now); ok {
					s.reserve(r.ID, wg, pl, t, r.Duration, s.LatestStart(r, now))
					return Assignment{}, fmt.Errorf("request %d: queued behind GPU %d slot %d, free at %v: %w", r.ID, wg, pl.Start, t, ErrNoCapacity)
				}
			}
		}
	default:
		return Assignment{}, fmt.Errorf("scheduler: unknown policy %d", int(s.cfg.Policy))
	}
	if g < 0 {
		return Assignment{}, fmt.Errorf("request %d: %d GPUs, %d in use: %w", r.ID, len(s.gpus), s.inUse, ErrNoCapacity)
	}
	pl := mig.Placement{Profile: prof[s.gpus[g].card], Start: start}
	return s.commit(g, pl, r, now)
}

// size returns the memory slices r needs on the fleet's first card that can
// serve it (0 if none).
func (s *Scheduler) size(r *Request) int {
	for i := range s.cards {
		if p, err := Resolve(&s.cards[i].card, r, s.cfg.Speeds); err == nil {
			return s.cards[i].card.Profiles[p].MemSlices
		}
	}
	return 0
}

// move applies change to GPU g and keeps the state index, the count of GPUs
// in use and the fragmentation sum in step with it.
func (s *Scheduler) move(g int, change func()) {
	gs := &s.gpus[g]
	cs := &s.cards[gs.card]
	old, wasBusy := s.state(g), gs.st.Instances() > 0
	change()
	nw, busy := s.state(g), gs.st.Instances() > 0
	if wasBusy {
		s.fragSum -= cs.frag[old]
		s.freeSum -= freeSlices(old)
	}
	if busy {
		s.fragSum += cs.frag[nw]
		s.freeSum += freeSlices(nw)
	}
	switch {
	case busy && !wasBusy:
		s.inUse++
	case wasBusy && !busy:
		s.inUse--
	}
	if old != nw {
		cs.buckets[old].del(g)
		cs.buckets[nw].add(g)
	}
}

// Due is when r must be done to be on time: its deadline, or, for a request
// without one, its arrival plus the reconfiguration time plus its duration
// (work without a deadline is due to be placed on arrival). It is the one
// definition of a miss: Simulate counts a request that ends after it, or is
// never placed, and LatestStart follows from it.
func (s *Scheduler) Due(r *Request) time.Duration {
	if r.Deadline == 0 {
		return r.Arrival + s.cfg.Reconfig + r.Duration
	}
	return r.Deadline
}

// LatestStart is the last moment r can be placed and still be done by Due:
// its deadline less its duration and the reconfiguration time (its arrival
// if it has no deadline: work without a deadline starts on arrival).
func (s *Scheduler) LatestStart(r *Request, now time.Duration) time.Duration {
	return s.Due(r) - r.Duration - s.cfg.Reconfig
}

func (s *Scheduler) observe(prof []int) {
	if !s.learn {
		return
	}
	if p := prof[0]; p >= 0 && p < len(s.mixCount) {
		s.mixCount[p]++
	}
	s.arrivals++
	// Re-learn the mix often at first, then every 4096 arrivals; a table
	// costs about 25k operations.
	if s.arrivals&(s.arrivals-1) == 0 && s.arrivals <= 4096 || s.arrivals%4096 == 0 {
		s.setMix(normalise(s.mixCount))
	}
}

func (s *Scheduler) commit(g int, pl mig.Placement, r *Request, now time.Duration) (Assignment, error) {
	gs := &s.gpus[g]
	cs := &s.cards[gs.card]
	p := &cs.card.Profiles[pl.Profile]
	var err error
	s.move(g, func() {
		if err = gs.st.Place(pl); err == nil && p.Max == 1 && p.MemSlices == 1 {
			gs.me = true
		}
	})
	if err != nil {
		return Assignment{}, fmt.Errorf("request %d on GPU %d: %w", r.ID, g, err)
	}
	a := Assignment{GPU: g, Card: cs.card.Name, Profile: p.Name, Placement: pl, Start: now + s.cfg.Reconfig}
	a.End = a.Start + r.Duration
	m := p.Mask(pl.Start)
	for i := 0; i < mig.MemorySlices; i++ {
		if m&(1<<i) != 0 {
			gs.ends[i] = a.End
		}
	}
	share := r.Share
	if share == 0 {
		share = p.Compute * 1000 / mig.ComputeSlices
	}
	s.running[r.ID] = running{gpu: g, pl: pl, share: share}
	s.refresh(g)
	delete(s.waiting, r.ID)
	s.shares += share
	return a, nil
}

// Release frees the instance of request id, which has completed.
func (s *Scheduler) Release(id uint64) error {
	r, ok := s.running[id]
	if !ok {
		return fmt.Errorf("release %d: %w", id, ErrUnknownID)
	}
	gs := &s.gpus[r.gpu]
	cs := &s.cards[gs.card]
	p := &cs.card.Profiles[r.pl.Profile]
	var err error
	s.move(r.gpu, func() {
		if err = gs.st.Remove(r.pl); err == nil && p.Max == 1 && p.MemSlices == 1 {
			gs.me = false
		}
	})
	if err != nil {
		return fmt.Errorf("release %d: %w", id, err)
	}
	m := p.Mask(r.pl.Start)
	for i := 0; i < mig.MemorySlices; i++ {
		if m&(1<<i) != 0 {
			gs.ends[i] = 0
		}
	}
	delete(s.running, id)
	s.shares -= r.share
	s.refresh(r.gpu)
	return nil
}
