package graph

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
)

// TestParamsRefused: parameters that cannot be run are refused with an
// error naming them. Before, Radii with -1 samples and BC with -2 sources
// panicked (a slice of a negative length: lovelock graph run --samples -1
// crashed), and -3 PageRank iterations or a damping of NaN or 2 ran and
// returned scores that were not PageRank, which the check then passed.
func TestParamsRefused(t *testing.T) {
	g, _ := build(t, 5, pairs(0, 1, 1, 2, 3, 4), true)
	for _, tc := range []struct {
		app  App
		p    Params
		want string
	}{
		{Radii, Params{Samples: -1}, "samples"},
		{Radii, Params{Samples: 65}, "65 Radii samples"}, // before: ran 64, reported as asked
		{BC, Params{BCSources: -2}, "BC sources"},
		{PageRank, Params{Iterations: -3}, "iterations"},
		{PageRank, Params{Damping: math.NaN()}, "damping"},
		{PageRank, Params{Damping: 2}, "damping"},
		{PageRank, Params{Damping: -0.5}, "damping"},
		{BFS, Params{Source: 5}, "source 5"},
	} {
		t.Run(fmt.Sprintf("%s/%+v", tc.app, tc.p), func(t *testing.T) {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("panicked: %v", r)
				}
			}()
			_, err := Run(context.Background(), NewEngine(g, Options{Workers: 2}), tc.app, tc.p)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Run: %v, want an error about %q", err, tc.want)
			}
		})
	}
	// The defaults and the edges of the ranges still run.
	for _, p := range []Params{{}, {Source: -1, Iterations: 1, Damping: 1, Samples: 64, BCSources: 100}} {
		for _, app := range Apps {
			if _, err := Run(context.Background(), NewEngine(g, Options{}), app, p); err != nil {
				t.Errorf("%s %+v: %v", app, p, err)
			}
		}
	}
}
