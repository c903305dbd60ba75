package sched

import (
	"errors"
	"testing"
	"time"
)

// TestDispatcherRequestPath drives a Dispatcher by hand as the ingest agent
// would: a request that must wait is placed when the work ahead completes,
// one that cannot wait goes on its latest start, unfit ones are refused.
func TestDispatcherRequestPath(t *testing.T) {
	d, err := NewDispatcher(Config{Policy: Lovelock, Fleet: []Fleet{{"H100-80GB", 2}}})
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	placed := func(p Placed) { got = append(got, p.Request.ID) }
	whole := &Request{ID: 1, Profile: "7g.80gb", Duration: 10 * time.Second}
	patient := &Request{ID: 2, Profile: "3g.40gb", Duration: 5 * time.Second, Deadline: time.Minute}
	unfit := &Request{ID: 3, Profile: "3g.20gb"} // an A100-40GB profile
	refused, err := d.Arrive(0, []*Request{whole, patient, unfit}, placed)
	if err != nil {
		t.Fatal(err)
	}
	if len(refused) != 1 || !errors.Is(refused[0], ErrUnfit) {
		t.Fatalf("refused %v, want request 3 as unfit", refused)
	}
	if len(got) != 1 || got[0] != 1 || len(d.Queued()) != 1 {
		t.Fatalf("placed %v, queued %d; want 1 placed, 2 waiting", got, len(d.Queued()))
	}
	if at, ok := d.NextTimer(); !ok || at != 55*time.Second {
		t.Fatalf("timer %v %v, want the patient request's latest start, 55s", at, ok)
	}
	if err := d.Complete(10*time.Second, 1, placed); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[1] != 2 || len(d.Queued()) != 0 {
		t.Fatalf("after the whole GPU frees: placed %v, queued %d", got, len(d.Queued()))
	}
	if _, ok := d.NextTimer(); ok {
		t.Fatal("a timer is left for a placed request")
	}

	// A waiting request withdrawn by its client leaves nothing behind.
	late := &Request{ID: 4, Profile: "7g.80gb", Arrival: 11 * time.Second, Duration: time.Second, Deadline: time.Hour}
	if _, err := d.Arrive(11*time.Second, []*Request{{ID: 5, Profile: "7g.80gb", Arrival: 11 * time.Second, Duration: time.Minute},
		{ID: 6, Profile: "7g.80gb", Arrival: 11 * time.Second, Duration: time.Minute}, late}, placed); err != nil {
		t.Fatal(err)
	}
	// 5 opens the second GPU; 6 and 4 queue behind the 3g on the first.
	if !d.Scheduler().Waiting(4) || len(d.Queued()) != 2 {
		t.Fatalf("before withdrawing: waiting %v, queued %d", d.Scheduler().Waiting(4), len(d.Queued()))
	}
	if !d.Withdraw(4) || d.Scheduler().Waiting(4) || len(d.Queued()) != 1 || d.Queued()[0].ID != 6 {
		t.Fatalf("withdraw: waiting %v, queued %d", d.Scheduler().Waiting(4), len(d.Queued()))
	}
	if d.Withdraw(4) {
		t.Fatal("withdrew request 4 twice")
	}
}

// TestStepDecidesAfterEverything: at 3 s a 3g.40gb completes and a 4g.40gb
// arrives while a 7g.80gb waits for the GPU. Complete, then Arrive, starts
// the 7g at once (it alone is known at the completion) and the 4g, due by
// 5 s, must open a second GPU; Step sees both and plans them together: the
// 4g from 3 s to 4 s, the 7g from 4 s, still by its deadline, on one GPU.
func TestStepDecidesAfterEverything(t *testing.T) {
	sec := func(n int) time.Duration { return time.Duration(n) * time.Second }
	for _, tc := range []struct {
		name string
		step bool
		gpus int // GPUs used
	}{
		{"complete then arrive", false, 2},
		{"step", true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := NewDispatcher(Config{Policy: Lovelock, Fleet: []Fleet{{"H100-80GB", 2}}})
			if err != nil {
				t.Fatal(err)
			}
			reqs := map[uint64]*Request{
				1: {ID: 1, Profile: "3g.40gb", Arrival: sec(1), Duration: sec(2), Deadline: sec(6)},
				2: {ID: 2, Profile: "7g.80gb", Arrival: sec(2), Duration: sec(3), Deadline: sec(7)},
				3: {ID: 3, Profile: "4g.40gb", Arrival: sec(3), Duration: sec(1), Deadline: sec(6)},
			}
			got := map[uint64]Assignment{}
			placed := func(p Placed) { got[p.Request.ID] = p.Assignment }
			for now := sec(1); now <= sec(10); now += time.Second {
				var done []uint64
				for id, a := range got {
					if a.End == now {
						done = append(done, id)
					}
				}
				var batch []*Request
				for _, r := range reqs {
					if r.Arrival == now {
						batch = append(batch, r)
					}
				}
				if tc.step {
					if _, err := d.Step(now, done, batch, placed); err != nil {
						t.Fatal(err)
					}
					continue
				}
				for _, id := range done {
					if err := d.Complete(now, id, placed); err != nil {
						t.Fatal(err)
					}
				}
				if err := d.Tick(now, placed); err != nil {
					t.Fatal(err)
				}
				if _, err := d.Arrive(now, batch, placed); err != nil {
					t.Fatal(err)
				}
			}
			used := map[int]bool{}
			for id, r := range reqs {
				a, ok := got[id]
				if !ok {
					t.Fatalf("request %d never placed", id)
				}
				if a.End > r.Deadline {
					t.Errorf("request %d ends %v, after its deadline %v", id, a.End, r.Deadline)
				}
				used[a.GPU] = true
			}
			if len(used) != tc.gpus {
				t.Errorf("%d GPUs used, want %d (%v)", len(used), tc.gpus, got)
			}
			if tc.step && (got[3].Start != sec(3) || got[2].Start != sec(4)) {
				t.Errorf("4g at %v, 7g at %v; want 3s and 4s", got[3].Start, got[2].Start)
			}
		})
	}
}
