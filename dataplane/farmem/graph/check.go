package graph

import (
	"context"
	"fmt"
	"math"
	"time"
)

// DefaultTolerance is the relative tolerance Compare allows PageRank and BC
// (floating-point sums whose order may differ between sparse and dense
// steps); the integer apps must match exactly.
const DefaultTolerance = 1e-9

// Compare checks got against want, the same app run on another copy of the
// graph (an in-memory one, the reference): BFS depths, component labels
// and radii must be equal; a PageRank or BC score may differ from want's by
// tol × (|want| + the mean of the finite |want|), and a NaN or an infinity
// must be the same in both (a non-finite mean would make every allowance
// NaN or infinite, and every score pass).
func Compare(got, want Result, tol float64) error {
	if !(tol >= 0) || math.IsInf(tol, 0) {
		return fmt.Errorf("graph: tolerance %g: want a finite number ≥ 0", tol)
	}
	if got.App != want.App {
		return fmt.Errorf("graph: comparing %s with %s", got.App, want.App)
	}
	if len(got.Ints) != len(want.Ints) || len(got.Floats) != len(want.Floats) {
		return fmt.Errorf("%s: %d+%d values, want %d+%d", got.App, len(got.Ints), len(got.Floats), len(want.Ints), len(want.Floats))
	}
	diffs, first := 0, -1
	for i := range want.Ints {
		if got.Ints[i] != want.Ints[i] {
			if diffs++; first < 0 {
				first = i
			}
		}
	}
	if diffs > 0 {
		return fmt.Errorf("%s: %d vertices differ; vertex %d has %d, want %d", got.App, diffs, first, got.Ints[first], want.Ints[first])
	}
	mean, finite := 0.0, 0
	for _, x := range want.Floats {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			mean += math.Abs(x)
			finite++
		}
	}
	if finite > 0 {
		mean /= float64(finite)
	}
	worst := 0.0
	for i, w := range want.Floats {
		g := got.Floats[i]
		if nonFinite(g) || nonFinite(w) {
			if g != w && !(math.IsNaN(g) && math.IsNaN(w)) {
				return fmt.Errorf("%s: vertex %d has %g, want %g", got.App, i, g, w)
			}
			continue
		}
		d := math.Abs(g - w)
		if d > tol*(math.Abs(w)+mean) {
			if diffs++; first < 0 {
				first = i
			}
		}
		if mean > 0 {
			worst = max(worst, d/(math.Abs(w)+mean))
		}
	}
	if diffs > 0 {
		return fmt.Errorf("%s: %d vertices beyond tolerance %g; vertex %d has %.17g, want %.17g (worst relative error %.3g)",
			got.App, diffs, tol, first, got.Floats[first], want.Floats[first], worst)
	}
	return nil
}

func nonFinite(x float64) bool { return math.IsNaN(x) || math.IsInf(x, 0) }

// Summary describes a result in one line: BFS's reach and depth, the
// number of components and the largest, PageRank's and BC's top vertex,
// the largest radius.
func Summary(r Result) string {
	switch r.App {
	case BFS:
		reached, maxd := 0, int32(0)
		for _, d := range r.Ints {
			if d >= 0 {
				reached++
				maxd = max(maxd, d)
			}
		}
		return fmt.Sprintf("reached %d of %d vertices, depth %d", reached, len(r.Ints), maxd)
	case Components:
		size := map[int32]int{}
		for _, l := range r.Ints {
			size[l]++
		}
		largest := 0
		for _, s := range size {
			largest = max(largest, s)
		}
		return fmt.Sprintf("%d components, the largest with %d vertices", len(size), largest)
	case Radii:
		maxr, reached := int32(-1), 0
		for _, x := range r.Ints {
			if x >= 0 {
				reached++
			}
			maxr = max(maxr, x)
		}
		return fmt.Sprintf("largest radius %d, %d vertices reached by a sample", maxr, reached)
	case PageRank, BC:
		if len(r.Floats) == 0 {
			return "no vertices"
		}
		top := 0
		sum := 0.0
		for i, x := range r.Floats {
			sum += x
			if x > r.Floats[top] {
				top = i
			}
		}
		return fmt.Sprintf("top vertex %d (%.6g), sum %.6g", top, r.Floats[top], sum)
	}
	return ""
}

// Checked is an app's run on one copy of a graph (far memory), checked
// against the same app on another (in memory).
type Checked struct {
	Far, Local         Result
	FarTime, LocalTime time.Duration
	// Mismatch is nil when the runs agree (Compare), else the difference.
	Mismatch error
}

// RunChecked runs app on far, then on local, with the same parameters and
// engine options, and compares the results with tol. An error means a run
// failed; a disagreement is reported in Checked.Mismatch.
func RunChecked(ctx context.Context, far, local *Graph, app App, p Params, o Options, tol float64) (Checked, error) {
	var c Checked
	var err error
	start := time.Now()
	if c.Far, err = Run(ctx, NewEngine(far, o), app, p); err != nil {
		return c, fmt.Errorf("%s over far memory: %w", app, err)
	}
	c.FarTime = time.Since(start)
	start = time.Now()
	o.Hints = nil // the local copy's reads need no far cache
	if c.Local, err = Run(ctx, NewEngine(local, o), app, p); err != nil {
		return c, fmt.Errorf("%s in memory: %w", app, err)
	}
	c.LocalTime = time.Since(start)
	c.Mismatch = Compare(c.Far, c.Local, tol)
	return c, nil
}
