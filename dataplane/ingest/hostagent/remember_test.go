package hostagent

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
)

// TestRememberedAnswers: a doorbell rung again (its completion lost) is
// answered from memory, never run again, however many other doorbells
// finish before it comes back within the DPU's re-ring window: refusals
// that ran nothing take no remembered answer, and answers are kept by age,
// not only by count.
func TestRememberedAnswers(t *testing.T) {
	const fill = 4096 // what the agent once kept, whatever their age
	first := func(t *testing.T, r *extRig) ingest.Ctrl {
		t.Helper()
		c := r.run(0, "checksum", []byte("the request whose completion is lost"))
		if c.Status != ingest.StatusOK {
			t.Fatalf("request %d: %s %q", c.Request, c.Status, c.Text)
		}
		return c
	}
	again := func(t *testing.T, r *extRig, c ingest.Ctrl, n int) {
		t.Helper()
		r.send(ingest.Ctrl{Op: ingest.OpDoorbell, Epoch: r.agent.Epoch(), Request: c.Request, Slot: 0,
			Length: uint32(len("the request whose completion is lost")), Text: "checksum"})
		if got := r.complete(c.Request); got.Status != c.Status || got.Length != c.Length {
			t.Fatalf("rung again: %+v, want %+v", got, c)
		}
		if s := r.agent.Stats(); s.Completed != uint64(n) || s.Repeats != 1 {
			t.Fatalf("completed %d, repeats %d: want %d and 1 (the model ran again)", s.Completed, s.Repeats, n)
		}
	}
	t.Run("refusals", func(t *testing.T) {
		r := newExtRig(t, nil)
		c := first(t, r)
		for range fill {
			r.mu.Lock()
			r.ids++
			id := r.ids
			r.mu.Unlock()
			r.send(ingest.Ctrl{Op: ingest.OpDoorbell, Epoch: r.agent.Epoch(), Request: id, GPU: 7, Length: 1, Text: "checksum"})
			wantFailure(t, r.complete(id), ingest.StatusBadRequest, "GPU 7")
		}
		again(t, r, c, 1)
	})
	t.Run("completions", func(t *testing.T) {
		r := newExtRig(t, nil)
		c := first(t, r)
		for i := range fill + 1 {
			if d := r.run(i%2, "checksum", []byte{byte(i), byte(i >> 8)}); d.Status != ingest.StatusOK {
				t.Fatalf("request %d: %s %q", d.Request, d.Status, d.Text)
			}
		}
		again(t, r, c, fill+2)
	})
}

// stepClock is a host agent's clock that moves only when read, by step
// (the agent reads it when a doorbell comes and when its run ends, so a
// run takes step), or when the test moves it on.
type stepClock struct {
	mu   sync.Mutex
	t    time.Time
	step time.Duration
}

func (c *stepClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(c.step)
	return c.t
}

func (c *stepClock) set(step, advance time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.step, c.t = step, c.t.Add(advance)
}

// TestRememberedSlowRuns: a slow run's answer is kept as long as the DPU
// keeps ringing for it (32 times its run time), past the 30 s a fast
// one's is kept, and a fast run of a model the DPU estimates slow (its
// average of the run times) is kept for that estimate; beyond the bound
// the answer soonest to expire goes first, not the slow one that finished
// first. Before, every answer went 30 s after it finished, so a model
// slower than about 1.5 s, whose doorbell the DPU rings again for 16 run
// times, ran twice.
func TestRememberedSlowRuns(t *testing.T) {
	clk := &stepClock{t: time.Unix(1_000_000, 0)}
	r := newExtRig(t, func(c *Config) { c.now, c.rememberMax = clk.now, 3 })
	run := func(slot int, took time.Duration) ingest.Ctrl {
		t.Helper()
		clk.set(took, 0)
		c := r.run(slot, "checksum", []byte{byte(slot), 1, 2, 3})
		if c.Status != ingest.StatusOK || c.DeviceUs != uint32(took.Microseconds()) {
			t.Fatalf("request %d: %s %q in %d us, want ok in %v", c.Request, c.Status, c.Text, c.DeviceUs, took)
		}
		return c
	}
	// ran rings c's doorbell again and says whether the model ran again
	// (its answer was forgotten) rather than being answered from memory.
	ran := func(c ingest.Ctrl) bool {
		t.Helper()
		before := r.agent.Stats().Completed
		r.send(ingest.Ctrl{Op: ingest.OpDoorbell, Epoch: r.agent.Epoch(), Request: c.Request, Slot: c.Slot, Length: 4, Text: "checksum"})
		if got := r.complete(c.Request); got.Status != ingest.StatusOK || got.Length != c.Length {
			t.Fatalf("request %d rung again: %+v, want %+v", c.Request, got, c)
		}
		return r.agent.Stats().Completed != before
	}
	fast := run(0, time.Millisecond)
	slow := run(1, 10*time.Second) // kept 320 s
	// The DPU's estimate is now (7*1 ms + 10 s)/8, 1.25 s: it rings
	// again for 20 s, and the next fast run is kept 32 times 1.09 s.
	after := run(0, time.Millisecond)
	clk.set(0, 33*time.Second)
	for _, c := range []struct {
		name string
		c    ingest.Ctrl
		ran  bool
	}{
		{"slow run, 33 s on", slow, false},
		{"fast run after the slow one, 33 s on", after, false},
		{"fast run, 33 s on", fast, true}, // kept 30 s; its new answer ~30.6 s
	} {
		if got := ran(c.c); got != c.ran {
			t.Fatalf("%s: the model ran again: %v, want %v", c.name, got, c.ran)
		}
	}
	// Kept now: slow (287 s left), after (2 s left), fast's new answer
	// (30.6 s left), the bound. One more answer (30 s) pushes out the one
	// soonest to expire: after's, not slow's, the oldest.
	more := run(1, 0)
	for _, c := range []struct {
		name string
		c    ingest.Ctrl
		ran  bool
	}{
		{"slow run, beyond the bound", slow, false},
		{"the newest run, beyond the bound", more, false},
		{"the answer soonest to expire, beyond the bound", after, true},
	} {
		if got := ran(c.c); got != c.ran {
			t.Fatalf("%s: the model ran again: %v, want %v", c.name, got, c.ran)
		}
	}
	r.agent.mu.Lock()
	n := len(r.agent.done)
	r.agent.mu.Unlock()
	if n > 3 {
		t.Fatalf("%d answers kept, want at most 3", n)
	}
}

// TestRunTimeFromCompletedRuns: the agent's copy of the DPU's run-time
// estimate, which sets how long answers are kept, moves only with runs
// that completed, as the DPU's does (dataplane/ingest/agent learns from
// completed runs only); before, a failed run's few microseconds pulled it
// down, so a slow model's later answers could go before the DPU stopped
// ringing for them.
func TestRunTimeFromCompletedRuns(t *testing.T) {
	clk := &stepClock{t: time.Unix(1_000_000, 0)}
	r := newExtRig(t, func(c *Config) { c.now = clk.now })
	a := r.agent
	c := ingest.Ctrl{Op: ingest.OpDoorbell, Request: 1, Text: "checksum"}
	a.mu.Lock()
	defer a.mu.Unlock()
	start := clk.now()
	clk.set(0, 8*time.Second)
	a.finishLocked(c, start, 4, nil, true)
	if got := a.runTime["checksum"]; got != 8*time.Second {
		t.Fatalf("estimate after one 8 s run: %v", got)
	}
	c.Request = 2
	a.finishLocked(c, clk.now(), 0, errors.New("the worker failed"), true)
	if got := a.runTime["checksum"]; got != 8*time.Second {
		t.Errorf("estimate after a failed run: %v, want 8s (unchanged)", got)
	}
	for _, e := range a.doneLog {
		if e.request == 2 && e.expires.Sub(e.at) != rememberRuns*8*time.Second {
			t.Errorf("the failed run's answer is kept %v, want %v (the model's estimate)", e.expires.Sub(e.at), rememberRuns*8*time.Second)
		}
	}
}

// TestGivenUpDoorbell: a doorbell the DPU marks as given up
// (ingest.FlagGivenUp) is answered as any doorbell rung again while the
// agent runs or remembers its request, and otherwise is answered released
// at once, with nothing run and the slot left free; the answer is
// remembered, so the request's own first ring arriving late runs nothing
// either. An unmarked doorbell the agent has no record of (its first ring
// was lost) still runs. Before, a marked doorbell for a request whose
// answer had expired ran the model again, its output read by nobody.
func TestGivenUpDoorbell(t *testing.T) {
	input := []byte("a request its DPU gave up on")
	for _, tc := range []struct {
		name string
		// before runs (or starts) the request and returns its number.
		before func(t *testing.T, r *extRig, clk *stepClock) uint64
		// flags are the doorbell's rung for it afterwards.
		flags ingest.CtrlFlags
		// want is the answer: OpComplete with status, or OpRunning.
		op     ingest.CtrlOp
		status ingest.Status
		// ran and released are the agent's runs and releases after.
		ran, released uint64
		slotFree      bool
	}{
		{"forgotten", func(t *testing.T, r *extRig, clk *stepClock) uint64 {
			c := r.run(0, "checksum", input)
			clk.set(0, rememberFor+time.Second)
			return c.Request
		}, ingest.FlagGivenUp, ingest.OpComplete, ingest.StatusReleased, 1, 1, true},
		{"never rung before", func(t *testing.T, r *extRig, clk *stepClock) uint64 {
			return 1 << 40 // a number the rig never rings
		}, ingest.FlagGivenUp, ingest.OpComplete, ingest.StatusReleased, 0, 1, true},
		{"remembered", func(t *testing.T, r *extRig, clk *stepClock) uint64 {
			return r.run(0, "checksum", input).Request
		}, ingest.FlagGivenUp, ingest.OpComplete, ingest.StatusOK, 1, 0, true},
		{"running", func(t *testing.T, r *extRig, clk *stepClock) uint64 {
			// No worker serves "idle": the run waits for one (WorkerWait).
			return r.ring(0, "idle", input)
		}, ingest.FlagGivenUp, ingest.OpRunning, 0, 0, 0, false},
		{"forgotten, not given up (a lost first ring)", func(t *testing.T, r *extRig, clk *stepClock) uint64 {
			c := r.run(0, "checksum", input)
			clk.set(0, rememberFor+time.Second)
			return c.Request
		}, 0, ingest.OpComplete, ingest.StatusOK, 2, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &stepClock{t: time.Unix(1_000_000, 0)}
			r := newExtRig(t, func(c *Config) { c.now, c.WorkerWait = clk.now, 10*time.Second })
			id := tc.before(t, r, clk)
			mdl := "checksum"
			if tc.op == ingest.OpRunning {
				mdl = "idle"
			}
			r.send(ingest.Ctrl{Op: ingest.OpDoorbell, Flags: tc.flags, Epoch: r.agent.Epoch(), Request: id, Slot: 0, Length: uint32(len(input)), Text: mdl})
			got := r.next(func(c ingest.Ctrl) bool {
				return c.Request == id && (c.Op == ingest.OpRunning || c.Op == ingest.OpComplete)
			})
			if got.Op != tc.op || (got.Op == ingest.OpComplete && got.Status != tc.status) {
				t.Fatalf("answer %s %s %q, want %s %s", got.Op, got.Status, got.Text, tc.op, tc.status)
			}
			if s := r.agent.Stats(); s.Completed != tc.ran || s.ReleasedUnrun != tc.released {
				t.Errorf("ran %d, released unrun %d; want %d, %d", s.Completed, s.ReleasedUnrun, tc.ran, tc.released)
			}
			if busy := r.agent.gpus[0].slots[0].busy.Load(); busy == tc.slotFree {
				t.Errorf("slot 0 busy %v, want %v", busy, !tc.slotFree)
			}
			if tc.status != ingest.StatusReleased {
				return
			}
			// The request's own first ring, late: answered released from
			// memory, nothing run.
			r.send(ingest.Ctrl{Op: ingest.OpDoorbell, Epoch: r.agent.Epoch(), Request: id, Slot: 0, Length: uint32(len(input)), Text: mdl})
			if got := r.complete(id); got.Status != ingest.StatusReleased {
				t.Fatalf("late first ring after the release: %s %q, want released", got.Status, got.Text)
			}
			if s := r.agent.Stats(); s.Completed != tc.ran || s.Repeats != 1 {
				t.Errorf("after the late first ring: ran %d, repeats %d; want %d, 1", s.Completed, s.Repeats, tc.ran)
			}
		})
	}
}
