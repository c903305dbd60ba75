package graph

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/lovelock-dpu/lovelock/dataplane/farmem/fmap"
)

// Advisor is where a MappingHinter sends its advice: an *fmap.Mapping.
type Advisor interface {
	Advise(ctx context.Context, a fmap.Advice) (fmap.AdviceResult, error)
}

// HintStats are a MappingHinter's counters.
type HintStats struct {
	// Batches is the number of Advise calls made, Extents and Bytes what
	// they named (after rounding to chunks and merging).
	Batches, Extents, Bytes uint64
	// Started is the number of cache entry loads the far end started.
	Started uint64
	// Dropped counts the engine's hint calls discarded because the queue
	// was full: hints are advice, and a late hint is worth nothing.
	Dropped uint64
	// Errors counts failed Advise calls; Err is the first.
	Errors uint64
	Err    string `json:",omitempty"`
}

// MappingHinter is the engine's Hinter for a graph in a far-memory
// mapping: Hint queues the ranges and returns at once; one goroutine takes
// everything queued, rounds it to whole chunks, merges it, and sends it to
// the far end with Advise (host agent → DPU agent: farmem.Region.Hint), so
// no worker waits on the fabric for a hint.
type MappingHinter struct {
	adv   Advisor
	chunk int64
	queue chan []fmap.Extent
	done  chan struct{}
	// closeMu orders Hint's send against Close's close of the queue:
	// Hint sends under the read lock, only while closed is false.
	closeMu sync.RWMutex
	closed  bool
	// queued numbers the hints queued, taken counts those the hinter has
	// taken off the queue: Hint yields until its own is taken.
	queueMu       sync.Mutex
	queued, taken atomic.Uint64

	batches, extents, bytes, started, dropped, errors atomic.Uint64
	mu                                                sync.Mutex
	firstErr                                          string
}

// NewMappingHinter starts a hinter sending to adv, whose region is read
// in chunks of chunk bytes (the mapping's chunk size). It runs until
// Close or ctx's end.
func NewMappingHinter(ctx context.Context, adv Advisor, chunk int64) *MappingHinter {
	h := &MappingHinter{adv: adv, chunk: max(chunk, 1), queue: make(chan []fmap.Extent, 256), done: make(chan struct{})}
	go h.loop(ctx)
	return h
}

// Hint implements Hinter. After Close it is a no-op (the hint is counted
// as dropped): hints are advice, and an engine still running when its
// hinter closed must not crash on a closed queue.
func (h *MappingHinter) Hint(r []fmap.Extent) {
	n, ok := h.enqueue(r)
	if !ok {
		return
	}
	// The caller goes on to read, and fault on, what it just hinted. A
	// thread waiting in a userfaultfd fault keeps its P, so when the
	// engine's workers hold every P (GOMAXPROCS 1, or as many workers as
	// Ps) the hinter would get one only at a worker's next preemption,
	// after the reads the hints were for: with one P, bench-graph's hinted
	// rows hit 27-40 % on BFS against 73-75 % with two. Yielding lets the
	// hinter take the queue and start its Advise first (a wait on the
	// socket, which gives the P back); with a P to spare it has already.
	for range 3 {
		if h.taken.Load() >= n {
			return
		}
		runtime.Gosched()
	}
}

// enqueue queues r for the hinter, or counts it dropped (queue full, or
// the hinter closed); it reports whether r was queued, and its number in
// the order of the queue (the hinter's taken count once it has taken r).
func (h *MappingHinter) enqueue(r []fmap.Extent) (uint64, bool) {
	h.closeMu.RLock()
	defer h.closeMu.RUnlock()
	if h.closed {
		h.dropped.Add(1)
		return 0, false
	}
	// Numbered and sent under queueMu, so that numbers follow the queue's
	// order when several workers hint at once.
	h.queueMu.Lock()
	defer h.queueMu.Unlock()
	select {
	case h.queue <- r:
		return h.queued.Add(1), true
	default:
		h.dropped.Add(1)
		return 0, false
	}
}

// maxBatch keeps one Advise within fmap's limit on ranges.
const maxBatch = 512

func (h *MappingHinter) loop(ctx context.Context) {
	defer close(h.done)
	for {
		var batch []fmap.Extent
		select {
		case <-ctx.Done():
			return
		case r, ok := <-h.queue:
			if !ok {
				return
			}
			h.taken.Add(1)
			batch = append(batch, r...)
		}
		// Take whatever else queued meanwhile: one call for all of it.
	drain:
		for len(batch) < 4*maxBatch {
			select {
			case r, ok := <-h.queue:
				if !ok {
					break drain
				}
				h.taken.Add(1)
				batch = append(batch, r...)
			default:
				break drain
			}
		}
		batch = mergeChunks(batch, h.chunk)
		for len(batch) > 0 {
			n := min(len(batch), maxBatch)
			res, err := h.adv.Advise(ctx, fmap.Advice{Hints: batch[:n]})
			h.batches.Add(1)
			h.extents.Add(uint64(n))
			for _, e := range batch[:n] {
				h.bytes.Add(uint64(e.Size))
			}
			h.started.Add(uint64(res.Hinted))
			if err != nil {
				h.errors.Add(1)
				h.mu.Lock()
				if h.firstErr == "" {
					h.firstErr = err.Error()
				}
				h.mu.Unlock()
				if ctx.Err() != nil {
					return
				}
			}
			batch = batch[n:]
		}
	}
}

// mergeChunks rounds each extent out to whole chunks, sorts them and
// merges those that overlap or touch.
func mergeChunks(es []fmap.Extent, chunk int64) []fmap.Extent {
	for i := range es {
		lo := es[i].Offset / chunk * chunk
		hi := (es[i].Offset + es[i].Size + chunk - 1) / chunk * chunk
		es[i] = fmap.Extent{Offset: lo, Size: hi - lo}
	}
	slices.SortFunc(es, func(a, b fmap.Extent) int {
		switch {
		case a.Offset < b.Offset:
			return -1
		case a.Offset > b.Offset:
			return 1
		}
		return 0
	})
	out := es[:0]
	for _, e := range es {
		if k := len(out) - 1; k >= 0 && e.Offset <= out[k].Offset+out[k].Size {
			out[k].Size = max(out[k].Size, e.Offset+e.Size-out[k].Offset)
			continue
		}
		out = append(out, e)
	}
	return out
}

// Close stops the hinter once the hints queued so far are sent, and
// returns its counters. Hints after Close are dropped; Close may be called
// more than once.
func (h *MappingHinter) Close() HintStats {
	h.closeMu.Lock()
	if !h.closed {
		h.closed = true
		close(h.queue)
	}
	h.closeMu.Unlock()
	<-h.done
	return h.Stats()
}

// Stats returns the counters so far.
func (h *MappingHinter) Stats() HintStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return HintStats{
		Batches: h.batches.Load(), Extents: h.extents.Load(), Bytes: h.bytes.Load(), Started: h.started.Load(),
		Dropped: h.dropped.Load(), Errors: h.errors.Load(), Err: h.firstErr,
	}
}
