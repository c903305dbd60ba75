package sched

import (
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func smallInstances(t *testing.T, n int, o GenOptions, seed uint64) []Instance {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 99))
	out := make([]Instance, n)
	for k := range out {
		in, err := Generate(rng, o)
		if err != nil {
			t.Fatal(err)
		}
		out[k] = in
	}
	return out
}

// TestExactMatchesCBC solves generated instances with Solve and with CBC
// (Debian's coinor-cbc, installed by make deps) and wants the same optimum.
func TestExactMatchesCBC(t *testing.T) {
	cbc, err := exec.LookPath("cbc")
	if err != nil {
		t.Skip("cbc not found: run `make deps` (installs coinor-cbc) to check the exact solver against it")
	}
	dir := t.TempDir()
	ins := smallInstances(t, 24, GenOptions{Card: "H100-80GB", Jobs: 5, GPUs: 2, Releases: 4, MaxDur: 4, MaxSlack: 3}, 1)
	ins = append(ins, smallInstances(t, 6, GenOptions{Card: "A100-40GB", Jobs: 6, GPUs: 3, Releases: 3, MaxDur: 3, MaxSlack: 2}, 2)...)
	// Running work on open GPUs, as the Dispatcher's windowed planner
	// poses it: fixed occupancy, open GPUs not charged.
	ins = append(ins, smallInstances(t, 12, GenOptions{Card: "H100-80GB", Jobs: 5, GPUs: 3, Releases: 0, MaxDur: 4, MaxSlack: 3, Open: 2}, 6)...)
	for k, in := range ins {
		opt, sched, err := Solve(&in, 0)
		if err != nil {
			t.Fatalf("instance %d: %v", k, err)
		}
		if c, err := in.Cost(sched); err != nil || c != opt {
			t.Fatalf("instance %d: exact schedule costs %d (%v), solver says %d", k, c, err, opt)
		}
		lp := filepath.Join(dir, "model.lp")
		sol := filepath.Join(dir, "model.sol")
		f, err := os.Create(lp)
		if err != nil {
			t.Fatal(err)
		}
		if err := WriteLP(f, &in); err != nil {
			t.Fatal(err)
		}
		f.Close()
		if out, err := exec.Command(cbc, lp, "solve", "solution", sol).CombinedOutput(); err != nil {
			t.Fatalf("instance %d: cbc: %v\n%s", k, err, out)
		}
		f, err = os.Open(sol)
		if err != nil {
			t.Fatal(err)
		}
		want, err := ParseCBCSolution(f)
		f.Close()
		if err != nil {
			t.Fatalf("instance %d: %v", k, err)
		}
		if opt != want {
			t.Fatalf("instance %d: exact %d, CBC %d\n%+v", k, opt, want, in.Jobs)
		}
	}
}

// TestHeuristicNeverBeatsOptimum is a bug detector: a heuristic schedule
// cheaper than the optimum means one of the two is wrong.
func TestHeuristicNeverBeatsOptimum(t *testing.T) {
	ins := smallInstances(t, 150, GenOptions{Card: "H100-80GB", Jobs: 6, GPUs: 3, Releases: 5, MaxDur: 4, MaxSlack: 4}, 3)
	var sumGap float64
	for k, in := range ins {
		opt, _, err := Solve(&in, 0)
		if err != nil {
			t.Fatalf("instance %d: %v", k, err)
		}
		for _, p := range []Policy{FirstFit, BestFit, Lovelock} {
			h, _, err := in.Heuristic(p)
			if err != nil {
				t.Fatalf("instance %d: %v", k, err)
			}
			if h < opt {
				t.Fatalf("instance %d: %s costs %d, below the optimum %d\n%+v", k, p, h, opt, in.Jobs)
			}
			if p == Lovelock {
				sumGap += float64(h-opt) / float64(opt)
			}
		}
	}
	// bench-sched measures the gap on 1000 instances (docs/scheduling.md):
	// about 10.4 % on instances like these with the windowed planner (12.5 %
	// without; this sample: 12.7 %, 13.3 % without), short of the 5 %
	// target for requests that arrive over time. It must not get worse.
	if mean := sumGap / float64(len(ins)); mean > 0.16 {
		t.Fatalf("lovelock's mean gap to the optimum %.1f%% over %d instances, measured about 13%%", 100*mean, len(ins))
	}
	t.Logf("lovelock's mean gap to the optimum: %.1f%% over %d instances", 100*sumGap/float64(len(ins)), len(ins))
}

func TestSolveBudget(t *testing.T) {
	ins := smallInstances(t, 1, GenOptions{Card: "H100-80GB", Jobs: 8, GPUs: 4, Releases: 6, MaxDur: 5, MaxSlack: 4}, 4)
	if _, _, err := Solve(&ins[0], 10); !errors.Is(err, ErrBudget) {
		t.Fatalf("tiny budget: %v, want ErrBudget", err)
	}
}

func TestCostRejectsOverlap(t *testing.T) {
	in := smallInstances(t, 1, GenOptions{Card: "H100-80GB", Jobs: 2, GPUs: 1, Releases: 0, MaxDur: 1, MaxSlack: 0}, 5)[0]
	in.Jobs[0].Profile, in.Jobs[1].Profile = 4, 4 // 3g and 3g
	if _, err := in.Cost([]Slot{{0, 0, 0}, {0, 4, 0}}); err != nil {
		t.Fatalf("3g@0 + 3g@4: %v", err)
	}
	if _, err := in.Cost([]Slot{{0, 0, 0}, {0, 0, 0}}); err == nil {
		t.Fatal("two 3g at slot 0 at once accepted")
	}
}

// TestCostRunningWork: fixed occupancy blocks its slices until it ends, and
// GPUs already open are not charged again.
func TestCostRunningWork(t *testing.T) {
	in := smallInstances(t, 1, GenOptions{Card: "H100-80GB", Jobs: 1, GPUs: 2, Releases: 0, MaxDur: 1, MaxSlack: 9}, 5)[0]
	in.Jobs[0] = Job{Profile: 4, Duration: 1, Deadline: 10} // 3g at slot 0 or 4
	in.Open = 1
	in.Busy = []Busy{{GPU: 0, Mask: 0x0f, Until: 3}}
	if _, err := in.Cost([]Slot{{0, 0, 2}}); err == nil {
		t.Fatal("3g@0 at 2 accepted on slices busy until 3")
	}
	if c, err := in.Cost([]Slot{{0, 0, 3}}); err != nil || c != 0 {
		t.Fatalf("3g@0 at 3 on the open GPU: cost %d, %v; want 0", c, err)
	}
	if c, err := in.Cost([]Slot{{1, 0, 0}}); err != nil || c != in.Weights.GPU {
		t.Fatalf("3g@0 on a new GPU: cost %d, %v; want one GPU", c, err)
	}
	opt, sched, err := Solve(&in, 0)
	if err != nil || opt != 0 || sched[0].GPU != 0 {
		t.Fatalf("Solve: %d %v %v; want the open GPU at no cost", opt, sched, err)
	}
}
