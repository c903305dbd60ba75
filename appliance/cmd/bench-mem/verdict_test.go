package main

import (
	"bytes"
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

// TestWritePinned checks the pinned layout's section: the main table's
// columns, and verdict lines in the main ones' style that name the layout,
// or one line saying it was not measured where the CPUs are missing.
func TestWritePinned(t *testing.T) {
	good := point{mbps: 100, cpuPerGB: 2}
	for _, tc := range []struct {
		name   string
		n      int
		rows   map[string][2]point
		want   []string
		reject []string
	}{
		{"met", 16, map[string][2]point{"read": {good, {mbps: 95, cpuPerGB: 1.5}}, "write": {good, {mbps: 90, cpuPerGB: 1}}},
			[]string{
				"16 requesters (the -requesters maximum), DPU agent on a CPU of its own: dpu0's lovelockd and kernel receive work on CPU 1; this process (the requesters), host0's and mem0's lovelockd and kernel receive work on CPU 0, on both paths\n",
				"via agent MB/s", "×direct", "CPU ×direct", "errors",
				"16 requesters, read, DPU on its own CPU: via agent 0.95x the direct throughput (target ≥ 0.9: met), host CPU per GiB 0.75x (target < 1: met)\n",
				"16 requesters, write, DPU on its own CPU: via agent 0.90x the direct throughput (target ≥ 0.9: met), host CPU per GiB 0.50x (target < 1: met)\n",
			}, []string{"not measured"}},
		{"not met", 16, map[string][2]point{"read": {good, {mbps: 50, cpuPerGB: 3}}, "write": {good, {mbps: 89, cpuPerGB: 2}}},
			[]string{
				"16 requesters, read, DPU on its own CPU: via agent 0.50x the direct throughput (target ≥ 0.9: not met), host CPU per GiB 1.50x (target < 1: not met)",
				"16 requesters, write, DPU on its own CPU: via agent 0.89x the direct throughput (target ≥ 0.9: not met), host CPU per GiB 1.00x (target < 1: not met)",
			}, nil},
		{"errors via the agent", 16, map[string][2]point{"read": {good, good}, "write": {good, {mbps: 95, cpuPerGB: 1, errors: 3}}},
			[]string{"16 requesters, write, DPU on its own CPU: not measured (3 errors via the agent"}, []string{"write, DPU on its own CPU: via agent"}},
		// -requesters 1,4: the section runs at 4, which is no verdict.
		{"no 16 requesters", 4, map[string][2]point{"read": {good, good}, "write": {good, good}},
			[]string{"4 requesters (the -requesters maximum)", "16 requesters, read, DPU on its own CPU: not measured (no 16-requester row in -requesters)"},
			[]string{": met"}},
		{"fewer than 2 CPUs", 16, nil,
			[]string{"DPU agent on a CPU of its own", "\nnot measured: needs 2 CPUs (CPUs 0 and 1 in this process's affinity mask)\n"},
			[]string{"via agent", "DPU on its own CPU:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := writePinned(&out, tc.n, tc.rows); err != nil {
				t.Fatal(err)
			}
			got := out.String()
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("output lacks %q:\n%s", w, got)
				}
			}
			for _, r := range tc.reject {
				if strings.Contains(got, r) {
					t.Errorf("output has %q:\n%s", r, got)
				}
			}
			// Each table row has the header's columns.
			for line := range strings.SplitSeq(got, "\n") {
				if f := strings.Fields(line); len(f) > 0 && (f[0] == "read" || f[0] == "write") && len(f) != 15 {
					t.Errorf("row %q has %d columns, want the main table's 15", line, len(f))
				}
			}
		})
	}
}

// TestTargetLineLayout checks that the main table's verdict lines keep
// their wording, and that a named layout only adds its name to the head.
func TestTargetLineLayout(t *testing.T) {
	rows := map[int][2]point{16: {{mbps: 100, cpuPerGB: 2}, {mbps: 95, cpuPerGB: 1.5}}}
	shared := targetLine("write", rows)
	if want := "16 requesters, write: via agent 0.95x"; !strings.HasPrefix(shared, want) {
		t.Errorf("shared layout: %q, want it to start %q", shared, want)
	}
	named := layoutTargetLine(pinnedLayout, "write", rows)
	if want := strings.Replace(shared, "write:", "write, DPU on its own CPU:", 1); named != want {
		t.Errorf("named layout: %q, want %q", named, want)
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
