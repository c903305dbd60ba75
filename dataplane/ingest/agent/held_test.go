package agent

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/memnet"
)

// TestGivenUpSlotHeld: a request whose doorbells go unanswered until the
// retries run out is answered host-unavailable, but its slot is held (the
// host may still run the model on it) and the request waiting for the
// slot is not placed there, until the host answers for it: its completion
// arrives, a doorbell rung again brings the answer it remembers, it
// re-registers with a new epoch, or it is declared lost. Stats count the
// slot as held, neither free nor in flight.
func TestGivenUpSlotHeld(t *testing.T) {
	partition := memnet.Faults{Drop: 1}
	for _, tc := range []struct {
		name        string
		hostTimeout time.Duration
		// release makes the host answer for the held request; ok says the
		// waiting request then runs (else it fails as host-unavailable).
		release func(t *testing.T, r *rig, slow *slowModel)
		ok      bool
	}{
		{"completion", 30 * time.Second, func(t *testing.T, r *rig, slow *slowModel) {
			r.net.SetFaults(dpuHostAddr, hostAddr, memnet.Faults{})
			slow.finish()
		}, true},
		{"completion lost, rung again", 30 * time.Second, func(t *testing.T, r *rig, slow *slowModel) {
			r.net.SetFaults(hostAddr, dpuHostAddr, partition)
			slow.finish()
			for end := time.Now().Add(10 * time.Second); r.host.Stats().Completed != 1; time.Sleep(time.Millisecond) {
				if time.Now().After(end) {
					t.Fatal("the host never finished the slow run")
				}
			}
			r.net.SetFaults(hostAddr, dpuHostAddr, memnet.Faults{})
			r.net.SetFaults(dpuHostAddr, hostAddr, memnet.Faults{})
		}, true},
		{"re-registered", 30 * time.Second, func(t *testing.T, r *rig, slow *slowModel) {
			r.net.SetFaults(hostAddr, dpuHostAddr, partition)
			slow.finish()
			r.stopHost()
			r.net.SetFaults(hostAddr, dpuHostAddr, memnet.Faults{})
			r.net.SetFaults(dpuHostAddr, hostAddr, memnet.Faults{})
			r.startHost(0)
		}, true},
		{"host lost", time.Second, func(t *testing.T, r *rig, slow *slowModel) {
			r.net.SetFaults(hostAddr, dpuHostAddr, partition)
			slow.finish()
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			slow := newSlowModel()
			// Both models take the whole GPU, so both requests use slot 0.
			r := newRig(t, rigOptions{models: []ModelConfig{{Name: "slow", Profile: "7g.80gb"}, {Name: "checksum", Profile: "7g.80gb"}},
				hostModels: []*model.Model{slow.model()},
				tweak: func(c *Config) {
					c.DoorbellRetries = 1
					c.HostTimeout = tc.hostTimeout
				}})
			t.Cleanup(slow.finish) // before the rig stops: the host waits for its runs
			a := r.agent

			cl := r.client(0)
			cl.send(cl.fragments(1, "slow", randomBytes(1, 4096), 0))
			select {
			case <-slow.started:
			case <-time.After(10 * time.Second):
				t.Fatal("the slow model never started")
			}
			// The host runs the model but hears no more doorbells: the
			// DPU's retries run out.
			r.net.SetFaults(dpuHostAddr, hostAddr, partition)
			in := randomBytes(2, 4096)
			second := goInfer(context.Background(), a, in)
			waitQueued(t, a, 1)

			ans, err := cl.await(1, nil, time.Second, 20*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if ans.status != ingest.StatusHostUnavailable {
				t.Fatalf("given-up request: %v %q, want host-unavailable", ans.status, ans.text)
			}
			// The answer went out after the slot was (or was not) freed,
			// under the same lock: what Stats say now is what followed.
			if s := a.Stats(); s.Queued != 1 || s.SlotsHeld != 1 || s.InFlight != 1 || s.GPUsInUse["default"] != 1 {
				t.Errorf("given up: queued %d, slots held %d, in flight %d, GPUs in use %v; want 1, 1, 1 (the waiting request), 1",
					s.Queued, s.SlotsHeld, s.InFlight, s.GPUsInUse)
			}

			tc.release(t, r, slow)
			o := await(t, second, "waiting request")
			if tc.ok {
				want := model.Checksum(in)
				if o.err != nil || !bytes.Equal(o.res.Output, want[:]) {
					t.Fatalf("waiting request: %+v, %v; want checksum %x", o.res, o.err, want)
				}
			} else if ingest.StatusOf(o.err) != ingest.StatusHostUnavailable {
				t.Fatalf("waiting request: %+v, %v; want host-unavailable", o.res, o.err)
			}
			s := a.Stats()
			if s.SlotsHeld != 0 || s.InFlight != 0 || s.Queued != 0 {
				t.Errorf("after: slots held %d, in flight %d, queued %d; want 0, 0, 0", s.SlotsHeld, s.InFlight, s.Queued)
			}
			wantOK := uint64(0)
			if tc.ok {
				wantOK = 1
			}
			if s.Completed != wantOK || s.Refused["host-unavailable"] != 2-wantOK {
				t.Errorf("after: completed %d, refused %v; want %d completed (the waiting request), %d host-unavailable", s.Completed, s.Refused, wantOK, 2-wantOK)
			}
			if n := slow.runs.Load(); n != 1 {
				t.Errorf("the slow model ran %d times, want 1", n)
			}
		})
	}
}
