package sched

import (
	"container/heap"
	"errors"
	"math"
	"slices"
	"sort"
	"time"
)

// Result is what a simulation measured for one policy.
type Result struct {
	Policy    string
	GPUs      int
	Requests  int
	Placed    int
	Rejected  int // no card of the fleet can serve them (ErrUnfit)
	Unserved  int // still waiting when the trace ended (fill mode: refused)
	Misses    int // finished after Scheduler.Due (their deadline, or without one started after arrival + Reconfig), or never started
	MissSize  int // Σ memory slices of the missed requests (eq. 1's Σ m_i δ_i)
	GPUHours  float64
	GPUsUsed  int // distinct GPUs that ever held an instance (eq. 1's Σ Y_j)
	PeakInUse int
	// AllocRate in a replay is the requested GPU share of the running
	// requests over the GPUs in use, integrated over time; in fill mode it is
	// FGD's: the share placed over the fleet's capacity.
	AllocRate float64
	// Frag is FGD's fragmentation rate: the share of the free memory
	// slices of the GPUs in use (Scheduler.Free) that a typical request,
	// drawn from the mix, cannot use (Scheduler.Fragmentation). In a replay
	// both are integrated over time before dividing; in fill mode it is
	// the rate at the end. 0 when no slice of a GPU in use is free.
	Frag float64
	// Decision latency of Place on arrivals.
	Decisions int
	MeanNs    float64
	P50Ns     float64
	P99Ns     float64
	Latency   []int64 `json:"-"` // every decision, ns, with SimOptions.Latencies
	// Plans is what Lovelock's windowed planner did.
	Plans      PlanStats
	Series     []Point               `json:"-"`
	Objective  int                   // eq. 1 with the given weights: GPU·GPUsUsed + MissPerSlice·MissSize
	Assignment map[uint64]Assignment `json:"-"`
}

// Point is the number of GPUs in use from time T on.
type Point struct {
	T     time.Duration
	InUse int
}

// SimOptions tune Simulate.
type SimOptions struct {
	Series      bool    // record GPUs in use over time
	Assignments bool    // record every assignment (for checks)
	Weights     Weights // for Result.Objective; zero: DefaultWeights
	Latencies   bool    // keep every decision's latency in Result.Latency
}

type event struct {
	t  time.Duration
	id uint64
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	return h[i].t < h[j].t || (h[i].t == h[j].t && h[i].id < h[j].id)
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Simulate replays reqs through a Dispatcher of cfg, as the ingest agent
// would drive it: arrivals at their time (those arriving together in one
// batch), completions at their instance's end, and the dispatcher's timers.
// Apart from the measured latencies the result is deterministic.
func Simulate(cfg Config, reqs []Request, opt SimOptions) (Result, error) {
	d, err := NewDispatcher(cfg)
	if err != nil {
		return Result{}, err
	}
	s := d.Scheduler()
	if opt.Weights == (Weights{}) {
		opt.Weights = DefaultWeights()
	}
	rs := slices.Clone(reqs)
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].Arrival < rs[j].Arrival })
	res := Result{Policy: cfg.Policy.String(), GPUs: s.GPUs(), Requests: len(rs)}
	if opt.Assignments {
		res.Assignment = map[uint64]Assignment{}
	}
	var (
		done      eventHeap
		batch     []*Request
		ended     []uint64
		lat       []int64
		used      = make([]bool, s.GPUs())
		last      time.Duration
		gpuTime   float64 // GPU·seconds
		shareTime float64 // share·seconds (thousandths)
		fragTime  float64 // unusable free slices·seconds (expected)
		freeTime  float64 // free slices of GPUs in use·seconds
	)
	d.OnDecision = func(dt time.Duration) { lat = append(lat, dt.Nanoseconds()) }
	advance := func(t time.Duration) {
		if dt := (t - last).Seconds(); dt > 0 {
			gpuTime += float64(s.InUse()) * dt
			shareTime += float64(s.Shares()) * dt
			fragTime += s.Fragmentation() * dt
			freeTime += float64(s.Free()) * dt
		}
		last = t
	}
	placed := func(p Placed) {
		r, a := p.Request, p.Assignment
		used[a.GPU] = true
		res.Placed++
		res.PeakInUse = max(res.PeakInUse, s.InUse())
		if a.End > s.Due(r) {
			res.Misses++
			res.MissSize += s.cards[s.gpus[a.GPU].card].card.Profiles[a.Placement.Profile].MemSlices
		}
		if opt.Assignments {
			res.Assignment[r.ID] = a
		}
		heap.Push(&done, event{t: a.End, id: r.ID})
	}
	record := func(t time.Duration) {
		if opt.Series && (len(res.Series) == 0 || res.Series[len(res.Series)-1].InUse != s.InUse()) {
			res.Series = append(res.Series, Point{T: t, InUse: s.InUse()})
		}
	}
	next := 0
	for {
		t := time.Duration(math.MaxInt64)
		if next < len(rs) {
			t = rs[next].Arrival
		}
		if done.Len() > 0 && done[0].t < t {
			t = done[0].t
		}
		if tt, ok := d.NextTimer(); ok && tt < t && len(d.Queued()) > 0 {
			t = tt
		}
		if t == math.MaxInt64 {
			break
		}
		advance(t)
		ended = ended[:0]
		for done.Len() > 0 && done[0].t <= t {
			ended = append(ended, heap.Pop(&done).(event).id)
		}
		batch = batch[:0]
		for next < len(rs) && rs[next].Arrival <= t {
			batch = append(batch, &rs[next])
			next++
		}
		refused, err := d.Step(t, ended, batch, placed)
		if err != nil {
			return res, err
		}
		res.Rejected += len(refused)
		record(t)
	}
	for _, r := range d.Queued() {
		// Never placed: late, with a deadline or without (Due).
		res.Unserved++
		res.Misses++
		if p, err := s.resolve(r); err == nil {
			for ci, pi := range p {
				if pi >= 0 {
					res.MissSize += s.cards[ci].card.Profiles[pi].MemSlices
					break
				}
			}
		}
	}
	for _, u := range used {
		if u {
			res.GPUsUsed++
		}
	}
	res.GPUHours = gpuTime / 3600
	if gpuTime > 0 {
		res.AllocRate = shareTime / 1000 / gpuTime
	}
	if freeTime > 0 {
		res.Frag = fragTime / freeTime
	}
	res.Decisions = len(lat)
	res.MeanNs, res.P50Ns, res.P99Ns = latencyStats(lat)
	if opt.Latencies {
		res.Latency = lat
	}
	res.Plans = s.Plans()
	res.Objective = opt.Weights.GPU*res.GPUsUsed + opt.Weights.MissPerSlice*res.MissSize
	return res, nil
}

type requestKey struct {
	profile    string
	throughput float64
	compute    int
	mem        int
	media      bool
}

// latencyStats sorts lat and returns its mean, median and 99th percentile.
func latencyStats(lat []int64) (mean, p50, p99 float64) {
	if len(lat) == 0 {
		return 0, 0, 0
	}
	var sum int64
	for _, l := range lat {
		sum += l
	}
	slices.Sort(lat)
	return float64(sum) / float64(len(lat)), float64(lat[len(lat)/2]), float64(lat[len(lat)*99/100])
}

// Fill places reqs in order, without departures, until their requested share
// reaches target times the fleet's capacity (FGD's experiment: 1.3), skipping
// requests that find no room. AllocRate is the share placed over capacity.
func Fill(cfg Config, reqs []Request, target float64) (Result, error) {
	s, err := New(cfg)
	if err != nil {
		return Result{}, err
	}
	res := Result{Policy: cfg.Policy.String(), GPUs: s.GPUs()}
	capacity := float64(s.GPUs()) * 1000
	var asked, placed float64
	var lat []int64
	for i := range reqs {
		r := reqs[i]
		r.Deadline = 0
		share := float64(r.Share)
		if asked >= target*capacity {
			break
		}
		res.Requests++
		t0 := time.Now()
		a, err := s.Place(&r, r.Arrival)
		lat = append(lat, time.Since(t0).Nanoseconds())
		switch {
		case err == nil:
			res.Placed++
			if share == 0 {
				share = float64(s.cards[s.gpus[a.GPU].card].card.Profiles[a.Placement.Profile].Compute) * 1000 / 7
			}
			placed += share
		case errors.Is(err, ErrUnfit):
			res.Rejected++
		case errors.Is(err, ErrNoCapacity):
			// Skipped for good: Lovelock may have queued it behind the
			// soonest slot, and with no departures that reservation would
			// hold its slices against every later request.
			s.Withdraw(r.ID)
			res.Unserved++
		default:
			return res, err
		}
		if share == 0 {
			share = 1000 / 7.0
		}
		asked += share
	}
	res.AllocRate = placed / capacity
	res.PeakInUse = s.InUse()
	res.GPUsUsed = s.InUse()
	if s.Free() > 0 {
		res.Frag = s.Fragmentation() / float64(s.Free())
	}
	res.Decisions = len(lat)
	res.MeanNs, res.P50Ns, res.P99Ns = latencyStats(lat)
	return res, nil
}
