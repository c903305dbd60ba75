package client

import "slices"

// span is a half-open byte range [lo, hi).
type span struct{ lo, hi uint64 }

// spans is the set of byte ranges of an output received so far: sorted,
// disjoint, never touching. It does not assume that every answer is cut at
// the same offsets, so a DPU may re-fragment a result it sends again.
type spans struct {
	s       []span
	covered uint64
}

// add records [lo, hi) and returns how many of its bytes were new.
func (x *spans) add(lo, hi uint64) uint64 {
	if lo >= hi {
		return 0
	}
	i := 0
	for i < len(x.s) && x.s[i].hi < lo {
		i++
	}
	nlo, nhi, old := lo, hi, uint64(0)
	j := i
	for ; j < len(x.s) && x.s[j].lo <= hi; j++ {
		nlo, nhi = min(nlo, x.s[j].lo), max(nhi, x.s[j].hi)
		old += x.s[j].hi - x.s[j].lo
	}
	x.s = slices.Replace(x.s, i, j, span{nlo, nhi})
	added := (nhi - nlo) - old
	x.covered += added
	return added
}
