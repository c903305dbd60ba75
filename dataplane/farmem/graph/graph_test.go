package graph

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// fixture is a small graph with answers known by hand or from the
// literature.
type fixture struct {
	name      string
	n         uint64
	edges     []Edge
	symmetric bool
	bfsSource int64
	bfs       []int32   // depths from bfsSource
	cc        []int32   // smallest ID per component
	radii     []int32   // eccentricities (every vertex a sample)
	bc        []float64 // Brandes' sum over all sources (undirected: each path from both ends)
	pagerank  []float64 // where known exactly
}

func pairs(p ...uint32) []Edge {
	var out []Edge
	for i := 0; i+1 < len(p); i += 2 {
		out = append(out, Edge{p[i], p[i+1]})
	}
	return out
}

// karate is Zachary's karate club (Zachary 1977), 34 members and 78
// friendships, 0-indexed as in networkx's karate_club_graph.
var karate = func() []Edge {
	adj := [][]uint32{
		0:  {1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 17, 19, 21, 31},
		1:  {2, 3, 7, 13, 17, 19, 21, 30},
		2:  {3, 7, 8, 9, 13, 27, 28, 32},
		3:  {7, 12, 13},
		4:  {6, 10},
		5:  {6, 10, 16},
		6:  {16},
		8:  {30, 32, 33},
		9:  {33},
		13: {33},
		14: {32, 33},
		15: {32, 33},
		18: {32, 33},
		19: {33},
		20: {32, 33},
		22: {32, 33},
		23: {25, 27, 29, 32, 33},
		24: {25, 27, 31},
		25: {31},
		26: {29, 33},
		27: {33},
		28: {31, 33},
		29: {32, 33},
		30: {32, 33},
		31: {32, 33},
		32: {33},
		33: nil,
	}
	var out []Edge
	for u, ns := range adj {
		for _, v := range ns {
			out = append(out, Edge{uint32(u), v})
		}
	}
	return out
}()

var fixtures = []fixture{
	{
		name: "path of 5", n: 5, edges: pairs(0, 1, 1, 2, 2, 3, 3, 4), symmetric: true,
		bfs: []int32{0, 1, 2, 3, 4}, cc: []int32{0, 0, 0, 0, 0}, radii: []int32{4, 3, 2, 3, 4},
		// vertex k lies on k × (4-k) pairs' only path, counted from both ends
		bc: []float64{0, 6, 8, 6, 0},
	},
	{
		name: "star of 6", n: 6, edges: pairs(0, 1, 0, 2, 0, 3, 0, 4, 0, 5), symmetric: true,
		bfs: []int32{0, 1, 1, 1, 1, 1}, cc: []int32{0, 0, 0, 0, 0, 0}, radii: []int32{1, 2, 2, 2, 2, 2},
		bc: []float64{20, 0, 0, 0, 0, 0}, // C(5,2) leaf pairs through the centre, twice
	},
	{
		name: "cycle of 6", n: 6, edges: pairs(0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 0), symmetric: true,
		bfs: []int32{0, 1, 2, 3, 2, 1}, cc: []int32{0, 0, 0, 0, 0, 0}, radii: []int32{3, 3, 3, 3, 3, 3},
		bc:       []float64{4, 4, 4, 4, 4, 4}, // 1 + ½ + ½ per vertex, twice
		pagerank: []float64{1. / 6, 1. / 6, 1. / 6, 1. / 6, 1. / 6, 1. / 6},
	},
	{
		name: "two components and an isolated vertex", n: 6, edges: pairs(1, 0, 2, 1, 4, 3), symmetric: true,
		bfs: []int32{0, 1, 2, -1, -1, -1}, cc: []int32{0, 0, 0, 3, 3, 5}, radii: []int32{2, 1, 2, 1, 1, 0},
		bc: []float64{0, 2, 0, 0, 0, 0},
	},
	{
		name: "directed cycle of 4", n: 4, edges: pairs(0, 1, 1, 2, 2, 3, 3, 0),
		bfs:      []int32{0, 1, 2, 3},
		pagerank: []float64{0.25, 0.25, 0.25, 0.25},
		bc:       []float64{3, 3, 3, 3}, // vertex 1 is inside 0→2, 0→3 and 3→2
	},
	{name: "karate club", n: 34, edges: karate, symmetric: true, bfsSource: 0},
}

func allVertices(n uint64) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(i)
	}
	return out
}

func build(t testing.TB, n uint64, edges []Edge, symmetric bool) (*Graph, []byte) {
	t.Helper()
	b, err := Build(n, edges, symmetric)
	if err != nil {
		t.Fatal(err)
	}
	g, err := Open(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Validate(); err != nil {
		t.Fatal(err)
	}
	return g, b
}

var engineConfigs = []Options{
	{Workers: 1},
	{Workers: 4},
	{Workers: 3, Mode: Sparse},
	{Workers: 3, Mode: Dense},
}

func TestFixtures(t *testing.T) {
	ctx := context.Background()
	for _, f := range fixtures {
		g, _ := build(t, f.n, f.edges, f.symmetric)
		ref := newRef(f.n, f.edges, f.symmetric)
		for _, o := range engineConfigs {
			t.Run(fmt.Sprintf("%s/workers=%d,mode=%d", f.name, o.Workers, o.Mode), func(t *testing.T) {
				e := NewEngine(g, o)
				depth, err := RunBFS(ctx, e, uint32(f.bfsSource))
				if err != nil {
					t.Fatal(err)
				}
				if f.bfs != nil && !slices.Equal(depth, f.bfs) {
					t.Errorf("BFS depths %v, want %v", depth, f.bfs)
				}
				if want := ref.bfs(uint32(f.bfsSource)); !slices.Equal(depth, want) {
					t.Errorf("BFS depths %v, reference %v", depth, want)
				}
				pr, err := RunPageRank(ctx, e, 20, 0.85)
				if err != nil {
					t.Fatal(err)
				}
				for v, want := range f.pagerank {
					if !near(pr[v], want, 1e-12) {
						t.Errorf("PageRank of %d is %g, want %g", v, pr[v], want)
					}
				}
				if err := Compare(Result{App: PageRank, Floats: pr}, Result{App: PageRank, Floats: ref.pagerank(20, 0.85)}, 1e-12); err != nil {
					t.Error(err)
				}
				bc, err := RunBC(ctx, e, allVertices(f.n))
				if err != nil {
					t.Fatal(err)
				}
				for v, want := range f.bc {
					if !near(bc[v], want, 1e-12) {
						t.Errorf("BC of %d is %g, want %g", v, bc[v], want)
					}
				}
				if err := Compare(Result{App: BC, Floats: bc}, Result{App: BC, Floats: ref.bc(allVertices(f.n))}, 1e-12); err != nil {
					t.Error(err)
				}
				if !f.symmetric {
					if _, err := RunComponents(ctx, e); !errors.Is(err, ErrNotSymmetric) {
						t.Errorf("components of a directed graph: %v, want ErrNotSymmetric", err)
					}
					return
				}
				cc, err := RunComponents(ctx, e)
				if err != nil {
					t.Fatal(err)
				}
				if f.cc != nil && !slices.Equal(cc, f.cc) {
					t.Errorf("components %v, want %v", cc, f.cc)
				}
				if want := ref.cc(); !slices.Equal(cc, want) {
					t.Errorf("components %v, reference %v", cc, want)
				}
				samples := allVertices(min(f.n, 64))
				radii, err := RunRadii(ctx, e, samples)
				if err != nil {
					t.Fatal(err)
				}
				if f.radii != nil && !slices.Equal(radii, f.radii) {
					t.Errorf("radii %v, want %v", radii, f.radii)
				}
				if want := ref.radii(samples); !slices.Equal(radii, want) {
					t.Errorf("radii %v, reference %v", radii, want)
				}
			})
		}
	}
}

// TestKarate checks what the literature says of Zachary's karate club: 78
// edges, degrees 16 and 17 for the instructor (0) and the president (33),
// one component, diameter 5, and the normalised betweenness centralities
// networkx reports (BC / ((n-1)(n-2)) of the sum over all sources).
func TestKarate(t *testing.T) {
	ctx := context.Background()
	g, _ := build(t, 34, karate, true)
	if g.M() != 2*78 {
		t.Fatalf("%d directed edges, want 156", g.M())
	}
	if g.OutDegree(0) != 16 || g.OutDegree(33) != 17 {
		t.Errorf("degrees %d and %d, want 16 and 17", g.OutDegree(0), g.OutDegree(33))
	}
	e := NewEngine(g, Options{Workers: 2})
	cc, err := RunComponents(ctx, e)
	if err != nil {
		t.Fatal(err)
	}
	for v, l := range cc {
		if l != 0 {
			t.Fatalf("vertex %d in component %d: the club is one component", v, l)
		}
	}
	radii, err := RunRadii(ctx, e, allVertices(34)[:34])
	if err != nil {
		t.Fatal(err)
	}
	if d := slices.Max(radii); d != 5 {
		t.Errorf("diameter %d, want 5", d)
	}
	bc, err := RunBC(ctx, e, allVertices(34))
	if err != nil {
		t.Fatal(err)
	}
	norm := 1.0 / (33 * 32)
	for v, want := range map[int]float64{0: 0.43763528, 33: 0.30407497, 32: 0.14524711, 2: 0.14365680, 31: 0.13827561} {
		if got := bc[v] * norm; !near(got, want, 1e-6) {
			t.Errorf("normalised BC of %d is %.8f, want %.8f", v, got, want)
		}
	}
}

// TestGenerated runs every app on R-MAT graphs, directed and undirected,
// in every engine configuration, against the sequential references.
func TestGenerated(t *testing.T) {
	ctx := context.Background()
	for _, symmetric := range []bool{true, false} {
		n, edges, err := RMAT(10, 8, 42)
		if err != nil {
			t.Fatal(err)
		}
		g, _ := build(t, n, edges, symmetric)
		ref := newRef(n, edges, symmetric)
		p := Params{Source: -1, Samples: 16, BCSources: 3, Seed: 7}
		for _, app := range Apps {
			if !symmetric && (app == Components || app == Radii) {
				continue
			}
			want := ref.run(g, app, p)
			for _, o := range engineConfigs {
				t.Run(fmt.Sprintf("sym=%t/%s/workers=%d,mode=%d", symmetric, app, o.Workers, o.Mode), func(t *testing.T) {
					got, err := Run(ctx, NewEngine(g, o), app, p)
					if err != nil {
						t.Fatal(err)
					}
					if err := Compare(got, want, DefaultTolerance); err != nil {
						t.Error(err)
					}
					if o.Mode == Auto && app != PageRank && (got.DenseSteps == 0 || got.SparseSteps == 0) {
						t.Logf("%s: %d dense and %d sparse steps", app, got.DenseSteps, got.SparseSteps)
					}
					t.Logf("%s", Summary(got))
				})
			}
		}
	}
}

// TestAutoUsesBothModes checks that Ligra's switch happens: a BFS on a
// power-law graph starts sparse and goes dense when the frontier grows.
func TestAutoUsesBothModes(t *testing.T) {
	n, edges, _ := RMAT(12, 16, 1)
	g, _ := build(t, n, edges, true)
	r, err := Run(context.Background(), NewEngine(g, Options{Workers: 2}), BFS, Params{Source: -1})
	if err != nil {
		t.Fatal(err)
	}
	if r.DenseSteps == 0 || r.SparseSteps == 0 {
		t.Errorf("BFS took %d dense and %d sparse steps, want both", r.DenseSteps, r.SparseSteps)
	}
}

func TestFormat(t *testing.T) {
	n, edges, _ := RMAT(6, 4, 3)
	for _, sym := range []bool{true, false} {
		g, b := build(t, n, edges, sym)
		if g.N() != int(n) || g.Symmetric() != sym {
			t.Fatalf("n %d symmetric %t, want %d %t", g.N(), g.Symmetric(), n, sym)
		}
		if uint64(len(b)) != FileSize(n, g.M(), sym) {
			t.Errorf("%d bytes, want %d", len(b), FileSize(n, g.M(), sym))
		}
		// Every edge of the reference is there, sorted, once.
		ref := newRef(n, edges, sym)
		for v := range uint32(n) {
			var got []uint32
			for i := g.out.offset(v); i < g.out.offset(v+1); i++ {
				got = append(got, g.out.neighbor(i))
			}
			if !slices.Equal(got, ref.out[v]) && !(len(got) == 0 && len(ref.out[v]) == 0) {
				t.Fatalf("vertex %d: out-neighbours %v, want %v", v, got, ref.out[v])
			}
		}
	}
	_, b := build(t, n, edges, true)
	bad := func(name string, mutate func([]byte) []byte, wantOpen bool) {
		t.Run(name, func(t *testing.T) {
			c := mutate(bytes.Clone(b))
			g, err := Open(c)
			if !wantOpen {
				if !errors.Is(err, ErrFormat) {
					t.Fatalf("Open: %v, want ErrFormat", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			if err := g.Validate(); !errors.Is(err, ErrFormat) {
				t.Errorf("Validate: %v, want ErrFormat", err)
			}
			// The engine meets the bad bytes: the app ends with an error.
			_, err = Run(context.Background(), NewEngine(g, Options{Workers: 2}), Components, Params{})
			if !errors.Is(err, ErrFormat) {
				t.Errorf("components over a corrupt graph: %v, want ErrFormat", err)
			}
		})
	}
	bad("magic", func(c []byte) []byte { c[0] = 'X'; return c }, false)
	bad("version", func(c []byte) []byte { c[8] = 9; return c }, false)
	bad("truncated", func(c []byte) []byte { return c[:len(c)-8] }, false)
	bad("short", func(c []byte) []byte { return c[:10] }, false)
	bad("neighbour out of range", func(c []byte) []byte {
		at := HeaderSize + 8*(n+1) + 4*3
		c[at], c[at+1], c[at+2], c[at+3] = 0xff, 0xff, 0xff, 0x7f
		return c
	}, true)
	bad("offsets decrease", func(c []byte) []byte {
		at := HeaderSize + 8*5
		c[at+6] = 0x10 // a huge offset for vertex 5
		return c
	}, true)
}

func TestReadEdgeList(t *testing.T) {
	in := "# Directed graph (each unordered pair of nodes is saved once)\n# FromNodeId\tToNodeId\n0\t1\n1 2  7\n\n% comment\n2\t0\n"
	n, edges, err := ReadEdgeList(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 || !slices.Equal(edges, pairs(0, 1, 1, 2, 2, 0)) {
		t.Errorf("n %d edges %v", n, edges)
	}
	for _, bad := range []string{"0\n", "a b\n", "1 -2\n", "", "# only comments\n", "0 4294967295\n"} {
		if _, _, err := ReadEdgeList(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestRMATDeterministic(t *testing.T) {
	n1, e1, _ := RMAT(8, 4, 9)
	n2, e2, _ := RMAT(8, 4, 9)
	_, e3, _ := RMAT(8, 4, 10)
	if n1 != 256 || n2 != 256 || len(e1) != 1024 || !slices.Equal(e1, e2) {
		t.Fatalf("same seed, different graphs")
	}
	if slices.Equal(e1, e3) {
		t.Fatalf("different seeds, same graph")
	}
	// Power law: the top vertex has far more than the average degree.
	g, _ := build(t, n1, e1, true)
	maxd := uint64(0)
	for v := range uint32(n1) {
		maxd = max(maxd, g.OutDegree(v))
	}
	if avg := g.M() / n1; maxd < 4*avg {
		t.Errorf("largest degree %d, average %d: not skewed", maxd, avg)
	}
}

// TestParseCaching reads lovelock graph run's three cache flags; a value
// out of its set is refused naming its flag (before, "cache mode" and
// "prefetcher" did not say which flag to change).
func TestParseCaching(t *testing.T) {
	for _, tc := range []struct {
		cache, prefetch, scope string
		want                   Caching
		err                    string
	}{
		{"", "", "", Caching{Prefetcher: "off"}, ""},
		{"static", "", "", Caching{Static: true, Prefetcher: "off"}, ""},
		{"dynamic", "", "", Caching{Prefetcher: "adjacent"}, ""},
		{"dynamic", "stride", "edges", Caching{Prefetcher: "stride"}, ""},
		{"dynamic", "adjacent", "region", Caching{Prefetcher: "adjacent", WholeRegion: true}, ""},
		{"static", "hints", "region", Caching{Static: true, Prefetcher: "hints", WholeRegion: true}, ""},
		{"static", "", "region", Caching{}, "needs the dynamic cache"},
		{"off", "", "region", Caching{}, "needs the dynamic cache"},
		{"dynamic", "", "vertices", Caching{}, `--dynamic-scope: dynamic cache scope "vertices"`},
		{"dynamic", "off", "", Caching{}, "would cache nothing"},
		{"off", "stride", "", Caching{}, "needs the dynamic cache"},
		{"lru", "", "", Caching{}, `--cache: cache mode "lru"`},
		{"dynamic", "leap", "", Caching{}, `--prefetch: prefetcher "leap"`},
	} {
		got, err := ParseCaching(tc.cache, tc.prefetch, tc.scope)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q %q %q: %v", tc.cache, tc.prefetch, tc.scope, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q %q %q: err %v, want one containing %q", tc.cache, tc.prefetch, tc.scope, err, tc.err)
		case got != tc.want:
			t.Errorf("%q %q %q: %+v, want %+v", tc.cache, tc.prefetch, tc.scope, got, tc.want)
		}
	}
}
