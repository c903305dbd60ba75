package sched

import (
	"errors"
	"math"
	"math/bits"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
)

// checkState verifies that every GPU's instances form a valid layout and that
// the state index agrees with them.
func checkState(t *testing.T, s *Scheduler) {
	t.Helper()
	inUse, free := 0, 0
	for g := range s.gpus {
		c, l := s.Layout(g)
		if err := c.Validate(l); err != nil {
			t.Fatalf("GPU %d holds an invalid layout %s: %v", g, c.Format(l), err)
		}
		var used uint8
		for _, pl := range l {
			used |= c.Profiles[pl.Profile].Mask(pl.Start)
		}
		if used != s.gpus[g].st.Used() {
			t.Fatalf("GPU %d: layout covers %08b, state says %08b", g, used, s.gpus[g].st.Used())
		}
		st := s.state(g)
		if s.cards[s.gpus[g].card].buckets[st].words[g>>6]&(1<<(g&63)) == 0 {
			t.Fatalf("GPU %d not in the bucket of its state %03x", g, st)
		}
		if len(l) > 0 {
			inUse++
			free += mig.MemorySlices - bits.OnesCount8(used|s.gpus[g].resv)
		}
	}
	if inUse != s.InUse() {
		t.Fatalf("%d GPUs hold instances, InUse says %d", inUse, s.InUse())
	}
	if free != s.Free() {
		t.Fatalf("%d slices free on the GPUs in use, Free says %d", free, s.Free())
	}
}

func TestEveryPolicyProducesValidLayouts(t *testing.T) {
	profiles := []string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}
	for _, p := range Policies() {
		t.Run(p.String(), func(t *testing.T) {
			s, err := New(Config{Policy: p, Fleet: []Fleet{{"H100-80GB", 5}, {"A100-80GB", 70}}})
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			var live []uint64
			placed := 0
			for i := uint64(1); i <= 3000; i++ {
				if len(live) > 0 && rng.IntN(3) == 0 {
					k := rng.IntN(len(live))
					if err := s.Release(live[k]); err != nil {
						t.Fatal(err)
					}
					live = append(live[:k], live[k+1:]...)
				}
				r := &Request{ID: i, Profile: profiles[rng.IntN(len(profiles))], Duration: time.Second}
				a, err := s.Place(r, 0)
				switch {
				case err == nil:
					live = append(live, i)
					placed++
					if p == Naive && a.Profile != "7g.80gb" {
						t.Fatalf("naive placed %s", a.Profile)
					}
				case errors.Is(err, ErrNoCapacity), errors.Is(err, ErrWait):
				default:
					t.Fatal(err)
				}
				if i%100 == 0 {
					checkState(t, s)
				}
			}
			if placed < 200 {
				t.Fatalf("only %d of 3000 placed", placed)
			}
			checkState(t, s)
		})
	}
}

func TestPlaceRefusesWithReason(t *testing.T) {
	s, err := New(Config{Policy: Lovelock, Fleet: []Fleet{{"A100-40GB", 1}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		r    Request
		want error
	}{
		{"profile of another card", Request{ID: 1, Profile: "3g.40gb"}, ErrUnfit},
		{"more memory than the card", Request{ID: 2, MemGB: 80}, ErrUnfit},
		{"profile with too little memory", Request{ID: 3, Profile: "1g.5gb", MemGB: 10}, ErrUnfit},
		{"more than a GPU", Request{ID: 4, Throughput: 1.5}, ErrUnfit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Place(&tc.r, 0)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Place: %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := s.Place(&Request{ID: 5, Profile: "7g.40gb"}, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Place(&Request{ID: 6, Profile: "1g.5gb"}, 0); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("full GPU: %v, want ErrNoCapacity", err)
	}
	if _, err := s.Place(&Request{ID: 5, Profile: "1g.5gb"}, 0); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("duplicate id: %v", err)
	}
	if err := s.Release(99); !errors.Is(err, ErrUnknownID) {
		t.Fatalf("release unknown: %v", err)
	}
}

func TestResolveBySpeed(t *testing.T) {
	h100, _ := mig.CardByName("H100-80GB")
	a100, _ := mig.CardByName("A100-40GB")
	for _, tc := range []struct {
		card   *mig.Card
		r      Request
		speeds Speeds
		want   string
	}{
		{&h100, Request{Throughput: 0.1}, nil, "1g.10gb"},
		{&h100, Request{Throughput: 0.15}, nil, "1g.20gb"}, // 26/132 SMs
		{&h100, Request{Throughput: 0.43}, nil, "3g.40gb"}, // 60/132 = 0.455
		{&h100, Request{Throughput: 0.5}, nil, "7g.80gb"},  // 4g: 64/132 = 0.485
		{&a100, Request{Throughput: 0.5}, nil, "4g.20gb"},  // 56/98 = 0.571
		{&a100, Request{Throughput: 0.15}, nil, "2g.10gb"}, // 1g: 14/98 = 0.143
		{&h100, Request{Throughput: 0.5}, Speeds{"4g.40gb": 0.55}, "4g.40gb"},
		{&h100, Request{Compute: 1, MemGB: 15}, nil, "1g.20gb"},
		{&h100, Request{Compute: 3}, nil, "3g.40gb"},
		{&h100, Request{Compute: 1, Media: true}, nil, "1g.10gb+me"},
		{&h100, Request{Profile: "MIG 2g.20gb"}, nil, "2g.20gb"},
	} {
		p, err := Resolve(tc.card, &tc.r, tc.speeds)
		if err != nil {
			t.Errorf("%s %+v: %v", tc.card.Name, tc.r, err)
			continue
		}
		if got := tc.card.Profiles[p].Name; got != tc.want {
			t.Errorf("%s %+v: %s, want %s", tc.card.Name, tc.r, got, tc.want)
		}
	}
}

// TestLovelockPacksAndAvoidsFragments: a 1g on an empty H100 goes where it
// blocks the fewest profiles (not slot 0, which blocks 4g and 3g@0 and
// 2g@0), and the next request joins the GPU in use instead of opening one.
func TestLovelockPacksAndAvoidsFragments(t *testing.T) {
	s, err := New(Config{Policy: Lovelock, Fleet: []Fleet{{"H100-80GB", 4}}})
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Place(&Request{ID: 1, Profile: "1g.10gb", Duration: time.Minute}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if a.Placement.Start == 0 {
		t.Fatalf("1g placed at slot 0, which blocks 4g, 3g and 2g at 0")
	}
	b, err := s.Place(&Request{ID: 2, Profile: "2g.20gb", Duration: time.Minute}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if b.GPU != a.GPU {
		t.Fatalf("second request opened GPU %d beside GPU %d in use", b.GPU, a.GPU)
	}
	checkState(t, s)
}

func TestLovelockWaitsWhenASlotFreesInTime(t *testing.T) {
	s, err := New(Config{Policy: Lovelock, Fleet: []Fleet{{"H100-80GB", 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Place(&Request{ID: 1, Profile: "7g.80gb", Duration: 10 * time.Second}, 0); err != nil {
		t.Fatal(err)
	}
	// Slack: the whole GPU frees at 10 s, the request must start by 20 s.
	r := &Request{ID: 2, Profile: "3g.40gb", Arrival: time.Second, Duration: 10 * time.Second, Deadline: 30 * time.Second}
	if _, err := s.Place(r, time.Second); !errors.Is(err, ErrWait) {
		t.Fatalf("with slack: %v, want ErrWait", err)
	}
	// At its latest start it opens the empty GPU.
	a, err := s.Place(r, 20*time.Second)
	if err != nil || a.GPU != 1 {
		t.Fatalf("at the latest start: %+v, %v; want GPU 1", a, err)
	}
	// Without slack it opens a GPU at once (none is left: no capacity).
	tight := &Request{ID: 3, Profile: "1g.10gb", Arrival: time.Second, Duration: 10 * time.Second, Deadline: 11 * time.Second}
	if _, err := s.Place(tight, time.Second); err != nil {
		t.Fatalf("tight request beside 3g on GPU 1: %v", err)
	}
}

func TestWaitMarginKeepsSlack(t *testing.T) {
	for _, tc := range []struct {
		margin float64
		want   error
	}{{0, ErrWait}, {0.5, nil}} {
		s, err := New(Config{Policy: Lovelock, Fleet: []Fleet{{"H100-80GB", 2}}, WaitMargin: tc.margin})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Place(&Request{ID: 1, Profile: "7g.80gb", Duration: 16 * time.Second}, 0); err != nil {
			t.Fatal(err)
		}
		// Latest start 20 s; the slot frees at 16 s, after half the slack.
		r := &Request{ID: 2, Profile: "3g.40gb", Duration: 10 * time.Second, Deadline: 30 * time.Second}
		_, err = s.Place(r, 0)
		if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("margin %.1f: %v, want %v", tc.margin, err, tc.want)
		}
	}
}

// TestLateRequestQueuesBehindSoonestSlot: with no GPU to open and no way to
// meet its deadline, a request still reserves the soonest slot, so that
// requests arriving later cannot take every slot ahead of it.
func TestLateRequestQueuesBehindSoonestSlot(t *testing.T) {
	s, err := New(Config{Policy: Lovelock, Fleet: []Fleet{{"H100-80GB", 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Place(&Request{ID: 1, Profile: "7g.80gb", Duration: 10 * time.Second}, 0); err != nil {
		t.Fatal(err)
	}
	late := &Request{ID: 2, Profile: "4g.40gb", Duration: 10 * time.Second, Deadline: 5 * time.Second}
	if _, err := s.Place(late, 0); !errors.Is(err, ErrNoCapacity) || !s.Waiting(2) {
		t.Fatalf("late request: %v, waiting %v; want ErrNoCapacity with a reservation", err, s.Waiting(2))
	}
	// A later request queues behind it, not ahead.
	patient := &Request{ID: 3, Profile: "4g.40gb", Duration: 10 * time.Second, Deadline: time.Hour}
	if _, err := s.Place(patient, 0); !errors.Is(err, ErrWait) {
		t.Fatalf("patient request: %v, want ErrWait", err)
	}
	if at, _ := s.ReservedAt(3); at != 20*time.Second {
		t.Fatalf("patient request expected at %v, want 20s (after the late one)", at)
	}
	if err := s.Release(1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Place(patient, 10*time.Second); !errors.Is(err, ErrWait) {
		t.Fatalf("patient request went ahead of the late one: %v", err)
	}
	a, err := s.Place(late, 10*time.Second)
	if err != nil || a.Placement.Start != 0 {
		t.Fatalf("late request after the slot frees: %+v, %v", a, err)
	}
	checkState(t, s)
}

// TestBackfillYields: a request may run on slices reserved for a waiting
// request if it ends before that one starts, or if the waiting request can
// start later and still make its latest start; its reservation then moves.
func TestBackfillYields(t *testing.T) {
	for _, tc := range []struct {
		name   string
		dur    time.Duration
		placed bool
		at     time.Duration // the waiting request's expected start after
	}{
		{"ends before the reservation", 5 * time.Second, true, 10 * time.Second},
		{"reservation yields", 15 * time.Second, true, 15 * time.Second},
		{"would push it past its latest start", 35 * time.Second, false, 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(Config{Policy: Lovelock, Fleet: []Fleet{{"H100-80GB", 1}}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Place(&Request{ID: 1, Profile: "4g.40gb", Duration: 10 * time.Second}, 0); err != nil {
				t.Fatal(err)
			}
			whole := &Request{ID: 2, Profile: "7g.80gb", Duration: 10 * time.Second, Deadline: 40 * time.Second}
			if _, err := s.Place(whole, 0); !errors.Is(err, ErrWait) {
				t.Fatalf("whole-GPU request: %v, want ErrWait", err)
			}
			a, err := s.Place(&Request{ID: 3, Profile: "3g.40gb", Duration: tc.dur, Deadline: tc.dur}, 0)
			if tc.placed != (err == nil) {
				t.Fatalf("3g for %v: %+v, %v", tc.dur, a, err)
			}
			if tc.placed && a.Placement.Start != 4 {
				t.Fatalf("3g at slot %d, want 4", a.Placement.Start)
			}
			if at, ok := s.ReservedAt(2); !ok || at != tc.at {
				t.Fatalf("waiting request expected at %v (%v), want %v", at, ok, tc.at)
			}
			checkState(t, s)
		})
	}
}

// TestNewValidates: New refuses settings that make no sense and says what to
// use: a negative reconfiguration time started work before it was placed
// (and halved GPU-hours), a wait margin below 0 waited past the latest start.
func TestNewValidates(t *testing.T) {
	fleet := []Fleet{{"H100-80GB", 1}}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" for none
	}{
		{"defaults", Config{Fleet: fleet}, ""},
		{"reconfig and margin", Config{Fleet: fleet, Reconfig: 5 * time.Second, WaitMargin: 0.5}, ""},
		{"negative reconfig", Config{Fleet: fleet, Reconfig: -time.Second}, "reconfiguration time -1s is negative: use 0"},
		{"negative margin", Config{Fleet: fleet, WaitMargin: -0.5}, "wait margin -0.5 outside [0, 1): use 0"},
		{"margin 1", Config{Fleet: fleet, WaitMargin: 1}, "wait margin 1 outside [0, 1)"},
		{"margin NaN", Config{Fleet: fleet, WaitMargin: math.NaN()}, "wait margin NaN outside [0, 1)"},
		{"empty fleet", Config{}, "empty fleet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, p := range Policies() {
				cfg := tc.cfg
				cfg.Policy = p
				_, err := New(cfg)
				_, derr := NewDispatcher(cfg)
				_, serr := Simulate(cfg, []Request{{ID: 1, Profile: "1g.10gb", Duration: time.Second}}, SimOptions{})
				for _, e := range []error{err, derr, serr} {
					if tc.want == "" && e != nil {
						t.Errorf("%s: %v", p, e)
					}
					if tc.want != "" && (e == nil || !strings.Contains(e.Error(), tc.want)) {
						t.Errorf("%s: error %v, want one containing %q", p, e, tc.want)
					}
				}
			}
		})
	}
}
