package main

import (
	"testing"
	"time"
)

func TestVersusA(t *testing.T) {
	a := row{path: path{id: "a"}, time: 2 * time.Second, memBytes: 1000}
	b := row{path: path{id: "b"}, time: 3 * time.Second, memBytes: 600}
	c := row{path: path{id: "c"}, time: 1 * time.Second, memBytes: 300}
	for _, tc := range []struct {
		name         string
		rows         []row // one app's rows, in run order
		last         row
		wantT, wantB string
	}{
		{"against (a)", []row{a, b}, c, "0.50×", "0.30×"},
		// -rows b,c: no (a) row, so no ratio to it; before, (b) stood in.
		{"no (a) row", []row{b}, c, "-", "-"},
		{"(a) itself", nil, a, "1.00×", "1.00×"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var base *row
			for _, r := range append(tc.rows, tc.last) {
				base = baseRow(base, r)
			}
			gotT, gotB := versusA(tc.last, base)
			if gotT != tc.wantT || gotB != tc.wantB {
				t.Errorf("versusA = %q, %q; want %q, %q", gotT, gotB, tc.wantT, tc.wantB)
			}
		})
	}
}
