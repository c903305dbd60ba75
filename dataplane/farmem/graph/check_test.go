package graph

import (
	"math"
	"testing"
)

// TestCompareNotVacuous: one non-finite score, or a tolerance that is not a
// finite number ≥ 0, must not make every other score pass. Before, a NaN
// (or an Inf) in the reference made the mean of |want| NaN (Inf), so every
// vertex's allowance was NaN (Inf) and scores 5 against 1 passed; a NaN
// tolerance passed anything.
func TestCompareNotVacuous(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	for _, tc := range []struct {
		name      string
		got, want []float64
		tol       float64
		ok        bool
	}{
		{"equal", []float64{0.25, 0.5}, []float64{0.25, 0.5}, DefaultTolerance, true},
		{"within tolerance", []float64{1 + 1e-12, 2}, []float64{1, 2}, DefaultTolerance, true},
		{"beyond tolerance", []float64{1.1, 2}, []float64{1, 2}, DefaultTolerance, false},
		{"NaN in both, the rest differs", []float64{nan, 5}, []float64{nan, 1}, DefaultTolerance, false},
		{"Inf in both, the rest differs", []float64{inf, 5}, []float64{inf, 1}, DefaultTolerance, false},
		{"NaN in both, the rest equal", []float64{nan, 1}, []float64{nan, 1}, DefaultTolerance, true},
		{"Inf in both, the rest equal", []float64{inf, 1}, []float64{inf, 1}, DefaultTolerance, true},
		{"Inf against -Inf", []float64{inf, 1}, []float64{-inf, 1}, DefaultTolerance, false},
		{"Inf against a number", []float64{inf, 1}, []float64{3, 1}, DefaultTolerance, false},
		{"NaN tolerance", []float64{5}, []float64{1}, nan, false},
		{"negative tolerance", []float64{1}, []float64{1}, -1, false},
		{"infinite tolerance", []float64{5}, []float64{1}, inf, false},
	} {
		err := Compare(Result{App: BC, Floats: tc.got}, Result{App: BC, Floats: tc.want}, tc.tol)
		if (err == nil) != tc.ok {
			t.Errorf("%s: Compare(%v, %v, %g) = %v, want ok %t", tc.name, tc.got, tc.want, tc.tol, err, tc.ok)
		}
	}
}
