package graph

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
)

// App names a graph application.
type App string

// The five applications of SODA's evaluation, as Ligra writes them.
const (
	BFS        App = "bfs"
	PageRank   App = "pagerank"
	Components App = "cc"
	Radii      App = "radii"
	BC         App = "bc"
)

// Apps lists every application, in SODA's order.
var Apps = []App{BFS, PageRank, Components, Radii, BC}

// ParseApp accepts an app's name (and "components" for cc).
func ParseApp(s string) (App, error) {
	if s == "components" {
		return Components, nil
	}
	for _, a := range Apps {
		if string(a) == s {
			return a, nil
		}
	}
	return "", fmt.Errorf("graph: unknown app %q: want one of bfs, pagerank, cc, radii, bc", s)
}

// ErrNotSymmetric is returned by the apps that need an undirected graph
// (Components, Radii) when given a directed one.
var ErrNotSymmetric = errors.New("graph: the app needs a symmetric (undirected) graph")

// Params are the apps' parameters. The zero value takes the defaults, and
// the same parameters give the same answer on the same graph.
type Params struct {
	// Source is BFS's root; negative picks the vertex with the most
	// out-edges, lowest ID first (the zero value is vertex 0: callers
	// that want the default pass -1, as lovelock graph run does).
	Source int64
	// Iterations of PageRank (default 20), Damping its factor (0.85).
	Iterations int
	Damping    float64
	// Samples is Radii's number of BFS sources (default 64, at most 64: one
	// bit each); BCSources is BC's (default 4). Both are drawn with Seed.
	Samples   int
	BCSources int
	Seed      uint64
}

// Defaults returns p with every zero field set to its default.
func (p Params) Defaults() Params {
	if p.Iterations == 0 {
		p.Iterations = 20
	}
	if p.Damping == 0 {
		p.Damping = 0.85
	}
	if p.Samples == 0 {
		p.Samples = 64
	}
	if p.BCSources == 0 {
		p.BCSources = 4
	}
	return p
}

// Result is an app's output: per-vertex integers (BFS depths, -1 for
// unreached; component labels, each the smallest vertex ID of its
// component; radii estimates, -1 where no sample reaches) or floats
// (PageRank scores, BC dependency sums), and how the engine got there.
type Result struct {
	App    App       `json:"app"`
	Ints   []int32   `json:"-"`
	Floats []float64 `json:"-"`
	// Steps is EdgeMap calls, split into dense and sparse ones.
	Steps       int    `json:"steps"`
	DenseSteps  int    `json:"dense_steps"`
	SparseSteps int    `json:"sparse_steps"`
	EdgesRead   uint64 `json:"edges_read"`
}

// check refuses parameters (after Defaults) that no app can run: a
// negative count would slice a sample to a negative length, and a damping
// outside (0, 1] gives scores that are not PageRank.
func (p Params) check() error {
	switch {
	case p.Iterations < 0:
		return fmt.Errorf("graph: %d PageRank iterations: want 0 (the default, 20) or more", p.Iterations)
	case !(p.Damping > 0 && p.Damping <= 1):
		return fmt.Errorf("graph: PageRank damping %g: want a factor in (0, 1]", p.Damping)
	case p.Samples < 0 || p.Samples > 64:
		// One bit of a uint64 per sample: more would silently run 64.
		return fmt.Errorf("graph: %d Radii samples: want 1 to 64 (0: the default, 64)", p.Samples)
	case p.BCSources < 0:
		return fmt.Errorf("graph: %d BC sources: want 0 (the default, 4) or more", p.BCSources)
	}
	return nil
}

// Run runs app on e's graph.
func Run(ctx context.Context, e *Engine, app App, p Params) (Result, error) {
	p = p.Defaults()
	if err := p.check(); err != nil {
		return Result{App: app}, err
	}
	e.Reset()
	r := Result{App: app}
	// The apps read the graph in this goroutine too (degrees, sources),
	// not only in the engine's workers.
	err := e.guarded(func() error { return runApp(ctx, e, app, p, &r) })
	r.DenseSteps, r.SparseSteps = e.DenseSteps, e.SparseSteps
	r.Steps = r.DenseSteps + r.SparseSteps
	r.EdgesRead = e.EdgesRead.Load()
	if err == nil {
		err = e.Err()
	}
	return r, err
}

// runApp runs app on e into r.
func runApp(ctx context.Context, e *Engine, app App, p Params, r *Result) error {
	var err error
	switch app {
	case BFS:
		src := p.Source
		if src < 0 {
			src = int64(maxDegreeVertex(e))
		}
		if src >= int64(e.g.n) {
			return fmt.Errorf("graph: BFS source %d: the graph has %d vertices", src, e.g.n)
		}
		r.Ints, err = RunBFS(ctx, e, uint32(src))
	case PageRank:
		r.Floats, err = RunPageRank(ctx, e, p.Iterations, p.Damping)
	case Components:
		r.Ints, err = RunComponents(ctx, e)
	case Radii:
		r.Ints, err = RunRadii(ctx, e, SampleVertices(e.g, p.Samples, p.Seed))
	case BC:
		r.Floats, err = RunBC(ctx, e, SampleVertices(e.g, p.BCSources, p.Seed))
	default:
		return fmt.Errorf("graph: unknown app %q", app)
	}
	return err
}

// maxDegreeVertex is the vertex with the most out-edges (lowest ID on a
// tie).
func maxDegreeVertex(e *Engine) uint32 {
	best, bestDeg := uint32(0), uint64(0)
	for v := range uint32(e.g.n) {
		a, b := e.span(e.g.out, v)
		if b-a > bestDeg {
			best, bestDeg = v, b-a
		}
	}
	return best
}

// SampleVertices draws k distinct vertices (all of them if k ≥ n) that have
// at least one out-edge where possible, from seed.
func SampleVertices(g *Graph, k int, seed uint64) []uint32 {
	n := int(g.n)
	var cand []uint32
	for v := range uint32(n) {
		if g.OutDegree(v) > 0 {
			cand = append(cand, v)
		}
	}
	if len(cand) == 0 {
		for v := range uint32(n) {
			cand = append(cand, v)
		}
	}
	if k >= len(cand) {
		return cand
	}
	rng := rand.New(rand.NewPCG(seed, 0x5a3b1e))
	rng.Shuffle(len(cand), func(i, j int) { cand[i], cand[j] = cand[j], cand[i] })
	out := slices.Clone(cand[:k])
	slices.Sort(out)
	return out
}

// RunBFS returns each vertex's depth from src (-1: unreachable): Ligra's
// BFS, level by level, so depths do not depend on the schedule.
func RunBFS(ctx context.Context, e *Engine, src uint32) ([]int32, error) {
	depth := make([]int32, e.g.n)
	for i := range depth {
		depth[i] = -1
	}
	depth[src] = 0
	frontier := e.Single(src)
	for round := int32(1); !frontier.Empty(); round++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		frontier = e.EdgeMap(frontier, EdgeFuncs{
			Update: func(_, d uint32) bool {
				atomic.StoreInt32(&depth[d], round)
				return true
			},
			UpdateAtomic: func(_, d uint32) bool { return atomic.CompareAndSwapInt32(&depth[d], -1, round) },
			Cond:         func(d uint32) bool { return atomic.LoadInt32(&depth[d]) == -1 },
		})
	}
	return depth, nil
}

// RunPageRank runs iterations of PageRank as Ligra's PageRank does, pulling
// p[s]/outdeg(s) over in-edges: p' = (1-damping)/n + damping × that sum.
// Mass at vertices without out-edges is not redistributed (as in Ligra), so
// the scores may sum to less than 1.
func RunPageRank(ctx context.Context, e *Engine, iterations int, damping float64) ([]float64, error) {
	n := int(e.g.n)
	deg := make([]float64, n)
	e.ForRange(func(v uint32) {
		a, b := e.span(e.g.out, v)
		deg[v] = float64(b - a)
	})
	p := make([]float64, n)
	contrib := make([]float64, n)
	next := make([]uint64, n) // float64 bits: UpdateAtomic adds with CAS
	for i := range p {
		p[i] = 1 / float64(n)
	}
	all := e.All()
	for range iterations {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		e.ForRange(func(v uint32) {
			if deg[v] > 0 {
				contrib[v] = p[v] / deg[v]
			} else {
				contrib[v] = 0
			}
			next[v] = 0
		})
		e.EdgeMap(all, EdgeFuncs{
			Update: func(s, d uint32) bool {
				next[d] = math.Float64bits(math.Float64frombits(next[d]) + contrib[s])
				return true
			},
			UpdateAtomic: func(s, d uint32) bool {
				for {
					old := atomic.LoadUint64(&next[d])
					if atomic.CompareAndSwapUint64(&next[d], old, math.Float64bits(math.Float64frombits(old)+contrib[s])) {
						return true
					}
				}
			},
		})
		e.ForRange(func(v uint32) {
			p[v] = (1-damping)/float64(n) + damping*math.Float64frombits(next[v])
		})
	}
	return p, nil
}

// RunComponents labels each vertex with the smallest vertex ID of its
// connected component: Ligra's label propagation, where a vertex whose
// label dropped pushes it to its neighbours in the next round. The
// fixpoint is unique, so the labels do not depend on the schedule.
func RunComponents(ctx context.Context, e *Engine) ([]int32, error) {
	if !e.g.Symmetric() {
		return nil, ErrNotSymmetric
	}
	ids := make([]uint32, e.g.n)
	for i := range ids {
		ids[i] = uint32(i)
	}
	lower := func(s, d uint32) bool {
		l := atomic.LoadUint32(&ids[s])
		for {
			old := atomic.LoadUint32(&ids[d])
			if l >= old {
				return false
			}
			if atomic.CompareAndSwapUint32(&ids[d], old, l) {
				return true
			}
		}
	}
	frontier := e.All()
	for !frontier.Empty() {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		frontier = e.EdgeMap(frontier, EdgeFuncs{Update: lower, UpdateAtomic: lower})
	}
	out := make([]int32, len(ids))
	for i, l := range ids {
		out[i] = int32(l)
	}
	return out, nil
}

// RunRadii estimates each vertex's eccentricity as Ligra's Radii does: a
// BFS from each of up to 64 sources at once, one bit per source in a
// vertex's visited mask; a vertex's radius is the last round in which a
// new source's bit reached it, i.e. its largest distance from a sample
// that reaches it (-1: none does).
func RunRadii(ctx context.Context, e *Engine, sources []uint32) ([]int32, error) {
	if !e.g.Symmetric() {
		return nil, ErrNotSymmetric
	}
	if len(sources) > 64 {
		return nil, fmt.Errorf("graph: radii: %d sources, at most 64", len(sources))
	}
	n := e.g.n
	visited := make([]uint64, n)
	nextVisited := make([]uint64, n)
	radii := make([]int32, n)
	for i := range radii {
		radii[i] = -1
	}
	for i, s := range sources {
		visited[s] |= 1 << i
		nextVisited[s] |= 1 << i
		radii[s] = 0
	}
	frontier := e.FromIDs(slices.Clone(sources))
	for round := int32(1); !frontier.Empty(); round++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// visited is read-only during the step; nextVisited collects.
		update := func(s, d uint32) bool {
			if visited[d]|visited[s] == visited[d] {
				return false
			}
			atomic.OrUint64(&nextVisited[d], visited[s])
			for {
				old := atomic.LoadInt32(&radii[d])
				if old == round {
					return false
				}
				if atomic.CompareAndSwapInt32(&radii[d], old, round) {
					return true
				}
			}
		}
		frontier = e.EdgeMap(frontier, EdgeFuncs{Update: update, UpdateAtomic: update})
		e.VertexMap(frontier, func(v uint32) { visited[v] = nextVisited[v] })
	}
	return radii, nil
}

// RunBC sums, for each vertex, Brandes' dependencies over shortest paths
// from each source: betweenness centrality from a sample of sources (all
// vertices as sources give the exact BC; for an undirected graph each path
// is then counted from both ends). Per source: a level-synchronous BFS
// (EdgeMap) finds the levels, each new level pulls its path counts from
// the previous one, and the levels are walked back pulling dependencies
// from the next, so every sum has a fixed order.
func RunBC(ctx context.Context, e *Engine, sources []uint32) ([]float64, error) {
	n := e.g.n
	bc := make([]float64, n)
	depth := make([]int32, n)
	// Path counts can double per level (a chain of diamonds passes
	// float64's range after about 1000 levels), so v's count is kept as
	// sigma[v]·2^sexp[v] with sigma[v] in [0.5, 1). Scaling by powers of
	// two is exact, so where plain float64 counts would stay finite this
	// gives the same bits; where they would overflow it stays finite.
	sigma := make([]float64, n)
	sexp := make([]int, n)
	delta := make([]float64, n)
	for _, src := range sources {
		for i := range depth {
			depth[i], sigma[i], sexp[i], delta[i] = -1, 0, 0, 0
		}
		depth[src], sigma[src], sexp[src] = 0, 0.5, 1 // one path
		levels := [][]uint32{{src}}
		frontier := e.Single(src)
		for round := int32(1); ; round++ {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			frontier = e.EdgeMap(frontier, EdgeFuncs{
				Update: func(_, d uint32) bool {
					atomic.StoreInt32(&depth[d], round)
					return true
				},
				UpdateAtomic: func(_, d uint32) bool { return atomic.CompareAndSwapInt32(&depth[d], -1, round) },
				Cond:         func(d uint32) bool { return atomic.LoadInt32(&depth[d]) == -1 },
			})
			if frontier.Empty() {
				break
			}
			// Depths are final for this level: pull path counts over
			// in-edges from the level before.
			e.vertexMapEdges(frontier, e.g.in, e.g.inAt, func(v uint32) {
				a, b := e.span(e.g.in, v)
				// sum·2^at, rescaled to the largest exponent so far.
				sum, at := 0.0, 0
				for i := a; i < b; i++ {
					u := e.g.in.neighbor(i)
					if uint64(u) < n && depth[u] == round-1 {
						switch f, x := sigma[u], sexp[u]; {
						case sum == 0:
							sum, at = f, x
						case x > at:
							sum, at = math.Ldexp(sum, at-x)+f, x
						default:
							sum += math.Ldexp(f, x-at)
						}
					}
				}
				f, x := math.Frexp(sum)
				sigma[v], sexp[v] = f, at+x
			})
			levels = append(levels, frontier.IDs())
		}
		for l := len(levels) - 2; l >= 0; l-- {
			next := int32(l + 1)
			e.vertexMapEdges(e.FromIDs(levels[l]), e.g.out, e.g.outAt, func(v uint32) {
				a, b := e.span(e.g.out, v)
				sum := 0.0
				for i := a; i < b; i++ {
					w := e.g.out.neighbor(i)
					if uint64(w) < n && depth[w] == next {
						// A ratio of counts, ≤ 1 since w's paths include v's.
						sum += math.Ldexp(sigma[v]/sigma[w], sexp[v]-sexp[w]) * (1 + delta[w])
					}
				}
				delta[v] = sum
				if v != src {
					bc[v] += sum
				}
			})
		}
	}
	return bc, nil
}
