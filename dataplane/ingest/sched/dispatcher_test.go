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
	late := &Request{ID: 4, Profile: "7g.80gb", Duration: time.Second, Deadline: time.Hour}
	if _, err := d.Arrive(11*time.Second, []*Request{{ID: 5, Profile: "7g.80gb", Duration: time.Minute},
		{ID: 6, Profile: "7g.80gb", Duration: time.Minute}, late}, placed); err != nil {
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
