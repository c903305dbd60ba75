package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem/fmap"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem/graph"
)

// runGraph runs `lovelock graph args...` in-process.
func runGraph(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := Run(context.Background(), App(&out, &out), append([]string{"lovelock", "graph"}, args...))
	return out.String(), err
}

func TestGraphHelp(t *testing.T) {
	for _, sub := range []string{"", "gen", "convert", "info", "run"} {
		args := []string{"--help"}
		if sub != "" {
			args = []string{sub, "--help"}
		}
		out, err := runGraph(t, args...)
		if err != nil || !strings.Contains(out, "USAGE") {
			t.Errorf("graph %s --help: %v\n%s", sub, err, out)
		}
	}
}

func TestGraphFiles(t *testing.T) {
	dir := t.TempDir()
	g := filepath.Join(dir, "g.csr")
	out, err := runGraph(t, "gen", "--scale", "8", "--edge-factor", "4", "-w", g)
	if err != nil || !strings.Contains(out, "256 vertices") {
		t.Fatalf("gen: %v\n%s", err, out)
	}
	out, err = runGraph(t, "info", "-o", "json", g)
	if err != nil {
		t.Fatalf("info: %v\n%s", err, out)
	}
	var info graphInfo
	if err := json.Unmarshal([]byte(out), &info); err != nil || info.Vertices != 256 || !info.Symmetric || info.Edges == 0 {
		t.Errorf("info: %+v (%v)\n%s", info, err, out)
	}

	el := filepath.Join(dir, "path.txt")
	os.WriteFile(el, []byte("# a path\n0 1\n1 2\n2 3\n"), 0o600)
	p := filepath.Join(dir, "path.csr")
	if out, err := runGraph(t, "convert", "-w", p, el); err != nil || !strings.Contains(out, "4 vertices, 6 edges stored (undirected)") {
		t.Fatalf("convert: %v\n%s", err, out)
	}
	out, err = runGraph(t, "run", "--local", "--app", "bfs", "--source", "0", "--graph", p)
	if err != nil || !strings.Contains(out, "reached 4 of 4 vertices, depth 3") {
		t.Errorf("run --local: %v\n%s", err, out)
	}

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--app", "bfs", "--graph", p, "--cache", "fast"}, `cache mode "fast"`},
		{[]string{"run", "--app", "bfs", "--graph", p, "--cache", "dynamic", "--prefetch", "next"}, `prefetcher "next"`},
		{[]string{"run", "--app", "bfs", "--graph", p, "--prefetch", "stride"}, "needs the dynamic cache"},
		{[]string{"run", "--app", "bfs", "--graph", p, "--cache", "dynamic", "--prefetch", "off"}, "would cache nothing"},
		{[]string{"run", "--app", "sssp", "--graph", p}, "unknown app"},
		{[]string{"run", "--app", "bfs", "--graph", p}, "give --region"},
		{[]string{"run", "--app", "bfs", "--graph", el, "--local"}, "malformed CSR"},
		{[]string{"convert", "-w", p, filepath.Join(dir, "none")}, "no such file"},
	} {
		out, err := runGraph(t, bad.args...)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("graph %v: %v, want an error with %q\n%s", bad.args, err, bad.want, out)
		}
	}
}

// TestGraphOutFlag: -o is --output on every command, so gen and convert
// take their file as --out or -w; before, graph gen --scale 4 -o json wrote
// a graph to a file named json.
func TestGraphOutFlag(t *testing.T) {
	t.Chdir(t.TempDir())
	if err := os.WriteFile("path.txt", []byte("0 1\n1 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args  []string
		want  string // in the error; "" for none
		wrote string // the file written
	}{
		{[]string{"gen", "--scale", "4", "-o", "json"}, "flag provided but not defined: -o", ""},
		{[]string{"convert", "path.txt", "-o", "json"}, "flag provided but not defined: -o", ""},
		{[]string{"gen", "--scale", "4", "-w", "a.csr"}, "", "a.csr"},
		{[]string{"gen", "--scale", "4", "--out", "b.csr"}, "", "b.csr"},
		{[]string{"convert", "path.txt", "-w", "c.csr"}, "", "c.csr"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, err := runGraph(t, tc.args...)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("%v\n%s", err, out)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("err = %v, want %q\n%s", err, tc.want, out)
			}
			if _, err := os.Stat("json"); err == nil {
				t.Error("wrote a file named json")
			}
			if _, err := os.Stat(tc.wrote); tc.wrote != "" && err != nil {
				t.Errorf("%s not written: %v", tc.wrote, err)
			}
		})
	}
}

// TestGraphRunFlagRanges: graph run refuses app parameters out of range
// before it reads the graph, naming the flag and what it takes. Before,
// --tolerance NaN or +Inf passed every PageRank and BC check (no difference
// is above them) and a negative one failed every check, --samples -1
// panicked, --samples 65 ran 64 sources, --iterations -3 ran no iteration
// and printed the initial ranks as PageRank's, and --workers -1 ran.
func TestGraphRunFlagRanges(t *testing.T) {
	g := filepath.Join(t.TempDir(), "g.csr")
	if out, err := runGraph(t, "gen", "--scale", "4", "-w", g); err != nil {
		t.Fatalf("gen: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--app", "pagerank", "--tolerance", "NaN"}, "graph run: --tolerance NaN: want a finite number ≥ 0 (left out: 1e-09)"},
		{[]string{"--app", "pagerank", "--tolerance", "+Inf"}, "graph run: --tolerance +Inf: want a finite number ≥ 0 (left out: 1e-09)"},
		{[]string{"--app", "bc", "--tolerance", "-1e-9"}, "graph run: --tolerance -1e-09: want a finite number ≥ 0 (left out: 1e-09)"},
		{[]string{"--app", "pagerank", "--iterations", "-3"}, "graph run: --iterations -3: want 1 or more (left out: 20)"},
		{[]string{"--app", "pagerank", "--iterations", "0"}, "graph run: --iterations 0: want 1 or more (left out: 20)"},
		{[]string{"--app", "radii", "--samples", "-1"}, "graph run: --samples -1: want 1 to 64 (left out: 64)"},
		{[]string{"--app", "radii", "--samples", "65"}, "graph run: --samples 65: want 1 to 64 (left out: 64)"},
		{[]string{"--app", "bc", "--bc-sources", "-2"}, "graph run: --bc-sources -2: want 1 or more (left out: 4)"},
		{[]string{"--app", "bfs", "--workers", "-1"}, "graph run: --workers -1: want 1 or more (left out: GOMAXPROCS)"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, err := runGraph(t, append([]string{"run", "--graph", g, "--local"}, tc.args...)...)
			if err == nil || err.Error() != tc.want {
				t.Errorf("err = %v, want %q\n%s", err, tc.want, out)
			}
		})
	}
	for _, args := range [][]string{{"--app", "radii", "--samples", "64"}, {"--app", "pagerank", "--tolerance", "0", "--iterations", "1"}} {
		if out, err := runGraph(t, append([]string{"run", "--graph", g, "--local"}, args...)...); err != nil {
			t.Errorf("%v: %v\n%s", args, err, out)
		}
	}
}

// TestMain runs the host agent of TestGraphRunFar instead of the tests when
// the test binary is started as one (CLI_GRAPH_HELPER=agent).
func TestMain(m *testing.M) {
	if os.Getenv("CLI_GRAPH_HELPER") == "agent" {
		if err := graphHelperAgent(); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// graphHelperAgent serves region N from the file DIR/N until SIGTERM;
// region 100+N too, with a backend whose Sync fails.
func graphHelperAgent() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	dir := os.Getenv("CLI_GRAPH_DIR")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "agent.sock"), Net: "unix"})
	if err != nil {
		return err
	}
	agent := &fmap.Agent{Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	err = agent.Serve(ctx, ln, func(_ context.Context, r fmap.RegionRef) (fmap.Backend, error) {
		id, syncErr := r.ID, error(nil)
		if id >= 100 {
			id, syncErr = id-100, errors.New("injected sync error")
		}
		f, err := os.Open(filepath.Join(dir, strconv.FormatUint(id, 10)))
		if err != nil {
			return nil, err
		}
		st, _ := f.Stat()
		return roFile{f, st.Size(), syncErr}, nil
	})
	return err
}

type roFile struct {
	*os.File
	size    int64
	syncErr error
}

func (f roFile) Size() int64                        { return f.size }
func (f roFile) Sync() error                        { return f.syncErr }
func (f roFile) WriteAt([]byte, int64) (int, error) { return 0, errors.New("read-only") }

// TestGraphRunFar runs `graph run` over a region served by a host agent in
// another process, with the default buffer (a third of the file): every
// app's check passes; a region holding another graph fails the check.
func TestGraphRunFar(t *testing.T) {
	testenv.RequirePriv(t)
	dir := t.TempDir()
	g, other := filepath.Join(dir, "g.csr"), filepath.Join(dir, "other.csr")
	if out, err := runGraph(t, "gen", "--scale", "11", "--edge-factor", "8", "-w", g); err != nil {
		t.Fatalf("gen: %v\n%s", err, out)
	}
	if out, err := runGraph(t, "gen", "--scale", "11", "--edge-factor", "8", "--seed", "2", "-w", other); err != nil {
		t.Fatalf("gen: %v\n%s", err, out)
	}
	for id, f := range map[string]string{"1": g, "2": other} {
		b, _ := os.ReadFile(f)
		os.WriteFile(filepath.Join(dir, id), b, 0o600)
	}
	cmd := exec.Command(os.Args[0], "-test.count=1")
	cmd.Env = append(os.Environ(), "CLI_GRAPH_HELPER=agent", "CLI_GRAPH_DIR="+dir)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
	sock := filepath.Join(dir, "agent.sock")
	// Ready when it answers, not when its socket file exists: bind makes
	// the file before listen takes connections.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the host agent did not start")
		}
	}
	for _, app := range []string{"bfs", "pagerank", "cc", "radii", "bc"} {
		out, err := runGraph(t, "run", "--app", app, "--graph", g, "--region", "1", "--host-socket", sock, "--chunk", "4KiB")
		if err != nil {
			t.Fatalf("run %s: %v\n%s", app, err, out)
		}
		for _, want := range []string{"check: ok", "over far memory", "evictions", "DPU cache hit rate: not measured"} {
			if !strings.Contains(out, want) {
				t.Errorf("run %s: output lacks %q:\n%s", app, want, out)
			}
		}
		if strings.Contains(out, " 0 evictions") {
			t.Errorf("run %s: a buffer of a third of the graph evicted nothing:\n%s", app, out)
		}
	}
	// A host agent serving files takes no cache advice: caching is refused,
	// not silently skipped.
	for _, mode := range [][]string{{"--cache", "static"}, {"--cache", "dynamic", "--prefetch", "hints"}} {
		args := append([]string{"run", "--app", "bfs", "--graph", g, "--region", "1", "--host-socket", sock}, mode...)
		if out, err := runGraph(t, args...); err == nil || !strings.Contains(err.Error(), "takes no cache advice") {
			t.Errorf("graph %v: %v, want a refusal\n%s", args, err, out)
		}
	}
	out, err := runGraph(t, "run", "--app", "cc", "--graph", g, "--region", "2", "--host-socket", sock, "-o", "json")
	if err == nil || !strings.Contains(out, "MISMATCH") {
		t.Errorf("a region holding another graph: %v\n%s", err, out)
	}
	// A run that succeeds still fails the command when the mapping's Close
	// does, after printing its report.
	out, err = runGraph(t, "run", "--app", "bfs", "--graph", g, "--region", "101", "--host-socket", sock)
	if err == nil || !strings.Contains(err.Error(), "injected sync error") || !strings.Contains(out, "check: ok") {
		t.Errorf("a run whose mapping's Close fails: %v, want the Close error after the report\n%s", err, out)
	}
}

// TestGraphHitRateReadAhead: with read-ahead, the host's chunk reads are
// its faults plus its read-ahead, and the reads the hit rate is over are
// at least those (static cache, prefetcher off: the misses are counted
// nowhere); counting only the faults showed 100 %.
func TestGraphHitRateReadAhead(t *testing.T) {
	at := func(static uint64) *farmem.AgentStats {
		return &farmem.AgentStats{Cache: farmem.CacheStats{Regions: []farmem.RegionCacheStats{{Region: 7, StaticHits: static}}}}
	}
	d, note := regionCacheDelta(at(10), at(60), 7, fmap.Stats{Faults: 40, ReadAhead: 400}, true)
	if d == nil {
		t.Fatalf("no cache delta: %s", note)
	}
	if d.Reads != 440 || d.HitRate < 0.11 || d.HitRate > 0.12 {
		t.Errorf("50 static hits, 40 faults and 400 chunks read ahead: %d reads, hit rate %.3f; want 440 reads, about 0.11", d.Reads, d.HitRate)
	}
}

// TestGraphHostBufferLine: the host-buffer line shows the chunks read ahead
// beside the faults; before, it showed the faults only, so a run with
// --read-ahead 16 looked as if it had read a tenth of what it had.
func TestGraphHostBufferLine(t *testing.T) {
	r := graphRunReport{Buffer: 4 << 20, Chunk: 64 << 10, Mapping: &fmap.Stats{Faults: 40, ReadAhead: 400, Evictions: 7, Capacity: 64}}
	var out bytes.Buffer
	printGraphRun(&out, r)
	want := "host buffer: 4MiB (64 chunks of 64KiB): 40 faults, 400 chunks read ahead, 7 evictions\n"
	if !strings.Contains(out.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, out.String())
	}
}

// TestGraphVerdict: a passed check says what it checked: equality for the
// apps compared exactly, the tolerance for PageRank and BC; before, every
// app's verdict said "equal", scores within the tolerance too.
func TestGraphVerdict(t *testing.T) {
	for _, tc := range []struct {
		app  graph.App
		want string
	}{
		{graph.BFS, "ok: equal to the in-memory run"},
		{graph.Components, "ok: equal to the in-memory run"},
		{graph.Radii, "ok: equal to the in-memory run"},
		{graph.PageRank, "ok: within 1e-09 (relative) of the in-memory run"},
		{graph.BC, "ok: within 1e-09 (relative) of the in-memory run"},
	} {
		if got := graphVerdict(tc.app, graph.DefaultTolerance); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.app, got, tc.want)
		}
	}
}

// TestGraphBytesNotMeasured: a byte count whose counters went back during
// the run (lovelockd restarted), or whose service did not answer, is left
// out with the reason; before, the first printed the wrapped difference
// (about 1.8e19 bytes) and the second "no --dpu-socket" though one was
// given.
func TestGraphBytesNotMeasured(t *testing.T) {
	u := func(v uint64) *uint64 { return &v }
	r := graphRunReport{NotMeasured: map[string]string{}}
	r.DPUFabricBytes = r.delta("dpu_fabric_bytes", u(5000), u(100), nil, nil)
	r.DPUHostBytes = r.delta("dpu_host_bytes", nil, nil, errors.New("connection refused"), nil)
	r.MemLinkBytes = r.delta("mem_link_bytes", u(100), u(5000), nil, nil)
	var out bytes.Buffer
	printGraphRun(&out, r)
	for _, want := range []string{
		"DPU agent ↔ memory nodes (fabric): not measured (its counters went back during the run",
		"DPU agent ↔ hosts: not measured (the service did not answer: connection refused)",
		"memory server link: 4900 bytes",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestGraphCacheDeltaRestart: a DPU agent whose counters went back during
// the run has no cache delta, and says why; before, the hit rate came from
// counters wrapped to about 1.8e19.
func TestGraphCacheDeltaRestart(t *testing.T) {
	st := func(hits uint64) *farmem.AgentStats {
		var a farmem.AgentStats
		a.Cache.Regions = []farmem.RegionCacheStats{{Region: 7, Hits: hits, Misses: hits}}
		return &a
	}
	if d, note := regionCacheDelta(st(500), st(10), 7, fmap.Stats{}, true); d != nil || !strings.Contains(note, "went back") {
		t.Errorf("counters went back: delta %+v, note %q; want none, saying why", d, note)
	}
	if d, note := regionCacheDelta(st(10), st(500), 7, fmap.Stats{}, true); d == nil || d.Hits != 490 || note != "" {
		t.Errorf("counters went on: delta %+v, note %q; want 490 hits", d, note)
	}
}

// TestGraphSizeHasUnit: gen, convert and info print the file's size with a
// unit. Before, a size no binary unit divides printed as a bare number
// ("…(undirected), 1544"), which read as a count of something.
func TestGraphSizeHasUnit(t *testing.T) {
	dir := t.TempDir()
	g := filepath.Join(dir, "g.csr")
	el := filepath.Join(dir, "path.txt")
	if err := os.WriteFile(el, []byte("0 1\n1 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	withUnit := regexp.MustCompile(`\d+ bytes( \(\d+\.\d [KMG]iB\))?`)
	for _, args := range [][]string{
		{"gen", "--scale", "4", "-w", g},
		{"gen", "--scale", "9", "-w", g},
		{"convert", "-w", g, el},
		{"info", g},
	} {
		out, err := runGraph(t, args...)
		if err != nil || !withUnit.MatchString(out) {
			t.Errorf("graph %v: %v; want the size in bytes with a unit:\n%s", args, err, out)
		}
	}
	for _, tc := range []struct {
		b    uint64
		want string
	}{
		{0, "0 bytes"},
		{1000, "1000 bytes"},
		{1544, "1544 bytes (1.5 KiB)"},
		{32 << 20, "33554432 bytes (32.0 MiB)"},
		{3<<30 + 1, "3221225473 bytes (3.0 GiB)"},
	} {
		if got := byteSize(tc.b); got != tc.want {
			t.Errorf("byteSize(%d) = %q, want %q", tc.b, got, tc.want)
		}
	}
}

// TestGraphConvertSparseIDs: convert keeps IDs that the edges bound, and
// refuses sparser ones, naming --renumber, before it allocates anything for
// them; --renumber numbers the vertices densely and writes the map back to
// the original IDs. Before, one ID near 2^32 made convert allocate about
// 32 bytes for every vertex up to it, over 100 GiB.
func TestGraphConvertSparseIDs(t *testing.T) {
	dir := t.TempDir()
	el := filepath.Join(dir, "sparse.txt")
	if err := os.WriteFile(el, []byte("# a path with a typo\n10 4294967294\n4294967294 30\n30 10\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	g := filepath.Join(dir, "g.csr")
	out, err := runGraph(t, "convert", "-w", g, el)
	if err == nil || !strings.Contains(err.Error(), "--renumber") || !strings.Contains(err.Error(), "4294967294") {
		t.Fatalf("convert of IDs up to 4294967294 from 3 edges: %v, want a refusal naming --renumber and the ID\n%s", err, out)
	}
	if _, err := os.Stat(g); err == nil {
		t.Errorf("the refused convert wrote %s", g)
	}

	out, err = runGraph(t, "convert", "--renumber", "-w", g, el)
	if err != nil || !strings.Contains(out, "3 vertices, 6 edges stored (undirected)") || !strings.Contains(out, g+".ids") {
		t.Fatalf("convert --renumber: %v\n%s", err, out)
	}
	ids, err := os.ReadFile(g + ".ids")
	if want := "# vertex original-ID (lovelock graph convert --renumber)\n0 10\n1 30\n2 4294967294\n"; err != nil || string(ids) != want {
		t.Errorf("the map: %q (%v), want %q", ids, err, want)
	}
	out, err = runGraph(t, "run", "--local", "--app", "bfs", "--source", "0", "--graph", g)
	if err != nil || !strings.Contains(out, "reached 3 of 3 vertices") {
		t.Errorf("run over the renumbered graph: %v\n%s", err, out)
	}

	// IDs with gaps that the edges bound are kept: vertex 5 stays 5.
	dense := filepath.Join(dir, "gaps.txt")
	if err := os.WriteFile(dense, []byte("0 5\n5 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := runGraph(t, "convert", "-w", g, dense); err != nil || !strings.Contains(out, "6 vertices") {
		t.Errorf("convert of IDs with a few gaps: %v\n%s", err, out)
	}
}

// TestGraphErrorsNameTheFlag: a refused convert or run names the flag (or
// the file) to change. Before, "unknown app", "cache mode", the CSR's own
// complaints, a BFS source past the graph, a socket that did not answer
// and a file that could not be written said nothing of which flag.
func TestGraphErrorsNameTheFlag(t *testing.T) {
	dir := t.TempDir()
	g := filepath.Join(dir, "g.csr")
	if out, err := runGraph(t, "gen", "--scale", "4", "-w", g); err != nil {
		t.Fatalf("gen: %v\n%s", err, out)
	}
	el := filepath.Join(dir, "path.txt")
	if err := os.WriteFile(el, []byte("0 1\nx 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	gone := filepath.Join(dir, "gone", "sock")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"gen", "--scale", "40", "-w", g}, "graph gen: --scale 40"},
		{[]string{"gen", "--scale", "4", "-w", filepath.Join(dir, "none", "g.csr")}, "graph gen: --out "},
		{[]string{"convert", "-w", filepath.Join(dir, "none", "g.csr"), el}, "graph convert: " + el + ": graph: edge list line 2"},
		{[]string{"run", "--local", "--app", "sssp", "--graph", g}, "graph run: --app: "},
		{[]string{"run", "--local", "--app", "bfs", "--graph", g, "--cache", "fast"}, `graph run: graph: --cache: cache mode "fast"`},
		{[]string{"run", "--local", "--app", "bfs", "--graph", g, "--cache", "dynamic", "--prefetch", "next"}, "--prefetch: "},
		{[]string{"run", "--local", "--app", "bfs", "--graph", g, "--cache", "dynamic", "--dynamic-scope", "all"}, "--dynamic-scope: "},
		{[]string{"run", "--local", "--app", "bfs", "--graph", el}, "graph run: --graph: " + el},
		{[]string{"run", "--local", "--app", "bfs", "--graph", filepath.Join(dir, "none.csr")}, "graph run: --graph: "},
		{[]string{"run", "--local", "--app", "bfs", "--graph", g, "--source", "16"}, "graph run: --source 16: want a vertex of"},
		{[]string{"run", "--app", "bfs", "--graph", g, "--region", "3", "--host-socket", gone}, "graph run: --region 3 through --host-socket " + gone},
		{[]string{"run", "--app", "bfs", "--graph", g, "--mem-socket", gone}, "graph run: --mem-socket " + gone},
		{[]string{"run", "--app", "bfs", "--graph", g, "--region", "3", "--buffer", "lots"}, "graph run: --buffer: "},
	} {
		out, err := runGraph(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("graph %v: %v, want an error with %q\n%s", tc.args, err, tc.want, out)
		}
	}
	// The file that could not be written is named with its flag.
	ok := filepath.Join(dir, "ok.txt")
	if err := os.WriteFile(ok, []byte("0 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "none", "g.csr")
	if _, err := runGraph(t, "convert", "-w", bad, ok); err == nil || !strings.Contains(err.Error(), "graph convert: --out "+bad) {
		t.Errorf("convert to %s: %v, want an error naming --out", bad, err)
	}
}
