package trace

import (
	"fmt"
	"math"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/sched"
)

// MapOptions set how pods become requests.
type MapOptions struct {
	// Slack sets each request's deadline to arrival + Slack × duration; the
	// trace has no deadlines. 0: none (work starts on arrival or is late,
	// sched.Scheduler.Due). It must be finite and ≥ 0; below 1 every
	// request misses its deadline.
	Slack float64
}

// MapStats counts what Map did.
type MapStats struct {
	Pods       int
	Requests   int
	CPUOnly    int // num_gpu 0: no accelerator work, left out
	NoDeletion int // no deletion_time, so no duration: left out
	MultiGPU   int // pods with num_gpu > 1, each split into num_gpu whole-GPU requests
}

// Map turns pods into requests. The mapping (docs/scheduling.md):
//
//   - arrival = creation_time; duration = deletion_time − scheduled_time (the
//     pod's run time; creation_time if it was never scheduled);
//   - a pod with num_gpu = 1 and gpu_milli = s asks for a throughput of
//     s/1000 of a whole GPU: under time-slicing a share s gets at most that,
//     so the smallest MIG profile whose speed (sched.Speeds) reaches s serves
//     the pod at least as fast, in isolation. Share records s for the
//     allocation rate;
//   - a pod with num_gpu = k > 1 (gpu_milli 1000) becomes k whole-GPU
//     requests (placed independently: gangs are not modelled);
//   - pods without GPUs or without a deletion time are left out and counted.
func Map(pods []Pod, opt MapOptions) ([]sched.Request, MapStats, error) {
	st := MapStats{Pods: len(pods)}
	if !(opt.Slack >= 0) || math.IsInf(opt.Slack, 1) {
		return nil, st, fmt.Errorf("slack %g: want a finite number ≥ 0 (deadline = arrival + slack × run time; 0: none)", opt.Slack)
	}
	var out []sched.Request
	id := uint64(0)
	for _, p := range pods {
		switch {
		case p.NumGPU == 0:
			st.CPUOnly++
			continue
		case p.Deletion < 0:
			st.NoDeletion++
			continue
		}
		start := p.Scheduled
		if start < 0 {
			start = p.Creation
		}
		if p.Deletion < start {
			return nil, st, fmt.Errorf("line %d: pod %s: deletion_time %d before scheduled_time %d: %w", p.Line, p.Name, p.Deletion, start, ErrMalformed)
		}
		r := sched.Request{
			Arrival:    time.Duration(p.Creation) * time.Second,
			Duration:   time.Duration(p.Deletion-start) * time.Second,
			Throughput: float64(p.GPUMilli) / 1000,
			Share:      p.GPUMilli,
		}
		if opt.Slack > 0 {
			if float64(r.Arrival)+opt.Slack*float64(r.Duration) >= math.MaxInt64 {
				return nil, st, fmt.Errorf("slack %g puts the deadline of pod %s (line %d) past %d s, the latest time a trace can hold: lower it",
					opt.Slack, p.Name, p.Line, MaxSeconds)
			}
			r.Deadline = r.Arrival + time.Duration(opt.Slack*float64(r.Duration))
			if r.Deadline == r.Arrival {
				r.Deadline++ // a zero-length pod still has a deadline
			}
		}
		if p.NumGPU > 1 {
			st.MultiGPU++
		}
		for k := 0; k < p.NumGPU; k++ {
			id++
			r.ID = id
			out = append(out, r)
		}
	}
	st.Requests = len(out)
	return out, st, nil
}
