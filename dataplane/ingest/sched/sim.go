package sched

import (
	"container/heap"
	"errors"
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
	Misses    int // finished after their deadline (or never started)
	MissSize  int // Σ memory slices of the missed requests (eq. 1's Σ m_i δ_i)
	GPUHours  float64
	GPUsUsed  int // distinct GPUs that ever held an instance (eq. 1's Σ Y_j)
	PeakInUse int
	// AllocRate in a replay is the requested GPU share of the running
	// requests over the GPUs in use, integrated over time; in fill mode it is
	// FGD's: the share placed over the fleet's capacity.
	AllocRate float64
	// Frag is the time-averaged fraction of the free memory slices of GPUs
	// in use that a typical request cannot use.
	Frag float64
	// Decision latency of Place on arrivals.
	Decisions  int
	MeanNs     float64
	P99Ns      float64
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
}

type event struct {
	t  time.Duration
	id uint64
	i  int // request index
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

// Simulate replays reqs through a scheduler of cfg: each arrival is placed or
// queued; completions release their instance and retry the queue in arrival
// order (every policy alike, so that only placement differs); a request
// Lovelock told to wait is also retried at its latest start. Apart from the
// measured latencies the result is deterministic.
func Simulate(cfg Config, reqs []Request, opt SimOptions) (Result, error) {
	s, err := New(cfg)
	if err != nil {
		return Result{}, err
	}
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
		done, timers eventHeap
		queue        []int // request indices waiting
		batch        []int // request indices arriving now
		lat          []int64
		started      = make([]bool, len(rs))
		used         = make([]bool, s.GPUs())
		last         time.Duration
		gpuTime      float64 // GPU·seconds
		shareTime    float64 // share·seconds (thousandths)
		fragTime     float64 // free-slice fraction·GPU·seconds
	)
	advance := func(t time.Duration) {
		if dt := (t - last).Seconds(); dt > 0 {
			gpuTime += float64(s.InUse()) * dt
			shareTime += float64(s.Shares()) * dt
			if s.InUse() > 0 {
				fragTime += s.Fragmentation() / 8 * dt
			}
		}
		last = t
	}
	place := func(i int, now time.Duration, timed bool) error {
		r := &rs[i]
		t0 := time.Now()
		a, err := s.Place(r, now)
		if timed {
			lat = append(lat, time.Since(t0).Nanoseconds())
		}
		if err != nil {
			return err
		}
		started[i] = true
		used[a.GPU] = true
		res.Placed++
		res.PeakInUse = max(res.PeakInUse, s.InUse())
		if r.Deadline != 0 && a.End > r.Deadline {
			res.Misses++
			res.MissSize += s.cards[s.gpus[a.GPU].card].card.Profiles[a.Placement.Profile].MemSlices
		}
		if opt.Assignments {
			res.Assignment[r.ID] = a
		}
		heap.Push(&done, event{t: a.End, id: r.ID, i: i})
		return nil
	}
	record := func(t time.Duration) {
		if opt.Series && (len(res.Series) == 0 || res.Series[len(res.Series)-1].InUse != s.InUse()) {
			res.Series = append(res.Series, Point{T: t, InUse: s.InUse()})
		}
	}
	// Requests that ask alike share a key: once one finds no room in a
	// retry round, the others of its key do not try.
	keys, nkeys := requestKeys(rs)
	full := make([]int, nkeys) // round in which the key found no room
	round := 0
	retry := func(now time.Duration) error {
		round++
		nfull := 0
		kept := queue[:0]
		for qi, i := range queue {
			if nfull == nkeys && len(s.waiting) == 0 {
				kept = append(kept, queue[qi:]...)
				break
			}
			// A request holding a reservation is due only from its expected
			// start (ends are exact here); before that it would only hear
			// ErrWait again. It may go where its key-mates found no room.
			if at, ok := s.ReservedAt(rs[i].ID); ok && at > now {
				kept = append(kept, i)
				continue
			}
			if full[keys[i]] == round && !s.Waiting(rs[i].ID) {
				kept = append(kept, i)
				continue
			}
			err := place(i, now, false)
			switch {
			case err == nil:
			case errors.Is(err, ErrNoCapacity):
				if full[keys[i]] != round {
					full[keys[i]] = round
					nfull++
				}
				kept = append(kept, i)
			case errors.Is(err, ErrWait):
				kept = append(kept, i)
				heap.Push(&timers, event{t: s.LatestStart(&rs[i], now), id: rs[i].ID, i: i})
			default:
				return err
			}
		}
		queue = kept
		return nil
	}
	next := 0
	for next < len(rs) || done.Len() > 0 || (timers.Len() > 0 && len(queue) > 0) {
		t := time.Duration(1<<63 - 1)
		if next < len(rs) {
			t = rs[next].Arrival
		}
		if done.Len() > 0 && done[0].t < t {
			t = done[0].t
		}
		if timers.Len() > 0 && timers[0].t < t {
			t = timers[0].t
		}
		advance(t)
		changed := false
		for done.Len() > 0 && done[0].t <= t {
			e := heap.Pop(&done).(event)
			if err := s.Release(e.id); err != nil {
				return res, err
			}
			changed = true
		}
		for timers.Len() > 0 && timers[0].t <= t {
			heap.Pop(&timers)
			changed = true
		}
		if changed && len(queue) > 0 {
			if err := retry(t); err != nil {
				return res, err
			}
		}
		batch = batch[:0]
		for next < len(rs) && rs[next].Arrival <= t {
			batch = append(batch, next)
			next++
		}
		if cfg.Policy == Lovelock && len(batch) > 1 {
			// Requests that arrive together are placed tightest deadline
			// first (a request with slack can wait for one without), largest
			// first among equals (first-fit decreasing).
			sort.SliceStable(batch, func(a, b int) bool {
				la, lb := s.LatestStart(&rs[batch[a]], 0), s.LatestStart(&rs[batch[b]], 0)
				if la != lb {
					return la < lb
				}
				return s.size(&rs[batch[a]]) > s.size(&rs[batch[b]])
			})
		}
		for _, i := range batch {
			err := place(i, t, true)
			switch {
			case err == nil:
			case errors.Is(err, ErrUnfit):
				res.Rejected++
			case errors.Is(err, ErrWait):
				queue = append(queue, i)
				heap.Push(&timers, event{t: s.LatestStart(&rs[i], t), id: rs[i].ID, i: i})
			case errors.Is(err, ErrNoCapacity):
				queue = append(queue, i)
			default:
				return res, err
			}
		}
		record(t)
	}
	for _, i := range queue {
		res.Unserved++
		if !started[i] && rs[i].Deadline != 0 {
			res.Misses++
			if p, err := s.resolve(&rs[i]); err == nil {
				for ci, pi := range p {
					if pi >= 0 {
						res.MissSize += s.cards[ci].card.Profiles[pi].MemSlices
						break
					}
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
		res.Frag = fragTime / gpuTime
	}
	res.Decisions = len(lat)
	res.MeanNs, res.P99Ns = latencyStats(lat)
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

func requestKeys(rs []Request) ([]int, int) {
	ids := map[requestKey]int{}
	keys := make([]int, len(rs))
	for i, r := range rs {
		k := requestKey{r.Profile, r.Throughput, r.Compute, r.MemGB, r.Media}
		id, ok := ids[k]
		if !ok {
			id = len(ids)
			ids[k] = id
		}
		keys[i] = id
	}
	return keys, len(ids)
}

func latencyStats(lat []int64) (mean, p99 float64) {
	if len(lat) == 0 {
		return 0, 0
	}
	var sum int64
	for _, l := range lat {
		sum += l
	}
	slices.Sort(lat)
	return float64(sum) / float64(len(lat)), float64(lat[len(lat)*99/100])
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
	if s.InUse() > 0 {
		res.Frag = s.Fragmentation() / 8 / float64(s.InUse())
	}
	res.Decisions = len(lat)
	res.MeanNs, res.P99Ns = latencyStats(lat)
	return res, nil
}
