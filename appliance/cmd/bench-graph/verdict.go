package main

import (
	"fmt"
	"strings"

	"github.com/lovelock-dpu/lovelock/dataplane/farmem/graph"
)

// SODA's reported hit rates on BFS and BC (issue 12: "56-68 %").
const sodaLow, sodaHigh = 0.56, 0.68

// ok reports whether the row's check passed: a row that disagrees with the
// in-memory run measured something else, and judges nothing.
func (r row) ok() bool { return strings.HasPrefix(r.check, "ok") }

// dynamicHitRate is the dynamic cache's hits over the reads it holds
// (SODA's Fig. 10 measure, the table's "dynamic hit rate"), and whether it
// held any.
func (r row) dynamicHitRate() (float64, bool) {
	n := r.cache.Hits + r.cache.Misses
	if n == 0 {
		return 0, false
	}
	return float64(r.cache.Hits) / float64(n), true
}

// name is the row's label without the "DPU + " every cached row shares.
func (r row) name() string { return strings.Replace(r.path.label, "DPU + ", "", 1) }

// sodaDynamic reports whether r is SODA's row (d): the dynamic cache over
// the edge arrays with the adjacent prefetcher, not the whole-region
// comparison.
func (r row) sodaDynamic() bool { return r.path.id == "d" && !r.path.caching.WholeRegion }

// graphVerdicts are issue 12's four targets, judged on rows, this run's:
// a row -apps or -rows left out, or whose check failed, is not measured.
func graphVerdicts(rows []row) []string { return layoutVerdicts("", rows) }

// layoutVerdicts is graphVerdicts for rows measured in a CPU layout, which
// the time target's lines name after the app unless it is the shared one
// (""): that is the target the layout changes.
func layoutVerdicts(layout string, rows []row) []string {
	of := func(app graph.App, keep func(row) bool) []row {
		var out []row
		for _, r := range rows {
			if r.app == app && keep(r) {
				out = append(out, r)
			}
		}
		return out
	}
	id := func(s string) func(row) bool { return func(r row) bool { return r.path.id == s } }
	var apps []graph.App
	for _, r := range rows {
		if len(apps) == 0 || apps[len(apps)-1] != r.app {
			apps = append(apps, r.app)
		}
	}
	out := []string{
		"target (d) ≥ 90 % hits on PageRank (the dynamic hit rate column, SODA's measure; row (d), SODA's edge cache): " +
			pageRankHits(of(graph.PageRank, row.sodaDynamic)),
		"target (c) ≥ 40 % fewer fabric bytes than (a) on PageRank (the mem0 link column): " +
			fewerBytes(of(graph.PageRank, id("a")), of(graph.PageRank, id("c"))),
	}
	for _, app := range []graph.App{graph.BFS, graph.BC} {
		out = append(out, fmt.Sprintf("target (e) above SODA's 56-68 %% on %s (the dynamic hit rate column; above 68 %% is above the range): %s",
			app, aboveSODA(of(app, id("e")))))
	}
	named := ""
	if layout != "" {
		named = ", " + layout
	}
	for _, app := range apps {
		later := func(r row) bool { return r.path.id >= "c" && r.path.id <= "e" }
		out = append(out, fmt.Sprintf("target (c)-(e) run time within 10 %% of (a) or better, %s%s: %s", app, named, timeWithin(of(app, id("a")), of(app, later))))
	}
	if len(apps) == 0 {
		out = append(out, "target (c)-(e) run time within 10 % of (a) or better"+named+": not measured (no rows)")
	}
	return out
}

// pageRankHits judges (d)'s dynamic hit rate on PageRank: at least 90 %.
func pageRankHits(d []row) string {
	if len(d) == 0 {
		return "not measured (no PageRank (d) edge-cache row in this run: -apps, -rows)"
	}
	r := d[0]
	h, ok := r.dynamicHitRate()
	switch {
	case !r.ok():
		return "not measured (its check failed)"
	case !ok:
		return "not measured (no read reached the dynamic cache)"
	}
	return fmt.Sprintf("%s (%.1f %%)", met(h >= 0.9), 100*h)
}

// fewerBytes judges (c)'s mem0 link bytes against (a)'s: at most 0.6×.
func fewerBytes(a, c []row) string {
	switch {
	case len(a) == 0:
		return "not measured (no PageRank (a) row in this run: -apps, -rows)"
	case len(c) == 0:
		return "not measured (no PageRank (c) row in this run: -apps, -rows)"
	case !a[0].ok():
		return "not measured ((a)'s check failed)"
	case !c[0].ok():
		return "not measured ((c)'s check failed)"
	case a[0].memBytes == 0:
		return "not measured ((a) moved no bytes on mem0's link: no baseline)"
	case c[0].memBytes == 0:
		return "not measured ((c) moved no bytes on mem0's link: the counter did not move)"
	}
	x := float64(c[0].memBytes) / float64(a[0].memBytes)
	// 0.6× exactly is 40 % fewer, to rounding.
	return fmt.Sprintf("%s (%.2f× (a)'s %.1f MB: %.1f %% fewer)", met(x <= 0.6+1e-9), x, mb(a[0].memBytes), 100*(1-x))
}

// aboveSODA judges each (e) row's dynamic hit rate on one app against
// SODA's 56-68 %: above 68 % is met, up to it is within SODA's range
// (neither), at or below 56 % is not met.
func aboveSODA(e []row) string {
	if len(e) == 0 {
		return "not measured (no (e) rows in this run: -apps, -rows)"
	}
	var parts []string
	for _, r := range e {
		h, ok := r.dynamicHitRate()
		var v string
		switch {
		case !r.ok():
			v = "not measured (its check failed)"
		case !ok:
			v = "not measured (no read reached the dynamic cache)"
		case h > sodaHigh:
			v = fmt.Sprintf("met (%.1f %%, above the range)", 100*h)
		case h > sodaLow:
			v = fmt.Sprintf("within the range (%.1f %%: above 56 %%, not above 68 %%)", 100*h)
		default:
			v = fmt.Sprintf("not met (%.1f %%, not above 56 %%)", 100*h)
		}
		parts = append(parts, r.name()+" "+v)
	}
	return strings.Join(parts, ", ")
}

// timeWithin judges each of one app's (c)-(e) rows' time against its (a)
// row's: at most 1.1×.
func timeWithin(a, later []row) string {
	switch {
	case len(a) == 0:
		return "not measured (no (a) row in this run: -rows)"
	case !a[0].ok():
		return "not measured ((a)'s check failed)"
	case a[0].time <= 0:
		return "not measured ((a) took no time: no baseline)"
	case len(later) == 0:
		return "not measured (no (c)-(e) rows in this run: -rows)"
	}
	var parts []string
	for _, r := range later {
		x := float64(r.time) / float64(a[0].time)
		v := fmt.Sprintf("%s (%.2f×)", met(x <= 1.1+1e-9), x)
		switch {
		case !r.ok():
			v = "not measured (its check failed)"
		case r.time <= 0:
			v = "not measured (no time measured)"
		}
		parts = append(parts, r.name()+" "+v)
	}
	return strings.Join(parts, ", ")
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}
