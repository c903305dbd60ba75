package sched

import (
	"math/bits"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
)

// This file holds the policies' choices of GPU and start slot; each scores
// GPU states (see index.go), not GPUs.

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
		d := cs.tie[nw] - cs.tie[state]
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
