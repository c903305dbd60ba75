package trace

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
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
		if sh.Weight, err = strconv.ParseFloat(weight, 64); err != nil || sh.Weight < 0 {
			return nil, fmt.Errorf("share mix %q: %q: bad weight", s, part)
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

// Synth returns a trace with the columns of openb_pod_list, deterministic in
// its seed.
func Synth(opt SynthOptions) ([]Pod, error) {
	if opt.Pods <= 0 || len(opt.Mix) == 0 || opt.MeanGap <= 0 || opt.MeanDuration <= 0 {
		return nil, fmt.Errorf("synthetic trace: need Pods, Mix, MeanGap and MeanDuration > 0")
	}
	rng := rand.New(rand.NewPCG(opt.Seed, 0x5ced))
	cum := make([]float64, len(opt.Mix))
	total := 0.0
	for i, s := range opt.Mix {
		total += s.Weight
		cum[i] = total
	}
	if total <= 0 {
		return nil, fmt.Errorf("synthetic trace: mix weights sum to 0")
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
		dur := int64(math.Max(1, math.Round(math.Exp(mu+sigma*rng.NormFloat64()))))
		pods[i] = Pod{
			Name: fmt.Sprintf("synth-pod-%05d", i), CPUMilli: 4000 * s.GPUs, MemoryMiB: 16384 * s.GPUs,
			NumGPU: s.GPUs, GPUMilli: s.Milli, QoS: "LS", Phase: "Succeeded",
			Creation: created, Scheduled: sched, Deletion: sched + dur, Line: i + 2,
		}
	}
	return pods, nil
}
