package graph

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
)

// Edge is a directed edge from Src to Dst.
type Edge struct{ Src, Dst uint32 }

type csrArrays struct {
	off   []uint64
	edges []uint32
}

// Build returns the CSR file image of the graph with n vertices and the
// given edges. Self loops and duplicate edges are dropped and each
// vertex's neighbours are sorted, as Ligra's inputs are. With symmetric
// every edge is stored in both directions (an undirected graph); without
// it the file also holds the transpose, which the engine's dense mode
// reads.
func Build(n uint64, edges []Edge, symmetric bool) ([]byte, error) {
	if n == 0 || n > MaxVertices {
		return nil, fmt.Errorf("graph: %d vertices: want 1 to %d", n, uint64(MaxVertices))
	}
	for _, e := range edges {
		if uint64(e.Src) >= n || uint64(e.Dst) >= n {
			return nil, fmt.Errorf("graph: edge %d-%d outside %d vertices", e.Src, e.Dst, n)
		}
	}
	out := toCSR(n, edges, symmetric, false)
	if symmetric {
		return encode(n, true, out, out), nil
	}
	return encode(n, false, out, toCSR(n, edges, false, true)), nil
}

// toCSR groups edges by source (by destination with transpose) with a
// counting sort, then sorts and deduplicates each vertex's neighbours.
func toCSR(n uint64, edges []Edge, both, transpose bool) csrArrays {
	deg := make([]uint64, n+1)
	each := func(f func(s, d uint32)) {
		for _, e := range edges {
			s, d := e.Src, e.Dst
			if s == d {
				continue
			}
			if transpose {
				s, d = d, s
			}
			f(s, d)
			if both {
				f(d, s)
			}
		}
	}
	each(func(s, _ uint32) { deg[s+1]++ })
	for v := uint64(1); v <= n; v++ {
		deg[v] += deg[v-1]
	}
	nbr := make([]uint32, deg[n])
	fill := slices.Clone(deg[:n])
	each(func(s, d uint32) { nbr[fill[s]] = d; fill[s]++ })
	// Sort and deduplicate in place, compacting towards the front.
	off := make([]uint64, n+1)
	w := uint64(0)
	for v := range n {
		a := nbr[deg[v]:deg[v+1]]
		slices.Sort(a)
		a = slices.Compact(a)
		copy(nbr[w:], a)
		w += uint64(len(a))
		off[v+1] = w
	}
	return csrArrays{off: off, edges: nbr[:w:w]}
}

// RMAT generates an R-MAT graph as Graph500's Kronecker generator does:
// 2^scale vertices, edgeFactor × 2^scale edges, quadrant probabilities
// A = 0.57, B = 0.19, C = 0.19 (D = 0.05), and vertex labels permuted at
// random so that the high-degree vertices are not the low IDs. The same
// seed gives the same edges.
func RMAT(scale, edgeFactor int, seed uint64) (uint64, []Edge, error) {
	if scale < 1 || scale > 31 {
		return 0, nil, fmt.Errorf("graph: R-MAT scale %d: want 1 to 31", scale)
	}
	if edgeFactor < 1 {
		return 0, nil, fmt.Errorf("graph: R-MAT edge factor %d: want at least 1", edgeFactor)
	}
	// Checked before the product, which would wrap in uint64.
	if uint64(edgeFactor) > MaxEdges>>scale {
		return 0, nil, fmt.Errorf("graph: R-MAT edge factor %d at scale %d: more than %d edges, the most a CSR file holds; lower one of them",
			edgeFactor, scale, uint64(MaxEdges))
	}
	const a, b, c = 0.57, 0.19, 0.19
	n := uint64(1) << scale
	rng := rand.New(rand.NewPCG(seed, 0x52_4d_41_54)) // "RMAT"
	edges := make([]Edge, uint64(edgeFactor)*n)
	for i := range edges {
		var s, d uint32
		for bit := range scale {
			r := rng.Float64()
			switch {
			case r < a:
			case r < a+b:
				d |= 1 << bit
			case r < a+b+c:
				s |= 1 << bit
			default:
				s |= 1 << bit
				d |= 1 << bit
			}
		}
		edges[i] = Edge{s, d}
	}
	perm := make([]uint32, n)
	for i := range perm {
		perm[i] = uint32(i)
	}
	rng.Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
	for i := range edges {
		edges[i] = Edge{perm[edges[i].Src], perm[edges[i].Dst]}
	}
	return n, edges, nil
}

// ErrSparseIDs is returned by CheckIDs: an edge list's largest vertex ID is
// too large for its number of edges to be kept as a vertex number.
var ErrSparseIDs = errors.New("graph: vertex IDs too sparse to keep")

// MinKeptVertices is the number of vertices an edge list may span with its
// IDs kept whatever its length (2 MiB of offsets), so that small
// hand-written lists with gaps convert as they are.
const MinKeptVertices = 1 << 16

// CheckIDs refuses to keep an edge list's IDs as vertex numbers when the
// n = largest ID + 1 vertices they span exceed 2 × edges (as many as the
// edges name at most) and MinKeptVertices. A CSR file's vertex arrays
// cost about 32 bytes a vertex, so without the bound one ID near 2^32 (a
// typo, or IDs that are hashes) would make Build allocate over 100 GiB;
// with it, they cost at most about as much as the edges. Renumber such a
// list instead.
func CheckIDs(n uint64, edges int) error {
	if n <= max(2*uint64(edges), MinKeptVertices) {
		return nil
	}
	cost := fmt.Sprintf("%d MiB", 32*n>>20)
	if 32*n >= 1<<30 {
		cost = fmt.Sprintf("%d GiB", 32*n>>30)
	}
	return fmt.Errorf("%w: the largest vertex ID is %d, but %d edges name at most %d vertices: kept as they are, the IDs would make %d vertices (about %s for their arrays), most of them gaps",
		ErrSparseIDs, n-1, edges, 2*uint64(edges), n, cost)
}

// Renumber replaces the vertex IDs in edges, in place, by 0 … k−1 in
// increasing order of the original IDs (so IDs that are already 0 … k−1
// stay), and returns ids, where ids[v] is vertex v's original ID; k is
// len(ids). Its memory is bounded by the edges' (a sorted copy of their
// IDs), never by an ID's value.
func Renumber(edges []Edge) []uint32 {
	ids := make([]uint32, 0, 2*len(edges))
	for _, e := range edges {
		ids = append(ids, e.Src, e.Dst)
	}
	slices.Sort(ids)
	ids = slices.Clip(slices.Compact(ids))
	at := func(id uint32) uint32 {
		i, _ := slices.BinarySearch(ids, id)
		return uint32(i)
	}
	for i, e := range edges {
		edges[i] = Edge{at(e.Src), at(e.Dst)}
	}
	return ids
}

// ReadEdgeList parses a SNAP-style edge list: one edge per line, source and
// destination as decimal vertex IDs separated by white space; lines that
// are empty or start with '#' or '%' are comments; further fields on a line
// (weights, timestamps) are ignored. n is the largest ID plus one: check it
// with CheckIDs, or Renumber, before Build allocates for n vertices.
func ReadEdgeList(r io.Reader) (uint64, []Edge, error) {
	const maxLine = 1 << 20
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	var edges []Edge
	n := uint64(0)
	line := 0
	for sc.Scan() {
		line++
		t := strings.TrimSpace(sc.Text())
		if t == "" || t[0] == '#' || t[0] == '%' {
			continue
		}
		f := strings.Fields(t)
		if len(f) < 2 {
			return 0, nil, fmt.Errorf("graph: edge list line %d: %q: want two vertex IDs", line, t)
		}
		var ids [2]uint32
		for i := range ids {
			v, err := strconv.ParseUint(f[i], 10, 32)
			if err != nil || v >= MaxVertices {
				return 0, nil, fmt.Errorf("graph: edge list line %d: vertex %q: want an ID below %d", line, f[i], uint64(MaxVertices))
			}
			ids[i] = uint32(v)
			n = max(n, v+1)
		}
		edges = append(edges, Edge{ids[0], ids[1]})
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		return 0, nil, fmt.Errorf("graph: edge list line %d: longer than %d bytes: want two vertex IDs per line", line+1, maxLine)
	} else if err != nil {
		return 0, nil, fmt.Errorf("graph: edge list, after line %d: %w", line, err)
	}
	if n == 0 {
		return 0, nil, fmt.Errorf("graph: edge list has no edges")
	}
	return n, edges, nil
}
