// Command bench-graph runs SODA's graph workloads over far memory on the
// netns testbed and prints, per app, the time and the bytes on the fabric
// for each path to the memory node. lovelockd runs each role in its node
// (appliance/internal/memcluster): the memory server on mem0, the
// far-memory agent on dpu0, a host agent on host0 that goes through dpu0,
// and a host agent on host1 whose client talks to mem0 directly (SODA's
// MemServer baseline; host1's traffic only crosses dpu1's kernel routing).
// The graph is an R-MAT graph preloaded into a region on mem0; the program
// (this process) maps it through one host agent or the other with a host
// buffer of at most a third of the footprint, runs the app, and checks the
// answer against the same app on the in-memory copy.
//
// Rows, as SODA's Figs. 9–11:
//
//	(a) host → memory node directly (SODA's MemServer)
//	(b) host → DPU agent → memory node, no cache
//	(c) DPU + static cache of the offsets (the vertex data)
//	(d) DPU + dynamic cache, SODA's prefetcher (adjacent)
//	(e) DPU + dynamic cache with ours: stride, and the engine's hints
//
// dpu0's agent runs with a dynamic arena of -dpu-cache bytes in 1 MiB
// entries and regions out of the dynamic cache by default; each row sets
// its region's caching through the host agent (graph.Caching, fmap's
// advise op), as lovelock graph run does. Each row gets a fresh region,
// created and freed through dpu0's agent, and dpu0's lovelockd restarts
// before each row, so that no cache state (static ranges, entries, the
// adaptive switch, B_net) carries over from one row to the next.
//
// The table ends with issue 12's targets judged on its rows (verdict.go).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/lovelock-dpu/lovelock/appliance/internal/cpupin"
	"github.com/lovelock-dpu/lovelock/appliance/internal/memcluster"
	"github.com/lovelock-dpu/lovelock/control/testbed"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem/fmap"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem/graph"
)

var (
	prefix     = flag.String("prefix", fmt.Sprintf("bg%d-", os.Getpid()%100000), "namespace prefix of the testbed this run brings up (and removes)")
	lovelockd  = flag.String("lovelockd", "bin/lovelockd", "the lovelockd binary to run in the nodes")
	scale      = flag.Int("scale", 16, "R-MAT scale: 2^scale vertices")
	edgeFactor = flag.Int("edge-factor", 16, "R-MAT edges per vertex")
	seed       = flag.Uint64("seed", 1, "R-MAT seed")
	appsFlag   = flag.String("apps", "bfs,pagerank,cc,radii,bc", "apps to run")
	chunk      = flag.String("chunk", "64KiB", "mapping chunk size")
	workers    = flag.Int("workers", 2, "engine goroutines")
	readAhead  = flag.Int("read-ahead", 0, "the mappings' read-ahead in chunks (fmap.Options.ReadAhead; 0: off, the default)")
	iterations = flag.Int("iterations", 10, "PageRank iterations")
	bcSources  = flag.Int("bc-sources", 2, "BC sources")
	samples    = flag.Int("samples", 64, "Radii samples")
	dpuCache   = flag.String("dpu-cache", "8MiB", "dpu0's dynamic cache arena")
	dpuEntry   = flag.String("dpu-entry", "1MiB", "dpu0's dynamic cache entry size (SODA's is 1 MiB): the unit every prefetcher loads and evicts")
	rowsFlag   = flag.String("rows", "a,b,c,d,e", "rows to run")
	pinned     = flag.Bool("pinned", false, "run every row with dpu0's lovelockd on CPU 1 and this process, host0's, host1's and mem0's lovelockd on CPU 0 (the DPU agent on a CPU of its own); needs CPUs 0 and 1")
)

func main() {
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "bench-graph:", err)
		os.Exit(1)
	}
}

// path is one way from the program to the memory node, with its caching.
type path struct {
	id      string // a, b, c, d, e
	label   string
	socket  string        // host agent's far-memory socket
	caching graph.Caching // zero: do not advise (the direct path)
}

// row is one measured (app, path).
type row struct {
	app       graph.App
	path      path
	time      time.Duration
	memBytes  uint64 // memory server's link, both directions
	dpuFabric uint64 // DPU agent ↔ memory node
	dpuHost   uint64 // host ↔ DPU agent
	mapping   fmap.Stats
	cache     farmem.RegionCacheStats // deltas over the run
	switches  uint64
	entry     uint64 // the agent's entry size
	hints     *graph.HintStats
	check     string
}

// hitRate is farmem.HitRate of the row's region, and whether there is one
// (a cached path with reads).
func (r row) hitRate() (float64, bool) {
	rate, reads := farmem.HitRate(r.cache, r.mapping)
	if r.path.caching == (graph.Caching{}) || reads == 0 {
		return 0, false
	}
	return rate, true
}

// prefetchBytes estimates the fabric bytes of prefetching: entries issued
// × entry size (without headers).
func (r row) prefetchBytes() uint64 { return r.cache.PrefetchIssued * r.entry }

func run(ctx context.Context) (err error) {
	if *pinned {
		if err := needCPUs(cpupin.Usable(hostCPU, dpuCPU)); err != nil {
			return err
		}
	}
	var apps []graph.App
	for _, s := range strings.Split(*appsFlag, ",") {
		a, err := graph.ParseApp(strings.TrimSpace(s))
		if err != nil {
			return err
		}
		apps = append(apps, a)
	}
	chunkSize, err := farmem.ParseSize(*chunk)
	if err != nil {
		return fmt.Errorf("-chunk: %w", err)
	}
	if _, err := os.Stat(*lovelockd); err != nil {
		return fmt.Errorf("-lovelockd: %w (build it: make build, or go build -o bin/lovelockd ./appliance/cmd/lovelockd)", err)
	}

	start := time.Now()
	n, edges, err := graph.RMAT(*scale, *edgeFactor, *seed)
	if err != nil {
		return err
	}
	img, err := graph.Build(n, edges, true)
	if err != nil {
		return err
	}
	edges = nil
	local, err := graph.Open(img)
	if err != nil {
		return err
	}
	// mem0 preloads the graph for creates through dpu0 from this
	// directory only (its preload_dir).
	preloads, err := os.MkdirTemp("", "bench-graph-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(preloads)
	f, err := os.Create(filepath.Join(preloads, "graph.csr"))
	if err != nil {
		return err
	}
	if _, err := f.Write(img); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	// The buffer is whole chunks, at most a third of the footprint.
	buffer := int64(len(img)) / 3 / int64(chunkSize) * int64(chunkSize)
	if buffer < 2*int64(chunkSize) {
		return fmt.Errorf("R-MAT scale %d is %s: too small for a buffer of a third of it in %s chunks; raise -scale", *scale, farmem.Size(uint64(len(img))), chunkSize)
	}
	fmt.Printf("R-MAT scale %d, edge factor %d: %d vertices, %d edges stored (undirected), footprint %s; host buffer %s (footprint %.2f× the buffer), %s chunks; built in %s\n",
		*scale, *edgeFactor, local.N(), local.M(), farmem.Size(uint64(len(img))), farmem.Size(uint64(buffer)),
		float64(len(img))/float64(buffer), chunkSize, time.Since(start).Round(time.Millisecond))

	spec := testbed.DefaultSpec()
	spec.Prefix = *prefix
	if err := testbed.Up(ctx, spec); err != nil {
		return err
	}
	defer func() {
		if err := testbed.Down(context.Background(), spec); err != nil {
			fmt.Fprintln(os.Stderr, "bench-graph: testbed down:", err)
		}
	}()
	if err := testbed.SetMTU(spec, 9000); err != nil {
		return err
	}
	cl, err := memcluster.Start(ctx, spec, *lovelockd, memcluster.Options{
		Extra: []memcluster.Role{{
			Name: "host1-direct", Node: "host1",
			Config: fmt.Sprintf("far_memory_host: {agent: %q, socket: \"{{dir}}/direct.sock\"}\n", memcluster.MemAddr),
		}},
		AgentCache: fmt.Sprintf(`{size: %s, entry_size: %s, static_size: 64MiB, prefetcher: "off"}`, *dpuCache, *dpuEntry),
		PreloadDir: preloads,
	})
	if err != nil {
		return err
	}
	defer cl.Stop()
	// Restored before the cluster stops (defers run last first): Restore
	// needs the processes it pinned.
	var lay *layout
	if *pinned {
		if lay, err = pinLayout(cl, cl.Extra["host1-direct"]); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, lay.restore()) }()
		var unsteer func() error
		if unsteer, err = steerLayout(spec); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, unsteer()) }()
	}
	arena, err := farmem.ParseSize(*dpuCache)
	if err != nil {
		return fmt.Errorf("-dpu-cache: %w", err)
	}
	entry, err := farmem.ParseSize(*dpuEntry)
	if err != nil {
		return fmt.Errorf("-dpu-entry: %w", err)
	}
	fmt.Printf("testbed %q: MTU 9000; lovelockd: memory server on mem0, far-memory agent on dpu0 (dynamic cache %s in %s entries, static up to 64 MiB), host agents on host0 (through dpu0) and host1 (to mem0 directly)\n", spec.Prefix, *dpuCache, *dpuEntry)

	// Regions are created and freed through dpu0's agent by a client in
	// host0's namespace, so that a free drops the agent's cache state.
	var admin *farmem.Client
	if err := spec.Run("host0", func() error {
		var err error
		admin, err = farmem.NewClient(farmem.ClientOptions{Server: netip.MustParseAddrPort(memcluster.AgentAddr)})
		return err
	}); err != nil {
		return err
	}
	defer admin.Close()

	direct := filepath.Join(cl.Dir, "direct.sock")
	all := []path{
		{id: "a", label: "(a) MemServer: host → memory node", socket: direct},
		{id: "b", label: "(b) DPU, no cache", socket: cl.HostSocket, caching: graph.Caching{Prefetcher: "off"}},
		{id: "c", label: "(c) DPU + static offsets", socket: cl.HostSocket, caching: graph.Caching{Static: true, Prefetcher: "off"}},
		{id: "d", label: "(d) DPU + dynamic edge cache, adjacent (SODA)", socket: cl.HostSocket, caching: graph.Caching{Prefetcher: "adjacent"}},
		{id: "d", label: "(d) DPU + dynamic, whole region, adjacent", socket: cl.HostSocket, caching: graph.Caching{Prefetcher: "adjacent", WholeRegion: true}},
		{id: "e", label: "(e) DPU + dynamic, stride", socket: cl.HostSocket, caching: graph.Caching{Prefetcher: "stride"}},
		{id: "e", label: "(e) DPU + dynamic, hints", socket: cl.HostSocket, caching: graph.Caching{Prefetcher: "hints"}},
		{id: "e", label: "(e) DPU + static offsets + dynamic, hints", socket: cl.HostSocket, caching: graph.Caching{Static: true, Prefetcher: "hints"}},
	}
	var paths []path
	for _, pa := range all {
		if strings.Contains(","+*rowsFlag+",", ","+pa.id+",") {
			paths = append(paths, pa)
		}
	}
	p := graph.Params{Source: -1, Iterations: *iterations, BCSources: *bcSources, Samples: *samples, Seed: *seed}
	o := graph.Options{Workers: *workers, HintAhead: uint64(arena) / 4, HintGrain: uint64(entry)}
	mo := fmap.Options{ChunkSize: int(chunkSize), BufferBytes: buffer, ReadAhead: *readAhead}

	if h := layoutHeader(*pinned); h != "" {
		fmt.Println(h)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "app\trow\ttime\tvs (a)\tin memory\tmem0 link MB\tvs (a)\ton-demand MB\tprefetch MB\thost↔DPU MB\thit rate\tdynamic hit rate\taccuracy\tfaults\tswitch turns\tcheck\t")
	failed := 0
	var rows []row
	for _, app := range apps {
		startRef := time.Now()
		ref, err := graph.Run(ctx, graph.NewEngine(local, o), app, p)
		if err != nil {
			return err
		}
		refTime := time.Since(startRef)
		var base *row // this app's (a) row, when -rows has it
		for _, pa := range paths {
			// The adaptive switch, B_net and the arena are the agent's,
			// not the region's: each row starts on a fresh agent.
			if err := lay.restartDPU(ctx, cl, spec, *lovelockd); err != nil {
				return fmt.Errorf("restart dpu0's lovelockd: %w", err)
			}
			info, err := admin.Create(ctx, 0, farmem.CreateOptions{Preload: f.Name()})
			if err != nil {
				return fmt.Errorf("preload the graph on mem0 through dpu0: %w", err)
			}
			r, err := measure(ctx, cl, info.ID, pa, app, p, o, mo, ref)
			if ferr := admin.Free(ctx, info.ID); err == nil && ferr != nil {
				err = fmt.Errorf("free region %d: %w", info.ID, ferr)
			}
			if err != nil {
				return fmt.Errorf("%s via %s: %w", app, pa.label, err)
			}
			base = baseRow(base, r)
			rows = append(rows, r)
			if !r.ok() {
				failed++
			}
			hit, dyn, acc := "–", "–", "–"
			if h, ok := r.hitRate(); ok {
				hit = fmt.Sprintf("%.1f%%", 100*h)
			}
			if h, ok := r.dynamicHitRate(); ok {
				dyn = fmt.Sprintf("%.1f%%", 100*h)
			}
			if r.cache.PrefetchIssued > 0 {
				acc = fmt.Sprintf("%.1f%%", 100*float64(r.cache.PrefetchUsed)/float64(r.cache.PrefetchIssued))
			}
			pf := r.prefetchBytes()
			vsT, vsB := versusA(r, base)
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.1f\t%s\t%.1f\t%.1f\t%.1f\t%s\t%s\t%s\t%d\t%d\t%s\t\n", app, pa.label, r.time.Round(time.Millisecond),
				vsT, refTime.Round(time.Millisecond), mb(r.memBytes), vsB,
				mb(r.memBytes-min(pf, r.memBytes)), mb(pf), mb(r.dpuHost), hit, dyn, acc, r.mapping.Faults, r.switches, r.check)
		}
		tw.Flush()
	}
	tw.Flush()
	fmt.Println("mem0 link: the memory server's datagram bytes in and out (the fabric, the same measure on every path); prefetch: the agent's entry fills (entries issued × the entry size, without headers), on-demand the rest (with the static load for (c)).")
	fmt.Println("hit rate: (static + dynamic hits) / the region's reads at dpu0 (at least one per fault); dynamic hit rate: the dynamic cache's hits / the reads it holds (SODA's Fig. 10; an edge cache holds the edge arrays' reads only); accuracy: prefetched entries used / issued; switch turns: the adaptive switch's events during the run.")
	fmt.Println("check: the far-memory run against the same app on the in-memory copy (exact for bfs, cc, radii; relative 1e-9 for pagerank, bc).")
	for _, r := range rows {
		if r.hints != nil {
			fmt.Printf("hints %s: %d batches, %d ranges, %.1f MB named, %d entry loads started, %d dropped, %d errors %s\n",
				r.app, r.hints.Batches, r.hints.Extents, mb(r.hints.Bytes), r.hints.Started, r.hints.Dropped, r.hints.Errors, r.hints.Err)
		}
	}
	fmt.Println("targets (issue 12), judged on this run's rows:")
	for _, l := range layoutVerdicts(layoutName(*pinned), rows) {
		fmt.Println(l)
	}
	if failed > 0 {
		return fmt.Errorf("%d runs disagree with the in-memory run", failed)
	}
	return nil
}

func mb(b uint64) float64 { return float64(b) / 1e6 }

// baseRow is the "vs (a)" baseline after row r of an app: r itself when it
// is the (a) row (the MemServer path), else base unchanged.
func baseRow(base *row, r row) *row {
	if r.path.id == "a" {
		return &r
	}
	return base
}

// versusA is r's time and mem0 link bytes as multiples of the (a) row's,
// "-" when the run has no (a) row (-rows without a) or (a) took no time.
func versusA(r row, a *row) (t, b string) {
	if a == nil || a.time <= 0 {
		return "-", "-"
	}
	return fmt.Sprintf("%.2f×", float64(r.time)/float64(a.time)), fmt.Sprintf("%.2f×", float64(r.memBytes)/float64(max(a.memBytes, 1)))
}

type counters struct {
	mem, dpuFabric, dpuHost uint64
	agent                   farmem.AgentStats
}

func read(ctx context.Context, cl *memcluster.Cluster) (counters, error) {
	var c counters
	var ss farmem.ServerStats
	if err := cl.Mem.Client().ServiceStats(ctx, "memserver", &ss); err != nil {
		return c, err
	}
	var as farmem.AgentStats
	if err := cl.DPU.Client().ServiceStats(ctx, "farmem", &as); err != nil {
		return c, err
	}
	c.mem = ss.Link.TXBytes + ss.Link.RXBytes
	c.dpuFabric = as.Fabric.TXBytes + as.Fabric.RXBytes
	c.dpuHost = as.Host.TXBytes + as.Host.RXBytes
	c.agent = as
	return c, nil
}

// measure maps the region through pa's host agent, runs app, and checks
// it against ref.
func measure(ctx context.Context, cl *memcluster.Cluster, region uint32, pa path, app graph.App, p graph.Params, o graph.Options, mo fmap.Options, ref graph.Result) (row, error) {
	r := row{app: app, path: pa}
	before, err := read(ctx, cl)
	if err != nil {
		return r, err
	}
	g, m, err := graph.MapRegion(ctx, pa.socket, uint64(region), mo)
	if err != nil {
		return r, err
	}
	// The time includes loading the static range: SODA amortises it
	// over the run, and so must this row.
	start := time.Now()
	if pa.caching != (graph.Caching{}) {
		if _, err := pa.caching.Apply(ctx, m, g); err != nil {
			m.Close()
			return r, err
		}
	}
	var hinter *graph.MappingHinter
	if pa.caching.Hints() {
		hinter = graph.NewMappingHinter(ctx, m, int64(mo.ChunkSize))
		o.Hints = hinter
	}
	res, err := graph.Run(ctx, graph.NewEngine(g, o), app, p)
	r.time = time.Since(start)
	if hinter != nil {
		hs := hinter.Close()
		r.hints = &hs
	}
	st, serr := m.Stats(ctx)
	if cerr := m.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return r, err
	}
	if serr != nil {
		return r, serr
	}
	r.mapping = st
	after, err := read(ctx, cl)
	if err != nil {
		return r, err
	}
	r.memBytes = after.mem - before.mem
	r.dpuFabric = after.dpuFabric - before.dpuFabric
	r.dpuHost = after.dpuHost - before.dpuHost
	b, a := regionStats(before.agent, region), regionStats(after.agent, region)
	r.cache = a.Since(b)
	r.cache.Region = region
	r.switches = after.agent.Cache.Switches - before.agent.Cache.Switches
	r.entry = after.agent.Cache.EntrySize
	r.check = "ok"
	if err := graph.Compare(res, ref, graph.DefaultTolerance); err != nil {
		r.check = "MISMATCH: " + err.Error()
	}
	return r, nil
}

func regionStats(st farmem.AgentStats, region uint32) farmem.RegionCacheStats {
	for _, r := range st.Cache.Regions {
		if r.Region == region {
			return r
		}
	}
	return farmem.RegionCacheStats{}
}
