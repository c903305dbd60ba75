package graph

import (
	"math"
	"slices"
)

// The references below are independent of the engine and of the CSR
// format: plain sequential textbook algorithms over adjacency lists built
// straight from the edge list (self loops and duplicates dropped, as Build
// does).

type refGraph struct {
	out, in [][]uint32
}

func newRef(n uint64, edges []Edge, symmetric bool) refGraph {
	outSet := make([]map[uint32]bool, n)
	inSet := make([]map[uint32]bool, n)
	for i := range outSet {
		outSet[i], inSet[i] = map[uint32]bool{}, map[uint32]bool{}
	}
	add := func(s, d uint32) { outSet[s][d] = true; inSet[d][s] = true }
	for _, e := range edges {
		if e.Src == e.Dst {
			continue
		}
		add(e.Src, e.Dst)
		if symmetric {
			add(e.Dst, e.Src)
		}
	}
	r := refGraph{out: make([][]uint32, n), in: make([][]uint32, n)}
	for v := range n {
		for d := range outSet[v] {
			r.out[v] = append(r.out[v], d)
		}
		for s := range inSet[v] {
			r.in[v] = append(r.in[v], s)
		}
		slices.Sort(r.out[v])
		slices.Sort(r.in[v])
	}
	return r
}

func (r refGraph) bfs(src uint32) []int32 {
	d := make([]int32, len(r.out))
	for i := range d {
		d[i] = -1
	}
	d[src] = 0
	q := []uint32{src}
	for len(q) > 0 {
		v := q[0]
		q = q[1:]
		for _, w := range r.out[v] {
			if d[w] < 0 {
				d[w] = d[v] + 1
				q = append(q, w)
			}
		}
	}
	return d
}

// cc labels components with union-find, then each with its smallest ID.
func (r refGraph) cc() []int32 {
	parent := make([]int, len(r.out))
	for i := range parent {
		parent[i] = i
	}
	find := func(x int) int {
		for parent[x] != x {
			parent[x] = parent[parent[x]]
			x = parent[x]
		}
		return x
	}
	for v, ns := range r.out {
		for _, w := range ns {
			a, b := find(v), find(int(w))
			if a != b {
				parent[max(a, b)] = min(a, b) // the root stays the smallest ID
			}
		}
	}
	out := make([]int32, len(parent))
	for v := range parent {
		out[v] = int32(find(v))
	}
	return out
}

func (r refGraph) radii(sources []uint32) []int32 {
	out := make([]int32, len(r.out))
	for i := range out {
		out[i] = -1
	}
	for _, s := range sources {
		for v, d := range r.bfs(s) {
			out[v] = max(out[v], d)
		}
	}
	return out
}

func (r refGraph) pagerank(iters int, damping float64) []float64 {
	n := len(r.out)
	p := make([]float64, n)
	for i := range p {
		p[i] = 1 / float64(n)
	}
	for range iters {
		next := make([]float64, n)
		for s, ns := range r.out {
			for _, d := range ns {
				next[d] += p[s] / float64(len(ns))
			}
		}
		for v := range next {
			next[v] = (1-damping)/float64(n) + damping*next[v]
		}
		p = next
	}
	return p
}

// bc is Brandes' algorithm with a queue and a stack.
func (r refGraph) bc(sources []uint32) []float64 {
	n := len(r.out)
	bc := make([]float64, n)
	for _, s := range sources {
		dist := make([]int, n)
		sigma := make([]float64, n)
		delta := make([]float64, n)
		for i := range dist {
			dist[i] = -1
		}
		dist[s], sigma[s] = 0, 1
		var stack []uint32
		q := []uint32{s}
		for len(q) > 0 {
			v := q[0]
			q = q[1:]
			stack = append(stack, v)
			for _, w := range r.out[v] {
				if dist[w] < 0 {
					dist[w] = dist[v] + 1
					q = append(q, w)
				}
				if dist[w] == dist[v]+1 {
					sigma[w] += sigma[v]
				}
			}
		}
		for i := len(stack) - 1; i >= 0; i-- {
			w := stack[i]
			for _, v := range r.in[w] {
				if dist[v] >= 0 && dist[v] == dist[w]-1 {
					delta[v] += sigma[v] / sigma[w] * (1 + delta[w])
				}
			}
			if w != s {
				bc[w] += delta[w]
			}
		}
	}
	return bc
}

// run gives the reference's result of app with p (defaults applied, BFS
// source and samples resolved the way Run resolves them on g).
func (r refGraph) run(g *Graph, app App, p Params) Result {
	p = p.Defaults()
	res := Result{App: app}
	switch app {
	case BFS:
		src := p.Source
		if src < 0 {
			best := 0
			for v := range r.out {
				if len(r.out[v]) > len(r.out[best]) {
					best = v
				}
			}
			src = int64(best)
		}
		res.Ints = r.bfs(uint32(src))
	case PageRank:
		res.Floats = r.pagerank(p.Iterations, p.Damping)
	case Components:
		res.Ints = r.cc()
	case Radii:
		res.Ints = r.radii(SampleVertices(g, min(p.Samples, 64), p.Seed))
	case BC:
		res.Floats = r.bc(SampleVertices(g, p.BCSources, p.Seed))
	}
	return res
}

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol*max(1, math.Abs(b)) }
