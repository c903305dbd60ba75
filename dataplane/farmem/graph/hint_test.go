package graph

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/farmem/fmap"
)

// recordingHinter keeps every range the engine hints.
type recordingHinter struct {
	mu  sync.Mutex
	got []fmap.Extent
}

func (r *recordingHinter) Hint(ext []fmap.Extent) {
	r.mu.Lock()
	r.got = append(r.got, ext...)
	r.mu.Unlock()
}

// TestEngineHints runs every app with a Hinter in every mode: the answer
// is unchanged, every hinted range lies in an edge array, and a dense
// step with an unbounded look-ahead names all of the in-edge array that
// the first claimed block does not read.
func TestEngineHints(t *testing.T) {
	ctx := context.Background()
	n, edges, err := RMAT(11, 8, 9)
	if err != nil {
		t.Fatal(err)
	}
	p := Params{Source: -1, Samples: 8, BCSources: 2, Seed: 5, Iterations: 2}
	for _, symmetric := range []bool{true, false} {
		g, _ := build(t, n, edges, symmetric)
		inEdges := g.Edges()
		for _, mode := range []Mode{Auto, Sparse, Dense} {
			for _, app := range Apps {
				if !symmetric && (app == Components || app == Radii) {
					continue
				}
				want, err := Run(ctx, NewEngine(g, Options{Workers: 2, Mode: mode}), app, p)
				if err != nil {
					t.Fatal(err)
				}
				h := &recordingHinter{}
				got, err := Run(ctx, NewEngine(g, Options{Workers: 2, Mode: mode, Hints: h, HintAhead: 64 << 10, HintGrain: 4 << 10}), app, p)
				if err != nil {
					t.Fatal(err)
				}
				// forced sparse PageRank and BC add floats in arrival order
				if err := Compare(got, want, DefaultTolerance); err != nil {
					t.Errorf("symmetric=%v mode %d: with hints: %v", symmetric, mode, err)
				}
				if len(h.got) == 0 {
					t.Errorf("symmetric=%v mode %d %s: no hints", symmetric, mode, app)
				}
				for _, x := range h.got {
					inside := false
					for _, a := range inEdges {
						inside = inside || (x.Offset >= a.Offset && x.Offset+x.Size <= a.Offset+a.Size && x.Size > 0)
					}
					if !inside {
						t.Fatalf("symmetric=%v mode %d %s: hint %+v outside the edge arrays %+v", symmetric, mode, app, x, inEdges)
					}
				}
			}
		}
		// One dense PageRank step, one worker, unbounded look-ahead: the
		// hints are the in-edge array past the first block, in order.
		h := &recordingHinter{}
		e := NewEngine(g, Options{Workers: 1, Mode: Dense, Hints: h, HintAhead: 1 << 40})
		if _, err := RunPageRank(ctx, e, 1, 0.85); err != nil {
			t.Fatal(err)
		}
		merged := mergeChunks(append([]fmap.Extent(nil), h.got...), 1)
		last := inEdges[len(inEdges)-1]
		if len(merged) != 1 || merged[0].Offset+merged[0].Size != last.Offset+last.Size || merged[0].Offset <= last.Offset {
			t.Errorf("symmetric=%v: dense hints %+v, want one range ending the in-edges %+v past the first block", symmetric, merged, last)
		}
		// Two workers and a short look-ahead: the hints keep pace with the
		// claims through the whole step (a look-ahead that never drained
		// would stop them after the first blocks).
		for range 3 {
			h = &recordingHinter{}
			e = NewEngine(g, Options{Workers: 2, Mode: Dense, Hints: h, HintAhead: 8 << 10, HintGrain: 4 << 10})
			if _, err := RunPageRank(ctx, e, 1, 0.85); err != nil {
				t.Fatal(err)
			}
			var named int64
			for _, x := range mergeChunks(append([]fmap.Extent(nil), h.got...), 1) {
				named += x.Size
			}
			if named < last.Size*3/4 {
				t.Errorf("symmetric=%v: a dense step with a short look-ahead hinted %d of %d in-edge bytes", symmetric, named, last.Size)
			}
		}
	}
}

func TestMergeChunks(t *testing.T) {
	got := mergeChunks([]fmap.Extent{{Offset: 5000, Size: 10}, {Offset: 100, Size: 4000}, {Offset: 8192, Size: 1}, {Offset: 20000, Size: 1}}, 4096)
	want := []fmap.Extent{{Offset: 0, Size: 12288}, {Offset: 16384, Size: 4096}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

// fakeAdvisor counts the hints a MappingHinter sends.
type fakeAdvisor struct {
	mu    sync.Mutex
	bytes int64
	calls int
	err   error
}

func (f *fakeAdvisor) Advise(_ context.Context, a fmap.Advice) (fmap.AdviceResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	for _, e := range a.Hints {
		f.bytes += e.Size
		if e.Offset%4096 != 0 || e.Size%4096 != 0 {
			return fmap.AdviceResult{}, errors.New("unaligned hint")
		}
	}
	if len(a.Hints) > maxBatch {
		return fmap.AdviceResult{}, errors.New("batch too large")
	}
	return fmap.AdviceResult{Supported: true, Hinted: len(a.Hints)}, f.err
}

func TestMappingHinter(t *testing.T) {
	f := &fakeAdvisor{}
	h := NewMappingHinter(context.Background(), f, 4096)
	var sent int64
	for i := range 200 {
		// 2000 distinct chunks, 10 per call, every other chunk: no merging.
		var ext []fmap.Extent
		for j := range 10 {
			ext = append(ext, fmap.Extent{Offset: int64(i*10+j) * 8192, Size: 1})
		}
		sent += 10 * 4096
		h.Hint(ext)
	}
	st := h.Close()
	if st.Errors != 0 {
		t.Fatalf("errors: %+v", st)
	}
	if int64(st.Bytes) != f.bytes || f.bytes+int64(st.Dropped)*10*4096 != sent {
		t.Errorf("stats %+v, advisor got %d bytes, %d sent: hints lost without being counted as dropped", st, f.bytes, sent)
	}
	if st.Started != st.Extents || st.Batches != uint64(f.calls) {
		t.Errorf("stats %+v against %d calls", st, f.calls)
	}
}

// TestHintAfterClose: an engine may still hint after its MappingHinter was
// closed (a run cut short, a caller closing early). Before, Hint sent on the
// closed queue and panicked; now it drops the hint, counted, and a second
// Close returns the same counters.
func TestHintAfterClose(t *testing.T) {
	f := &fakeAdvisor{}
	h := NewMappingHinter(context.Background(), f, 4096)
	h.Hint([]fmap.Extent{{Offset: 0, Size: 1}})
	st := h.Close()
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("Hint after Close panicked: %v", r)
			}
		}()
		h.Hint([]fmap.Extent{{Offset: 8192, Size: 1}})
	}()
	again := h.Close()
	if again.Dropped != st.Dropped+1 || again.Extents != st.Extents || again.Bytes != st.Bytes {
		t.Errorf("after Close and one more Hint: %+v, want %+v with one more dropped and nothing sent", again, st)
	}

	// Hints racing Close: each is sent or counted as dropped, none panics
	// (go test -race checks the ordering).
	h = NewMappingHinter(context.Background(), f, 4096)
	var wg sync.WaitGroup
	const workers, each = 4, 200
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				h.Hint([]fmap.Extent{{Offset: int64(w*each+i) * 8192, Size: 1}})
			}
		})
	}
	h.Close()
	wg.Wait()
	st = h.Stats()
	if st.Extents+st.Dropped != workers*each {
		t.Errorf("hints racing Close: %+v; want %d sent or dropped", st, workers*each)
	}
}

// TestHintRunsBeforeCaller: with one P, Hint lets the hinter take the
// queue and call Advise before it returns, so a caller that then holds the
// P (a worker faulting on what it hinted keeps it in the kernel) does not
// delay its hints to its next preemption. Before, Hint returned at once and
// the Advise came only when the caller gave the P up.
func TestHintRunsBeforeCaller(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	f := &fakeAdvisor{}
	h := NewMappingHinter(context.Background(), f, 4096)
	for i := range 100 {
		h.Hint([]fmap.Extent{{Offset: int64(i) * 8192, Size: 1}})
		// No yield between Hint and this check: the caller keeps the P.
		// Taken is what Hint waits for; the hinter goes on to Advise
		// without yielding, so that has been called too unless the
		// hinter was preempted in between (10 ms of wall time on a busy
		// machine), which only the count after Close below allows for.
		if taken := h.taken.Load(); taken < uint64(i+1) {
			t.Fatalf("hint %d: the hinter had taken %d when Hint returned, want %d", i, taken, i+1)
		}
	}
	if st := h.Close(); st.Batches == 0 || int(st.Batches) != f.calls || st.Dropped != 0 {
		t.Errorf("after Close: %+v, %d Advise calls; want every hint sent, none dropped", st, f.calls)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.bytes != 100*4096 {
		t.Errorf("advisor got %d bytes, want %d", f.bytes, 100*4096)
	}
}
