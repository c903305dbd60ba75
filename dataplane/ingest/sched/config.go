package sched

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
)

// Policy chooses where a request goes.
type Policy int

// The policies. Naive gives every request a whole GPU (the paper's baseline);
// FirstFit takes the lowest-numbered GPU and slot that fit; BestFit the GPU
// left with the fewest free memory slices; Lovelock minimises eq. 1 online
// (GPUs in use, then deadline misses) with fragmentation growth as the
// tie-breaker.
const (
	Naive Policy = iota
	FirstFit
	BestFit
	Lovelock
)

// Policies lists every policy, baselines first.
func Policies() []Policy { return []Policy{Naive, FirstFit, BestFit, Lovelock} }

func (p Policy) String() string {
	switch p {
	case Naive:
		return "naive"
	case FirstFit:
		return "firstfit"
	case BestFit:
		return "bestfit"
	case Lovelock:
		return "lovelock"
	}
	return fmt.Sprintf("policy(%d)", int(p))
}

// ParsePolicy reads a policy name as String writes it.
func ParsePolicy(s string) (Policy, error) {
	for _, p := range Policies() {
		if strings.EqualFold(s, p.String()) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("unknown policy %q: want naive, firstfit, bestfit or lovelock", s)
}

// Fleet is a number of GPUs of one card.
type Fleet struct {
	Card  string
	Count int
}

// ParseFleet reads "64xH100-80GB" or "8xA100-40GB,4xH200-141GB".
func ParseFleet(s string) ([]Fleet, error) {
	var out []Fleet
	for _, part := range strings.Split(s, ",") {
		n, card, ok := strings.Cut(strings.TrimSpace(part), "x")
		count, err := strconv.Atoi(n)
		if !ok || err != nil || count <= 0 {
			return nil, fmt.Errorf("fleet %q: want COUNTxCARD, e.g. 64xH100-80GB", part)
		}
		if _, err := mig.CardByName(card); err != nil {
			return nil, fmt.Errorf("fleet %q: %w", part, err)
		}
		out = append(out, Fleet{Card: card, Count: count})
	}
	return out, nil
}

// Weights are eq. 1's ε₁ (per GPU used) and ε₂ (per memory slice of a request
// that misses its deadline; the paper's m_i is the request's size, here its
// memory slices). They are integers so that the exact solver and CBC agree
// without rounding.
type Weights struct {
	GPU          int
	MissPerSlice int
}

// DefaultWeights makes a missed 1g request cost as much as a GPU, so the
// optimum trades a GPU for a miss only when the miss is small and the GPU
// would serve nothing else.
func DefaultWeights() Weights { return Weights{GPU: 8, MissPerSlice: 8} }

// Config sets up a Scheduler.
type Config struct {
	Policy Policy
	Fleet  []Fleet
	Speeds Speeds
	// Reconfig is the time to create a GPU instance on idle slices (≥ 0);
	// work starts that much after it is placed. Running instances are never
	// moved.
	Reconfig time.Duration
	// WaitMargin is the share of a request's slack (latest start − now)
	// that Lovelock keeps in reserve when it decides to wait for a slot
	// rather than open a GPU, in [0, 1): 0 waits up to the latest start, as
	// eq. 1 asks; 0.5 waits at most half the slack, which avoids misses when
	// a saturated fleet meets a burst, at the price of more GPUs opened.
	WaitMargin float64
	// Mix is the expected share of requests per profile index (the same seven
	// on every card), the target workload of the fragmentation measure. Nil:
	// learned from the arrivals.
	Mix []float64
	// Frag is the fragmentation measure Lovelock breaks ties with (and its
	// planner orders slots by); the zero value is the default, FragStranded.
	Frag FragMeasure
	// Window bounds Lovelock's windowed planner: requests that wait together
	// are planned exactly while they and the GPUs in use are few. The zero
	// value is the default; Window{Requests: -1} turns it off.
	Window Window
}

// Validate checks the settings New depends on, saying what to use instead:
// a fleet, a reconfiguration time of at least 0 (a negative one would start
// work before it is placed) and a wait margin in [0, 1) (below 0 Lovelock
// would wait past a request's latest start).
func (c Config) Validate() error {
	if len(c.Fleet) == 0 {
		return fmt.Errorf("scheduler: empty fleet: give GPUs, e.g. 64xH100-80GB")
	}
	if c.Reconfig < 0 {
		return fmt.Errorf("scheduler: reconfiguration time %v is negative: use 0 (instances ready at once) or the time creating a MIG instance takes", c.Reconfig)
	}
	if !(c.WaitMargin >= 0 && c.WaitMargin < 1) {
		return fmt.Errorf("scheduler: wait margin %g outside [0, 1): use 0 to wait up to a request's latest start, or a share of its slack to keep in reserve, e.g. 0.5", c.WaitMargin)
	}
	return nil
}

// FragMeasure names the fragmentation measure Lovelock uses as its
// tie-breaker (see fragTable and strandedTable).
type FragMeasure int

// The measures. FragNext is FGD's: the expected number of free memory slices
// the next request, drawn from the mix, cannot use. FragStranded, the
// default, counts the free memory slices that no profile of the mix can use
// any more (stranded), and breaks its ties with FragNext; with a learned mix
// it starts after 64 arrivals (FragNext before).
const (
	FragDefault FragMeasure = iota
	FragNext
	FragStranded
)

// FragMeasures lists the measures by name, the default first.
func FragMeasures() []FragMeasure { return []FragMeasure{FragStranded, FragNext} }

func (f FragMeasure) resolve() FragMeasure {
	if f == FragDefault {
		return FragStranded
	}
	return f
}

func (f FragMeasure) String() string {
	switch f.resolve() {
	case FragNext:
		return "next"
	case FragStranded:
		return "stranded"
	}
	return fmt.Sprintf("frag(%d)", int(f))
}

// ParseFrag reads a measure name as String writes it ("" is the default).
func ParseFrag(s string) (FragMeasure, error) {
	if s == "" {
		return FragDefault, nil
	}
	for _, f := range FragMeasures() {
		if strings.EqualFold(s, f.String()) {
			return f, nil
		}
	}
	return 0, fmt.Errorf("unknown fragmentation measure %q: want next or stranded", s)
}
