package main

import (
	"slices"
	"strings"
	"testing"
)

func TestGapColumns(t *testing.T) {
	for _, tc := range []struct {
		name string
		gaps []float64
		want string // mean, median, p90, max, optimal
	}{
		// 1..10 %: the median of an even count is the mean of the middle two
		// (5.5 %), p90 the 9th smallest by nearest rank (9 %), not the 10th.
		{"ten", []float64{.10, .09, .08, .07, .06, .05, .04, .03, .02, .01}, "5.5%\t5.5%\t9.0%\t10.0%\t0.0%"},
		{"odd", []float64{0, .02, .01}, "1.0%\t1.0%\t2.0%\t2.0%\t33.3%"},
		{"one", []float64{.04}, "4.0%\t4.0%\t4.0%\t4.0%\t0.0%"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := gapColumns(tc.gaps); got != tc.want {
				t.Errorf("gapColumns = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestNearestRank(t *testing.T) {
	var xs []int64
	for i := int64(100); i >= 1; i-- {
		xs = append(xs, i)
	}
	slices.Sort(xs)
	for _, tc := range []struct {
		pct  int
		want int64
	}{{50, 50}, {90, 90}, {99, 99}, {100, 100}, {1, 1}} {
		if got := nearestRank(xs, tc.pct); got != tc.want {
			t.Errorf("p%d of 1..100 = %d, want %d", tc.pct, got, tc.want)
		}
	}
}

// The heuristic below the exact optimum is the bug detector of issue 14's
// tests: the bench fails the run on it rather than print a count.
func TestBelowOptimum(t *testing.T) {
	if err := belowOptimum("window", []string{"firstfit", "lovelock"}, []int{0, 0}); err != nil {
		t.Errorf("no bug: %v", err)
	}
	err := belowOptimum("window", []string{"firstfit", "lovelock"}, []int{0, 2})
	if err == nil || !strings.Contains(err.Error(), "lovelock") || !strings.Contains(err.Error(), "2 instances") {
		t.Errorf("2 instances below the optimum: %v", err)
	}
}
