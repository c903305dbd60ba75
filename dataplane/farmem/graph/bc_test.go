package graph

import (
	"context"
	"fmt"
	"math"
	"testing"
)

// TestBCManyLevels: on a chain of layers two vertices wide, each joined to
// both of the next, the number of shortest paths doubles per level, 2^1099
// at the last of 1100: past float64's range. Before, the counts became +Inf
// after about 1024 levels and the dependencies Inf/Inf = NaN (or 0 at the
// boundary); now each vertex of layer k gets exactly L−k from the source
// above layer 1, whatever the workers and mode.
func TestBCManyLevels(t *testing.T) {
	const layers = 1100
	n := uint64(1 + 2*layers) // vertex 0, then layer k's 2k−1 and 2k
	edges := []Edge{{0, 1}, {0, 2}}
	for k := uint32(1); k < layers; k++ {
		for _, a := range []uint32{2*k - 1, 2 * k} {
			edges = append(edges, Edge{a, 2*k + 1}, Edge{a, 2*k + 2})
		}
	}
	want := make([]float64, n)
	for v := uint64(1); v < n; v++ {
		want[v] = float64(layers - (v+1)/2)
	}
	for _, sym := range []bool{true, false} {
		g, _ := build(t, n, edges, sym)
		for _, o := range engineConfigs {
			t.Run(fmt.Sprintf("symmetric=%t/workers=%d,mode=%d", sym, o.Workers, o.Mode), func(t *testing.T) {
				bc, err := RunBC(context.Background(), NewEngine(g, o), []uint32{0})
				if err != nil {
					t.Fatal(err)
				}
				for v, x := range bc {
					if math.IsNaN(x) || math.IsInf(x, 0) {
						t.Fatalf("vertex %d (layer %d): BC %g, want %g", v, (v+1)/2, x, want[v])
					}
				}
				if err := Compare(Result{App: BC, Floats: bc}, Result{App: BC, Floats: want}, DefaultTolerance); err != nil {
					t.Error(err)
				}
			})
		}
	}
}
