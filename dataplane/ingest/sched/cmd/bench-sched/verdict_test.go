package main

import (
	"strings"
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/sched"
)

func replayRows(naive, lovelock float64, unserved int) []polRow {
	return []polRow{
		{name: "naive", policy: sched.Naive, value: naive},
		{name: "bestfit", policy: sched.BestFit, value: lovelock + 10},
		{name: "lovelock", policy: sched.Lovelock, value: lovelock, unserved: unserved},
		// The margin variant is a comparison, never judged.
		{name: "lovelock (margin 0.5)", policy: sched.Lovelock, margin: true, value: naive},
	}
}

// TestReplayVerdict: the replay target is judged per mix, lovelock's
// GPU-hours against naive's of the same mix; before, no verdict printed.
func TestReplayVerdict(t *testing.T) {
	whole := []polRow{
		{name: "naive", policy: sched.Naive, value: 5206.6},
		{name: "firstfit", policy: sched.FirstFit, value: 5206.6},
		{name: "lovelock", policy: sched.Lovelock, value: 5206.6},
	}
	two := append(replayRows(3325.5, 1007.9, 0), polRow{name: "lovelock next", policy: sched.Lovelock, value: 2400})
	for _, tc := range []struct {
		name string
		rows []polRow
		want string
	}{
		{"met", replayRows(3325.5, 1007.9, 0), "lovelock met (69.7 % fewer)"},
		{"not met", replayRows(3000, 2100, 0), "lovelock not met (30.0 % fewer)"},
		{"exactly a third", replayRows(3000, 2010, 0), "lovelock met (33.0 % fewer)"},
		{"each measure", two, "lovelock met (69.7 % fewer), lovelock next not met (27.8 % fewer)"},
		// The whole-GPU mix: every policy places alike, no pass invented.
		{"no choice", whole, "not met (equal: every policy 5206.6 GPU-h; the mix leaves no choice)"},
		{"zero baseline", replayRows(0, 0, 0), "not measured (naive's GPU-hours 0.0: no baseline)"},
		// Requests never served cost no GPU-hours: not a saving.
		{"unserved", replayRows(3325.5, 1007.9, 12), "lovelock not measured (12 requests unserved, naive 0"},
		{"no naive", replayRows(3325.5, 1007.9, 0)[1:], "not measured (no naive row)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := replayVerdict(tc.rows); !strings.HasPrefix(got, tc.want) {
				t.Errorf("replayVerdict = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestFillVerdict(t *testing.T) {
	rows := func(naive, bestfit, lovelock float64) []polRow {
		return []polRow{
			{name: "naive", policy: sched.Naive, value: naive},
			{name: "bestfit", policy: sched.BestFit, value: bestfit},
			{name: "lovelock", policy: sched.Lovelock, value: lovelock},
		}
	}
	for _, tc := range []struct {
		name string
		rows []polRow
		want string
	}{
		{"met", rows(0.19, 0.6518, 0.6747), "lovelock met (+3.51 %)"},
		{"not met", rows(0.19, 0.6518, 0.6507), "lovelock not met (-0.17 %)"},
		// The large mix: naive differs, the others place alike.
		{"equal to bestfit", rows(0.56, 0.8771, 0.8771), "lovelock not met (equal to bestfit: 0.8771)"},
		{"no choice", rows(1, 1, 1), "not met (equal: every policy 1.0000; the mix leaves no choice)"},
		{"zero baseline", rows(0, 0, 0.1), "not measured (bestfit's allocation rate 0.0000: no baseline)"},
		{"no lovelock", rows(0.2, 0.6, 0.7)[:2], "not measured (no lovelock row)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fillVerdict(tc.rows); got != tc.want {
				t.Errorf("fillVerdict = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestGapVerdict(t *testing.T) {
	heur := gapRow{name: "lovelock heuristic", mean: 0.01, n: 1000} // not the row judged
	for _, tc := range []struct {
		name string
		rows []gapRow
		want string
	}{
		{"met", []gapRow{heur, {name: "lovelock", target: true, mean: 0.001, n: 1000}}, "lovelock met (0.1 %)"},
		{"at 5 %", []gapRow{{name: "lovelock", target: true, mean: 0.05, n: 1000}}, "lovelock met (5.0 %)"},
		{"not met", []gapRow{heur, {name: "lovelock", target: true, mean: 0.082, n: 1000}}, "lovelock not met (8.2 %)"},
		// A cost below the optimum is a bug: its gap is no measurement.
		{"bug", []gapRow{{name: "lovelock", target: true, mean: -0.01, bugs: 3, n: 1000}}, "lovelock not measured (3 instances below the optimum"},
		{"no instances", []gapRow{{name: "lovelock", target: true, n: 0}}, "lovelock not measured (no gap"},
		{"no lovelock", []gapRow{heur}, "not measured (no lovelock row)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := gapVerdict(tc.rows); !strings.HasPrefix(got, tc.want) {
				t.Errorf("gapVerdict = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRateVerdict(t *testing.T) {
	naive := rateRow{name: "naive", policy: sched.Naive, perSec: 2e6}
	for _, tc := range []struct {
		name string
		rows []rateRow
		want string
	}{
		{"met", []rateRow{naive, {name: "lovelock", policy: sched.Lovelock, perSec: 450e3}}, "lovelock met (450 k/s)"},
		{"not met", []rateRow{naive, {name: "lovelock", policy: sched.Lovelock, perSec: 99e3}}, "lovelock not met (99 k/s)"},
		{"no time", []rateRow{{name: "lovelock", policy: sched.Lovelock, perSec: 0}}, "lovelock not measured (rate 0"},
		{"no lovelock", []rateRow{naive}, "not measured (no lovelock row)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := rateVerdict(tc.rows); !strings.HasPrefix(got, tc.want) {
				t.Errorf("rateVerdict = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestVerdictsSections: a section -sections left out has its target "not
// measured", and the others are judged on their own section's rows.
func TestVerdictsSections(t *testing.T) {
	o := outcome{
		ran:   map[string]bool{"gap": true},
		mixes: []string{"small"},
		gap:   []gapClass{{name: "window", rows: []gapRow{{name: "lovelock", target: true, mean: 0.001, n: 10}}}},
	}
	got := strings.Join(o.verdicts(), "\n")
	for _, w := range []string{
		"target ≥ 33 % fewer GPU-hours than naive (replay): not measured (-sections left out replay)",
		"target a higher allocation rate than best-fit (fill): not measured (-sections left out fill)",
		"target heuristic within 5 % of optimum on small instances (gap, lovelock's mean gap), window: lovelock met (0.1 %)",
		"target ≥ 100k decisions/s for 1000 GPUs (rate): not measured (-sections left out rate)",
	} {
		if !strings.Contains(got, w) {
			t.Errorf("verdicts lack %q:\n%s", w, got)
		}
	}
	o.ran["replay"] = true
	o.replay = map[string][]polRow{"small": replayRows(3325.5, 1007.9, 0)}
	if got := strings.Join(o.verdicts(), "\n"); !strings.Contains(got, "(replay, lovelock vs naive), small: lovelock met (69.7 % fewer)") {
		t.Errorf("replay ran, no verdict on it:\n%s", got)
	}
}
