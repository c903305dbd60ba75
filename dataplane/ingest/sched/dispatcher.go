package sched

import (
	"container/heap"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"
)

// Dispatcher is the request path around a Scheduler: it places arrivals,
// keeps the requests that found no room or were told to wait, and retries
// them when work completes and, for a waiting request, at its latest start.
// The ingest agent drives one Dispatcher from its scheduling goroutine:
// Arrive for each batch of requests received together, Complete for each
// finished request, and Tick at NextTimer. Simulate drives it the same way.
// It is not safe for concurrent use.
type Dispatcher struct {
	s      *Scheduler
	queue  []*Request
	timers eventHeap
	timed  map[uint64]time.Duration // waiting requests with a timer, and when

	// Requests that ask alike share a key: once one finds no room in a
	// retry round, the others of its key do not try in that round.
	keys  map[requestKey]int
	full  []int
	round int

	// OnDecision, if set, gets the decision time of every arrival: its
	// Place, or the windowed plan that placed it.
	OnDecision func(time.Duration)
	pending    time.Duration // a plan given up, counted with the next Place
}

// Placed reports one request that got an instance.
type Placed struct {
	Request    *Request
	Assignment Assignment
}

// NewDispatcher returns a dispatcher over a new scheduler of cfg.
func NewDispatcher(cfg Config) (*Dispatcher, error) {
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return &Dispatcher{s: s, timed: map[uint64]time.Duration{}, keys: map[requestKey]int{}}, nil
}

// Scheduler returns the scheduler the dispatcher drives.
func (d *Dispatcher) Scheduler() *Scheduler { return d.s }

// Queued returns the requests waiting for an instance, in queue order.
func (d *Dispatcher) Queued() []*Request { return d.queue }

// NextTimer returns when Tick must next be called, if ever.
func (d *Dispatcher) NextTimer() (time.Duration, bool) {
	for d.timers.Len() > 0 {
		e := d.timers[0]
		if t, ok := d.timed[e.id]; ok && t == e.t {
			return e.t, true
		}
		heap.Pop(&d.timers) // stale: placed since, or timer moved
	}
	return 0, false
}

// Arrive places the requests that arrived together at now; placed (if not
// nil) hears of each one that got an instance. Requests that find no room,
// or are told to wait, are queued; those no card can ever serve are
// returned, with the error saying why (wrapping ErrUnfit).
func (d *Dispatcher) Arrive(now time.Duration, batch []*Request, placed func(Placed)) ([]error, error) {
	var refused []error
	if d.s.cfg.Policy == Lovelock && len(batch) > 0 && len(batch)+len(d.queue) > 1 {
		var err error
		if batch, refused, err = d.planWindow(now, batch, placed); err != nil || batch == nil {
			return refused, err
		}
	}
	more, err := d.placeEach(now, batch, placed)
	return append(refused, more...), err
}

// placeEach places arrivals one by one with the policy, tightest deadline
// first for Lovelock; see Arrive.
func (d *Dispatcher) placeEach(now time.Duration, batch []*Request, placed func(Placed)) ([]error, error) {
	var refused []error
	if d.s.cfg.Policy == Lovelock && len(batch) > 1 {
		// Tightest deadline first (a request with slack can wait for one
		// without), largest first among equals (first-fit decreasing).
		sort.SliceStable(batch, func(a, b int) bool {
			la, lb := d.s.LatestStart(batch[a], 0), d.s.LatestStart(batch[b], 0)
			if la != lb {
				return la < lb
			}
			return d.s.size(batch[a]) > d.s.size(batch[b])
		})
	}
	for _, r := range batch {
		t0 := time.Now()
		a, err := d.s.Place(r, now)
		if d.OnDecision != nil {
			d.OnDecision(time.Since(t0) + d.pending)
		}
		d.pending = 0
		switch {
		case err == nil:
			if placed != nil {
				placed(Placed{r, a})
			}
		case errors.Is(err, ErrUnfit):
			refused = append(refused, err)
		case errors.Is(err, ErrWait), errors.Is(err, ErrNoCapacity):
			d.queue = append(d.queue, r)
			d.timer(r, now, err)
		default:
			return refused, err
		}
	}
	return refused, nil
}

// planWindow plans the queue and the fitting arrivals together with the
// exact solver (Scheduler.plan), when the window is small enough. It returns
// the arrivals left to the heuristic: nil if the plan took them all.
// OnDecision hears the whole planning time once per arrival (each waited for
// all of it), and a failed attempt's time with the first heuristic decision.
func (d *Dispatcher) planWindow(now time.Duration, batch []*Request, placed func(Placed)) ([]*Request, []error, error) {
	if !d.s.canPlan(len(batch) + len(d.queue)) {
		return batch, nil, nil // most arrivals on a busy fleet: O(1)
	}
	t0 := time.Now()
	var refused []error
	fit := make([]*Request, 0, len(batch))
	for _, r := range batch {
		if _, err := d.s.resolve(r); err != nil {
			refused = append(refused, err)
			continue
		}
		fit = append(fit, r)
	}
	// Several arrivals, or one arrival and requests already waiting: the
	// queue is planned afresh with it (a cheap lookahead for the online
	// case). A lone arrival with nothing waiting is the heuristic's.
	if len(fit) == 0 || len(fit)+len(d.queue) < 2 {
		return fit, refused, nil
	}
	win := append(slices.Clone(d.queue), fit...)
	got, ok, err := d.s.plan(win, now)
	if err != nil || !ok {
		d.pending = time.Since(t0)
		return fit, refused, err
	}
	for _, r := range fit {
		if prof, err := d.s.resolve(r); err == nil {
			d.s.observe(prof)
		}
	}
	d.queue = d.queue[:0]
	for _, r := range win {
		if d.s.Waiting(r.ID) {
			d.queue = append(d.queue, r)
			d.timer(r, now, ErrWait)
		} else {
			delete(d.timed, r.ID)
		}
	}
	dt := time.Since(t0)
	if d.OnDecision != nil {
		for range fit {
			d.OnDecision(dt)
		}
	}
	if placed != nil {
		for _, p := range got {
			placed(p)
		}
	}
	return nil, refused, nil
}

// timer makes sure a request told to wait is retried by its latest start.
func (d *Dispatcher) timer(r *Request, now time.Duration, err error) {
	if !errors.Is(err, ErrWait) {
		return
	}
	t := d.s.LatestStart(r, now)
	if rv, ok := d.s.waiting[r.ID]; ok && rv.planned && t <= now {
		// Its plan, not its latest start, decides now: it keeps waiting
		// for its slot (Place), so a timer would only fire again.
		delete(d.timed, r.ID)
		return
	}
	if old, ok := d.timed[r.ID]; ok && old == t {
		return
	}
	d.timed[r.ID] = t
	heap.Push(&d.timers, event{t: t, id: r.ID})
}

// Complete releases the instance of request id, finished at now, and
// retries the queue.
func (d *Dispatcher) Complete(now time.Duration, id uint64, placed func(Placed)) error {
	if err := d.s.Release(id); err != nil {
		return err
	}
	return d.retry(now, nil, placed)
}

// Tick retries the waiting requests whose latest start has come.
func (d *Dispatcher) Tick(now time.Duration, placed func(Placed)) error {
	due := d.due(now)
	if len(due) == 0 {
		return nil
	}
	return d.retry(now, due, placed)
}

// due pops the timers that have come by now and returns their requests.
func (d *Dispatcher) due(now time.Duration) map[uint64]bool {
	var due map[uint64]bool
	for {
		t, ok := d.NextTimer()
		if !ok || t > now {
			break
		}
		e := heap.Pop(&d.timers).(event)
		delete(d.timed, e.id)
		if due == nil {
			due = map[uint64]bool{}
		}
		due[e.id] = true
	}
	return due
}

// Step is one decision step at now, everything that happened at that
// instant at once: the requests in done completed, the timers due by now
// fire, and batch arrived. It is Complete for each of done, Tick and Arrive,
// except that nothing is decided before all of it is known: the slices of
// every completion are free before any waiting request is retried, and for
// Lovelock the queue and the arrivals are planned together as one window
// (Complete would place the queue one by one at the first completion,
// before the arrivals of the same instant were seen). The result is
// Arrive's.
func (d *Dispatcher) Step(now time.Duration, done []uint64, batch []*Request, placed func(Placed)) ([]error, error) {
	for _, id := range done {
		if err := d.s.Release(id); err != nil {
			return nil, err
		}
	}
	due := d.due(now)
	var refused []error
	if d.s.cfg.Policy == Lovelock && len(batch) > 0 && len(batch)+len(d.queue) > 1 {
		// The queue planned with the arrivals: nothing left to retry.
		var err error
		if batch, refused, err = d.planWindow(now, batch, placed); err != nil || batch == nil {
			return refused, err
		}
	}
	// No plan: the queue first, in arrival order, then the arrivals.
	if err := d.retry(now, due, placed); err != nil {
		return refused, err
	}
	more, err := d.placeEach(now, batch, placed)
	return append(refused, more...), err
}

func (d *Dispatcher) key(r *Request) int {
	k := requestKey{r.Profile, r.Throughput, r.Compute, r.MemGB, r.Media}
	id, ok := d.keys[k]
	if !ok {
		id = len(d.keys)
		d.keys[k] = id
		d.full = append(d.full, 0)
	}
	return id
}

// retry tries the queue in arrival order, the same for every policy, so that
// only placement differs between them.
func (d *Dispatcher) retry(now time.Duration, due map[uint64]bool, placed func(Placed)) error {
	if len(d.queue) == 0 {
		return nil
	}
	d.round++
	kept := d.queue[:0]
	for _, r := range d.queue {
		// A request holding a reservation whose slices are still busy would
		// only hear ErrWait again, unless its latest start has come.
		if d.s.reservedBusy(r.ID) && !due[r.ID] {
			kept = append(kept, r)
			continue
		}
		k := d.key(r)
		if d.full[k] == d.round && !d.s.Waiting(r.ID) {
			kept = append(kept, r)
			continue
		}
		a, err := d.s.Place(r, now)
		switch {
		case err == nil:
			delete(d.timed, r.ID)
			if placed != nil {
				placed(Placed{r, a})
			}
		case errors.Is(err, ErrNoCapacity):
			d.full[k] = d.round
			kept = append(kept, r)
		case errors.Is(err, ErrWait):
			kept = append(kept, r)
			d.timer(r, now, err)
		default:
			return fmt.Errorf("retry request %d: %w", r.ID, err)
		}
	}
	clear(d.queue[len(kept):])
	d.queue = kept
	return nil
}

// Withdraw drops a queued request (its client gave up), with any slot
// reserved for it. It reports whether the request was queued.
func (d *Dispatcher) Withdraw(id uint64) bool {
	for i, r := range d.queue {
		if r.ID == id {
			d.queue = append(d.queue[:i], d.queue[i+1:]...)
			d.s.Withdraw(id)
			delete(d.timed, id)
			return true
		}
	}
	return false
}
