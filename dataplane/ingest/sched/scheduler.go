package sched

import (
	"fmt"
	"math/bits"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
)

// Placer is what the ingest agent calls on its request path: Place for each
// arrival, Release for each completion. *Scheduler implements it.
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
	frag    [numStates]float64
	fit     [][numStates]uint8 // per profile
}

type gpuState struct {
	card int
	st   *mig.GPU
	me   bool
	ends [mig.MemorySlices]time.Duration // when each memory slice frees up
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

	waiting map[uint64]bool // told to wait (ErrWait), not placed since

	learn     bool
	mixCount  []float64
	arrivals  int
	profOfBuf []int
}

// New returns a scheduler for cfg.Fleet, every GPU empty.
func New(cfg Config) (*Scheduler, error) {
	if len(cfg.Fleet) == 0 {
		return nil, fmt.Errorf("scheduler: empty fleet: give GPUs, e.g. 64xH100-80GB")
	}
	s := &Scheduler{cfg: cfg, running: map[uint64]running{}, waiting: map[uint64]bool{}}
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
			s.gpus = append(s.gpus, gpuState{card: ci})
			s.cards[ci].buckets[0].add(g)
		}
	}
	for i := range s.gpus {
		s.gpus[i].st = mig.NewGPU(&s.cards[s.gpus[i].card].card)
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

func (s *Scheduler) setMix(mix []float64) {
	for i := range s.cards {
		s.cards[i].frag = fragTable(&s.cards[i].card, mix)
	}
	s.fragSum = 0
	for g := range s.gpus {
		if s.gpus[g].st.Instances() > 0 {
			s.fragSum += s.cards[s.gpus[g].card].frag[s.state(g)]
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
// expected number of their free memory slices a typical request cannot use.
func (s *Scheduler) Fragmentation() float64 { return s.fragSum }

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
	st := int(s.gpus[g].st.Used())
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
		if g < 0 {
			// Wait only while enough GPUs stay empty for every waiting
			// request to open one at its latest start: waiting must not
			// turn into a miss when the slot it waits for goes to another.
			if latest := s.LatestStart(r, now); latest > now && s.empty() > len(s.waiting) {
				if t, ok := s.earliest(prof, now); ok && t <= latest {
					s.waiting[r.ID] = true
					return Assignment{}, fmt.Errorf("request %d: a slot frees at %v, before its latest start %v: %w", r.ID, t, latest, ErrWait)
				}
			}
			g, start = s.chooseLovelock(prof, true)
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

// Withdraw forgets a request that was told to wait and will not be placed
// (the client gave up); waiting requests hold back empty GPUs.
func (s *Scheduler) Withdraw(id uint64) { delete(s.waiting, id) }

// empty returns the number of GPUs holding no instance.
func (s *Scheduler) empty() int { return len(s.gpus) - s.inUse }

// LatestStart is the last moment r can start and still meet its deadline (its
// arrival if it has none: work without a deadline starts on arrival).
func (s *Scheduler) LatestStart(r *Request, now time.Duration) time.Duration {
	if r.Deadline == 0 {
		return r.Arrival
	}
	return r.Deadline - r.Duration - s.cfg.Reconfig
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
	old := s.state(g)
	if err := gs.st.Place(pl); err != nil {
		return Assignment{}, fmt.Errorf("request %d on GPU %d: %w", r.ID, g, err)
	}
	p := &cs.card.Profiles[pl.Profile]
	if p.Max == 1 && p.MemSlices == 1 {
		gs.me = true
	}
	if old == 0 {
		s.inUse++
	} else {
		s.fragSum -= cs.frag[old]
	}
	nw := s.state(g)
	s.fragSum += cs.frag[nw]
	cs.buckets[old].del(g)
	cs.buckets[nw].add(g)
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
	old := s.state(r.gpu)
	if err := gs.st.Remove(r.pl); err != nil {
		return fmt.Errorf("release %d: %w", id, err)
	}
	p := &cs.card.Profiles[r.pl.Profile]
	if p.Max == 1 && p.MemSlices == 1 {
		gs.me = false
	}
	m := p.Mask(r.pl.Start)
	for i := 0; i < mig.MemorySlices; i++ {
		if m&(1<<i) != 0 {
			gs.ends[i] = 0
		}
	}
	nw := s.state(r.gpu)
	s.fragSum -= cs.frag[old]
	if nw == 0 {
		s.inUse--
	} else {
		s.fragSum += cs.frag[nw]
	}
	cs.buckets[old].del(r.gpu)
	cs.buckets[nw].add(r.gpu)
	delete(s.running, id)
	s.shares -= r.share
	return nil
}

// chooseEmpty returns the lowest-numbered empty GPU on which the request's
// profile fits, and the start slot that grows fragmentation least (or the
// lowest slot, if !byFrag).
func (s *Scheduler) chooseEmpty(prof []int, byFrag bool) (int, int) {
	bestG, bestStart, bestD := -1, 0, 0.0
	for ci := range s.cards {
		cs := &s.cards[ci]
		if prof[ci] < 0 || cs.buckets[0].n == 0 {
			continue
		}
		g := cs.buckets[0].min()
		fit := cs.fit[prof[ci]][0]
		if fit == 0 {
			continue
		}
		start, d := bits.TrailingZeros8(fit), 0.0
		if byFrag {
			start, d = s.leastFrag(cs, prof[ci], 0, fit)
		}
		if bestG < 0 || (byFrag && d < bestD-1e-9) || (!byFrag && g < bestG) {
			bestG, bestStart, bestD = g, start, d
		}
	}
	return bestG, bestStart
}

// leastFrag returns the start among fit whose placement grows fragmentation
// least, preferring lower slots on ties.
func (s *Scheduler) leastFrag(cs *cardState, p, state int, fit uint8) (int, float64) {
	pr := &cs.card.Profiles[p]
	best, bestD := -1, 0.0
	for f := fit; f != 0; f &= f - 1 {
		st := bits.TrailingZeros8(f)
		nw := state | int(pr.Mask(st))
		if pr.Max == 1 && pr.MemSlices == 1 {
			nw |= meBit
		}
		d := cs.frag[nw] - cs.frag[state]
		if best < 0 || d < bestD-1e-9 {
			best, bestD = st, d
		}
	}
	return best, bestD
}

func (s *Scheduler) chooseFirst(prof []int) (int, int) {
	bestG, bestStart := -1, 0
	for ci := range s.cards {
		cs := &s.cards[ci]
		if prof[ci] < 0 {
			continue
		}
		fit := &cs.fit[prof[ci]]
		for st := 0; st < numStates; st++ {
			if fit[st] == 0 || cs.buckets[st].n == 0 {
				continue
			}
			if g := cs.buckets[st].min(); bestG < 0 || g < bestG {
				bestG, bestStart = g, bits.TrailingZeros8(fit[st])
			}
		}
	}
	return bestG, bestStart
}

func (s *Scheduler) chooseBest(prof []int) (int, int) {
	bestG, bestStart, bestFree := -1, 0, 0
	for ci := range s.cards {
		cs := &s.cards[ci]
		if prof[ci] < 0 {
			continue
		}
		fit := &cs.fit[prof[ci]]
		need := cs.card.Profiles[prof[ci]].MemSlices
		for st := 0; st < numStates; st++ {
			if fit[st] == 0 || cs.buckets[st].n == 0 {
				continue
			}
			free := mig.MemorySlices - bits.OnesCount8(uint8(st)) - need
			g := cs.buckets[st].min()
			if bestG < 0 || free < bestFree || (free == bestFree && g < bestG) {
				bestG, bestStart, bestFree = g, bits.TrailingZeros8(fit[st]), free
			}
		}
	}
	return bestG, bestStart
}

// chooseLovelock places on a GPU already in use if any fits (eq. 1: no new
// GPU), choosing the state and slot that grow fragmentation least, then the
// fullest GPU; with open set, it may open an empty GPU instead.
func (s *Scheduler) chooseLovelock(prof []int, open bool) (int, int) {
	if open {
		return s.chooseEmpty(prof, true)
	}
	bestG, bestStart, bestD, bestFree := -1, 0, 0.0, 0
	for ci := range s.cards {
		cs := &s.cards[ci]
		if prof[ci] < 0 {
			continue
		}
		fit := &cs.fit[prof[ci]]
		need := cs.card.Profiles[prof[ci]].MemSlices
		for st := 1; st < numStates; st++ {
			if fit[st] == 0 || cs.buckets[st].n == 0 {
				continue
			}
			start, d := s.leastFrag(cs, prof[ci], st, fit[st])
			free := mig.MemorySlices - bits.OnesCount8(uint8(st)) - need
			better := bestG < 0 || d < bestD-1e-9 ||
				(d < bestD+1e-9 && (free < bestFree || (free == bestFree && cs.buckets[st].min() < bestG)))
			if better {
				bestG, bestStart, bestD, bestFree = cs.buckets[st].min(), start, d, free
			}
		}
	}
	return bestG, bestStart
}

// earliest returns when a slot for the request's profile frees up on a GPU
// in use, from the expected ends of the running requests.
func (s *Scheduler) earliest(prof []int, now time.Duration) (time.Duration, bool) {
	best, found := time.Duration(0), false
	for g := range s.gpus {
		gs := &s.gpus[g]
		p := prof[gs.card]
		if p < 0 || gs.st.Instances() == 0 {
			continue
		}
		pr := &s.cards[gs.card].card.Profiles[p]
		if gs.me && pr.Max == 1 && pr.MemSlices == 1 {
			continue // frees only with the +me instance; rare, ignored
		}
		for _, st := range pr.Starts {
			t := now
			for i := st; i < st+pr.MemSlices; i++ {
				t = max(t, gs.ends[i])
			}
			if !found || t < best {
				best, found = t, true
			}
		}
	}
	return best, found
}
