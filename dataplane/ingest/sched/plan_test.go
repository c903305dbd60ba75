package sched

import (
	"testing"
	"time"
)

// TestWindowPlansOptimally: requests released together are planned exactly,
// so Lovelock's schedule matches the optimum except where the node budget ran
// out (bench-sched measures 0.1 % on 1000 such instances); it stays valid
// (Run checks it with Cost) and never below the optimum.
func TestWindowPlansOptimally(t *testing.T) {
	ins := smallInstances(t, 150, GenOptions{Card: "H100-80GB", Jobs: 6, GPUs: 3, Releases: 0, MaxDur: 4, MaxSlack: 4}, 7)
	var sumGap float64
	var plans PlanStats
	for k, in := range ins {
		opt, _, err := Solve(&in, 0)
		if err != nil {
			t.Fatalf("instance %d: %v", k, err)
		}
		h, _, res, err := in.Run(Config{Policy: Lovelock}, SimOptions{})
		if err != nil {
			t.Fatalf("instance %d: %v", k, err)
		}
		if h < opt {
			t.Fatalf("instance %d: lovelock costs %d, below the optimum %d\n%+v", k, h, opt, in.Jobs)
		}
		sumGap += float64(h-opt) / float64(opt)
		plans.Plans += res.Plans.Plans
		plans.OverNodes += res.Plans.OverNodes
	}
	if plans.Plans+plans.OverNodes != len(ins) {
		t.Fatalf("%d windows planned, %d over budget; want one window per instance, %d", plans.Plans, plans.OverNodes, len(ins))
	}
	if mean := sumGap / float64(len(ins)); mean > 0.02 {
		t.Fatalf("windowed mean gap %.1f%% over %d instances, measured 0.1%% on 1000", 100*mean, len(ins))
	}
	t.Logf("windowed mean gap %.2f%%, %d planned, %d over budget", 100*sumGap/float64(len(ins)), plans.Plans, plans.OverNodes)
}

// TestWindowOverBudget: a window whose plan runs out of nodes is left to the
// heuristic, which places it as it would without the planner.
func TestWindowOverBudget(t *testing.T) {
	ins := smallInstances(t, 40, GenOptions{Card: "H100-80GB", Jobs: 6, GPUs: 3, Releases: 2, MaxDur: 4, MaxSlack: 4}, 8)
	for k, in := range ins {
		h, _, _, err := in.Run(Config{Policy: Lovelock, Window: Window{Requests: -1}}, SimOptions{})
		if err != nil {
			t.Fatalf("instance %d: %v", k, err)
		}
		w, _, res, err := in.Run(Config{Policy: Lovelock, Window: Window{Nodes: 1}}, SimOptions{})
		if err != nil {
			t.Fatalf("instance %d: %v", k, err)
		}
		if res.Plans.Plans != 0 || w != h {
			t.Fatalf("instance %d: budget of 1 node: %d plans, cost %d; heuristic alone %d", k, res.Plans.Plans, w, h)
		}
	}
}

// TestSolveFragOrder: trying slots least fragmenting first changes which
// optimum is found, never its cost, also with running work.
func TestSolveFragOrder(t *testing.T) {
	s, err := New(Config{Policy: Lovelock, Fleet: []Fleet{{"H100-80GB", 1}}})
	if err != nil {
		t.Fatal(err)
	}
	ins := smallInstances(t, 60, GenOptions{Card: "H100-80GB", Jobs: 5, GPUs: 3, Releases: 3, MaxDur: 4, MaxSlack: 3, Open: 1}, 9)
	for k, in := range ins {
		a, _, err := Solve(&in, 0)
		if err != nil {
			t.Fatal(err)
		}
		b, sched, _, err := solve(&in, 0, &s.cards[0].frag)
		if err != nil {
			t.Fatal(err)
		}
		if c, err := in.Cost(sched); a != b || c != b || err != nil {
			t.Fatalf("instance %d: slot order %d, fragmentation order %d (schedule costs %d, %v)", k, a, b, c, err)
		}
	}
}

// TestWindowWaitsOnRunningWork drives a Dispatcher by hand: two requests
// arriving together while a whole GPU is busy are planned to wait for it
// (their deadlines allow) rather than open the second GPU, and start when it
// frees; a planned request can be withdrawn.
func TestWindowWaitsOnRunningWork(t *testing.T) {
	d, err := NewDispatcher(Config{Policy: Lovelock, Fleet: []Fleet{{"H100-80GB", 2}}})
	if err != nil {
		t.Fatal(err)
	}
	var got []Placed
	placed := func(p Placed) { got = append(got, p) }
	if _, err := d.Arrive(0, []*Request{{ID: 1, Profile: "7g.80gb", Duration: 10 * time.Second}}, placed); err != nil {
		t.Fatal(err)
	}
	batch := []*Request{
		{ID: 2, Profile: "3g.40gb", Arrival: time.Second, Duration: 5 * time.Second, Deadline: 20 * time.Second},
		{ID: 3, Profile: "3g.40gb", Arrival: time.Second, Duration: 5 * time.Second, Deadline: 20 * time.Second},
		{ID: 4, Profile: "3g.40gb", Arrival: time.Second, Duration: 5 * time.Second, Deadline: time.Minute},
	}
	if _, err := d.Arrive(time.Second, batch, placed); err != nil {
		t.Fatal(err)
	}
	if p := d.Scheduler().Plans(); p.Plans != 1 || len(got) != 1 || len(d.Queued()) != 3 {
		t.Fatalf("plans %+v, placed %d, queued %d; want one plan, all three waiting", p, len(got), len(d.Queued()))
	}
	for _, id := range []uint64{2, 3, 4} {
		if !d.Scheduler().Waiting(id) {
			t.Fatalf("request %d not waiting", id)
		}
	}
	if at, ok := d.Scheduler().ReservedAt(4); !ok || at != 15*time.Second {
		t.Fatalf("request 4 reserved at %v %v; want 15s, after one of the others", at, ok)
	}
	if !d.Withdraw(4) || d.Scheduler().Waiting(4) {
		t.Fatal("withdrawing planned request 4")
	}
	if err := d.Complete(10*time.Second, 1, placed); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || len(d.Queued()) != 0 {
		t.Fatalf("after the whole GPU frees: placed %d, queued %d; want 2 and 3 placed", len(got), len(d.Queued()))
	}
	for _, p := range got[1:] {
		if p.Assignment.GPU != 0 || p.Assignment.Start != 10*time.Second {
			t.Fatalf("request %d: %+v; want GPU 0 at 10s", p.Request.ID, p.Assignment)
		}
	}
	if d.Scheduler().InUse() != 1 {
		t.Fatalf("%d GPUs in use, want 1", d.Scheduler().InUse())
	}
}
