package agent

import "slices"

// ranges is the set of input bytes received, as sorted disjoint
// half-open intervals that never touch; fragments mostly arrive in order,
// so the set is mostly one interval that grows at its end.
//
// A client decides how many holes its fragments leave, so add finds its
// place by binary search and changes the set in place: a fragment costs
// O(log n) to find and at most one move of the intervals after it, never
// a copy of the whole set. The agent bounds n per request
// (maxInputIntervals).
type ranges [][2]int

// add inserts [lo, hi) and reports whether it added anything new. A
// fragment that overlaps what is there only partly counts as new; its
// bytes are the same bytes (a retransmission), so copying them again is
// harmless.
func (rs *ranges) add(lo, hi int) bool {
	s := *rs
	// i: the first interval that ends at or after lo (touching merges).
	i, _ := slices.BinarySearchFunc(s, lo, func(iv [2]int, lo int) int {
		if iv[1] < lo {
			return -1
		}
		return 1
	})
	if i < len(s) && s[i][0] <= lo && hi <= s[i][1] {
		return false
	}
	// j: the first interval after i that starts past hi.
	j, _ := slices.BinarySearchFunc(s[i:], hi, func(iv [2]int, hi int) int {
		if iv[0] <= hi {
			return -1
		}
		return 1
	})
	j += i
	if i == j {
		*rs = slices.Insert(s, i, [2]int{lo, hi})
		return true
	}
	s[i] = [2]int{min(lo, s[i][0]), max(hi, s[j-1][1])}
	*rs = slices.Delete(s, i+1, j)
	return true
}

// covers reports whether the set is exactly [0, n).
func (rs ranges) covers(n int) bool {
	return len(rs) == 1 && rs[0][0] == 0 && rs[0][1] == n
}
