package trace

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Share is one entry of a share mix: pods asking gpu_milli Milli (1000 with
// GPUs > 1 for multi-GPU pods) with relative weight Weight.
type Share struct {
	Milli  int
	GPUs   int
	Weight float64
}

// Mixes are the named share mixes of the benchmark. They are not measured from
// a real trace; "mixed" only follows the shape FGD reports for Alibaba's
// (many small shares, a large whole-GPU part).
func Mixes() map[string][]Share {
	return map[string][]Share{
		"small": {{100, 1, 4}, {200, 1, 3}, {250, 1, 2}, {400, 1, 1}},
		"mixed": {{100, 1, 2}, {200, 1, 2}, {250, 1, 1}, {400, 1, 1}, {500, 1, 1}, {1000, 1, 2}, {1000, 2, 0.5}},
		"large": {{250, 1, 1}, {400, 1, 2}, {450, 1, 2}, {1000, 1, 2}},
		"whole": {{1000, 1, 3}, {1000, 2, 1}, {1000, 4, 0.5}},
	}
}

// ParseMix reads a mix name (see Mixes) or "MILLI[xGPUS]:WEIGHT,…", e.g.
// "100:3,500:1,1000x2:1".
func ParseMix(s string) ([]Share, error) {
	if m, ok := Mixes()[s]; ok {
		return m, nil
	}
	var out []Share
	for _, part := range strings.Split(s, ",") {
		share, weight, ok := strings.Cut(part, ":")
		milli, gpus, multi := strings.Cut(share, "x")
		sh := Share{GPUs: 1}
		var err error
		if sh.Milli, err = strconv.Atoi(milli); !ok || err != nil || sh.Milli <= 0 || sh.Milli > 1000 {
			return nil, fmt.Errorf("share mix %q: want a mix name or MILLI[xGPUS]:WEIGHT,… with 0 < MILLI ≤ 1000", s)
		}
		if multi {
			if sh.GPUs, err = strconv.Atoi(gpus); err != nil || sh.GPUs < 1 || (sh.GPUs > 1 && sh.Milli != 1000) {
				return nil, fmt.Errorf("share mix %q: %q: GPUS must be ≥ 1, and > 1 only with MILLI 1000", s, part)
			}
		}
		if sh.Weight, err = strconv.ParseFloat(weight, 64); err != nil {
			return nil, fmt.Errorf("share mix %q: %q: weight %q is not a number", s, part, weight)
		}
		if err := checkPositive("weight", sh.Weight, ""); err != nil {
			return nil, fmt.Errorf("share mix %q: %q: %w", s, part, err)
		}
		out = append(out, sh)
	}
	return out, nil
}

// SynthOptions shape a synthetic trace.
type SynthOptions struct {
	Pods         int
	Mix          []Share
	Seed         uint64
	MeanGap      float64 // mean seconds between creations (exponential)
	MeanDuration float64 // mean run time in seconds (log-normal, σ = 1)
	MaxWait      int64   // scheduled_time − creation_time is uniform in [0, MaxWait]
}

// checkPositive refuses a value that is not a finite number above 0 (NaN,
// ±Inf, 0 or less), naming it.
func checkPositive(what string, v float64, unit string) error {
	if !(v > 0) || math.IsInf(v, 1) {
		return fmt.Errorf("%s %g%s: want a finite number > 0", what, v, unit)
	}
	return nil
}

// MaxSeconds is the latest time a trace can hold, in seconds since its
// start (about 292 years): a request's times are time.Durations.
const MaxSeconds = math.MaxInt64 / int64(time.Second)

// Synth returns a trace with the columns of openb_pod_list, deterministic in
// its seed. Weights and means must be finite and above 0.
func Synth(opt SynthOptions) ([]Pod, error) {
	if opt.Pods <= 0 || len(opt.Mix) == 0 {
		return nil, fmt.Errorf("synthetic trace: %d pods, %d shares in the mix: want at least one of each", opt.Pods, len(opt.Mix))
	}
	if err := checkPositive("mean gap", opt.MeanGap, " s"); err != nil {
		return nil, fmt.Errorf("synthetic trace: %w", err)
	}
	if err := checkPositive("mean duration", opt.MeanDuration, " s"); err != nil {
		return nil, fmt.Errorf("synthetic trace: %w", err)
	}
	rng := rand.New(rand.NewPCG(opt.Seed, 0x5ced))
	cum := make([]float64, len(opt.Mix))
	total := 0.0
	for i, s := range opt.Mix {
		if err := checkPositive("weight", s.Weight, ""); err != nil {
			return nil, fmt.Errorf("synthetic trace: share %dx%d: %w", s.Milli, s.GPUs, err)
		}
		total += s.Weight
		cum[i] = total
	}
	if math.IsInf(total, 1) {
		return nil, fmt.Errorf("synthetic trace: mix weights sum to %g: scale them down", total)
	}
	const sigma = 1.0
	mu := math.Log(opt.MeanDuration) - sigma*sigma/2
	pods := make([]Pod, opt.Pods)
	t := 0.0
	for i := range pods {
		t += rng.ExpFloat64() * opt.MeanGap
		s := opt.Mix[sort.SearchFloat64s(cum, rng.Float64()*total)]
		created := int64(t)
		sched := created
		if opt.MaxWait > 0 {
			sched += rng.Int64N(opt.MaxWait + 1)
		}
		d := math.Max(1, math.Round(math.Exp(mu+sigma*rng.NormFloat64())))
		if t+float64(opt.MaxWait)+d > float64(MaxSeconds) {
			return nil, fmt.Errorf("synthetic trace: pod %d would end past %d s, the latest time a trace can hold: lower the mean gap (%g s) or duration (%g s)",
				i, MaxSeconds, opt.MeanGap, opt.MeanDuration)
		}
		dur := int64(d)
		pods[i] = Pod{
			Name: fmt.Sprintf("synth-pod-%05d", i), CPUMilli: 4000 * s.GPUs, MemoryMiB: 16384 * s.GPUs,
			NumGPU: s.GPUs, GPUMilli: s.Milli, QoS: "LS", Phase: "Succeeded",
			Creation: created, Scheduled: sched, Deletion: sched + dur, Line: i + 2,
		}
	}
	return pods, nil
}
