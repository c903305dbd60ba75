package mig

import (
	"errors"
	"testing"
)

// The layout counts are derived by hand, slot by slot, in docs/scheduling.md:
// f(p) counts the layouts of memory slices p..7 without a media-extension
// instance (f(8)=f(7)=1, f(6)=3, f(5)=6, f(4)=19, f(3)=38, f(2)=114,
// f(1)=228, f(0)=723 with the empty one), h(p) those with at most one
// (h(0)=2319). The slot structure is the same on every card.
func TestLayoutCounts(t *testing.T) {
	for _, c := range Cards() {
		t.Run(c.Name, func(t *testing.T) {
			all := c.Layouts()
			var noME, maximal, maximalNoME int
			seen := map[string]bool{}
			for _, l := range all {
				if err := c.Validate(l); err != nil {
					t.Fatalf("enumerated layout %s invalid: %v", c.Format(l), err)
				}
				key := c.Format(l)
				if seen[key] {
					t.Fatalf("layout %s enumerated twice", key)
				}
				seen[key] = true
				me := false
				for _, pl := range l {
					if c.Profiles[pl.Profile].Max == 1 && c.Profiles[pl.Profile].MemSlices == 1 {
						me = true
					}
				}
				if !me {
					noME++
				}
				if c.Maximal(l) {
					maximal++
					if !me {
						maximalNoME++
					}
				}
			}
			for _, tc := range []struct {
				what      string
				got, want int
			}{
				{"layouts", len(all), 2318},
				{"layouts without +me", noME, 722},
				{"maximal layouts", maximal, 239},
				{"maximal layouts without +me", maximalNoME, 78},
			} {
				if tc.got != tc.want {
					t.Errorf("%s: %d, want %d", tc.what, tc.got, tc.want)
				}
			}
		})
	}
}

// TestLayoutsBruteForce checks the enumeration against every subset of the
// placements of the profiles without +me that hold at most 4 instances.
func TestLayoutsBruteForce(t *testing.T) {
	c, err := CardByName("H100-80GB")
	if err != nil {
		t.Fatal(err)
	}
	var all []Placement
	for i, p := range c.Profiles {
		if i == 1 {
			continue // +me: counted in TestLayoutCounts
		}
		for _, s := range p.Starts {
			all = append(all, Placement{Profile: i, Start: s})
		}
	}
	// Count subsets of size 1..8 that validate, by recursion over the list.
	var count int
	var cur Layout
	var rec func(i int)
	rec = func(i int) {
		if i == len(all) {
			if len(cur) > 0 && c.Validate(cur) == nil {
				count++
			}
			return
		}
		rec(i + 1)
		cur = append(cur, all[i])
		if c.Validate(cur) == nil { // prune: a superset of an invalid set is invalid
			rec(i + 1)
		}
		cur = cur[:len(cur)-1]
	}
	rec(0)
	if count != 722 {
		t.Fatalf("brute force: %d layouts without +me, want 722", count)
	}
}

func TestMaxInstancesFollowFromGeometry(t *testing.T) {
	for _, c := range Cards() {
		most := make([]int, len(c.Profiles))
		for _, l := range c.Layouts() {
			n := make([]int, len(c.Profiles))
			for _, pl := range l {
				n[pl.Profile]++
			}
			for i := range n {
				most[i] = max(most[i], n[i])
			}
		}
		for i, p := range c.Profiles {
			if most[i] != p.Max {
				t.Errorf("%s %s: at most %d in any layout, table says %d", c.Name, p.Name, most[i], p.Max)
			}
		}
	}
}

func TestValidateRefusesWithReason(t *testing.T) {
	c, err := CardByName("H100-80GB")
	if err != nil {
		t.Fatal(err)
	}
	idx := func(name string) int {
		i, err := c.Profile(name)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	g1, me, g1x2, g2, g3, g4, g7 := idx("1g.10gb"), idx("1g.10gb+me"), idx("1g.20gb"), idx("2g.20gb"), idx("3g.40gb"), idx("4g.40gb"), idx("7g.80gb")
	for _, tc := range []struct {
		name string
		l    Layout
		want error
	}{
		{"3g+3g+1g: compute sums to 7 but memory is full", Layout{{g3, 0}, {g3, 4}, {g1, 6}}, ErrOverlap},
		{"3g+3g", Layout{{g3, 0}, {g3, 4}}, nil},
		{"4g+3g", Layout{{g4, 0}, {g3, 4}}, nil},
		{"4g+2g+1g", Layout{{g4, 0}, {g2, 4}, {g1, 6}}, nil},
		{"seven 1g", Layout{{g1, 0}, {g1, 1}, {g1, 2}, {g1, 3}, {g1, 4}, {g1, 5}, {g1, 6}}, nil},
		{"1g at slot 7", Layout{{g1, 7}}, ErrBadStart},
		{"2g at slot 6", Layout{{g2, 6}}, ErrBadStart},
		{"3g at slot 2", Layout{{g3, 2}}, ErrBadStart},
		{"4g at slot 4", Layout{{g4, 4}}, ErrBadStart},
		{"two +me", Layout{{me, 0}, {me, 1}}, ErrTooMany},
		{"1g.20gb at 6 beside 3g at 0", Layout{{g3, 0}, {g1x2, 6}, {g2, 4}}, nil},
		{"7g and anything", Layout{{g7, 0}, {g1, 6}}, ErrOverlap},
		{"unknown profile", Layout{{42, 0}}, ErrNoProfile},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.Validate(tc.l)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Validate(%v) = %v, want %v", tc.l, err, tc.want)
			}
			if err != nil && len(err.Error()) < 20 {
				t.Fatalf("reason too terse: %q", err)
			}
		})
	}
}
