package main

import (
	"testing"
)

func TestHistoStats(t *testing.T) {
	for _, tc := range []struct {
		rates       []float64
		lo, med, hi float64
	}{
		{[]float64{3, 1, 2}, 1, 2, 3},
		// An even count's median is the mean of the middle two.
		{[]float64{4, 1, 3, 2}, 1, 2.5, 4},
		{[]float64{5, 7}, 5, 6, 7},
		{[]float64{9}, 9, 9, 9},
	} {
		lo, med, hi := histoRow{rates: tc.rates}.stats()
		if lo != tc.lo || med != tc.med || hi != tc.hi {
			t.Errorf("%v: %v %v %v, want %v %v %v", tc.rates, lo, med, hi, tc.lo, tc.med, tc.hi)
		}
	}
}
