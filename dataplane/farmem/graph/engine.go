package graph

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/lovelock-dpu/lovelock/dataplane/farmem/fmap"
)

// Mode picks how EdgeMap traverses a frontier.
type Mode int

const (
	// Auto chooses per call, as Ligra does: dense (pull over in-edges) when
	// the frontier's size plus its out-degrees exceed the threshold (m/20),
	// sparse (push over out-edges) otherwise.
	Auto Mode = iota
	// Sparse always pushes; Dense always pulls. For tests and comparisons:
	// the results must not depend on the mode.
	Sparse
	Dense
)

// Options configure an Engine.
type Options struct {
	// Workers is the number of goroutines per parallel step; default
	// GOMAXPROCS. The results do not depend on it.
	Workers int
	// Mode forces sparse or dense traversal; default Auto.
	Mode Mode
	// Threshold is the frontier weight (vertices plus out-edges) above which
	// Auto goes dense; default m/20, Ligra's.
	Threshold uint64
	// Hints, when set, receives the byte ranges of the graph's edge array
	// that each EdgeMap step will read, ahead of the workers reading them
	// (see Hinter). Nil sends none.
	Hints Hinter
	// HintAhead is how far the hints run ahead of the workers, in bytes
	// of far cache entries (HintGrain) that the hinted ranges touch;
	// default 8 MiB. It should stay well below the far cache's size, or
	// hinted entries are evicted before they are read.
	HintAhead uint64
	// HintGrain is the far cache's entry size, by which HintAhead counts;
	// default 1 MiB, the DPU agent's default entry_size.
	HintGrain uint64
}

// Hinter receives the engine's advance notice of the ranges of the graph
// image (byte offsets from its start) that a step will read. Hint is called
// by the engine's workers between blocks of work: it must not block on
// the far end (queue the ranges and send them elsewhere, as MappingHinter
// does), and it owns the slice.
type Hinter interface {
	Hint(ranges []fmap.Extent)
}

// Engine runs Ligra's operators over one graph: EdgeMap over a frontier's
// edges, VertexMap over its vertices. Vertex state belongs to the apps and
// lives in local memory; the engine reads only the graph's bytes. An
// Engine runs one app at a time.
type Engine struct {
	g         *Graph
	workers   int
	mode      Mode
	threshold uint64
	// stamp[v] == round marks v as already in this EdgeMap's sparse
	// output, so that each vertex is output once without clearing an
	// n-sized array per call.
	stamp []atomic.Uint32
	round uint32
	bad   atomic.Pointer[string] // first inconsistency found in the graph's bytes
	lost  atomic.Pointer[error]  // the first fault on the graph's bytes: far memory that could not be read
	hints Hinter
	ahead uint64
	grain uint64

	// Counters of the last app run (reset by Reset).
	DenseSteps, SparseSteps int
	EdgesRead               atomic.Uint64
}

// NewEngine returns an engine over g.
func NewEngine(g *Graph, o Options) *Engine {
	e := &Engine{g: g, workers: o.Workers, mode: o.Mode, threshold: o.Threshold, hints: o.Hints, ahead: o.HintAhead, grain: o.HintGrain}
	if e.ahead == 0 {
		e.ahead = 8 << 20
	}
	if e.grain == 0 {
		e.grain = 1 << 20
	}
	if e.workers <= 0 {
		e.workers = runtime.GOMAXPROCS(0)
	}
	if e.threshold == 0 {
		e.threshold = max(g.m/20, 1)
	}
	e.stamp = make([]atomic.Uint32, g.n)
	return e
}

// Graph is the engine's graph.
func (e *Engine) Graph() *Graph { return e.g }

// Reset clears the counters.
func (e *Engine) Reset() {
	e.DenseSteps, e.SparseSteps = 0, 0
	e.EdgesRead.Store(0)
}

// Err reports the first out-of-range offset or neighbour an operator met
// (wrapping ErrFormat), or nil. Such edges are skipped, so a run over a
// corrupt graph ends, with this error. A read of the graph's bytes that
// faulted (far memory whose chunk the host agent poisoned after its fetch
// kept failing: fmap.Options.FetchTimeout) ends the run early with an
// error wrapping ErrFarMemory.
func (e *Engine) Err() error {
	if p := e.lost.Load(); p != nil {
		return *p
	}
	if p := e.bad.Load(); p != nil {
		return fmt.Errorf("%w: %s", ErrFormat, *p)
	}
	return nil
}

func (e *Engine) fail(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	e.bad.CompareAndSwap(nil, &s)
}

// span returns the edge range [lo, hi) of v in a, or an empty one if the
// offsets are inconsistent.
func (e *Engine) span(a adj, v uint32) (uint64, uint64) {
	lo, hi := a.offset(v), a.offset(v+1)
	if lo > hi || hi > e.g.m {
		e.fail("vertex %d's edges run from %d to %d of %d", v, lo, hi, e.g.m)
		return 0, 0
	}
	return lo, hi
}

// guard runs body under guarded; after a fault, every body is skipped, so
// the app's loop ends soon.
func (e *Engine) guard(body func(w, lo, hi int)) func(w, lo, hi int) {
	return func(w, lo, hi int) {
		if e.lost.Load() != nil {
			return
		}
		e.guarded(func() error { body(w, lo, hi); return nil })
	}
}

// guarded runs f, turning a fault on the graph's bytes into the engine's
// error (see caught; Err reports it, f's result is then nil).
func (e *Engine) guarded(f func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if !e.caught(r) {
				panic(r)
			}
			err = nil
		}
	}()
	return f()
}

// caught records r, a recovered panic, as the engine's error if it is a
// fault on the graph's bytes: SIGBUS from a far-memory chunk the host agent
// poisoned after its fetch kept failing (fmap.Options.FetchTimeout). A
// fault anywhere else is not the graph's, and caught leaves it alone.
func (e *Engine) caught(r any) bool {
	var fault interface{ Addr() uintptr }
	err, ok := r.(error)
	if !ok || !errors.As(err, &fault) || !e.g.holds(fault.Addr()) {
		return false
	}
	at := fault.Addr() - uintptr(unsafe.Pointer(unsafe.SliceData(e.g.image)))
	lost := fmt.Errorf("%w: byte %d of the graph could not be read (the host agent gave up on its chunk; "+
		"the mapping's Close says why)", ErrFarMemory, at)
	e.lost.CompareAndSwap(nil, &lost)
	return true
}

// parallel runs body over [0, n) in blocks on e.workers goroutines; body
// gets the worker's index, so it may keep per-worker state.
func (e *Engine) parallel(n int, body func(w, lo, hi int)) {
	e.parallelHinted(n, nil, body)
}

// parallelHinted is parallel with hints: when the engine has a Hinter,
// each block's claim first runs the hints ahead (see hintAhead).
func (e *Engine) parallelHinted(n int, hint func(lo, hi int) []fmap.Extent, body func(w, lo, hi int)) {
	if n == 0 {
		return
	}
	body = e.guard(body)
	workers := min(e.workers, (n+255)/256)
	if e.hints == nil {
		hint = nil
	}
	if workers <= 1 && hint == nil {
		body(0, 0, n)
		return
	}
	workers = max(workers, 1)
	grain := max(64, n/(workers*16))
	if hint != nil {
		h := &hintAhead{e: e, n: n, grain: grain, extents: hint, sizes: make([]uint64, (n+grain-1)/grain)}
		inner := body
		body = func(w, lo, hi int) {
			h.claim(lo)
			inner(w, lo, hi)
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for {
				lo := int(next.Add(int64(grain))) - grain
				if lo >= n {
					return
				}
				body(w, lo, min(lo+grain, n))
			}
		})
	}
	wg.Wait()
}

// Subset is a set of vertices, a frontier: a list of IDs (sparse) or a
// flag per vertex (dense).
type Subset struct {
	n     int
	ids   []uint32
	bits  []bool
	dense bool
	size  int
}

// Size is the number of vertices in s.
func (s Subset) Size() int { return s.size }

// Empty reports whether s has no vertex.
func (s Subset) Empty() bool { return s.size == 0 }

// Single is the subset holding v alone.
func (e *Engine) Single(v uint32) Subset {
	return Subset{n: int(e.g.n), ids: []uint32{v}, size: 1}
}

// All is the subset of every vertex.
func (e *Engine) All() Subset {
	bits := make([]bool, e.g.n)
	for i := range bits {
		bits[i] = true
	}
	return Subset{n: int(e.g.n), bits: bits, dense: true, size: int(e.g.n)}
}

// FromIDs is the subset of the given distinct vertices.
func (e *Engine) FromIDs(ids []uint32) Subset {
	return Subset{n: int(e.g.n), ids: ids, size: len(ids)}
}

// IDs lists s's vertices (in increasing order if s is dense).
func (s Subset) IDs() []uint32 {
	if !s.dense {
		return s.ids
	}
	out := make([]uint32, 0, s.size)
	for v, in := range s.bits {
		if in {
			out = append(out, uint32(v))
		}
	}
	return out
}

func (s Subset) toDense() Subset {
	if s.dense {
		return s
	}
	bits := make([]bool, s.n)
	for _, v := range s.ids {
		bits[v] = true
	}
	return Subset{n: s.n, bits: bits, dense: true, size: s.size}
}

// EdgeFuncs are an EdgeMap's callbacks, Ligra's F: for each edge (s, d)
// with s in the frontier and Cond(d), Update(s, d) says whether d joins the
// output frontier.
type EdgeFuncs struct {
	// Update is called in dense mode, where one goroutine handles all of
	// d's in-edges: it may update d's state without atomics (reading s's
	// state still races with other goroutines' updates of s, so state that
	// changes within a step must be read atomically).
	Update func(s, d uint32) bool
	// UpdateAtomic is called in sparse mode, where goroutines pushing from
	// different sources may update d at once.
	UpdateAtomic func(s, d uint32) bool
	// Cond(d) false skips d (dense mode stops reading d's in-edges as soon
	// as it turns false). Nil means always true.
	Cond func(d uint32) bool
}

// EdgeMap applies f to the edges leaving frontier and returns the
// vertices for which an update returned true, each once.
func (e *Engine) EdgeMap(frontier Subset, f EdgeFuncs) Subset {
	n := int(e.g.n)
	if frontier.size == 0 {
		return Subset{n: n}
	}
	cond := f.Cond
	if cond == nil {
		cond = func(uint32) bool { return true }
	}
	dense := e.mode == Dense
	if e.mode == Auto {
		dense = e.weight(frontier) > e.threshold
	}
	if dense {
		e.DenseSteps++
		return e.edgeMapDense(frontier.toDense(), f.Update, cond)
	}
	e.SparseSteps++
	return e.edgeMapSparse(frontier.IDs(), f.UpdateAtomic, cond)
}

// weight is Ligra's frontier weight: its vertices plus their out-degrees.
func (e *Engine) weight(s Subset) uint64 {
	ids := s.IDs()
	sums := make([]uint64, e.workers)
	e.parallel(len(ids), func(w, lo, hi int) {
		for _, v := range ids[lo:hi] {
			a, b := e.span(e.g.out, v)
			sums[w] += b - a
		}
	})
	total := uint64(len(ids))
	for _, x := range sums {
		total += x
	}
	return total
}

func (e *Engine) edgeMapDense(frontier Subset, update func(s, d uint32) bool, cond func(uint32) bool) Subset {
	n := int(e.g.n)
	out := make([]bool, n)
	counts := make([]int, e.workers)
	read := make([]uint64, e.workers)
	e.parallelHinted(n, func(lo, hi int) []fmap.Extent {
		// A dense step streams the in-edges of the vertices whose Cond
		// holds (it may stop early in a vertex: then the hint overshoots).
		var ext []fmap.Extent
		for d := lo; d < hi; d++ {
			if !cond(uint32(d)) {
				continue
			}
			a, b := e.span(e.g.in, uint32(d))
			ext = e.addEdges(ext, e.g.inAt, a, b)
		}
		return ext
	}, func(w, lo, hi int) {
		for d := lo; d < hi; d++ {
			v := uint32(d)
			if !cond(v) {
				continue
			}
			a, b := e.span(e.g.in, v)
			for i := a; i < b; i++ {
				s := e.g.in.neighbor(i)
				read[w]++
				if int(s) >= n {
					e.fail("in-edge %d of vertex %d points at %d of %d", i, v, s, n)
					continue
				}
				if frontier.bits[s] && update(s, v) && !out[d] {
					out[d] = true
					counts[w]++
				}
				if !cond(v) {
					break
				}
			}
		}
	})
	size := 0
	for w := range counts {
		size += counts[w]
		e.EdgesRead.Add(read[w])
	}
	return Subset{n: n, bits: out, dense: true, size: size}
}

func (e *Engine) edgeMapSparse(ids []uint32, update func(s, d uint32) bool, cond func(uint32) bool) Subset {
	n := int(e.g.n)
	e.round++
	if e.round == 0 { // wrapped: stale stamps could equal the new round
		for i := range e.stamp {
			e.stamp[i].Store(0)
		}
		e.round = 1
	}
	round := e.round
	outs := make([][]uint32, e.workers)
	read := make([]uint64, e.workers)
	e.parallelHinted(len(ids), func(lo, hi int) []fmap.Extent {
		// A sparse step knows its frontier: the out-edges of ids[lo:hi]
		// are offsets[s]..offsets[s+1] of the edge array.
		var ext []fmap.Extent
		for _, s := range ids[lo:hi] {
			a, b := e.span(e.g.out, s)
			ext = e.addEdges(ext, e.g.outAt, a, b)
		}
		return ext
	}, func(w, lo, hi int) {
		for _, s := range ids[lo:hi] {
			a, b := e.span(e.g.out, s)
			for i := a; i < b; i++ {
				d := e.g.out.neighbor(i)
				read[w]++
				if int(d) >= n {
					e.fail("edge %d of vertex %d points at %d of %d", i, s, d, n)
					continue
				}
				if cond(d) && update(s, d) {
					if old := e.stamp[d].Load(); old != round && e.stamp[d].CompareAndSwap(old, round) {
						outs[w] = append(outs[w], d)
					}
				}
			}
		}
	})
	var all []uint32
	for w := range outs {
		all = append(all, outs[w]...)
		e.EdgesRead.Add(read[w])
	}
	return Subset{n: n, ids: all, size: len(all)}
}

// VertexMap calls f for each vertex of s, in parallel.
func (e *Engine) VertexMap(s Subset, f func(v uint32)) {
	if s.dense {
		e.parallel(s.n, func(_, lo, hi int) {
			for v := lo; v < hi; v++ {
				if s.bits[v] {
					f(uint32(v))
				}
			}
		})
		return
	}
	e.parallel(len(s.ids), func(_, lo, hi int) {
		for _, v := range s.ids[lo:hi] {
			f(v)
		}
	})
}

// vertexMapEdges is VertexMap for an f that reads each vertex's edges in
// a, whose edge array starts at byte at of the image (BC's pulls): with a
// Hinter, those ranges are hinted ahead as in EdgeMap.
func (e *Engine) vertexMapEdges(s Subset, a adj, at uint64, f func(v uint32)) {
	ids := s.IDs()
	e.parallelHinted(len(ids), func(lo, hi int) []fmap.Extent {
		var ext []fmap.Extent
		for _, v := range ids[lo:hi] {
			x, y := e.span(a, v)
			ext = e.addEdges(ext, at, x, y)
		}
		return ext
	}, func(_, lo, hi int) {
		for _, v := range ids[lo:hi] {
			f(v)
		}
	})
}

// ForRange calls f for each vertex ID in [0, n), in parallel: a
// VertexMap over all vertices without building the subset.
func (e *Engine) ForRange(f func(v uint32)) {
	e.parallel(int(e.g.n), func(_, lo, hi int) {
		for v := lo; v < hi; v++ {
			f(uint32(v))
		}
	})
}

// hintAhead runs one step's hints ahead of its workers: when a worker
// claims a block, the blocks after the furthest one claimed are hinted
// until the hinted blocks not yet claimed touch HintAhead bytes of far
// cache entries. Blocks are claimed in increasing order (an atomic
// counter), so that is how far the far cache is asked to run ahead of the
// reads.
type hintAhead struct {
	e       *Engine
	n       int
	grain   int
	extents func(lo, hi int) []fmap.Extent

	mu    sync.Mutex
	front int      // blocks below front are claimed (being read or done)
	next  int      // first block not hinted
	sizes []uint64 // entry bytes hinted per block (one entry while computed)
}

func (h *hintAhead) claim(lo int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.front = max(h.front, lo/h.grain+1)
	// A block claimed before it was hinted is read now: too late to hint.
	h.next = max(h.next, h.front)
	// After a fault on the graph's bytes the run is ending: hint no more.
	for h.next < len(h.sizes) && h.outstanding() < h.e.ahead && h.e.lost.Load() == nil {
		nb := h.next
		h.next++
		h.sizes[nb] = h.e.grain // one entry while hint runs unlocked
		h.sizes[nb] = h.hint(nb)
	}
}

// hint hints block nb and returns the entry bytes it named. It is called
// with h.mu held and runs without it: the extents read offsets, which may
// fault (far memory), so not under the lock that the other workers' claims
// wait on. Those reads run guarded like the workers' own: a fault ends the
// run with ErrFarMemory (and hints nothing) instead of crashing the
// program. The deferred Lock keeps claim's deferred Unlock right even if
// a panic that is not the graph's passes through.
func (h *hintAhead) hint(nb int) uint64 {
	h.mu.Unlock()
	defer h.mu.Lock()
	lo := nb * h.grain
	var ext []fmap.Extent
	h.e.guarded(func() error {
		ext = h.extents(lo, min(lo+h.grain, h.n))
		return nil
	})
	if len(ext) > 0 {
		h.e.hints.Hint(ext)
	}
	return h.e.entryBytes(ext)
}

// outstanding is the entry bytes hinted for blocks not yet claimed.
func (h *hintAhead) outstanding() uint64 {
	var n uint64
	for b := h.front; b < h.next; b++ {
		n += h.sizes[b]
	}
	return n
}

// addEdges appends the bytes of edges [a, b) of the edge array at byte
// offset at of the image, merging with the last extent when they touch.
func (e *Engine) addEdges(ext []fmap.Extent, at, a, b uint64) []fmap.Extent {
	if a >= b {
		return ext
	}
	off, size := int64(at+4*a), int64(4*(b-a))
	if k := len(ext) - 1; k >= 0 && ext[k].Offset+ext[k].Size == off {
		ext[k].Size += size
		return ext
	}
	return append(ext, fmap.Extent{Offset: off, Size: size})
}

// entryBytes is the size of the far cache entries (HintGrain) that ext
// touches, counting an entry once when consecutive extents share it.
func (e *Engine) entryBytes(ext []fmap.Extent) uint64 {
	var n uint64
	last := ^uint64(0)
	for _, x := range ext {
		lo, hi := uint64(x.Offset)/e.grain, uint64(x.Offset+x.Size-1)/e.grain
		if lo == last {
			lo++
		}
		if hi >= lo {
			n += hi - lo + 1
		}
		last = hi
	}
	return n * e.grain
}
