package agent

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
)

// heldWrites is an importer whose first write into a slot waits until the
// test lets it go: a slow DMA. It notes a write into a buffer another
// write is still copying into.
type heldWrites struct {
	devmem.ShmImporter
	hold    chan struct{} // closed: the first write goes on
	started chan struct{} // closed when the first write began

	once    sync.Once
	mu      sync.Mutex
	first   bool
	busy    map[devmem.Mapping]int
	overlap bool
}

func newHeldWrites() *heldWrites {
	return &heldWrites{hold: make(chan struct{}), started: make(chan struct{}), busy: map[devmem.Mapping]int{}}
}

func (w *heldWrites) Import(h devmem.Handle) (devmem.Mapping, error) {
	m, err := w.ShmImporter.Import(h)
	if err != nil {
		return nil, err
	}
	return heldMapping{m, w}, nil
}

type heldMapping struct {
	devmem.Mapping
	w *heldWrites
}

func (m heldMapping) WriteAt(p []byte, off int) error {
	w := m.w
	w.mu.Lock()
	w.busy[m.Mapping]++
	w.overlap = w.overlap || w.busy[m.Mapping] > 1
	first := !w.first
	w.first = true
	w.mu.Unlock()
	if first {
		close(w.started)
		<-w.hold
	}
	err := m.Mapping.WriteAt(p, off)
	w.mu.Lock()
	w.busy[m.Mapping]--
	w.mu.Unlock()
	return err
}

// release lets the held write go on.
func (w *heldWrites) release() { w.once.Do(func() { close(w.hold) }) }

func (w *heldWrites) overlapped() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.overlap
}

// heldRig is a rig of one GPU whose requests each take the whole GPU, so
// that they share slot 0 one after the other, and whose first write is
// held.
func heldRig(t *testing.T) (*rig, *heldWrites) {
	w := newHeldWrites()
	r := newRig(t, rigOptions{models: []ModelConfig{{Name: "checksum", Profile: "7g.80gb"}},
		tweak: func(c *Config) { c.Importer = w }})
	t.Cleanup(w.release) // before the rig stops: unmapping waits for the write
	return r, w
}

type inferred struct {
	res *ingest.Result
	err error
}

func goInfer(ctx context.Context, a *Agent, in []byte) chan inferred {
	return goInferModel(ctx, a, "checksum", in)
}

func goInferModel(ctx context.Context, a *Agent, mdl string, in []byte) chan inferred {
	ch := make(chan inferred, 1)
	go func() {
		res, err := a.Infer(ctx, &ingest.Request{Model: mdl, Input: in})
		ch <- inferred{res, err}
	}()
	return ch
}

func waitQueued(t *testing.T, a *Agent, n int) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); a.Stats().Queued != n; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("never %d queued: %+v", n, a.Stats())
		}
	}
}

func await(t *testing.T, ch chan inferred, what string) inferred {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no answer", what)
		return inferred{}
	}
}

// TestAbandonedSlotKept: a caller that gives up while its input is being
// written into a slot is answered at once, but the slot stays its
// request's until the write ended; the request waiting for the slot then
// runs on it alone, with the right output.
func TestAbandonedSlotKept(t *testing.T) {
	r, w := heldRig(t)
	ctx, cancel := context.WithCancel(context.Background())
	first := goInfer(ctx, r.agent, randomBytes(1, 64<<10))
	<-w.started
	in := randomBytes(2, 64<<10)
	second := goInfer(context.Background(), r.agent, in)
	waitQueued(t, r.agent, 1)
	cancel()
	if o := await(t, first, "canceled request"); o.err == nil {
		t.Errorf("canceled request: result %+v, want an error", o.res)
	}
	// The slot is still being written: nothing may start on it.
	time.Sleep(100 * time.Millisecond)
	if w.overlapped() || r.agent.Stats().Queued != 1 {
		t.Errorf("the waiting request started on the slot while the canceled one's write still ran (queued %d)", r.agent.Stats().Queued)
	}
	w.release()
	o := await(t, second, "waiting request")
	want := model.Checksum(in)
	if o.err != nil || !bytes.Equal(o.res.Output, want[:]) {
		t.Fatalf("waiting request: %v, want checksum %x", o.err, want)
	}
	if w.overlapped() {
		t.Error("two writes into one slot at once")
	}
	if s := r.agent.Stats(); s.InFlight != 0 || s.BufferBytes != 0 || s.Completed != 1 {
		t.Errorf("in flight %d, buffered %d, completed %d; want 0, 0, 1", s.InFlight, s.BufferBytes, s.Completed)
	}
}

// TestOutcomeCountedOnce: a request failed twice (a timer and a
// goroutine of the agent racing) is answered and counted once, under the
// first failure's status.
func TestOutcomeCountedOnce(t *testing.T) {
	r := newRig(t, rigOptions{})
	a := r.agent
	deadline := ingest.Errorf(ingest.StatusDeadline, "deadline passed")
	gone := ingest.Errorf(ingest.StatusHostUnavailable, "host gone")
	for i, tc := range []struct {
		name string
		errs []error
		want map[string]uint64
	}{
		{"deadline twice", []error{deadline, deadline}, map[string]uint64{"deadline": 1}},
		{"deadline, then host gone", []error{deadline, gone}, map[string]uint64{"deadline": 1}},
		{"host gone, then deadline", []error{gone, deadline}, map[string]uint64{"host-unavailable": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := a.Stats().Refused
			a.mu.Lock()
			req := &request{key: reqKey{id: uint64(i)}, seq: uint64(i), model: a.models["checksum"], done: make(chan *outcome, len(tc.errs))}
			a.reqs[req.key], a.bySeq[req.seq] = req, req
			for _, err := range tc.errs {
				a.failLocked(req, err)
			}
			a.mu.Unlock()
			after := a.Stats().Refused
			for k, v := range tc.want {
				if got := after[k] - before[k]; got != v {
					t.Errorf("%s counted %d times, want %d", k, got, v)
				}
			}
			for k := range after {
				if _, ok := tc.want[k]; !ok && after[k] != before[k] {
					t.Errorf("%s counted %d times, want 0", k, after[k]-before[k])
				}
			}
			if n := len(req.done); n != 1 {
				t.Errorf("answered %d times, want 1", n)
			}
		})
	}
}

// TestCanceledIsNotDeadline: an Infer caller that cancels is counted as
// canceled, not as a deadline refusal, whether its request waited for a
// slice or was being written; one whose deadline passes is a deadline.
func TestCanceledIsNotDeadline(t *testing.T) {
	for _, tc := range []struct {
		name     string
		queued   bool          // the second request, queued behind a held write, is the one given up
		timeout  time.Duration // the caller's deadline; 0: it cancels
		deadline uint64
	}{
		{"canceled while written", false, 0, 0},
		{"canceled while queued", true, 0, 0},
		{"deadline while queued", true, time.Second, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, w := heldRig(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			first := goInfer(context.Background(), r.agent, randomBytes(1, 4096))
			if !tc.queued {
				first = goInfer(ctx, r.agent, randomBytes(1, 4096))
			}
			<-w.started
			mine := first
			if tc.queued {
				if tc.timeout > 0 {
					// From here: the deadline must not pass before the
					// request is queued, however slow the machine.
					var stop context.CancelFunc
					ctx, stop = context.WithTimeout(context.Background(), tc.timeout)
					defer stop()
				}
				mine = goInfer(ctx, r.agent, randomBytes(2, 4096))
				waitQueued(t, r.agent, 1)
			}
			if tc.timeout == 0 {
				cancel()
			}
			o := await(t, mine, "request given up")
			switch {
			case tc.timeout == 0 && !errors.Is(o.err, context.Canceled):
				t.Errorf("canceled: %v, want an error wrapping context.Canceled", o.err)
			case tc.timeout > 0 && ingest.StatusOf(o.err) != ingest.StatusDeadline:
				t.Errorf("deadline passed: %v, want status deadline", o.err)
			}
			s := r.agent.Stats()
			if s.Refused["deadline"] != tc.deadline || s.Canceled != 1-tc.deadline {
				t.Errorf("deadline refusals %d, canceled %d; want %d, %d (refused %v)", s.Refused["deadline"], s.Canceled, tc.deadline, 1-tc.deadline, s.Refused)
			}
		})
	}
}

// slowModel is a model only the tests' host agent runs: the checksum, but
// each run says it started and then waits until the test lets it end, as
// a model that runs longer than its caller waits.
type slowModel struct {
	started chan struct{} // closed when the first run began
	release chan struct{} // closed: runs end
	runs    atomic.Int32
	once    sync.Once
}

func newSlowModel() *slowModel {
	return &slowModel{started: make(chan struct{}), release: make(chan struct{})}
}

func (s *slowModel) model() *model.Model {
	ck, _ := model.Builtin("checksum")
	return &model.Model{Name: "slow", Doc: "the checksum, as slow as the test says", Multiple: 1, OutputSize: ck.OutputSize,
		Reference: func(in, out []byte) int {
			if s.runs.Add(1) == 1 {
				close(s.started)
			}
			<-s.release
			return ck.Reference(in, out)
		}}
}

// finish lets every run end.
func (s *slowModel) finish() { s.once.Do(func() { close(s.release) }) }

// TestGiveUpWhileRunning: an Infer caller whose deadline passes, or who
// cancels, while the GPU host still runs its model is answered at once
// (deadline, or canceled), counted once; its slot stays reserved for as
// long as the run goes on (a request waiting for it is not placed, the
// host is never rung for a busy slot); the run's late completion is
// neither delivered nor counted, as a result or as a protocol error; and
// the slot then goes to the waiting request.
func TestGiveUpWhileRunning(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration // the caller's deadline; 0: it cancels
	}{
		{"deadline", time.Second},
		{"canceled", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			slow := newSlowModel()
			// Both models take the whole GPU, so both requests use slot 0.
			r := newRig(t, rigOptions{models: []ModelConfig{{Name: "slow", Profile: "7g.80gb"}, {Name: "checksum", Profile: "7g.80gb"}},
				hostModels: []*model.Model{slow.model()}})
			t.Cleanup(slow.finish) // before the rig stops: the host waits for its runs
			a := r.agent
			ctx, cancel := context.WithCancel(context.Background())
			if tc.timeout > 0 {
				ctx, cancel = context.WithTimeout(context.Background(), tc.timeout)
			}
			defer cancel()

			first := goInferModel(ctx, a, "slow", randomBytes(1, 4096))
			select {
			case <-slow.started:
			case o := <-first:
				t.Fatalf("the first request ended before its model ran: %+v, %v", o.res, o.err)
			case <-time.After(10 * time.Second):
				t.Fatal("the slow model never started")
			}
			in := randomBytes(2, 4096)
			second := goInfer(context.Background(), a, in)
			waitQueued(t, a, 1)

			if tc.timeout == 0 {
				cancel()
			}
			o := await(t, first, "request given up")
			switch {
			case o.err == nil:
				t.Fatalf("request given up: result %+v, want an error", o.res)
			case tc.timeout == 0 && !errors.Is(o.err, context.Canceled):
				t.Errorf("canceled: %v, want an error wrapping context.Canceled", o.err)
			case tc.timeout > 0 && ingest.StatusOf(o.err) != ingest.StatusDeadline:
				t.Errorf("deadline passed: %v, want status deadline", o.err)
			}
			var wantDeadline, wantCanceled uint64 = 1, 0
			if tc.timeout == 0 {
				wantDeadline, wantCanceled = 0, 1
			}
			counted := func(when string) {
				t.Helper()
				s := a.Stats()
				if s.Refused["deadline"] != wantDeadline || s.Canceled != wantCanceled || len(s.Refused) != int(wantDeadline) {
					t.Errorf("%s: refused %v, canceled %d; want deadline %d, canceled %d, nothing else", when, s.Refused, s.Canceled, wantDeadline, wantCanceled)
				}
				if s.ProtocolErrors != 0 || s.LateResults != 0 {
					t.Errorf("%s: %d host protocol errors, %d late results; want none", when, s.ProtocolErrors, s.LateResults)
				}
			}
			counted("answered")

			// The model still runs: for longer than the doorbell timeout,
			// which the DPU rings again on and the host answers "running".
			time.Sleep(4 * r.cfg.DoorbellTimeout)
			select {
			case o := <-second:
				t.Fatalf("the waiting request was answered while the first one's model still ran: %+v, %v", o.res, o.err)
			default:
			}
			if s := a.Stats(); s.Queued != 1 || s.InFlight != 1 || s.SlotsHeld != 1 || s.Completed != 0 || s.Rerings == 0 {
				t.Errorf("while the model runs: queued %d, in flight %d, slots held %d, completed %d, doorbells rung again %d; want 1, 1, 1, 0, > 0",
					s.Queued, s.InFlight, s.SlotsHeld, s.Completed, s.Rerings)
			}
			if hs := r.host.Stats(); hs.Completed != 0 || hs.Failed != 0 || hs.Repeats == 0 {
				t.Errorf("host while the model runs: completed %d, failed %d, repeated doorbells %d; want 0, 0, > 0", hs.Completed, hs.Failed, hs.Repeats)
			}
			counted("while the model runs")

			slow.finish()
			o = await(t, second, "waiting request")
			want := model.Checksum(in)
			if o.err != nil || !bytes.Equal(o.res.Output, want[:]) {
				t.Fatalf("waiting request: %+v, %v; want checksum %x", o.res, o.err, want)
			}
			if o.res.GPU != 0 || o.res.Slice != "7g.80gb@0" {
				t.Errorf("waiting request ran on GPU %d slice %s, want the first one's slot, GPU 0 7g.80gb@0", o.res.GPU, o.res.Slice)
			}
			select {
			case o := <-first:
				t.Errorf("the given-up request was answered again: %+v, %v", o.res, o.err)
			default:
			}
			s := a.Stats()
			if s.Completed != 1 || s.InFlight != 0 || s.SlotsHeld != 0 || s.Queued != 0 || s.BufferBytes != 0 {
				t.Errorf("after: completed %d, in flight %d, slots held %d, queued %d, buffered %d; want 1, 0, 0, 0, 0", s.Completed, s.InFlight, s.SlotsHeld, s.Queued, s.BufferBytes)
			}
			if hs := r.host.Stats(); hs.Completed != 2 || hs.Failed != 0 {
				t.Errorf("host after: completed %d, failed %d; want 2 (the slow run, then the waiting request), 0", hs.Completed, hs.Failed)
			}
			counted("after")
			if n := slow.runs.Load(); n != 1 {
				t.Errorf("the slow model ran %d times, want 1", n)
			}
		})
	}
}
