package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
)

// LoadOptions describe a load: which requests, how fast, for how long.
type LoadOptions struct {
	// Model names the model every request asks for.
	Model string
	// Size is the input size in bytes when Input is nil: every request
	// then sends the same random input (seed 1).
	Size int
	// Input, when set, returns request i's input (i from 0); it is called
	// from several goroutines at once.
	Input func(i int) []byte
	// Rate is the open-loop arrival rate in requests per second: request
	// i is due at start + i/Rate whatever happened to the ones before,
	// with at most Concurrency outstanding; a request due while that many
	// are outstanding is dropped and counted (Report.Dropped), not
	// delayed, so the report never hides that the system fell behind.
	// 0 runs a closed loop: Concurrency workers, each sending its next
	// request when the last completed.
	Rate float64
	// Concurrency is the closed loop's workers, or the open loop's bound
	// on outstanding requests. 0: 1 closed, 1024 open.
	Concurrency int
	// Count and Duration end the load: after Count requests, or once
	// Duration has passed since the start, whichever comes first (0: no
	// limit; one of them must be set). Outstanding requests are then
	// waited for.
	Count    int
	Duration time.Duration
	// Deadline is each request's deadline (Infer's deadline); 0: none.
	Deadline time.Duration
	// Check, when set, verifies a successful result; an error counts the
	// request as Wrong.
	Check func(in, out []byte) error

	// issued, for tests, runs when no further request will be issued.
	issued func()
}

// Report is what a load did.
type Report struct {
	// Sent counts requests handed to Infer; OK those that returned a
	// result; Failed the others by cause (Cause: a status name, timeout,
	// closed, canceled...). Dropped counts open-loop requests not sent
	// because Concurrency were outstanding.
	Sent    int            `json:"sent"`
	OK      int            `json:"ok"`
	Failed  map[string]int `json:"failed,omitempty"`
	Dropped int            `json:"dropped"`
	// DeadlineMisses counts results that came back after Deadline and
	// failures with the deadline status (also in Failed).
	DeadlineMisses int `json:"deadline_misses"`
	// Wrong counts results that Check refused (also in OK); FirstWrong
	// is the first refusal's message.
	Wrong      int    `json:"wrong"`
	FirstWrong string `json:"first_wrong,omitempty"`
	// FirstError is the first failure's message.
	FirstError string `json:"first_error,omitempty"`
	// Elapsed runs from the first request to the last completion.
	Elapsed time.Duration `json:"elapsed_ns"`
	// Throughput is OK results per second; MBps their input megabytes
	// (10⁶ bytes) per second.
	Throughput float64 `json:"throughput_rps"`
	MBps       float64 `json:"throughput_mbps"`
	// Latency summarises the OK requests' latencies, Infer's call to its
	// return; with no OK request there is none, and JSON leaves it out
	// rather than show zeros as measurements.
	Latency Latency `json:"latency,omitzero"`
	// Retransmissions is the client's count during the load.
	Retransmissions uint64 `json:"retransmissions"`
}

// Latency is a latency distribution's percentiles (nearest rank).
type Latency struct {
	P50 time.Duration `json:"p50_ns"`
	P90 time.Duration `json:"p90_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
}

// Failures returns the number of failed requests.
func (r *Report) Failures() int {
	n := 0
	for _, v := range r.Failed {
		n += v
	}
	return n
}

// Load runs a load through c and reports on it. When ctx ends first, it
// stops issuing, cancels the requests outstanding (they count as canceled)
// and returns the report with ctx's error.
func Load(ctx context.Context, c *Client, o LoadOptions) (*Report, error) {
	switch {
	case o.Count <= 0 && o.Duration <= 0:
		return nil, errors.New("ingest load: give a count or a duration")
	case o.Rate < 0:
		return nil, fmt.Errorf("ingest load: rate %v", o.Rate)
	case o.Input == nil && o.Size <= 0:
		return nil, errors.New("ingest load: give an input size or an input function")
	}
	if o.Input == nil {
		in := make([]byte, o.Size)
		rng := rand.New(rand.NewPCG(1, 0))
		for i := range in {
			in[i] = byte(rng.Uint32())
		}
		o.Input = func(int) []byte { return in }
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 1
		if o.Rate > 0 {
			o.Concurrency = 1024
		}
	}
	l := &loader{c: c, o: o, rep: Report{Failed: map[string]int{}}}
	before := c.Stats().Retransmissions
	start := time.Now()
	var end time.Time
	if o.Duration > 0 {
		end = start.Add(o.Duration)
	}
	more := func(i int) bool {
		return (o.Count <= 0 || i < o.Count) && (end.IsZero() || time.Now().Before(end)) && ctx.Err() == nil
	}
	var wg sync.WaitGroup
	if o.Rate == 0 {
		var mu sync.Mutex
		next := 0
		take := func() (int, bool) {
			mu.Lock()
			defer mu.Unlock()
			if !more(next) {
				return 0, false
			}
			next++
			return next - 1, true
		}
		for range o.Concurrency {
			wg.Go(func() {
				for i, ok := take(); ok; i, ok = take() {
					l.one(ctx, i)
				}
			})
		}
		wg.Wait()
	} else {
		interval := time.Duration(float64(time.Second) / o.Rate)
		sem := make(chan struct{}, o.Concurrency)
		timer := time.NewTimer(0)
		<-timer.C
	issue:
		for i := 0; more(i); i++ {
			if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
				timer.Reset(d)
				select {
				case <-timer.C:
				case <-ctx.Done():
					break issue
				}
				if !more(i) {
					break
				}
			}
			select {
			case sem <- struct{}{}:
				wg.Go(func() {
					defer func() { <-sem }()
					l.one(ctx, i)
				})
			default:
				l.mu.Lock()
				l.rep.Dropped++
				l.mu.Unlock()
			}
		}
		timer.Stop()
		if o.issued != nil {
			o.issued()
		}
		wg.Wait()
	}
	rep := &l.rep
	rep.Elapsed = l.last.Sub(start)
	if rep.Elapsed <= 0 {
		rep.Elapsed = time.Since(start)
	}
	if s := rep.Elapsed.Seconds(); s > 0 {
		rep.Throughput = float64(rep.OK) / s
		rep.MBps = float64(l.okBytes) / s / 1e6
	}
	slices.Sort(l.lat)
	if n := len(l.lat); n > 0 {
		rank := func(p float64) time.Duration { return l.lat[min(n-1, int(p*float64(n)+0.999999)-1)] }
		rep.Latency = Latency{P50: rank(0.50), P90: rank(0.90), P99: rank(0.99), Max: l.lat[n-1]}
	}
	rep.Retransmissions = c.Stats().Retransmissions - before
	return rep, ctx.Err()
}

type loader struct {
	c *Client
	o LoadOptions

	mu      sync.Mutex
	rep     Report
	lat     []time.Duration
	okBytes int64
	last    time.Time
}

// one runs request i and records it.
func (l *loader) one(ctx context.Context, i int) {
	in := l.o.Input(i)
	t0 := time.Now()
	res, err := l.c.Infer(ctx, l.o.Model, in, l.o.Deadline)
	now := time.Now()
	lat := now.Sub(t0)
	var wrong error
	if err == nil && l.o.Check != nil {
		wrong = l.o.Check(in, res.Output)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rep.Sent++
	l.last = now
	if err != nil {
		l.rep.Failed[Cause(err)]++
		if ingest.StatusOf(err) == ingest.StatusDeadline {
			l.rep.DeadlineMisses++
		}
		if l.rep.FirstError == "" {
			l.rep.FirstError = err.Error()
		}
		return
	}
	l.rep.OK++
	l.okBytes += int64(len(in))
	l.lat = append(l.lat, lat)
	if l.o.Deadline > 0 && lat > l.o.Deadline {
		l.rep.DeadlineMisses++
	}
	if wrong != nil {
		l.rep.Wrong++
		if l.rep.FirstWrong == "" {
			l.rep.FirstWrong = fmt.Sprintf("request %d: %v", i, wrong)
		}
	}
}

// Verify returns a LoadOptions.Check for a built-in model that compares
// the output with the model's CPU reference: exactly for checksum, within
// model.Close's tolerance for mlp, whose device may sum in another order.
func Verify(name string) (func(in, out []byte) error, error) {
	m, err := model.Builtin(name)
	if err != nil {
		return nil, err
	}
	if m.Reference == nil {
		return nil, fmt.Errorf("model %s has no CPU reference to check against", name)
	}
	exact := name != "mlp"
	return func(in, out []byte) error {
		if err := m.Check(len(in)); err != nil {
			return err
		}
		want := make([]byte, m.OutputSize(len(in)))
		want = want[:m.Reference(in, want)]
		switch {
		case len(out) != len(want):
			return fmt.Errorf("model %s: %d output bytes, want %d", name, len(out), len(want))
		case exact && !bytes.Equal(out, want):
			return fmt.Errorf("model %s: output %x differs from the reference %x", name, head(out), head(want))
		case !exact && !model.Close(out, want):
			return fmt.Errorf("model %s: output differs from the reference beyond tolerance", name)
		}
		return nil
	}, nil
}

func head(b []byte) []byte { return b[:min(len(b), 16)] }
