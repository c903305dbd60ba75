package main

import (
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
