package agent

import (
	"bytes"
	"context"
	"errors"
	"sync"
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
	ch := make(chan inferred, 1)
	go func() {
		res, err := a.Infer(ctx, &ingest.Request{Model: "checksum", Input: in})
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
		{"deadline while queued", true, 50 * time.Millisecond, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, w := heldRig(t)
			ctx, cancel := context.WithCancel(context.Background())
			if tc.timeout > 0 {
				ctx, cancel = context.WithTimeout(context.Background(), tc.timeout)
			}
			defer cancel()
			first := goInfer(context.Background(), r.agent, randomBytes(1, 4096))
			if !tc.queued {
				first = goInfer(ctx, r.agent, randomBytes(1, 4096))
			}
			<-w.started
			mine := first
			if tc.queued {
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
