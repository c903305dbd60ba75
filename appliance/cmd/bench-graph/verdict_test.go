package main

import (
	"strings"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem/graph"
)

var (
	pathA      = path{id: "a", label: "(a) MemServer: host → memory node"}
	pathC      = path{id: "c", label: "(c) DPU + static offsets", caching: graph.Caching{Static: true, Prefetcher: "off"}}
	pathD      = path{id: "d", label: "(d) DPU + dynamic edge cache, adjacent (SODA)", caching: graph.Caching{Prefetcher: "adjacent"}}
	pathDWhole = path{id: "d", label: "(d) DPU + dynamic, whole region, adjacent", caching: graph.Caching{Prefetcher: "adjacent", WholeRegion: true}}
	pathStride = path{id: "e", label: "(e) DPU + dynamic, stride", caching: graph.Caching{Prefetcher: "stride"}}
	pathHints  = path{id: "e", label: "(e) DPU + dynamic, hints", caching: graph.Caching{Prefetcher: "hints"}}
)

// hits is a row of app on p whose dynamic cache hit per mille of its reads.
func hits(app graph.App, p path, perMille uint64) row {
	return row{app: app, path: p, time: time.Second, check: "ok", cache: farmem.RegionCacheStats{Hits: perMille, Misses: 1000 - perMille}}
}

func failed(r row) row {
	r.check = "MISMATCH: depth of 7"
	return r
}

// TestPageRankHits: (d) is judged on SODA's edge-cache row's dynamic hit
// rate, not on the whole-region comparison row.
func TestPageRankHits(t *testing.T) {
	for _, tc := range []struct {
		name string
		rows []row
		want string
	}{
		{"met", []row{hits(graph.PageRank, pathDWhole, 870), hits(graph.PageRank, pathD, 937)}, "met (93.7 %)"},
		{"not met", []row{hits(graph.PageRank, pathDWhole, 950), hits(graph.PageRank, pathD, 871)}, "not met (87.1 %)"},
		{"-rows without d", []row{hits(graph.PageRank, pathStride, 950)}, "not measured (no PageRank (d) edge-cache row"},
		{"-apps without pagerank", []row{hits(graph.BFS, pathD, 950)}, "not measured (no PageRank (d) edge-cache row"},
		{"check failed", []row{failed(hits(graph.PageRank, pathD, 950))}, "not measured (its check failed)"},
		{"no dynamic reads", []row{{app: graph.PageRank, path: pathD, check: "ok"}}, "not measured (no read reached the dynamic cache)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d []row
			for _, r := range tc.rows {
				if r.app == graph.PageRank && r.sodaDynamic() {
					d = append(d, r)
				}
			}
			if got := pageRankHits(d); !strings.HasPrefix(got, tc.want) {
				t.Errorf("pageRankHits = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestFewerBytes(t *testing.T) {
	a := row{app: graph.PageRank, path: pathA, check: "ok", memBytes: 100e6}
	c := func(b uint64) row { return row{app: graph.PageRank, path: pathC, check: "ok", memBytes: b} }
	for _, tc := range []struct {
		name string
		a, c []row
		want string
	}{
		{"met", []row{a}, []row{c(55e6)}, "met (0.55× (a)'s 100.0 MB: 45.0 % fewer)"},
		{"exactly 40 %", []row{a}, []row{c(60e6)}, "met (0.60×"},
		{"not met", []row{a}, []row{c(91e6)}, "not met (0.91× (a)'s 100.0 MB: 9.0 % fewer)"},
		{"no (a)", nil, []row{c(55e6)}, "not measured (no PageRank (a) row"},
		{"no (c)", []row{a}, nil, "not measured (no PageRank (c) row"},
		{"(c) failed", []row{a}, []row{failed(c(1))}, "not measured ((c)'s check failed)"},
		{"(a) failed", []row{failed(a)}, []row{c(1)}, "not measured ((a)'s check failed)"},
		// A ratio to nothing is no pass.
		{"zero baseline", []row{{path: pathA, check: "ok"}}, []row{c(0)}, "not measured ((a) moved no bytes"},
		{"zero row", []row{a}, []row{c(0)}, "not measured ((c) moved no bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fewerBytes(tc.a, tc.c); !strings.HasPrefix(got, tc.want) {
				t.Errorf("fewerBytes = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestAboveSODA: above 68 % is above SODA's range, between 56 and 68 %
// within it (said, not rounded to a pass or a fail), at or below 56 % not
// met.
func TestAboveSODA(t *testing.T) {
	static := path{id: "e", label: "(e) DPU + static offsets + dynamic, hints", caching: graph.Caching{Static: true, Prefetcher: "hints"}}
	for _, tc := range []struct {
		name string
		rows []row
		want string
	}{
		{"above", []row{hits(graph.BFS, pathStride, 917)}, "(e) dynamic, stride met (91.7 %, above the range)"},
		{"within", []row{hits(graph.BC, pathHints, 621)}, "(e) dynamic, hints within the range (62.1 %: above 56 %, not above 68 %)"},
		{"at the top", []row{hits(graph.BC, pathHints, 680)}, "(e) dynamic, hints within the range (68.0 %"},
		{"below", []row{hits(graph.BC, pathHints, 560)}, "(e) dynamic, hints not met (56.0 %, not above 56 %)"},
		{"each row", []row{hits(graph.BC, pathStride, 875), hits(graph.BC, static, 671)},
			"(e) dynamic, stride met (87.5 %, above the range), (e) static offsets + dynamic, hints within the range (67.1 %"},
		{"check failed", []row{failed(hits(graph.BFS, pathStride, 917))}, "(e) dynamic, stride not measured (its check failed)"},
		{"no reads", []row{{app: graph.BFS, path: pathStride, check: "ok"}}, "(e) dynamic, stride not measured (no read reached"},
		{"-rows without e", nil, "not measured (no (e) rows"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := aboveSODA(tc.rows); !strings.HasPrefix(got, tc.want) {
				t.Errorf("aboveSODA = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestTimeWithin(t *testing.T) {
	a := row{path: pathA, time: 2 * time.Second, check: "ok"}
	at := func(p path, d time.Duration) row { return row{path: p, time: d, check: "ok"} }
	for _, tc := range []struct {
		name     string
		a, later []row
		want     string
	}{
		{"per row", []row{a}, []row{at(pathC, 1800*time.Millisecond), at(pathD, 2200*time.Millisecond), at(pathStride, 2300*time.Millisecond)},
			"(c) static offsets met (0.90×), (d) dynamic edge cache, adjacent (SODA) met (1.10×), (e) dynamic, stride not met (1.15×)"},
		{"check failed", []row{a}, []row{failed(at(pathC, time.Second))}, "(c) static offsets not measured (its check failed)"},
		{"no (a)", nil, []row{at(pathC, time.Second)}, "not measured (no (a) row"},
		{"(a) failed", []row{failed(a)}, []row{at(pathC, time.Second)}, "not measured ((a)'s check failed)"},
		{"zero baseline", []row{at(pathA, 0)}, []row{at(pathC, time.Second)}, "not measured ((a) took no time"},
		{"no (c)-(e)", []row{a}, nil, "not measured (no (c)-(e) rows"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := timeWithin(tc.a, tc.later); !strings.HasPrefix(got, tc.want) {
				t.Errorf("timeWithin = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestGraphVerdicts: the table ends with the four targets, each on its
// own app's rows; an app -apps left out is not measured.
func TestGraphVerdicts(t *testing.T) {
	a := hits(graph.PageRank, pathA, 0)
	a.memBytes, a.time = 100e6, 2*time.Second
	c := hits(graph.PageRank, pathC, 100)
	c.memBytes, c.time = 91e6, 3*time.Second
	rows := []row{a, c, hits(graph.PageRank, pathD, 937), hits(graph.BFS, pathA, 0), hits(graph.BFS, pathStride, 917)}
	got := strings.Join(graphVerdicts(rows), "\n")
	for _, w := range []string{
		"target (d) ≥ 90 % hits on PageRank (the dynamic hit rate column, SODA's measure; row (d), SODA's edge cache): met (93.7 %)",
		"target (c) ≥ 40 % fewer fabric bytes than (a) on PageRank (the mem0 link column): not met (0.91×",
		"on bfs (the dynamic hit rate column; above 68 % is above the range): (e) dynamic, stride met (91.7 %, above the range)",
		"on bc (the dynamic hit rate column; above 68 % is above the range): not measured (no (e) rows",
		"within 10 % of (a) or better, pagerank: (c) static offsets not met (1.50×), (d) dynamic edge cache, adjacent (SODA) met (0.50×)",
		"within 10 % of (a) or better, bfs: (e) dynamic, stride met (1.00×)",
	} {
		if !strings.Contains(got, w) {
			t.Errorf("verdicts lack %q:\n%s", w, got)
		}
	}
}
