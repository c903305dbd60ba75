package sched

import (
	"errors"
	"fmt"
	"math"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
)

// ErrBudget is returned when the exact solver runs out of its node budget.
var ErrBudget = errors.New("exact solver: node budget exhausted")

// Solve finds an optimal schedule of a small instance by branch and bound.
//
// It builds schedules in order of start time (ties by job index): the next
// job starts at its release or when a job already placed ends, never earlier
// than the previous start. Any schedule can be shifted left, job by job, until
// each job starts at its release or at the end of a job in its way that
// started earlier, without raising its cost (the cost only grows with finish
// times), so these "active" schedules contain an optimum. GPUs are identical,
// so a job opens only the lowest-numbered unused one. The bound is the cost so
// far plus the misses no start can avoid any more. maxNodes bounds the search
// (0: 50 million); the error then wraps ErrBudget.
//
// GPUs already open cost nothing to use; a job starts also when fixed
// occupancy (Instance.Busy) in its way ends, and the lowest-numbered unused
// GPU it may open is the first one after them.
func Solve(in *Instance, maxNodes int) (int, []Slot, error) {
	cost, sched, _, err := solve(in, maxNodes, nil)
	return cost, sched, err
}

// solve is Solve, also returning the nodes it searched. If frag is not nil
// (fragmentation per GPU state, fragTable), it tries a job's start slots
// least fragmenting first: the cost found is the same, but among optima the
// one found first, and kept, leaves GPUs less fragmented for the requests
// that have not arrived yet.
func solve(in *Instance, maxNodes int, frag *[numStates]float64) (int, []Slot, int, error) {
	if err := in.check(); err != nil {
		return 0, nil, 0, err
	}
	if maxNodes <= 0 {
		maxNodes = 50_000_000
	}
	n := len(in.Jobs)
	b := &bnb{in: in, best: math.MaxInt, cur: make([]Slot, n), placed: make([]bool, n), maxNodes: maxNodes, frag: frag}
	b.mask = make([][]uint8, n)
	b.size = make([]int, n)
	for i, j := range in.Jobs {
		p := in.Card.Profiles[j.Profile]
		b.size[i] = p.MemSlices
		for _, s := range p.Starts {
			b.mask[i] = append(b.mask[i], p.Mask(s))
		}
	}
	width := n + len(in.Busy)
	b.times = make([]int, (n+1)*width)
	b.width = width
	b.search(0, 0, -1, in.Open, 0)
	if b.nodes > maxNodes {
		return 0, nil, b.nodes, fmt.Errorf("%d jobs, %d GPUs: %w", n, in.GPUs, ErrBudget)
	}
	if b.bestSched == nil {
		return 0, nil, b.nodes, fmt.Errorf("exact solver: no schedule found")
	}
	return b.best, b.bestSched, b.nodes, nil
}

type bnb struct {
	in        *Instance
	best      int
	bestSched []Slot
	cur       []Slot
	placed    []bool
	mask      [][]uint8 // per job, per start index
	size      []int
	nodes     int
	maxNodes  int
	times     []int // candidate start times, width per depth
	width     int
	frag      *[numStates]float64
}

// order returns job i's start indices on GPU g at time t, least fragmenting
// first when b.frag is set (slot order otherwise).
func (b *bnb) order(i, g, t int, out *[mig.MemorySlices]int) []int {
	ms := b.mask[i]
	o := out[:len(ms)]
	for k := range o {
		o[k] = k
	}
	if b.frag == nil || len(o) < 2 {
		return o
	}
	var occ uint8 // slices of g taken at t
	for k, a := range b.cur {
		if b.placed[k] && a.GPU == g && a.Time <= t && t < a.Time+b.in.Jobs[k].Duration {
			occ |= b.mask[k][a.Start]
		}
	}
	for _, bz := range b.in.Busy {
		if bz.GPU == g && t < bz.Until {
			occ |= bz.Mask
		}
	}
	f := func(k int) float64 { return b.frag[occ|ms[k]] }
	for x := 1; x < len(o); x++ {
		for y := x; y > 0 && f(o[y]) < f(o[y-1])-1e-9; y-- {
			o[y], o[y-1] = o[y-1], o[y]
		}
	}
	return o
}

// free reports whether job i fits on GPU g at start index si from time t.
func (b *bnb) free(i, g, si, t int) bool {
	m := b.mask[i][si]
	end := t + b.in.Jobs[i].Duration
	for k, a := range b.cur {
		if !b.placed[k] || a.GPU != g {
			continue
		}
		if b.mask[k][a.Start]&m != 0 && t < a.Time+b.in.Jobs[k].Duration && a.Time < end {
			return false
		}
	}
	for _, bz := range b.in.Busy {
		if bz.GPU == g && bz.Mask&m != 0 && t < bz.Until {
			return false
		}
	}
	return true
}

func (b *bnb) search(depth, lastT, lastJob, used, cost int) {
	b.nodes++
	if b.nodes > b.maxNodes {
		return
	}
	in := b.in
	n := len(in.Jobs)
	if depth == n {
		if cost < b.best {
			b.best = cost
			b.bestSched = make([]Slot, n)
			for i, a := range b.cur {
				p := in.Card.Profiles[in.Jobs[i].Profile]
				b.bestSched[i] = Slot{GPU: a.GPU, Start: p.Starts[a.Start], Time: a.Time}
			}
		}
		return
	}
	// Bound: misses that are certain now.
	bound := cost
	for i, j := range in.Jobs {
		if !b.placed[i] && max(j.Release, lastT)+j.Duration > j.Deadline {
			bound += in.Weights.MissPerSlice * b.size[i]
		}
	}
	if bound >= b.best {
		return
	}
	// Candidate start times: releases and ends, not before lastT.
	times := b.times[depth*b.width : (depth+1)*b.width]
	nt := 0
	add := func(t int) {
		if t < lastT {
			return
		}
		for k := 0; k < nt; k++ {
			if times[k] == t {
				return
			}
		}
		times[nt] = t
		nt++
	}
	for _, bz := range in.Busy {
		add(bz.Until)
	}
	for i, j := range in.Jobs {
		if !b.placed[i] {
			add(j.Release)
		} else {
			add(b.cur[i].Time + j.Duration)
		}
	}
	// Earliest times first: they tend to give cheap schedules early.
	for x := 1; x < nt; x++ {
		for y := x; y > 0 && times[y] < times[y-1]; y-- {
			times[y], times[y-1] = times[y-1], times[y]
		}
	}
	for ti := 0; ti < nt; ti++ {
		t := times[ti]
		for i, j := range in.Jobs {
			if b.placed[i] || t < j.Release || (t == lastT && i < lastJob) {
				continue
			}
			miss := 0
			if t+j.Duration > j.Deadline {
				miss = in.Weights.MissPerSlice * b.size[i]
			}
			for g := 0; g <= used && g < in.GPUs; g++ {
				open := 0
				if g == used { // used ≥ in.Open: a GPU not open yet
					open = in.Weights.GPU
				}
				if cost+miss+open >= b.best {
					continue
				}
				var buf [mig.MemorySlices]int
				for _, si := range b.order(i, g, t, &buf) {
					if !b.free(i, g, si, t) {
						continue
					}
					b.placed[i] = true
					b.cur[i] = Slot{GPU: g, Start: si, Time: t}
					nu := used
					if g == used {
						nu++
					}
					b.search(depth+1, t, i, nu, cost+miss+open)
					b.placed[i] = false
				}
			}
		}
	}
}
