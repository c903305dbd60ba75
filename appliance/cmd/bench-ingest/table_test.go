package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       time.Duration
		err        bool
	}{
		{"plain", "1234 (bench-ingest) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 5 0 99 0 0", 3250 * time.Millisecond, false},
		{"name with spaces and parentheses", "7 (a) b (c)) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1 0 0", 70 * time.Millisecond, false},
		{"short", "7 (x) R 1 2 3", 0, true},
		{"no name", "7 x R", 0, true},
		{"not a number", "7 (x) R 1 7 7 0 -1 0 0 0 0 0 u 4 0", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStatCPU([]byte(tc.stat))
			if (err != nil) != tc.err || got != tc.want {
				t.Fatalf("parseStatCPU = %v, %v; want %v, error %t", got, err, tc.want, tc.err)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	var lats []time.Duration
	for i := 100; i >= 1; i-- {
		lats = append(lats, time.Duration(i))
	}
	for _, tc := range []struct{ p, want int }{{50, 50}, {99, 99}, {100, 100}, {1, 1}} {
		if got := percentile(lats, tc.p); got != time.Duration(tc.want) {
			t.Errorf("p%d = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("empty: %v", got)
	}
}

func TestFormatTable(t *testing.T) {
	r := func(num int, loaded bool, rps float64, cpu time.Duration) row {
		return row{path: paths[map[int]int{1: 0, 3: 1, 4: 2}[num]], loaded: loaded, requests: int(rps), rps: rps,
			p50: time.Millisecond, p99: 2 * time.Millisecond, hostCPU: cpu}
	}
	rows := []row{
		r(1, false, 1000, 100*time.Millisecond), r(1, true, 500, 100*time.Millisecond),
		r(3, false, 1000, 50*time.Millisecond), {path: paths[1], loaded: true, note: "not measured: boom"},
		r(4, false, 1000, 10*time.Millisecond), r(4, true, 950, 10*time.Millisecond),
	}
	got := formatTable(rows)
	for _, want := range []string{
		"unloaded: 10.0x (met)",      // 100 µs vs 10 µs per request
		"80% host load: 19.0x (met)", // 200 µs vs 10.5 µs
		"≥ 90% of its unloaded throughput under load: 95% (met)",
		"(1) keeps 50% of its unloaded throughput",
		"(3) throughput kept under 80% host load: not measured",
		"(3) with host load 80%: not measured: boom",
		"not measured",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}

func TestParseCPUBusy(t *testing.T) {
	stat := "cpu  10 0 5 100 0 0 0 0 0 0\ncpu0 100 2 30 900 7 1 4 3 0 0\ncpu1 1 1 1 1 1 1 1 1 0 0\n"
	got, err := parseCPUBusy(stat, 0)
	if want := 140 * clockTick; err != nil || got != want { // 100+2+30+1+4+3
		t.Errorf("cpu0: %v %v, want %v", got, err, want)
	}
	if _, err := parseCPUBusy(stat, 2); err == nil {
		t.Error("cpu2: no error for a CPU /proc/stat does not list")
	}
}

// A row whose results were wrong, or whose host CPU came out zero or
// negative (a busy loop's ticks counted beyond CPU 0's own), gives no
// verdict: its numbers are not the path's.
func TestFormatTableNotMeasured(t *testing.T) {
	r := func(num int, loaded bool, rps float64, cpu time.Duration, wrong int) row {
		return row{path: paths[map[int]int{1: 0, 3: 1, 4: 2}[num]], loaded: loaded, requests: int(rps), rps: rps,
			p50: time.Millisecond, p99: 2 * time.Millisecond, hostCPU: cpu, wrong: wrong}
	}
	for _, tc := range []struct {
		name string
		rows []row
		want []string
	}{
		{"wrong results in (4)", []row{
			r(1, false, 1000, 100*time.Millisecond, 0), r(1, true, 500, 100*time.Millisecond, 0),
			r(4, false, 1000, 10*time.Millisecond, 3), r(4, true, 950, 10*time.Millisecond, 0),
		}, []string{
			"≥ 5x less than (1), unloaded: not measured ((4) unloaded: 3 wrong results)",
			"≥ 90% of its unloaded throughput under load: not measured ((4) unloaded: 3 wrong results)",
		}},
		{"wrong results in (1)", []row{
			r(1, false, 1000, 100*time.Millisecond, 0), r(1, true, 500, 100*time.Millisecond, 7),
			r(4, false, 1000, 10*time.Millisecond, 0), r(4, true, 950, 10*time.Millisecond, 0),
		}, []string{
			"≥ 5x less than (1), unloaded: 10.0x (met)",
			"≥ 5x less than (1), 80% host load: not measured ((1) loaded: 7 wrong results)",
			"(1) throughput kept under 80% host load: not measured ((1) loaded: 7 wrong results)",
		}},
		{"negative host CPU in (4)", []row{
			r(1, false, 1000, 100*time.Millisecond, 0), r(4, false, 1000, -10*time.Millisecond, 0),
		}, []string{
			"≥ 5x less than (1), unloaded: not measured ((4) unloaded: host CPU -10ms",
		}},
		{"zero host CPU in (1)", []row{
			r(1, false, 1000, 0, 0), r(4, false, 1000, 10*time.Millisecond, 0),
		}, []string{
			"≥ 5x less than (1), unloaded: not measured ((1) unloaded: host CPU 0s",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := formatTable(tc.rows)
			for _, want := range tc.want {
				if !strings.Contains(got, want) {
					t.Errorf("table lacks %q:\n%s", want, got)
				}
			}
		})
	}
}
