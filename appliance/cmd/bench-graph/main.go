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
// Paths:
//
//	(a) host → memory node directly
//	(b) host → DPU agent → memory node, no cache
//	(c)–(e) DPU static cache, dynamic cache, dynamic cache with prefetching:
//	    printed as "not built" until the DPU caches exist
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/lovelock-dpu/lovelock/appliance/internal/memcluster"
	"github.com/lovelock-dpu/lovelock/control/api"
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
	iterations = flag.Int("iterations", 10, "PageRank iterations")
	bcSources  = flag.Int("bc-sources", 2, "BC sources")
	samples    = flag.Int("samples", 64, "Radii samples")
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

// path is one way from the program to the memory node.
type path struct {
	label  string
	socket string // host agent's far-memory socket; "" if not built
	why    string // why it is not built
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
	check     string
}

func run(ctx context.Context) error {
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
	f, err := os.CreateTemp("", "bench-graph-*.csr")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
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
	cl, err := memcluster.Start(ctx, spec, *lovelockd, memcluster.Options{Extra: []memcluster.Role{{
		Name: "host1-direct", Node: "host1",
		Config: fmt.Sprintf("far_memory_host: {agent: %q, socket: \"{{dir}}/direct.sock\"}\n", memcluster.MemAddr),
	}}})
	if err != nil {
		return err
	}
	defer cl.Stop()
	fmt.Printf("testbed %q: MTU 9000; lovelockd: memory server on mem0, far-memory agent on dpu0, host agents on host0 (through dpu0) and host1 (to mem0 directly)\n", spec.Prefix)

	mem := cl.Mem.Client()
	var info farmem.RegionInfo
	if err := mem.ServiceCall(ctx, http.MethodPost, "memserver", "regions", api.MemCreate{Preload: f.Name()}, &info); err != nil {
		return fmt.Errorf("preload the graph on mem0: %w", err)
	}
	paths := []path{
		{label: "(a) host → memory node", socket: filepath.Join(cl.Dir, "direct.sock")},
		{label: "(b) host → DPU agent → memory node, no cache", socket: cl.HostSocket},
		{label: "(c) DPU static cache (vertex offsets)", why: "not built"},
		{label: "(d) DPU dynamic cache", why: "not built"},
		{label: "(e) DPU dynamic cache + prefetching", why: "not built"},
	}
	p := graph.Params{Source: -1, Iterations: *iterations, BCSources: *bcSources, Samples: *samples, Seed: *seed}
	o := graph.Options{Workers: *workers}
	mo := fmap.Options{ChunkSize: int(chunkSize), BufferBytes: buffer}

	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "app\tpath\ttime\tvs (a)\tin memory\tfabric bytes (mem0)\tDPU↔mem0 bytes\thost↔DPU bytes\tfaults\tevictions\tcheck\t")
	failed := 0
	for _, app := range apps {
		startRef := time.Now()
		ref, err := graph.Run(ctx, graph.NewEngine(local, o), app, p)
		if err != nil {
			return err
		}
		refTime := time.Since(startRef)
		var base time.Duration
		for _, pa := range paths {
			if pa.socket == "" {
				fmt.Fprintf(tw, "%s\t%s\t%s\t\t\t\t\t\t\t\t\t\n", app, pa.label, pa.why)
				continue
			}
			r, err := measure(ctx, cl, info.ID, pa, app, p, o, mo, ref)
			if err != nil {
				return fmt.Errorf("%s via %s: %w", app, pa.label, err)
			}
			if base == 0 {
				base = r.time
			}
			if !strings.HasPrefix(r.check, "ok") {
				failed++
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f×\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t\n", app, pa.label, r.time.Round(time.Millisecond),
				float64(r.time)/float64(base), refTime.Round(time.Millisecond), r.memBytes, r.dpuFabric, r.dpuHost,
				r.mapping.Faults, r.mapping.Evictions, r.check)
		}
	}
	tw.Flush()
	fmt.Println("fabric bytes (mem0): the memory server's datagram bytes in and out; DPU↔mem0 and host↔DPU: dpu0's agent's, both directions (0 on path (a), which does not cross it).")
	fmt.Println("check: the far-memory run against the same app on the in-memory copy (exact for bfs, cc, radii; relative 1e-9 for pagerank, bc).")
	if failed > 0 {
		return fmt.Errorf("%d runs disagree with the in-memory run", failed)
	}
	return nil
}

type counters struct{ mem, dpuFabric, dpuHost uint64 }

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
	start := time.Now()
	res, err := graph.Run(ctx, graph.NewEngine(g, o), app, p)
	r.time = time.Since(start)
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
	r.check = "ok"
	if err := graph.Compare(res, ref, graph.DefaultTolerance); err != nil {
		r.check = "MISMATCH: " + err.Error()
	}
	return r, nil
}
