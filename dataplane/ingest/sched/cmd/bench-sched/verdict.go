package main

import (
	"fmt"
	"math"
	"strings"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/sched"
)

// Issue 14's targets, as the issue words them.
const (
	targetReplay = "≥ 33 % fewer GPU-hours than naive"
	targetFill   = "a higher allocation rate than best-fit"
	targetGap    = "heuristic within 5 % of optimum on small instances"
	targetRate   = "≥ 100k decisions/s for 1000 GPUs"
)

// polRow is one policy's row of a replay or fill mix, as the verdicts
// read it.
type polRow struct {
	name     string // as the table prints it
	policy   sched.Policy
	margin   bool    // the WaitMargin variant: not judged, a comparison
	value    float64 // GPU-hours (replay) or mean allocation rate (fill)
	unserved int     // replay: requests never served
}

// gapRow is one policy's mean gap to the optimum in one class.
type gapRow struct {
	name   string
	target bool // lovelock as configured (planner on): the row judged
	mean   float64
	bugs   int // instances below the optimum
	n      int // instances
}

type gapClass struct {
	name string
	rows []gapRow
}

// rateRow is one policy's decision rate on the 1000-GPU fleet.
type rateRow struct {
	name   string
	policy sched.Policy
	perSec float64 // steps (one Release and one Place) per second
}

// outcome is what the sections of one run measured; a section -sections
// left out has ran false and no rows.
type outcome struct {
	ran    map[string]bool
	mixes  []string
	replay map[string][]polRow // by mix
	fill   map[string][]polRow
	gap    []gapClass
	rate   []rateRow
}

// verdicts are the target lines of the run: each judged on the rows of
// its own section, "not measured" for a section that did not run.
func (o outcome) verdicts() []string {
	var out []string
	notRun := func(target, section string) {
		out = append(out, fmt.Sprintf("target %s (%s): not measured (-sections left out %s)", target, section, section))
	}
	if o.ran["replay"] {
		for _, mix := range o.mixes {
			out = append(out, fmt.Sprintf("target %s (replay, lovelock vs naive), %s: %s", targetReplay, mix, replayVerdict(o.replay[mix])))
		}
	} else {
		notRun(targetReplay, "replay")
	}
	if o.ran["fill"] {
		for _, mix := range o.mixes {
			out = append(out, fmt.Sprintf("target %s (fill, lovelock vs bestfit), %s: %s", targetFill, mix, fillVerdict(o.fill[mix])))
		}
	} else {
		notRun(targetFill, "fill")
	}
	if o.ran["gap"] {
		for _, c := range o.gap {
			out = append(out, fmt.Sprintf("target %s (gap, lovelock's mean gap), %s: %s", targetGap, c.name, gapVerdict(c.rows)))
		}
	} else {
		notRun(targetGap, "gap")
	}
	if o.ran["rate"] {
		out = append(out, fmt.Sprintf("target %s (rate, lovelock; a decision is one step's Place): %s", targetRate, rateVerdict(o.rate)))
	} else {
		notRun(targetRate, "rate")
	}
	return out
}

// same is equality to rounding: two policies that placed alike compute
// the same sums in the same order, so a real difference is far larger.
func same(a, b float64) bool {
	return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b))
}

// allSame reports whether every row has the same value: a mix that leaves
// the policies no choice, where no policy can beat another.
func allSame(rows []polRow) bool {
	for _, r := range rows {
		if !same(r.value, rows[0].value) {
			return false
		}
	}
	return len(rows) > 0
}

// judgeEach joins one verdict per lovelock row (not the margin variant),
// named when there are several (-frag with two measures).
func judgeEach(rows []polRow, judge func(polRow) string) string {
	var parts []string
	for _, r := range rows {
		if r.policy == sched.Lovelock && !r.margin {
			parts = append(parts, r.name+" "+judge(r))
		}
	}
	if len(parts) == 0 {
		return "not measured (no lovelock row)"
	}
	return strings.Join(parts, ", ")
}

func find(rows []polRow, p sched.Policy) (polRow, bool) {
	for _, r := range rows {
		if r.policy == p && !r.margin {
			return r, true
		}
	}
	return polRow{}, false
}

// replayVerdict judges one replay mix: lovelock's GPU-hours at most 0.67×
// naive's. A naive row with no GPU-hours is no baseline, and a lovelock
// row that left more requests unserved than naive did less work, not the
// same work on fewer GPUs: neither is a pass.
func replayVerdict(rows []polRow) string {
	naive, ok := find(rows, sched.Naive)
	switch {
	case !ok:
		return "not measured (no naive row)"
	case !(naive.value > 0) || math.IsInf(naive.value, 0):
		return fmt.Sprintf("not measured (naive's GPU-hours %.1f: no baseline)", naive.value)
	case allSame(rows):
		return fmt.Sprintf("not met (equal: every policy %.1f GPU-h; the mix leaves no choice)", naive.value)
	}
	return judgeEach(rows, func(r polRow) string {
		if r.unserved > naive.unserved {
			return fmt.Sprintf("not measured (%d requests unserved, naive %d: less work, not fewer GPU-hours)", r.unserved, naive.unserved)
		}
		fewer := 1 - r.value/naive.value
		if same(r.value, naive.value) {
			return fmt.Sprintf("not met (equal to naive: %.1f GPU-h)", r.value)
		}
		// Exactly a third less is met, to rounding (1 − 2010/3000 < 0.33).
		return fmt.Sprintf("%s (%.1f %% fewer)", met(fewer >= 0.33-1e-9), 100*fewer)
	})
}

// fillVerdict judges one fill mix: lovelock's mean allocation rate above
// bestfit's. Equal is not higher, and says so.
func fillVerdict(rows []polRow) string {
	bf, ok := find(rows, sched.BestFit)
	switch {
	case !ok:
		return "not measured (no bestfit row)"
	case !(bf.value > 0) || math.IsInf(bf.value, 0):
		return fmt.Sprintf("not measured (bestfit's allocation rate %.4f: no baseline)", bf.value)
	case allSame(rows):
		return fmt.Sprintf("not met (equal: every policy %.4f; the mix leaves no choice)", bf.value)
	}
	return judgeEach(rows, func(r polRow) string {
		if same(r.value, bf.value) {
			return fmt.Sprintf("not met (equal to bestfit: %.4f)", r.value)
		}
		return fmt.Sprintf("%s (%+.2f %%)", met(r.value > bf.value), 100*(r.value/bf.value-1))
	})
}

// gapVerdict judges one class of the gap table: lovelock's mean gap at
// most 5 %. A row with an instance below the optimum has a bug in it,
// not a gap.
func gapVerdict(rows []gapRow) string {
	var parts []string
	for _, r := range rows {
		if !r.target {
			continue
		}
		var v string
		switch {
		case r.bugs > 0:
			v = fmt.Sprintf("not measured (%d instances below the optimum: a bug, see the error below)", r.bugs)
		case r.n == 0 || math.IsNaN(r.mean) || math.IsInf(r.mean, 0):
			v = "not measured (no gap: no instances, or an optimum of 0)"
		default:
			v = fmt.Sprintf("%s (%.1f %%)", met(r.mean <= 0.05), 100*r.mean)
		}
		parts = append(parts, r.name+" "+v)
	}
	if len(parts) == 0 {
		return "not measured (no lovelock row)"
	}
	return strings.Join(parts, ", ")
}

// rateVerdict judges lovelock's decisions per second on 1000 GPUs.
func rateVerdict(rows []rateRow) string {
	var parts []string
	for _, r := range rows {
		if r.policy != sched.Lovelock {
			continue
		}
		v := fmt.Sprintf("%s (%.0f k/s)", met(r.perSec >= 100e3), r.perSec/1e3)
		if !(r.perSec > 0) || math.IsInf(r.perSec, 0) {
			v = fmt.Sprintf("not measured (rate %v: no time measured)", r.perSec)
		}
		parts = append(parts, r.name+" "+v)
	}
	if len(parts) == 0 {
		return "not measured (no lovelock row)"
	}
	return strings.Join(parts, ", ")
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}
