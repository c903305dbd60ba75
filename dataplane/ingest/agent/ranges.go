package agent

// ranges is the set of input bytes received, as sorted disjoint
// half-open intervals; fragments mostly arrive in order, so the set is
// mostly one interval that grows at its end.
type ranges [][2]int

// add inserts [lo, hi) and reports whether it added anything new. A
// fragment that overlaps what is there only partly counts as new; its
// bytes are the same bytes (a retransmission), so copying them again is
// harmless.
func (rs *ranges) add(lo, hi int) bool {
	s := *rs
	i := 0
	for i < len(s) && s[i][1] < lo {
		i++
	}
	if i < len(s) && s[i][0] <= lo && hi <= s[i][1] {
		return false
	}
	j := i
	for j < len(s) && s[j][0] <= hi {
		lo = min(lo, s[j][0])
		hi = max(hi, s[j][1])
		j++
	}
	out := append(s[:i:i], [2]int{lo, hi})
	out = append(out, s[j:]...)
	*rs = out
	return true
}

// covers reports whether the set is exactly [0, n).
func (rs ranges) covers(n int) bool {
	return len(rs) == 1 && rs[0][0] == 0 && rs[0][1] == n
}
