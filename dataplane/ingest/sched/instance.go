package sched

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
)

// Instance is a small scheduling problem in whole time units: eq. 1 with the
// real MIG geometry. Every job must run once, on one GPU, in one instance of
// its profile at an allowed start slot, from a start time ≥ its release for
// its duration; instances on a GPU whose lifetimes overlap must not share
// memory slices. The cost is Weights.GPU per GPU used at all plus
// Weights.MissPerSlice per memory slice of every job finishing after its
// deadline.
//
// An instance can start from a fleet already at work, as the Dispatcher's
// windowed planner does: GPUs 0 to Open−1 are in use already (eq. 1 charged
// them when they were opened, so Cost does not charge them again) and Busy
// lists the memory slices their running instances hold from time 0.
type Instance struct {
	Card    mig.Card
	GPUs    int
	Jobs    []Job
	Weights Weights
	Open    int
	Busy    []Busy
}

// Busy is fixed occupancy: memory slices Mask of GPU GPU are taken from time
// 0 until Until (a running instance and when it is expected to end).
type Busy struct {
	GPU   int
	Mask  uint8
	Until int
}

// Job is one request of an Instance.
type Job struct {
	Profile  int // index into Card.Profiles; media-extension profiles are not supported
	Release  int
	Duration int // ≥ 1
	Deadline int
}

// Slot is where and when the solver runs a job.
type Slot struct {
	GPU, Start, Time int
}

// horizon bounds every start time worth considering: all jobs one after the
// other after the last release.
func (in *Instance) horizon() int {
	h := 0
	for _, j := range in.Jobs {
		h = max(h, j.Release)
	}
	for _, b := range in.Busy {
		h = max(h, b.Until)
	}
	for _, j := range in.Jobs {
		h += j.Duration
	}
	return h
}

func (in *Instance) check() error {
	if in.GPUs <= 0 || in.GPUs > 64 {
		return fmt.Errorf("instance: %d GPUs, want 1..64", in.GPUs)
	}
	if in.Open < 0 || in.Open > in.GPUs {
		return fmt.Errorf("instance: %d GPUs open of %d", in.Open, in.GPUs)
	}
	for k, b := range in.Busy {
		if b.GPU < 0 || b.GPU >= in.Open || b.Mask == 0 || b.Until < 1 {
			return fmt.Errorf("instance: busy %d: GPU %d, slices %08b until %d: want an open GPU, slices, until ≥ 1", k, b.GPU, b.Mask, b.Until)
		}
	}
	for i, j := range in.Jobs {
		if j.Profile < 0 || j.Profile >= len(in.Card.Profiles) {
			return fmt.Errorf("instance: job %d: profile %d: %w", i, j.Profile, mig.ErrNoProfile)
		}
		if p := in.Card.Profiles[j.Profile]; p.Max == 1 && p.MemSlices == 1 {
			return fmt.Errorf("instance: job %d: media-extension profile %s not supported by the exact solver", i, p.Name)
		}
		if j.Duration < 1 || j.Release < 0 {
			return fmt.Errorf("instance: job %d: duration %d, release %d: want duration ≥ 1, release ≥ 0", i, j.Duration, j.Release)
		}
	}
	return nil
}

// Cost returns the objective of a schedule (GPUs already open are not
// charged), and an error if it breaks a constraint. It is the one judge of the exact solver, CBC's answer and the
// heuristic.
func (in *Instance) Cost(sched []Slot) (int, error) {
	if len(sched) != len(in.Jobs) {
		return 0, fmt.Errorf("schedule has %d jobs, instance %d", len(sched), len(in.Jobs))
	}
	used := map[int]bool{}
	cost := 0
	for i, a := range sched {
		j := in.Jobs[i]
		p := in.Card.Profiles[j.Profile]
		if err := in.Card.Check(mig.Placement{Profile: j.Profile, Start: a.Start}, 0, nil); err != nil {
			return 0, fmt.Errorf("job %d: %w", i, err)
		}
		if a.GPU < 0 || a.GPU >= in.GPUs || a.Time < j.Release {
			return 0, fmt.Errorf("job %d: GPU %d time %d: outside the fleet or before release %d", i, a.GPU, a.Time, j.Release)
		}
		for k := 0; k < i; k++ {
			b, jk := sched[k], in.Jobs[k]
			if b.GPU == a.GPU && p.Mask(a.Start)&in.Card.Profiles[jk.Profile].Mask(b.Start) != 0 &&
				a.Time < b.Time+jk.Duration && b.Time < a.Time+j.Duration {
				return 0, fmt.Errorf("jobs %d and %d overlap on GPU %d", k, i, a.GPU)
			}
		}
		for _, b := range in.Busy {
			if b.GPU == a.GPU && p.Mask(a.Start)&b.Mask != 0 && a.Time < b.Until {
				return 0, fmt.Errorf("job %d overlaps running work on GPU %d until %d", i, a.GPU, b.Until)
			}
		}
		if a.GPU >= in.Open {
			used[a.GPU] = true
		}
		if a.Time+j.Duration > j.Deadline {
			cost += in.Weights.MissPerSlice * p.MemSlices
		}
	}
	return cost + in.Weights.GPU*len(used), nil
}

// Requests returns the jobs as requests, one time unit a second. A job due
// at 0 is due 1 ns before it: a Request's deadline 0 means none.
func (in *Instance) Requests() []Request {
	rs := make([]Request, len(in.Jobs))
	for i, j := range in.Jobs {
		rs[i] = Request{ID: uint64(i + 1), Profile: in.Card.Profiles[j.Profile].Name,
			Arrival: time.Duration(j.Release) * time.Second, Duration: time.Duration(j.Duration) * time.Second,
			Deadline: time.Duration(j.Deadline) * time.Second}
		if j.Deadline == 0 {
			rs[i].Deadline = -1
		}
	}
	return rs
}

// Heuristic runs the instance through the simulator with policy p and
// returns its schedule, checked and costed by Cost.
func (in *Instance) Heuristic(p Policy) (int, []Slot, error) {
	cost, sched, _, err := in.Run(Config{Policy: p}, SimOptions{})
	return cost, sched, err
}

// Run is Heuristic with a whole configuration (its fleet is the instance's)
// and simulator options; it also returns the simulator's result.
func (in *Instance) Run(cfg Config, opt SimOptions) (int, []Slot, Result, error) {
	p := cfg.Policy
	cfg.Fleet = []Fleet{{Card: in.Card.Name, Count: in.GPUs}}
	opt.Assignments, opt.Weights = true, in.Weights
	res, err := Simulate(cfg, in.Requests(), opt)
	if err != nil {
		return 0, nil, res, err
	}
	sched := make([]Slot, len(in.Jobs))
	for i := range in.Jobs {
		a, ok := res.Assignment[uint64(i+1)]
		if !ok {
			return 0, nil, res, fmt.Errorf("%s left job %d unplaced", p, i)
		}
		if p == Naive {
			return 0, nil, res, fmt.Errorf("naive changes the jobs' profiles; its schedule is not one of the instance")
		}
		sched[i] = Slot{GPU: a.GPU, Start: a.Placement.Start, Time: int(a.Start / time.Second)}
	}
	cost, err := in.Cost(sched)
	if err != nil {
		return 0, nil, res, fmt.Errorf("%s: infeasible schedule: %w", p, err)
	}
	return cost, sched, res, nil
}

// GenOptions shape random small instances.
type GenOptions struct {
	Card     string
	Jobs     int
	GPUs     int
	Releases int // releases uniform in [0, Releases]
	MaxDur   int // durations uniform in [1, MaxDur]
	MaxSlack int // deadline = release + duration + uniform [0, MaxSlack]
	// Open GPUs already run work (Instance.Open, Busy): up to three random
	// instances each, ending uniform in [1, MaxDur]. Drawn after the jobs,
	// so instances without are the same as before.
	Open int
}

// Generate returns a random instance, deterministic in rng.
func Generate(rng *rand.Rand, o GenOptions) (Instance, error) {
	c, err := mig.CardByName(o.Card)
	if err != nil {
		return Instance{}, err
	}
	in := Instance{Card: c, GPUs: o.GPUs, Weights: DefaultWeights()}
	var profs []int
	for i, p := range c.Profiles {
		if !(p.Max == 1 && p.MemSlices == 1) {
			profs = append(profs, i)
		}
	}
	for range o.Jobs {
		j := Job{Profile: profs[rng.IntN(len(profs))], Release: rng.IntN(o.Releases + 1), Duration: 1 + rng.IntN(o.MaxDur)}
		j.Deadline = j.Release + j.Duration + rng.IntN(o.MaxSlack+1)
		in.Jobs = append(in.Jobs, j)
	}
	in.Open = o.Open
	for g := range o.Open {
		gpu := mig.NewGPU(&in.Card)
		for range 1 + rng.IntN(3) {
			p := profs[rng.IntN(len(profs))]
			pr := in.Card.Profiles[p]
			st := pr.Starts[rng.IntN(len(pr.Starts))]
			if gpu.Place(mig.Placement{Profile: p, Start: st}) == nil {
				in.Busy = append(in.Busy, Busy{GPU: g, Mask: pr.Mask(st), Until: 1 + rng.IntN(o.MaxDur)})
			}
		}
		if gpu.Instances() == 0 { // an open GPU runs something
			pr := in.Card.Profiles[profs[0]]
			in.Busy = append(in.Busy, Busy{GPU: g, Mask: pr.Mask(pr.Starts[0]), Until: 1})
		}
	}
	return in, nil
}
