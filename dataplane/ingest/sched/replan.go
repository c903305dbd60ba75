package sched

import (
	"fmt"
	"slices"
)

// Replan schedules the instance online with the exact solver, knowing only
// the jobs released so far: at each release time it solves, optimally, the
// jobs released and not yet started against the work already started (as
// Instance.Open and Busy), and commits the starts the plan makes before the
// next release time; the rest are planned again then. Each step is optimal
// for what has arrived, so what it misses of the optimum it misses for not
// knowing what arrives next (another online policy may guess better on some
// instances and worse on others: TestGapLossesNeedTheFuture shows a choice
// no online policy gets right on both of two futures). bench-sched sets it
// beside Lovelock to split Lovelock's gap.
func (in *Instance) Replan() (int, []Slot, error) {
	if err := in.check(); err != nil {
		return 0, nil, err
	}
	if in.Open > 0 || len(in.Busy) > 0 {
		return 0, nil, fmt.Errorf("replan: instances with running work are not supported")
	}
	n := len(in.Jobs)
	sched := make([]Slot, n)
	started := make([]bool, n)
	var times []int
	for _, j := range in.Jobs {
		times = append(times, j.Release)
	}
	slices.Sort(times)
	times = slices.Compact(times)
	used := 0 // GPUs opened so far: the solver opens the lowest-numbered first
	for ti, t := range times {
		next := -1
		if ti+1 < len(times) {
			next = times[ti+1]
		}
		sub := Instance{Card: in.Card, GPUs: in.GPUs, Weights: in.Weights, Open: used}
		var idx []int
		for i, j := range in.Jobs {
			switch {
			case started[i]:
				if end := sched[i].Time + j.Duration; end > t {
					m := in.Card.Profiles[j.Profile].Mask(sched[i].Start)
					sub.Busy = append(sub.Busy, Busy{GPU: sched[i].GPU, Mask: m, Until: end - t})
				}
			case j.Release <= t:
				idx = append(idx, i)
				sub.Jobs = append(sub.Jobs, Job{Profile: j.Profile, Duration: j.Duration, Deadline: j.Deadline - t})
			}
		}
		if len(idx) == 0 {
			continue
		}
		_, plan, err := Solve(&sub, 0)
		if err != nil {
			return 0, nil, fmt.Errorf("replan at %d: %w", t, err)
		}
		for k, i := range idx {
			if p := plan[k]; next < 0 || t+p.Time < next {
				sched[i] = Slot{GPU: p.GPU, Start: p.Start, Time: t + p.Time}
				started[i] = true
				used = max(used, p.GPU+1)
			}
		}
	}
	cost, err := in.Cost(sched)
	return cost, sched, err
}
