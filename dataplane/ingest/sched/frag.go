package sched

import (
	"math/bits"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
)

// fragTable returns, for every state, the fragmentation of a GPU in it: the
// expected number of free memory slices that a request drawn from mix cannot
// use, FGD's measure (Weng et al., ATC '23) with MIG slots in place of GPU
// shares. A free slice is unusable by profile k if no start of k that is free
// now covers it, so a lone free slice 7 is a fragment for every profile but
// 3g@4 and 7g, which do not fit either.
func fragTable(c *mig.Card, mix []float64) [numStates]float64 {
	var t [numStates]float64
	for s := 0; s < numStates; s++ {
		used := uint8(s)
		free := ^used
		for k, w := range mix {
			if w == 0 || k >= len(c.Profiles) {
				continue
			}
			p := &c.Profiles[k]
			var cover uint8
			if !(s&meBit != 0 && p.Max == 1 && p.MemSlices == 1) {
				for _, st := range p.Starts {
					if m := p.Mask(st); m&used == 0 {
						cover |= m
					}
				}
			}
			t[s] += w * float64(bits.OnesCount8(free&^cover))
		}
	}
	return t
}

// strandedTable returns, for every state, its stranded memory slices: free
// slices that no profile the workload asks for (a mix weight of at least a
// quarter of the even share) can use, because every start of every such
// profile that covers the slice is taken. Unlike fragTable, which charges a
// slice to each profile that cannot use it, a slice some expected profile
// can still use costs nothing: on an H100 serving 1g, 2g and 3g requests, a
// 1g at slot 4 strands slice 7 (only 3g@4 reaches it) while a 1g at slot 0
// strands none, which fragTable rates alike. Ties are broken by fragTable,
// scaled below one slice: next is fragTable(c, mix).
func strandedTable(c *mig.Card, mix []float64, next *[numStates]float64) [numStates]float64 {
	n := 0
	for _, w := range mix {
		if w > 0 {
			n++
		}
	}
	var t [numStates]float64
	for s := 0; s < numStates; s++ {
		used := uint8(s)
		var cover uint8
		for k, w := range mix {
			if w == 0 || w < 0.25/float64(n) || k >= len(c.Profiles) {
				continue
			}
			p := &c.Profiles[k]
			if s&meBit != 0 && p.Max == 1 && p.MemSlices == 1 {
				continue
			}
			for _, st := range p.Starts {
				if m := p.Mask(st); m&used == 0 {
					cover |= m
				}
			}
		}
		t[s] = float64(bits.OnesCount8(^used&^cover)) + next[s]/16
	}
	return t
}

// fitTable returns, for every state, the free start slots of profile p.
func fitTable(c *mig.Card, p int) [numStates]uint8 {
	var t [numStates]uint8
	pr := &c.Profiles[p]
	me := pr.Max == 1 && pr.MemSlices == 1
	for s := 0; s < numStates; s++ {
		if me && s&meBit != 0 {
			continue
		}
		t[s] = mig.FreeStarts(pr, uint8(s))
	}
	return t
}

// uniformMix weighs every profile but the media-extension one alike.
func uniformMix(c *mig.Card) []float64 {
	mix := make([]float64, len(c.Profiles))
	for i, p := range c.Profiles {
		if !(p.Max == 1 && p.MemSlices == 1) {
			mix[i] = 1
		}
	}
	return normalise(mix)
}

func normalise(mix []float64) []float64 {
	var sum float64
	for _, w := range mix {
		sum += w
	}
	out := make([]float64, len(mix))
	for i, w := range mix {
		if sum > 0 {
			out[i] = w / sum
		}
	}
	return out
}
