package agent

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
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

// TestGivenUpReleasedUnrun: a given-up request (its doorbell retries ran
// out, or its Infer caller cancelled) is rung on marked as given up; a
// host with no record of it (every doorbell was lost) answers released
// without running the model, and the slot goes to the waiting request,
// counted as released unrun on both sides. A request the host still runs
// when given up is answered running, its slot held until the run
// completes, as before; and a live request whose first doorbell was lost
// still runs. Before, the marked ring did not exist: the host, with no
// record of the given-up request, ran the model on the slot for nobody.
func TestGivenUpReleasedUnrun(t *testing.T) {
	partition := memnet.Faults{Drop: 1}
	for _, tc := range []struct {
		name string
		// slow: the first request runs the slow model and has started
		// when the DPU's doorbells begin to be lost; else they are lost
		// from the start.
		slow bool
		// cancel: the first request comes from Infer, whose caller
		// cancels it once its doorbell has been rung; else from a client.
		cancel  bool
		retries int
		// first is the client's answer (ok: it ran).
		first ingest.Status
		// hostRuns and released are the host's runs and both sides'
		// releases at the end (the waiting request's run included).
		hostRuns, released uint64
	}{
		{"doorbells lost, retries run out", false, false, 1, ingest.StatusHostUnavailable, 1, 1},
		{"doorbells lost, caller cancelled", false, true, 8, ingest.StatusOK, 1, 1},
		{"running when given up", true, false, 1, ingest.StatusHostUnavailable, 2, 0},
		{"first doorbell lost, request live", false, false, 8, ingest.StatusOK, 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			slow := newSlowModel()
			// Both models take the whole GPU, so both requests use slot 0.
			r := newRig(t, rigOptions{models: []ModelConfig{{Name: "slow", Profile: "7g.80gb"}, {Name: "checksum", Profile: "7g.80gb"}},
				hostModels: []*model.Model{slow.model()},
				tweak:      func(c *Config) { c.DoorbellRetries = tc.retries }})
			t.Cleanup(slow.finish) // before the rig stops: the host waits for its runs
			a, host := r.agent, r.host
			mdl := "checksum"
			if tc.slow {
				mdl = "slow"
			} else {
				r.net.SetFaults(dpuHostAddr, hostAddr, partition)
			}
			cl := r.client(0)
			in := randomBytes(1, 4096)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var first chan inferred
			if tc.cancel {
				first = goInferModel(ctx, a, mdl, in)
			} else {
				cl.send(cl.fragments(1, mdl, in, 0))
			}
			if tc.slow {
				select {
				case <-slow.started:
				case <-time.After(10 * time.Second):
					t.Fatal("the slow model never started")
				}
				r.net.SetFaults(dpuHostAddr, hostAddr, partition)
			}
			// The first request holds the slot before the second comes.
			for end := time.Now().Add(10 * time.Second); a.Stats().Doorbells == 0; time.Sleep(time.Millisecond) {
				if time.Now().After(end) {
					t.Fatal("the first request's doorbell was never rung")
				}
			}
			in2 := randomBytes(2, 4096)
			second := goInfer(context.Background(), a, in2)
			waitQueued(t, a, 1)
			heal := func() {
				// What was rung before is lost, not sent after the heal.
				r.hostQueueSent()
				r.net.SetFaults(dpuHostAddr, hostAddr, memnet.Faults{})
			}
			switch {
			case tc.cancel:
				cancel()
				if o := await(t, first, "cancelled request"); !errors.Is(o.err, context.Canceled) {
					t.Fatalf("cancelled request: %+v, %v; want canceled", o.res, o.err)
				}
				heal()
			case tc.first == ingest.StatusOK:
				heal()
				ans, err := cl.await(1, nil, time.Second, 20*time.Second)
				want := model.Checksum(in)
				if err != nil || ans.status != ingest.StatusOK || !bytes.Equal(ans.out, want[:]) {
					t.Fatalf("live request: %+v, %v; want checksum %x", ans, err, want)
				}
			default:
				ans, err := cl.await(1, nil, time.Second, 20*time.Second)
				if err != nil || ans.status != tc.first {
					t.Fatalf("given-up request: %+v, %v; want %s", ans, err, tc.first)
				}
				rep := host.Stats().Repeats
				heal()
				if tc.slow {
					// The marked ring reaches the host while it runs: it
					// answers running, and the slot stays held.
					for end := time.Now().Add(10 * time.Second); host.Stats().Repeats == rep; time.Sleep(time.Millisecond) {
						if time.Now().After(end) {
							t.Fatal("the host never heard the given-up request's doorbell again")
						}
					}
					if s := a.Stats(); s.SlotsHeld != 1 || s.HeldReleased != 0 {
						t.Fatalf("running when rung again: slots held %d, released unrun %d; want 1, 0", s.SlotsHeld, s.HeldReleased)
					}
					slow.finish()
				}
			}
			o := await(t, second, "waiting request")
			want := model.Checksum(in2)
			if o.err != nil || !bytes.Equal(o.res.Output, want[:]) {
				t.Fatalf("waiting request: %+v, %v; want checksum %x", o.res, o.err, want)
			}
			s, hs := a.Stats(), host.Stats()
			if s.SlotsHeld != 0 || s.InFlight != 0 || s.Queued != 0 {
				t.Errorf("after: slots held %d, in flight %d, queued %d; want 0, 0, 0", s.SlotsHeld, s.InFlight, s.Queued)
			}
			if hs.Completed != tc.hostRuns || s.HeldReleased != tc.released || hs.ReleasedUnrun != tc.released {
				t.Errorf("after: the host ran %d, released unrun %d (DPU), %d (host); want %d, %d, %d",
					hs.Completed, s.HeldReleased, hs.ReleasedUnrun, tc.hostRuns, tc.released, tc.released)
			}
			if want := map[bool]int32{true: 1}[tc.slow]; slow.runs.Load() != want {
				t.Errorf("the slow model ran %d times, want %d", slow.runs.Load(), want)
			}
		})
	}
}

// hostQueueSent waits until every datagram the agent has queued for the
// host so far has been sent (and met the link's faults): one queued after
// them on the same outbox arrives.
func (r *rig) hostQueueSent() {
	r.t.Helper()
	ep, err := r.net.Listen(netip.MustParseAddrPort("10.1.0.99:1"))
	if err != nil {
		r.t.Fatal(err)
	}
	defer ep.Close()
	r.agent.toHost.push(transport.Packet{Addr: ep.LocalAddr(), Data: []byte("sent after")})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ep.Recv(ctx, make([]transport.Packet, 1)); err != nil {
		r.t.Fatalf("the agent's queue to the host never drained: %v", err)
	}
}
