package sched

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func randomRequests(n int, seed uint64, slack float64) []Request {
	rng := rand.New(rand.NewPCG(seed, 3))
	profiles := []string{"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}
	rs := make([]Request, n)
	t := time.Duration(0)
	for i := range rs {
		t += time.Duration(rng.ExpFloat64() * float64(time.Second))
		d := time.Duration(1+rng.IntN(120)) * time.Second
		rs[i] = Request{ID: uint64(i + 1), Profile: profiles[rng.IntN(len(profiles))], Arrival: t, Duration: d}
		if slack > 0 {
			rs[i].Deadline = t + time.Duration(slack*float64(d))
		}
	}
	return rs
}

// TestSimulateServesEverything: on an overloaded fleet every request still
// runs in the end (none stuck behind a reservation), every GPU-hour is
// accounted for, and no policy beats the work's lower bound.
func TestSimulateServesEverything(t *testing.T) {
	reqs := randomRequests(3000, 1, 2)
	var work float64 // memory-slice hours / 8: no policy can use fewer GPU-hours
	for _, r := range reqs {
		slices := map[string]int{"1g.10gb": 1, "1g.20gb": 2, "2g.20gb": 2, "3g.40gb": 4, "4g.40gb": 4, "7g.80gb": 8}[r.Profile]
		work += float64(slices) / 8 * r.Duration.Hours()
	}
	for _, gpus := range []int{8, 200} {
		for _, p := range Policies() {
			res, err := Simulate(Config{Policy: p, Fleet: []Fleet{{"H100-80GB", gpus}}}, reqs, SimOptions{Series: true})
			if err != nil {
				t.Fatal(err)
			}
			if res.Unserved != 0 || res.Placed != len(reqs) {
				t.Errorf("%d GPUs, %s: %d placed, %d unserved of %d", gpus, p, res.Placed, res.Unserved, len(reqs))
			}
			if p != Naive && res.GPUHours < work*(1-1e-9) {
				t.Errorf("%d GPUs, %s: %.2f GPU-hours below the work's %.2f", gpus, p, res.GPUHours, work)
			}
			if res.PeakInUse > gpus || len(res.Series) == 0 || res.Series[len(res.Series)-1].InUse != 0 {
				t.Errorf("%d GPUs, %s: peak %d, series ends %+v", gpus, p, res.PeakInUse, res.Series[len(res.Series)-1])
			}
		}
	}
}

// TestNaiveGPUHoursAreRunTimes: one whole GPU per request on an ample fleet
// costs exactly the sum of the run times.
func TestNaiveGPUHoursAreRunTimes(t *testing.T) {
	reqs := randomRequests(500, 2, 0)
	var sum float64
	for _, r := range reqs {
		sum += r.Duration.Hours()
	}
	res, err := Simulate(Config{Policy: Naive, Fleet: []Fleet{{"A100-80GB", 1000}}}, reqs, SimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d := res.GPUHours - sum; d > 1e-9 || d < -1e-9 || res.Misses != 0 {
		t.Fatalf("naive: %.6f GPU-hours, %d misses; run times sum to %.6f", res.GPUHours, res.Misses, sum)
	}
}

// TestReconfigDelaysStart: creating an instance takes Config.Reconfig; the
// work starts that much later and can miss its deadline for it.
func TestReconfigDelaysStart(t *testing.T) {
	reqs := []Request{
		{ID: 1, Profile: "3g.40gb", Arrival: 0, Duration: 10 * time.Second, Deadline: 12 * time.Second},
		{ID: 2, Profile: "3g.40gb", Arrival: 0, Duration: 10 * time.Second, Deadline: 20 * time.Second},
	}
	res, err := Simulate(Config{Policy: BestFit, Fleet: []Fleet{{"H100-80GB", 1}}, Reconfig: 5 * time.Second}, reqs,
		SimOptions{Assignments: true})
	if err != nil {
		t.Fatal(err)
	}
	for id, a := range res.Assignment {
		if a.Start != 5*time.Second || a.End != 15*time.Second {
			t.Errorf("request %d: %v-%v, want 5s-15s", id, a.Start, a.End)
		}
	}
	if res.Misses != 1 || res.MissSize != 4 {
		t.Fatalf("%d misses (%d slices), want request 1 only (4 slices)", res.Misses, res.MissSize)
	}
	if want := 15.0 / 3600; math.Abs(res.GPUHours-want) > 1e-12 {
		t.Fatalf("%.6f GPU-hours, want %.6f (the instances exist while they are created)", res.GPUHours, want)
	}
}

// TestFillWithdrawsSkipped: a request Fill skips leaves nothing behind. On one
// H100 holding a 4g.40gb, a 7g.80gb finds no room; Lovelock queues it behind
// the 4g (a reservation of all eight slices), and unless Fill withdraws it the
// 3g.40gb that fits at slot 4 is refused too.
func TestFillWithdrawsSkipped(t *testing.T) {
	reqs := []Request{
		{ID: 1, Profile: "4g.40gb", Share: 500, Arrival: 0, Duration: time.Minute},
		{ID: 2, Profile: "7g.80gb", Share: 1000, Arrival: time.Second, Duration: time.Minute},
		{ID: 3, Profile: "3g.40gb", Share: 400, Arrival: 2 * time.Second, Duration: time.Minute},
	}
	for _, p := range Policies() {
		res, err := Fill(Config{Policy: p, Fleet: []Fleet{{"H100-80GB", 1}}}, reqs, 10)
		if err != nil {
			t.Fatal(err)
		}
		want := struct{ placed, unserved int }{2, 1}
		if p == Naive {
			want.placed, want.unserved = 1, 2 // a whole GPU each
		}
		if res.Placed != want.placed || res.Unserved != want.unserved {
			t.Errorf("%s: %d placed, %d skipped; want %d, %d", p, res.Placed, res.Unserved, want.placed, want.unserved)
		}
		if want.placed == 2 && math.Abs(res.AllocRate-0.9) > 1e-9 {
			t.Errorf("%s: allocation rate %.3f, want 0.9", p, res.AllocRate)
		}
	}
}

// TestMissesWithoutDeadline: a request without a deadline is due to start on
// arrival (LatestStart); Simulate counts it late when it starts after its
// arrival plus the reconfiguration time, as it does a request that ends
// after its deadline. Three 1000 s whole-GPU requests at 0 on one H100 run
// one after the other: two of them start late.
func TestMissesWithoutDeadline(t *testing.T) {
	sec := func(n int) time.Duration { return time.Duration(n) * time.Second }
	whole := func(deadline time.Duration) []Request {
		var rs []Request
		for i := range 3 {
			rs = append(rs, Request{ID: uint64(i + 1), Profile: "7g.80gb", Duration: sec(1000), Deadline: deadline})
		}
		return rs
	}
	for _, tc := range []struct {
		name     string
		reqs     []Request
		gpus     int
		reconfig time.Duration
		misses   int
		size     int
	}{
		{"no deadline, one GPU: two start late", whole(0), 1, 0, 2, 16},
		{"no deadline, reconfiguration is not late", whole(0), 3, sec(5), 0, 0},
		{"no deadline, one GPU, with reconfiguration", whole(0), 1, sec(5), 2, 16},
		{"deadlines met one after the other", whole(sec(3000)), 1, 0, 0, 0},
		{"deadlines, the last misses", whole(sec(2500)), 1, 0, 1, 8},
		{"no deadline, a slice each", []Request{
			{ID: 1, Profile: "1g.10gb", Duration: sec(10)},
			{ID: 2, Profile: "3g.40gb", Arrival: sec(1), Duration: sec(10)},
		}, 2, 0, 0, 0}, // naive: a GPU each
	} {
		for _, p := range Policies() {
			t.Run(tc.name+"/"+p.String(), func(t *testing.T) {
				cfg := Config{Policy: p, Fleet: []Fleet{{"H100-80GB", tc.gpus}}, Reconfig: tc.reconfig}
				res, err := Simulate(cfg, tc.reqs, SimOptions{Assignments: true})
				if err != nil {
					t.Fatal(err)
				}
				size := tc.size
				if p == Naive && tc.size > 0 {
					size = 8 * tc.misses // a whole GPU each
				}
				if res.Misses != tc.misses || res.MissSize != size {
					t.Errorf("%d misses (%d slices), want %d (%d); assignments %+v", res.Misses, res.MissSize, tc.misses, size, res.Assignment)
				}
				// The same definition as LatestStart: late is placed after it.
				s, err := New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				late := 0
				for _, r := range tc.reqs {
					if a := res.Assignment[r.ID]; a.Start-cfg.Reconfig > s.LatestStart(&r, 0) {
						late++
					}
				}
				if late != res.Misses {
					t.Errorf("%d placed after their latest start, %d misses", late, res.Misses)
				}
			})
		}
	}
}

// TestFragIsShareOfFreeSlices: Result.Frag is FGD's fragmentation rate, the
// share of the free memory slices of the GPUs in use that a typical request
// cannot use, in a replay (over time) and in fill mode. A 4g.40gb, a 2g.20gb
// and a 1g.10gb on one H100 leave slice 7 free, which no profile can use:
// 1, where the rate over all slices of the GPUs in use said 0.125.
func TestFragIsShareOfFreeSlices(t *testing.T) {
	only1g := []float64{1, 0, 0, 0, 0, 0, 0} // H100 profile 0: 1g.10gb
	req := func(id int, profile string) Request {
		return Request{ID: uint64(id), Profile: profile, Duration: time.Minute}
	}
	for _, tc := range []struct {
		name string
		reqs []Request
		gpus int
		mix  []float64
		want float64
	}{
		{"4g, 2g and 1g: slice 7 is nobody's", []Request{req(1, "4g.40gb"), req(2, "2g.20gb"), req(3, "1g.10gb")}, 1, nil, 1},
		{"one 1g, 1g mix: slice 7 of 7 free", []Request{req(1, "1g.10gb")}, 1, only1g, 1.0 / 7},
		{"a full GPU has no free slice", []Request{req(1, "7g.80gb"), req(2, "1g.10gb")}, 2, only1g, 1.0 / 7},
		{"nothing free", []Request{req(1, "7g.80gb")}, 1, nil, 0},
	} {
		for _, p := range []Policy{FirstFit, BestFit, Lovelock} {
			t.Run(tc.name+"/"+p.String(), func(t *testing.T) {
				cfg := Config{Policy: p, Fleet: []Fleet{{"H100-80GB", tc.gpus}}, Mix: tc.mix}
				res, err := Simulate(cfg, tc.reqs, SimOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if res.Placed != len(tc.reqs) || math.Abs(res.Frag-tc.want) > 1e-9 {
					t.Errorf("replay: %d placed, frag %.4f, want %.4f", res.Placed, res.Frag, tc.want)
				}
				res, err = Fill(cfg, tc.reqs, 10)
				if err != nil {
					t.Fatal(err)
				}
				if res.Placed != len(tc.reqs) || math.Abs(res.Frag-tc.want) > 1e-9 {
					t.Errorf("fill: %d placed, frag %.4f, want %.4f", res.Placed, res.Frag, tc.want)
				}
			})
		}
	}
}
