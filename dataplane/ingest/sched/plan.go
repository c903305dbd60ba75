package sched

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
)

// This file holds Lovelock's windowed planner: when requests wait together
// and the fleet's running work is small, the Dispatcher plans them with the
// exact solver instead of one by one.

// Window bounds the windowed planner. When the requests waiting together
// (the queue plus the arrivals) and the GPUs in use are few enough, Lovelock
// plans them exactly with Solve against the running instances, and commits
// the plan: starts now, and reservations for the later starts. Otherwise, or
// when the solver runs out of its node budget, the heuristic places them one
// by one as before. The zero value is the default.
type Window struct {
	// Requests is the most requests planned together: 0 means 8; a negative
	// value turns the planner off.
	Requests int
	// GPUs is the most GPUs in use at which it plans (0: 8).
	GPUs int
	// Nodes is the solver's node budget per plan (0: 20 000), which bounds
	// a decision's cost: a node costs O(requests × (requests + running
	// instances)), about 0.1–0.3 µs on these sizes.
	Nodes int
}

func (w Window) limits() (reqs, gpus, nodes int) {
	reqs, gpus, nodes = w.Requests, w.GPUs, w.Nodes
	if reqs == 0 {
		reqs = 8
	}
	if gpus == 0 {
		gpus = 8
	}
	if nodes == 0 {
		nodes = 20_000
	}
	return reqs, gpus, nodes
}

// PlanStats counts the windowed planner's work.
type PlanStats struct {
	Plans     int // windows planned exactly and committed
	OverNodes int // windows left to the heuristic: node budget exhausted
	Nodes     int // solver nodes, over all windows tried
}

// Plans returns what the windowed planner did so far.
func (s *Scheduler) Plans() PlanStats { return s.plans }

// canPlan reports, in O(1), whether a window of n requests is within the
// planner's bounds now: the Dispatcher asks before it builds one.
func (s *Scheduler) canPlan(n int) bool {
	maxReqs, maxGPUs, _ := s.cfg.Window.limits()
	return s.cfg.Policy == Lovelock && maxReqs >= 0 && n > 0 && n <= maxReqs && s.inUse <= maxGPUs &&
		len(s.cards) == 1 && len(s.waiting) <= n
}

// plan places reqs, which have all arrived by now, with the exact solver
// against the running instances. ok is false, and nothing changed, when the
// window is out of the planner's bounds (Config.Window), a request is not
// one the solver takes, or the budget ran out. Otherwise the plan is
// committed: placed lists the requests started now; the others hold
// reservations of their planned slots (Waiting reports them) and start when
// those free. Existing reservations must all belong to requests in reqs,
// which are planned afresh.
func (s *Scheduler) plan(reqs []*Request, now time.Duration) (placed []Placed, ok bool, err error) {
	_, _, maxNodes := s.cfg.Window.limits()
	if !s.canPlan(len(reqs)) {
		return nil, false, nil
	}
	cs := &s.cards[0]
	in := Instance{Card: cs.card, Weights: DefaultWeights()}
	for _, r := range reqs {
		if _, dup := s.running[r.ID]; dup {
			return nil, false, nil
		}
		p, err := Resolve(&cs.card, r, s.cfg.Speeds)
		if err != nil {
			return nil, false, nil
		}
		if pr := &cs.card.Profiles[p]; pr.Max == 1 && pr.MemSlices == 1 {
			return nil, false, nil // +me: the solver does not model its limit
		}
		dur := int(s.cfg.Reconfig + r.Duration)
		if dur < 1 {
			return nil, false, nil
		}
		// Time in nanoseconds from now. A request without a deadline is
		// priced as due if placed now, not by Due: one that has waited is
		// late by Due already, and a miss already paid for would let the
		// plan put it off at no cost, again at every step.
		dl := int(s.Due(r) - now)
		if r.Deadline == 0 {
			dl = int(max(r.Arrival, now)-now) + dur
		}
		in.Jobs = append(in.Jobs, Job{Profile: p, Duration: dur, Deadline: dl})
	}
	n := 0
	for id := range s.waiting {
		if slices.IndexFunc(reqs, func(r *Request) bool { return r.ID == id }) >= 0 {
			n++
		}
	}
	if n != len(s.waiting) {
		return nil, false, nil // a reservation the plan does not own
	}
	// GPUs in use first (their running instances fixed), then as many of the
	// lowest-numbered empty GPUs as there are requests.
	var gpus []int
	for _, rn := range s.running {
		if !slices.Contains(gpus, rn.gpu) {
			gpus = append(gpus, rn.gpu)
		}
	}
	slices.Sort(gpus)
	in.Open = len(gpus)
	for g := 0; g < len(s.gpus) && len(gpus) < in.Open+len(reqs) && len(gpus) < 64; g++ {
		if s.gpus[g].st.Instances() == 0 {
			gpus = append(gpus, g)
		}
	}
	in.GPUs = len(gpus)
	for _, rn := range s.running {
		gs := &s.gpus[rn.gpu]
		m := cs.card.Profiles[rn.pl.Profile].Mask(rn.pl.Start)
		// An instance past its expected end still holds its slices: it is
		// taken to end just after now.
		until := max(int(gs.ends[rn.pl.Start]-now), 1)
		in.Busy = append(in.Busy, Busy{GPU: slices.Index(gpus, rn.gpu), Mask: m, Until: until})
	}
	_, sched, nodes, err := solve(&in, maxNodes, &cs.tie)
	s.plans.Nodes += nodes
	if errors.Is(err, ErrBudget) {
		s.plans.OverNodes++
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("window of %d requests: %w", len(reqs), err)
	}
	s.plans.Plans++
	for _, r := range reqs {
		s.unreserve(r.ID)
	}
	// Starts now first, so that no reservation stands in their way.
	for pass := 0; pass < 2; pass++ {
		for i, r := range reqs {
			sl := sched[i]
			if (sl.Time == 0) != (pass == 0) {
				continue
			}
			g, pl := gpus[sl.GPU], mig.Placement{Profile: in.Jobs[i].Profile, Start: sl.Start}
			if pass == 0 {
				a, err := s.commit(g, pl, r, now)
				if err != nil {
					return placed, true, fmt.Errorf("window plan: %w", err)
				}
				placed = append(placed, Placed{r, a})
				continue
			}
			s.reserve(r.ID, g, pl, now+time.Duration(sl.Time), r.Duration, s.LatestStart(r, now))
			rv := s.waiting[r.ID]
			rv.planned = true
			s.waiting[r.ID] = rv
		}
	}
	return placed, true, nil
}
