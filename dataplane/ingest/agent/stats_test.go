package agent

import (
	"context"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
)

// TestLatencyPercentiles: the agent's p50 and p99 are nearest-rank
// percentiles (the smallest latency at least p of the kept ones are at or
// below), as the load generator's are; before, they were one rank high:
// of 1..100 ms the p99 was the maximum, 100 ms, and of two latencies the
// p50 was the larger.
func TestLatencyPercentiles(t *testing.T) {
	for _, tc := range []struct {
		name     string
		n        int // latencies 1..n ms, added in reverse
		ring     int
		p50, p99 time.Duration
	}{
		{"none", 0, 16, 0, 0},
		{"one", 1, 16, 1 * time.Millisecond, 1 * time.Millisecond},
		{"two", 2, 16, 1 * time.Millisecond, 2 * time.Millisecond},
		{"hundred", 100, 128, 50 * time.Millisecond, 99 * time.Millisecond},
		{"thousand", 1000, 1024, 500 * time.Millisecond, 990 * time.Millisecond},
		// Only the last 100 are kept: 1..100 ms, added last.
		{"ring wrapped", 150, 100, 50 * time.Millisecond, 99 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l latencies
			l.init(tc.ring)
			for i := tc.n; i >= 1; i-- {
				l.add(time.Duration(i) * time.Millisecond)
			}
			p := l.percentiles(0.5, 0.99)
			if p[0] != tc.p50 || p[1] != tc.p99 {
				t.Errorf("p50 %v, p99 %v; want %v, %v", p[0], p[1], tc.p50, tc.p99)
			}
		})
	}
}

// TestRunTimeFromRunsOnly: the model's run-time estimate, the scheduler's
// duration for its requests, learns from completed runs only. A refusal
// that ran nothing (a slot found busy, no worker for an external model)
// or a failed run says nothing about how long the model runs; before,
// each one's few microseconds pulled the estimate towards zero, an eighth
// of the way each time.
func TestRunTimeFromRunsOnly(t *testing.T) {
	r := newRig(t, rigOptions{tweak: noReRing})
	a := r.agent
	for _, tc := range []struct {
		name   string
		status ingest.Status
		want   time.Duration
	}{
		{"slot busy", ingest.StatusOverloaded, 10 * time.Millisecond},
		{"no worker", ingest.StatusModelFailed, 10 * time.Millisecond},
		{"host restarted", ingest.StatusHostUnavailable, 10 * time.Millisecond},
		{"completed", ingest.StatusOK, (7*10*time.Millisecond + 2*time.Millisecond) / 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a.mu.Lock()
			a.models["checksum"].duration = 10 * time.Millisecond
			a.mu.Unlock()
			req := runningRequest(a, 0, 0)
			c := ingest.Ctrl{Op: ingest.OpComplete, Epoch: req.host.epoch, Request: req.seq, Status: tc.status, DeviceUs: 2000}
			if tc.status == ingest.StatusOK {
				c.Length = 8
			}
			a.complete(c)
			o := <-req.done
			if ingest.StatusOf(o.err) != tc.status {
				t.Fatalf("answered %v, want %v", o.err, tc.status)
			}
			a.mu.Lock()
			got := a.models["checksum"].duration
			a.mu.Unlock()
			if got != tc.want {
				t.Errorf("run-time estimate %v, want %v", got, tc.want)
			}
		})
	}
}

// TestFrontEndCounters: Fragments counts input datagrams, as documented,
// and InferCalls the requests handed to Infer (the gRPC front end), a
// refused one too; BytesIn counts the input bytes of both. Before, every
// Infer call counted as a fragment, so fragments mixed datagrams with
// gRPC requests.
func TestFrontEndCounters(t *testing.T) {
	r := newRig(t, rigOptions{})
	a := r.agent
	cl := r.client(0)
	in := randomBytes(1, 20000)
	pkts := cl.fragments(1, "checksum", in, 0)
	cl.send(pkts)
	if ans, err := cl.await(1, nil, time.Second, 20*time.Second); err != nil || ans.status != ingest.StatusOK {
		t.Fatalf("datagram request: %+v, %v", ans, err)
	}
	if _, err := a.Infer(context.Background(), &ingest.Request{Model: "checksum", Input: in[:3000]}); err != nil {
		t.Fatalf("Infer: %v", err)
	}
	if _, err := a.Infer(context.Background(), &ingest.Request{Model: "resnet", Input: in[:10]}); ingest.StatusOf(err) != ingest.StatusUnknownModel {
		t.Fatalf("Infer of an unknown model: %v, want unknown-model", err)
	}
	s := a.Stats()
	if s.Fragments != uint64(len(pkts)) || s.InferCalls != 2 || s.BytesIn != 20000+3000+10 || s.Received != 2 {
		t.Errorf("fragments %d, infer calls %d, bytes in %d, received %d; want %d, 2, %d, 2", s.Fragments, s.InferCalls, s.BytesIn, s.Received,
			len(pkts), 20000+3000+10)
	}
}
