package graph

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestValidateRefusesLies: Validate refuses a file that breaks what the
// format promises and the engine relies on: a file flagged symmetric whose
// edges are not (dense steps pull over the out-edges as if they were the
// in-edges, so BFS from 0 over 0→1→2 reached 1 and 2 in sparse mode and
// neither in dense), a transposed section whose in-degrees are right but
// whose neighbours are not, and neighbour lists that are unsorted, repeat
// a neighbour or hold a self loop. Before, Validate accepted all of them.
func TestValidateRefusesLies(t *testing.T) {
	csr := func(off []uint64, edges ...uint32) csrArrays { return csrArrays{off: off, edges: edges} }
	for _, tc := range []struct {
		name    string
		n       uint64
		sym     bool
		out, in csrArrays
		want    string
	}{
		{
			name: "symmetric flag on directed edges", n: 3, sym: true,
			out:  csr([]uint64{0, 1, 2, 2}, 1, 2), // 0→1, 1→2 and no way back
			want: "no edge back",
		},
		{
			name: "symmetric with one edge missing its reverse", n: 3, sym: true,
			out:  csr([]uint64{0, 1, 3, 3}, 1, 0, 2), // 0-1 both ways, 1→2 only
			want: "no edge back",
		},
		{
			name: "transpose with the right counts and the wrong neighbours", n: 4,
			out:  csr([]uint64{0, 1, 1, 2, 2}, 1, 3), // 0→1, 2→3
			in:   csr([]uint64{0, 0, 1, 1, 2}, 2, 0), // says 2→1, 0→3
			want: "not in the transposed section",
		},
		{
			name: "unsorted neighbours", n: 3, sym: true,
			out:  csr([]uint64{0, 2, 3, 4}, 2, 1, 0, 0),
			want: "not sorted",
		},
		{
			name: "duplicate neighbour", n: 2,
			out:  csr([]uint64{0, 2, 2}, 1, 1),
			in:   csr([]uint64{0, 0, 2}, 0, 0),
			want: "not sorted",
		},
		{
			name: "self loop", n: 2, sym: true,
			out:  csr([]uint64{0, 2, 3}, 0, 1, 0),
			want: "self loop",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.in
			if tc.sym {
				in = tc.out
			}
			g, err := Open(encode(tc.n, tc.sym, tc.out, in))
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			err = g.Validate()
			if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate: %v, want ErrFormat saying %q", err, tc.want)
			}
		})
	}
}

// TestValidateAcceptsBuilt: every file Build writes passes, including
// inputs with self loops, duplicates, isolated vertices and no edges.
func TestValidateAcceptsBuilt(t *testing.T) {
	n, rmat, _ := RMAT(9, 8, 5)
	for _, tc := range []struct {
		n     uint64
		edges []Edge
	}{
		{1, nil},
		{5, nil},
		{4, pairs(0, 0, 0, 1, 0, 1, 1, 0, 2, 2)},
		{n, rmat},
	} {
		for _, sym := range []bool{true, false} {
			build(t, tc.n, tc.edges, sym) // fails the test if Validate does
		}
	}
	// And the engine's answer on a validated file does not depend on the mode.
	g, _ := build(t, n, rmat, false)
	var depths [][]int32
	for _, m := range []Mode{Sparse, Dense} {
		d, err := RunBFS(context.Background(), NewEngine(g, Options{Workers: 2, Mode: m}), 0)
		if err != nil {
			t.Fatal(err)
		}
		depths = append(depths, d)
	}
	for v := range depths[0] {
		if depths[0][v] != depths[1][v] {
			t.Fatalf("vertex %d: depth %d sparse, %d dense", v, depths[0][v], depths[1][v])
		}
	}
}
