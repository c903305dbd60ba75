package main

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestTargetLine(t *testing.T) {
	good := point{mbps: 100, cpuPerGB: 2}
	for _, tc := range []struct {
		name   string
		rows   map[int][2]point
		want   string
		reject string
	}{
		{"met", map[int][2]point{16: {good, {mbps: 95, cpuPerGB: 1.5}}},
			"16 requesters, read: via agent 0.95x the direct throughput (target ≥ 0.9: met), host CPU per GiB 0.75x (target < 1: met)", ""},
		{"not met", map[int][2]point{16: {good, {mbps: 50, cpuPerGB: 3}}},
			"0.50x the direct throughput (target ≥ 0.9: not met), host CPU per GiB 1.50x (target < 1: not met)", ""},
		// The target is at 16 requesters: a run without that row has no verdict.
		{"no 16-requester row", map[int][2]point{4: {good, {mbps: 200, cpuPerGB: 1}}},
			"16 requesters, read: not measured (no 16-requester row in -requesters)", "met"},
		// The direct path moved nothing: the ratio is +Inf, which is not a pass.
		{"direct moved nothing", map[int][2]point{16: {{errors: 30}, {mbps: 95, cpuPerGB: 1}}},
			"16 requesters, read: not measured (30 errors on the direct path", "met"},
		{"errors via the agent", map[int][2]point{16: {good, {mbps: 95, cpuPerGB: 1, errors: 2}}},
			"not measured (2 errors via the agent", "met"},
		{"nothing moved, no errors", map[int][2]point{16: {{}, {}}},
			"not measured (the direct path moved nothing", "met"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := targetLine("read", tc.rows)
			if !strings.Contains(got, tc.want) {
				t.Errorf("got %q, want it to contain %q", got, tc.want)
			}
			if tc.reject != "" && strings.Contains(got, ": "+tc.reject+")") {
				t.Errorf("got %q: a verdict on a row that was not measured", got)
			}
		})
	}
}

func TestSummarizePercentiles(t *testing.T) {
	for _, tc := range []struct {
		n        int
		p50, p99 time.Duration
	}{
		// Nearest rank: p99 of 100 samples is the 99th smallest, not the
		// largest; p50 of an even count the lower middle one.
		{100, 50, 99},
		{1, 1, 1},
		{2, 1, 2},
		{1000, 500, 990},
	} {
		var lats []time.Duration
		for i := tc.n; i >= 1; i-- {
			lats = append(lats, time.Duration(i))
		}
		p := summarize(lats, 0, time.Second, 0, 0)
		if p.p50 != tc.p50 || p.p99 != tc.p99 {
			t.Errorf("%d samples 1..%d: p50 %d, p99 %d; want %d, %d", tc.n, tc.n, p.p50, p.p99, tc.p50, tc.p99)
		}
	}
}

// TestMeasureWindow checks what measure counts: operations that complete
// inside the window, not one still in flight when it closes (before, a
// requester's last operation was counted after the window's length had
// been taken, over-stating MB/s by up to one chunk per requester).
func TestMeasureWindow(t *testing.T) {
	errFailed := errors.New("failed")
	for _, tc := range []struct {
		name string
		// op is the operation; ended is closed once the window's end
		// has been taken.
		op             func(ended <-chan struct{}) error
		wantOK, wantEr bool
	}{
		{"in flight at the end", func(ended <-chan struct{}) error { <-ended; return nil }, false, false},
		{"failed in flight at the end", func(ended <-chan struct{}) error { <-ended; return errFailed }, false, false},
		{"back to back", func(<-chan struct{}) error { time.Sleep(time.Millisecond); return nil }, true, false},
		{"failing", func(<-chan struct{}) error { time.Sleep(time.Millisecond); return errFailed }, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ended := make(chan struct{})
			w := measure(4, 0, 50*time.Millisecond, 0,
				func(int) func() error { return func() error { return tc.op(ended) } },
				func() {}, func() { close(ended) })
			if (w.ok > 0) != tc.wantOK || len(w.lats) != w.ok {
				t.Errorf("%d operations counted, %d latencies; want some: %v", w.ok, len(w.lats), tc.wantOK)
			}
			if (w.errs > 0) != tc.wantEr {
				t.Errorf("%d errors counted; want some: %v", w.errs, tc.wantEr)
			}
			if w.elapsed < 50*time.Millisecond {
				t.Errorf("window of %v, want at least its 50ms length", w.elapsed)
			}
		})
	}
}
