package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem/fmap"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem/graph"
)

func graphCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "graph",
		Usage: "graph workloads over far memory (SODA's BFS, PageRank, Components, Radii, BC): make CSR files, run and check apps",
		Description: "Graphs are binary CSR files (docs/graph.md). gen makes an R-MAT (Graph500) graph, convert\n" +
			"reads a SNAP edge list, info checks a file. run maps the file's far-memory copy through this\n" +
			"host's lovelockd (far_memory_host) and runs an app over it, then runs the same app on the\n" +
			"file in memory and compares: it prints the time, the bytes on the fabric, the host buffer's\n" +
			"faults and read-ahead and the check's verdict, and fails if the answers differ.",
		Subcommands: []*ucli.Command{graphGenCommand(), graphConvertCommand(), graphInfoCommand(), graphRunCommand()},
	}
}

// outFlag is the file gen and convert write. Its short name is -w, as
// capture's --write: -o is --output (the format) on every command.
func outFlag() ucli.Flag {
	return &ucli.StringFlag{Name: "out", Aliases: []string{"w"}, Usage: "the CSR `FILE` to write", Required: true}
}

// writeAtomic writes b to path through a temporary file and a rename, so a
// reader never sees half a file.
func writeAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// writeCSR writes img to path (--out) and says what it wrote.
func writeCSR(w io.Writer, path string, img []byte) error {
	if err := writeAtomic(path, img); err != nil {
		return fmt.Errorf("--out %s: %w", path, err)
	}
	h, _ := graph.ParseHeader(img)
	kind := "directed"
	if h.Flags&graph.FlagSymmetric != 0 {
		kind = "undirected"
	}
	fmt.Fprintf(w, "%s: %d vertices, %d edges stored (%s), %s\n", path, h.N, h.M, kind, byteSize(uint64(len(img))))
	return nil
}

// byteSize formats a byte count with its unit: farmem.Size prints a bare
// number when no binary unit divides it, which read as a count of
// something else.
func byteSize(b uint64) string {
	units := []struct {
		name string
		n    uint64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}
	for _, u := range units {
		if b >= u.n {
			return fmt.Sprintf("%d bytes (%.1f %s)", b, float64(b)/float64(u.n), u.name)
		}
	}
	return fmt.Sprintf("%d bytes", b)
}

func graphGenCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "gen",
		Usage:     "generate an R-MAT (Graph500) graph: 2^scale vertices, edge-factor × 2^scale edges, as a CSR file",
		ArgsUsage: " ",
		Flags: []ucli.Flag{
			&ucli.IntFlag{Name: "scale", Usage: "log2 of the number of vertices", Required: true},
			&ucli.IntFlag{Name: "edge-factor", Value: 16, Usage: "edges per vertex (Graph500's 16)"},
			&ucli.Uint64Flag{Name: "seed", Value: 1, Usage: "the same seed gives the same graph"},
			&ucli.BoolFlag{Name: "directed", Usage: "keep edges directed (the file then also holds the transpose); default undirected, as Ligra's apps expect"},
			outFlag(),
		},
		Action: func(c *ucli.Context) error {
			n, edges, err := graph.RMAT(c.Int("scale"), c.Int("edge-factor"), c.Uint64("seed"))
			if err != nil {
				return fmt.Errorf("graph gen: --scale %d --edge-factor %d: %w", c.Int("scale"), c.Int("edge-factor"), err)
			}
			img, err := graph.Build(n, edges, !c.Bool("directed"))
			if err != nil {
				return fmt.Errorf("graph gen: %w", err)
			}
			if err := writeCSR(c.App.Writer, c.String("out"), img); err != nil {
				return fmt.Errorf("graph gen: %w", err)
			}
			return nil
		},
	}
}

func graphConvertCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "convert",
		Usage:     "convert a SNAP-style edge list (one 'src dst' pair per line, '#' comments; '-' for stdin) to a CSR file",
		ArgsUsage: "EDGELIST",
		Description: "Vertex IDs are kept as vertex numbers (vertex 7 of the list is vertex 7 of the graph) while\n" +
			"the largest is below twice the number of edges (or 65536); sparser IDs are refused, since the\n" +
			"gaps would cost memory for vertices without edges. --renumber numbers the vertices 0 to k-1 in\n" +
			"the order of their IDs instead and writes each one's original ID to FILE.ids.",
		Flags: []ucli.Flag{
			&ucli.BoolFlag{Name: "directed", Usage: "keep edges directed; default: store both directions"},
			&ucli.BoolFlag{Name: "renumber", Usage: "number the vertices 0 to k-1 in the order of their IDs, and write 'vertex original-ID' lines to the --out FILE.ids"},
			outFlag(),
		},
		Action: func(c *ucli.Context) error {
			if c.NArg() == 0 {
				return errors.New("graph convert: want one edge list file (or - for stdin)")
			}
			if err := checkArgs(c, 1); err != nil {
				return err
			}
			var r io.Reader = os.Stdin
			p := c.Args().First()
			if p != "-" {
				f, err := os.Open(p)
				if err != nil {
					return fmt.Errorf("graph convert: %w", err)
				}
				defer f.Close()
				r = f
			}
			n, edges, err := graph.ReadEdgeList(r)
			if err != nil {
				return fmt.Errorf("graph convert: %s: %w", p, err)
			}
			out := c.String("out")
			var ids []uint32
			if c.Bool("renumber") {
				ids = graph.Renumber(edges)
				n = uint64(len(ids))
			} else if err := graph.CheckIDs(n, len(edges)); err != nil {
				return fmt.Errorf("graph convert: %s: %w; convert it with --renumber (vertices numbered 0 to k-1 in the order of their IDs, the original IDs written to %s.ids)", p, err, out)
			}
			img, err := graph.Build(n, edges, !c.Bool("directed"))
			if err != nil {
				return fmt.Errorf("graph convert: %s: %w", p, err)
			}
			if err := writeCSR(c.App.Writer, out, img); err != nil {
				return fmt.Errorf("graph convert: %w", err)
			}
			if ids == nil {
				return nil
			}
			if err := writeAtomic(out+".ids", idMap(ids)); err != nil {
				return fmt.Errorf("graph convert: --renumber: the map of IDs: %w (%s is written, but its vertices cannot be mapped back: run again)", err, out)
			}
			fmt.Fprintf(c.App.Writer, "renumbered: vertex v is the v-th smallest ID of the list (0 to %d for IDs %d to %d); %s.ids gives each one's original ID\n",
				len(ids)-1, ids[0], ids[len(ids)-1], out)
			return nil
		},
	}
}

// idMap is the --renumber map: a comment, then "vertex original-ID" per
// line, as SNAP's edge lists are laid out.
func idMap(ids []uint32) []byte {
	b := []byte("# vertex original-ID (lovelock graph convert --renumber)\n")
	for v, id := range ids {
		b = strconv.AppendInt(b, int64(v), 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(id), 10)
		b = append(b, '\n')
	}
	return b
}

// graphInfo is what graph info reports.
type graphInfo struct {
	File      string `json:"file"`
	Vertices  int    `json:"vertices"`
	Edges     uint64 `json:"edges"`
	Symmetric bool   `json:"symmetric"`
	Bytes     int    `json:"bytes"`
	MaxDegree uint64 `json:"max_out_degree"`
	Isolated  int    `json:"isolated"`
}

func graphInfoCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "info",
		Usage:     "check a CSR file (every offset and neighbour) and print its size and degrees",
		ArgsUsage: "FILE",
		Flags:     []ucli.Flag{outputFlag()},
		Action: func(c *ucli.Context) error {
			asJSON, err := wantJSON(c)
			if err != nil {
				return err
			}
			if c.NArg() == 0 {
				return errors.New("graph info: want one CSR file")
			}
			if err := checkArgs(c, 1); err != nil {
				return err
			}
			g, img, err := loadCSR(c.Args().First())
			if err != nil {
				return fmt.Errorf("graph info: %w", err)
			}
			in := graphInfo{File: c.Args().First(), Vertices: g.N(), Edges: g.M(), Symmetric: g.Symmetric(), Bytes: len(img)}
			for v := range uint32(g.N()) {
				d := g.OutDegree(v)
				in.MaxDegree = max(in.MaxDegree, d)
				if d == 0 {
					in.Isolated++
				}
			}
			if asJSON {
				return writeJSON(c.App.Writer, in)
			}
			fmt.Fprintf(c.App.Writer, "%s: %d vertices, %d edges stored, symmetric %t, %s; largest out-degree %d, %d vertices without out-edges\n",
				in.File, in.Vertices, in.Edges, in.Symmetric, byteSize(uint64(in.Bytes)), in.MaxDegree, in.Isolated)
			return nil
		},
	}
}

// loadCSR reads and validates a CSR file.
func loadCSR(path string) (*graph.Graph, []byte, error) {
	img, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	g, err := graph.Open(img)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := g.Validate(); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return g, img, nil
}

// graphRunReport is what graph run reports.
type graphRunReport struct {
	App       graph.App     `json:"app"`
	File      string        `json:"file"`
	Vertices  int           `json:"vertices"`
	Edges     uint64        `json:"edges"`
	Bytes     int           `json:"bytes"`
	Region    uint32        `json:"region,omitempty"`
	Buffer    int64         `json:"buffer_bytes,omitempty"`
	Chunk     int           `json:"chunk_bytes,omitempty"`
	FarTime   time.Duration `json:"far_ns,omitempty"`
	LocalTime time.Duration `json:"local_ns"`
	Result    graph.Result  `json:"result"`
	Summary   string        `json:"summary"`
	Mapping   *fmap.Stats   `json:"mapping,omitempty"`
	// Bytes on the fabric: the DPU agent's link to the memory nodes, and the
	// memory server's own link (both directions, with headers).
	DPUFabricBytes *uint64 `json:"dpu_fabric_bytes,omitempty"`
	DPUHostBytes   *uint64 `json:"dpu_host_bytes,omitempty"`
	MemLinkBytes   *uint64 `json:"mem_link_bytes,omitempty"`
	// NotMeasured says, by the JSON name of a byte count left out, why:
	// a service that did not answer, or counters that went back during
	// the run (lovelockd restarted), whose difference would be garbage.
	NotMeasured map[string]string `json:"not_measured,omitempty"`
	HitRate     *float64          `json:"dpu_cache_hit_rate,omitempty"`
	HitRateNote string            `json:"dpu_cache_note,omitempty"`
	// Caching is the DPU cache mode asked for; Cache the deltas of the
	// agent's counters for the region over the run (with --dpu-socket).
	Caching graph.Caching `json:"caching"`
	Cache   *cacheDelta   `json:"dpu_cache,omitempty"`
	// Hints are the engine's hints (--prefetch hints).
	Hints *graph.HintStats `json:"hints,omitempty"`
	Check string           `json:"check"`
}

// cacheDelta is what the DPU agent's caches did for the region during a
// run: the differences of farmem.RegionCacheStats, and the estimate of the
// fabric bytes that prefetching moved (entries issued × entry size).
type cacheDelta struct {
	farmem.RegionCacheStats
	Reads         uint64  `json:"reads"`
	HitRate       float64 `json:"hit_rate"`
	PrefetchBytes uint64  `json:"prefetch_bytes"`
	Switches      uint64  `json:"switches"`
	On            bool    `json:"on"`
}

func graphRunCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "run",
		Usage:     "run an app over a graph in far memory, check it against the same app in memory, print time, fabric bytes and the verdict",
		ArgsUsage: " ",
		Description: "The graph's far-memory copy is --region, or a new region that the memory node's lovelockd\n" +
			"(--mem-socket) preloads from --graph (the path must be readable on the memory node; it is on\n" +
			"the testbed) and frees afterwards, or one uploaded with --upload ADDR (a DPU agent's or memory\n" +
			"node's far-memory address, reached from this namespace). The mapping is served by this host's\n" +
			"lovelockd on --host-socket (far_memory_host.socket), through whichever agent its config names.\n" +
			"--dpu-socket (the DPU's lovelockd) adds the agent's fabric bytes; --mem-socket the memory\n" +
			"server's. --local runs in memory only.\n\n" +
			"  lovelock graph run --app pagerank --graph g.csr --host-socket /run/lovelock/farmem.sock \\\n" +
			"      --mem-socket /run/lovelock/mem0.sock --dpu-socket /run/lovelock/dpu0.sock",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "app", Usage: "bfs, pagerank, cc, radii or bc", Required: true},
			&ucli.StringFlag{Name: "graph", Usage: "the CSR `FILE` (also the in-memory reference)", Required: true},
			&ucli.BoolFlag{Name: "local", Usage: "run in memory only"},
			&ucli.StringFlag{Name: "host-socket", Value: "/run/lovelock/farmem.sock", Usage: "this host's far-memory socket (lovelockd far_memory_host.socket)"},
			&ucli.StringFlag{Name: "mem-socket", Usage: "the memory node's lovelockd API socket: preload the region, count its bytes"},
			&ucli.StringFlag{Name: "dpu-socket", Usage: "the DPU's lovelockd API socket (the agent the mapping goes through): count its fabric bytes"},
			&ucli.UintFlag{Name: "region", Usage: "an existing region holding the CSR file"},
			&ucli.StringFlag{Name: "upload", Usage: "upload the file into a new region through this far-memory `ADDR` (ip:port) instead of a preload"},
			&ucli.BoolFlag{Name: "keep", Usage: "keep the region created for the run"},
			&ucli.StringFlag{Name: "buffer", Usage: "host buffer: bytes or a unit (default a third of the file)"},
			&ucli.StringFlag{Name: "chunk", Usage: "mapping chunk size (default 64KiB)"},
			&ucli.IntFlag{Name: "read-ahead", Usage: "chunks the host agent fetches ahead of a sequential run of faults (0: off, the default; 16 suits scans)"},
			// 0 (-1 for the source) picks the engine's default: help
			// says which, not the zero.
			&ucli.IntFlag{Name: "workers", Usage: "engine goroutines", DefaultText: "GOMAXPROCS"},
			&ucli.Int64Flag{Name: "source", Value: -1, Usage: "BFS source", DefaultText: "the vertex with the most edges"},
			&ucli.IntFlag{Name: "iterations", Usage: "PageRank iterations", DefaultText: "20"},
			&ucli.IntFlag{Name: "samples", Usage: "Radii sources", DefaultText: "64"},
			&ucli.IntFlag{Name: "bc-sources", Usage: "BC sources", DefaultText: "4"},
			&ucli.Uint64Flag{Name: "seed", Usage: "seed of the Radii and BC samples"},
			&ucli.Float64Flag{Name: "tolerance", Value: graph.DefaultTolerance, Usage: "relative tolerance of the PageRank and BC check"},
			&ucli.StringFlag{Name: "cache", Value: "off", Usage: "DPU cache mode: off, static (the offsets in the DPU's static cache) or dynamic (the DPU's dynamic cache with --prefetch)"},
			&ucli.StringFlag{Name: "prefetch", Usage: "the DPU's prefetcher for the region: adjacent (SODA's; dynamic's default), stride, hints (the engine's), off (static's default)"},
			&ucli.StringFlag{Name: "dynamic-scope", Value: "edges", Usage: "what the DPU's dynamic cache holds: edges (the edge arrays, SODA's dynamic edge cache) or region (the offsets too)"},
			&ucli.StringFlag{Name: "hint-ahead", Usage: "with --prefetch hints: how far the hints run ahead of the reads, in bytes of DPU cache entries (default a quarter of the DPU's arena, or 8MiB)"},
			outputFlag(),
		},
		Action: graphRun,
	}
}

// graphRunFlagsInRange refuses, before the graph is read, an app
// parameter outside what it takes. The apps read 0 as their default, so an
// explicit 0 is refused too; a tolerance that is NaN or +Inf would pass
// every check, a negative one fail every check.
func graphRunFlagsInRange(c *ucli.Context) error {
	if tol := c.Float64("tolerance"); !(tol >= 0) || math.IsInf(tol, 1) {
		return fmt.Errorf("graph run: --tolerance %g: want a finite number ≥ 0 (left out: %g)", tol, graph.DefaultTolerance)
	}
	for _, f := range []struct {
		name, dflt string
		most       int
	}{
		{"iterations", "20", 0},
		{"samples", "64", 64}, // one bit each
		{"bc-sources", "4", 0},
		{"workers", "GOMAXPROCS", 0},
	} {
		if n := c.Int(f.name); c.IsSet(f.name) && (n < 1 || f.most > 0 && n > f.most) {
			if f.most > 0 {
				return fmt.Errorf("graph run: --%s %d: want 1 to %d (left out: %s)", f.name, n, f.most, f.dflt)
			}
			return fmt.Errorf("graph run: --%s %d: want 1 or more (left out: %s)", f.name, n, f.dflt)
		}
	}
	return nil
}

// graphVerdict is the check's verdict when it passed: BFS depths, labels
// and radii are equal to the in-memory run's; PageRank and BC scores only
// within the relative tolerance (graph.Compare).
func graphVerdict(app graph.App, tol float64) string {
	if app == graph.PageRank || app == graph.BC {
		return fmt.Sprintf("ok: within %g (relative) of the in-memory run", tol)
	}
	return "ok: equal to the in-memory run"
}

func graphRun(c *ucli.Context) error {
	asJSON, err := wantJSON(c)
	if err != nil {
		return err
	}
	app, err := graph.ParseApp(c.String("app"))
	if err != nil {
		return fmt.Errorf("graph run: --app: %w", err)
	}
	caching, err := graph.ParseCaching(c.String("cache"), c.String("prefetch"), c.String("dynamic-scope"))
	if err != nil {
		return fmt.Errorf("graph run: %w", err) // names the flag
	}
	if err := graphRunFlagsInRange(c); err != nil {
		return err
	}
	p := graph.Params{Source: c.Int64("source"), Iterations: c.Int("iterations"), Samples: c.Int("samples"),
		BCSources: c.Int("bc-sources"), Seed: c.Uint64("seed")}
	opts := graph.Options{Workers: c.Int("workers")}
	region, err := uint32Flag(c, "region")
	if err != nil {
		return fmt.Errorf("graph run: %w", err)
	}
	path := c.String("graph")
	local, img, err := loadCSR(path)
	if err != nil {
		return fmt.Errorf("graph run: --graph: %w", err)
	}
	if src := c.Int64("source"); src != -1 && (src < 0 || src >= int64(local.N())) {
		return fmt.Errorf("graph run: --source %d: want a vertex of %s, 0 to %d (left out: the vertex with the most edges)", src, path, local.N()-1)
	}
	rep := graphRunReport{App: app, File: path, Vertices: local.N(), Edges: local.M(), Bytes: len(img), Caching: caching}
	ctx := c.Context
	w := c.App.Writer

	if c.Bool("local") {
		start := time.Now()
		rep.Result, err = graph.Run(ctx, graph.NewEngine(local, opts), app, p)
		if err != nil {
			return err
		}
		rep.LocalTime = time.Since(start)
		rep.Summary = graph.Summary(rep.Result)
		rep.Check = "not checked (--local)"
		if asJSON {
			return writeJSON(w, rep)
		}
		fmt.Fprintf(w, "%s on %s (%d vertices, %d edges) in memory: %s\n%s\n", app, path, local.N(), local.M(), rep.LocalTime.Round(time.Microsecond), rep.Summary)
		return nil
	}

	var mem, dpu *api.Client
	if s := c.String("mem-socket"); s != "" {
		mem = api.NewClient(s)
	}
	if s := c.String("dpu-socket"); s != "" {
		dpu = api.NewClient(s)
	}
	given := region != 0 // --region: the operator's region, never freed here
	switch {
	case given:
	case c.String("upload") != "":
		addr, err := netip.ParseAddrPort(c.String("upload"))
		if err != nil {
			return fmt.Errorf("graph run: --upload: %w", err)
		}
		cl, err := farmem.NewClient(farmem.ClientOptions{Server: addr})
		if err != nil {
			return fmt.Errorf("graph run: --upload %s: %w", addr, err)
		}
		defer cl.Close()
		region, err = graph.Upload(ctx, cl, img)
		if err != nil {
			return fmt.Errorf("graph run: --upload %s: %w", addr, err)
		}
		if !c.Bool("keep") {
			defer cl.Free(context.Background(), region)
		}
	case mem != nil:
		abs, err := filepath.Abs(path)
		if err != nil {
			return err
		}
		var info farmem.RegionInfo
		if err := mem.ServiceCall(ctx, http.MethodPost, memServer, "regions", api.MemCreate{Preload: abs}, &info); err != nil {
			return fmt.Errorf("graph run: --mem-socket %s: preload %s on the memory node: %w", c.String("mem-socket"), abs, noMemServer(err))
		}
		region = info.ID
	default:
		return errors.New("graph run: give --region ID, --mem-socket (to preload --graph on the memory node) or --upload ADDR, or --local")
	}
	rep.Region = region
	if !given && c.String("upload") == "" && !c.Bool("keep") {
		defer mem.ServiceCall(context.Background(), http.MethodDelete, memServer, fmt.Sprintf("regions/%d", region), nil, nil)
	}

	var mo fmap.Options
	if v := c.String("buffer"); v != "" {
		b, err := farmem.ParseSize(v)
		if err != nil {
			return fmt.Errorf("graph run: --buffer: %w", err)
		}
		mo.BufferBytes = int64(b)
	}
	if v := c.String("chunk"); v != "" {
		b, err := farmem.ParseSize(v)
		if err != nil {
			return fmt.Errorf("graph run: --chunk: %w", err)
		}
		mo.ChunkSize = int(b)
	}
	mo.ReadAhead = int(c.Int("read-ahead"))
	if mo.ReadAhead < 0 {
		return fmt.Errorf("graph run: --read-ahead %d: want 0 (off) or a number of chunks", mo.ReadAhead)
	}
	// The counters start before the caches are set: loading the static
	// range is part of the run's fabric bytes, as in SODA.
	before := readFabric(ctx, mem, dpu)
	far, m, err := graph.MapRegion(ctx, c.String("host-socket"), uint64(region), mo)
	if err != nil {
		if given {
			return fmt.Errorf("graph run: --region %d through --host-socket %s: %w", region, c.String("host-socket"), err)
		}
		return fmt.Errorf("graph run: --host-socket %s: %w", c.String("host-socket"), err)
	}
	defer m.Close()
	if _, err := caching.Apply(ctx, m, far); err != nil {
		return fmt.Errorf("graph run: --cache %s --prefetch %s: %w", c.String("cache"), caching.Prefetcher, err)
	}
	var hinter *graph.MappingHinter
	if caching.Hints() {
		chunk := int64(mo.ChunkSize)
		if chunk == 0 {
			chunk = fmap.DefaultChunkSize
		}
		hinter = graph.NewMappingHinter(ctx, m, chunk)
		opts.Hints = hinter
		if a := before.agent; a != nil {
			opts.HintGrain = a.Cache.EntrySize
			opts.HintAhead = a.Cache.ArenaBytes / 4
		}
		if v := c.String("hint-ahead"); v != "" {
			b, err := farmem.ParseSize(v)
			if err != nil {
				return fmt.Errorf("graph run: --hint-ahead: %w", err)
			}
			opts.HintAhead = uint64(b)
		}
	}
	res, err := graph.RunChecked(ctx, far, local, app, p, opts, c.Float64("tolerance"))
	if hinter != nil {
		hs := hinter.Close()
		rep.Hints = &hs
	}
	st, serr := m.Stats(ctx)
	cerr := m.Close()
	if err != nil {
		if cerr != nil {
			return fmt.Errorf("%w; %v", err, cerr) // a lost chunk: Close says which and why
		}
		return err
	}
	after := readFabric(ctx, mem, dpu)
	rep.Result, rep.FarTime, rep.LocalTime = res.Far, res.FarTime, res.LocalTime
	rep.Summary = graph.Summary(res.Far)
	if serr == nil {
		rep.Mapping = &st
		rep.Chunk = mo.ChunkSize
		if rep.Chunk == 0 {
			rep.Chunk = fmap.DefaultChunkSize
		}
		rep.Buffer = int64(st.Capacity) * int64(rep.Chunk)
	}
	rep.NotMeasured = map[string]string{}
	rep.DPUFabricBytes = rep.delta("dpu_fabric_bytes", before.dpuFabric, after.dpuFabric, before.dpuErr, after.dpuErr)
	rep.DPUHostBytes = rep.delta("dpu_host_bytes", before.dpuHost, after.dpuHost, before.dpuErr, after.dpuErr)
	rep.MemLinkBytes = rep.delta("mem_link_bytes", before.memLink, after.memLink, before.memErr, after.memErr)
	var host fmap.Stats
	if rep.Mapping != nil {
		host = *rep.Mapping
	}
	rep.Cache, rep.HitRateNote = regionCacheDelta(before.agent, after.agent, region, host, dpu != nil)
	if rep.Cache != nil {
		r := rep.Cache.HitRate
		rep.HitRate = &r
	}
	rep.Check = graphVerdict(app, c.Float64("tolerance"))
	if res.Mismatch != nil {
		rep.Check = "MISMATCH: " + res.Mismatch.Error()
	}
	if asJSON {
		if err := writeJSON(w, rep); err != nil {
			return err
		}
	} else {
		printGraphRun(w, rep)
	}
	var errs []error
	if res.Mismatch != nil {
		errs = append(errs, fmt.Errorf("graph run: %s over far memory differs from the in-memory run: %w", app, res.Mismatch))
	}
	if cerr != nil {
		// The run's report stands; the mapping's end failed (the agent's
		// write-back or the backend's sync): the host agent's log has more.
		errs = append(errs, fmt.Errorf("graph run: %w", cerr))
	}
	return errors.Join(errs...)
}

func printGraphRun(w io.Writer, r graphRunReport) {
	fmt.Fprintf(w, "%s on %s: %d vertices, %d edges, %s in region %d\n", r.App, r.File, r.Vertices, r.Edges, byteSize(uint64(r.Bytes)), r.Region)
	ratio := float64(r.FarTime) / float64(max(r.LocalTime, 1))
	fmt.Fprintf(w, "time: %s over far memory, %s in memory (%.1f×); %d steps (%d dense, %d sparse), %d edges read\n",
		r.FarTime.Round(time.Microsecond), r.LocalTime.Round(time.Microsecond), ratio, r.Result.Steps, r.Result.DenseSteps, r.Result.SparseSteps, r.Result.EdgesRead)
	if s := r.Mapping; s != nil {
		// Read-ahead fetches chunks no fault asked for: with it on, the
		// faults alone undercount what the mapping read.
		fmt.Fprintf(w, "host buffer: %s (%d chunks of %s): %d faults, %d chunks read ahead, %d evictions\n", farmem.Size(uint64(r.Buffer)), s.Capacity, farmem.Size(uint64(r.Chunk)), s.Faults, s.ReadAhead, s.Evictions)
	}
	bytes := func(p *uint64, key, what, flag string) {
		if p == nil {
			why := r.NotMeasured[key]
			if why == "" {
				why = "no " + flag
			}
			fmt.Fprintf(w, "%s: not measured (%s)\n", what, why)
			return
		}
		fmt.Fprintf(w, "%s: %d bytes (%.1f MiB)\n", what, *p, float64(*p)/(1<<20))
	}
	bytes(r.DPUFabricBytes, "dpu_fabric_bytes", "DPU agent ↔ memory nodes (fabric)", "--dpu-socket")
	bytes(r.DPUHostBytes, "dpu_host_bytes", "DPU agent ↔ hosts", "--dpu-socket")
	bytes(r.MemLinkBytes, "mem_link_bytes", "memory server link", "--mem-socket")
	pf := r.Caching.Prefetcher
	mode := "off"
	switch {
	case r.Caching.Static && pf != "off":
		mode = "static offsets + dynamic, prefetcher " + pf
	case r.Caching.Static:
		mode = "static offsets"
	case pf != "off":
		mode = "dynamic, prefetcher " + pf
	}
	if pf != "off" {
		if r.Caching.WholeRegion {
			mode += ", over the whole region"
		} else {
			mode += ", over the edge arrays"
		}
	}
	fmt.Fprintf(w, "DPU caches: %s\n", mode)
	if d := r.Cache; d != nil {
		fmt.Fprintf(w, "DPU cache hit rate: %.1f%% of %d reads (%d static hits, %d dynamic hits, %d misses, %d bypassed by the switch, %d outside the dynamic cache's ranges); dynamic cache alone %.1f%%\n",
			100*d.HitRate, d.Reads, d.StaticHits, d.Hits, d.Misses, d.Bypassed, d.OutsideDynamic, 100*d.Coverage)
		fmt.Fprintf(w, "DPU prefetch: %d entries issued (≈ %.1f MiB on the fabric), %d used, accuracy %.2f, %d hinted; switch %s, %d turns\n",
			d.PrefetchIssued, float64(d.PrefetchBytes)/(1<<20), d.PrefetchUsed, d.Accuracy, d.Hinted, onOff(d.On), d.Switches)
	} else {
		fmt.Fprintf(w, "DPU cache hit rate: %s\n", r.HitRateNote)
	}
	if h := r.Hints; h != nil {
		fmt.Fprintf(w, "hints: %d batches, %d ranges, %.1f MiB named, %d entry loads started, %d dropped, %d errors %s\n",
			h.Batches, h.Extents, float64(h.Bytes)/(1<<20), h.Started, h.Dropped, h.Errors, h.Err)
	}
	fmt.Fprintf(w, "result: %s\ncheck: %s\n", r.Summary, r.Check)
}

// fabricCounters are the byte counters graph run reads before and after.
type fabricCounters struct {
	dpuFabric, dpuHost, memLink *uint64
	agent                       *farmem.AgentStats
	// Why a service asked did not give its counters.
	dpuErr, memErr error
}

func readFabric(ctx context.Context, mem, dpu *api.Client) fabricCounters {
	var f fabricCounters
	if dpu != nil {
		var st farmem.AgentStats
		if err := dpu.ServiceStats(ctx, memAgent, &st); err == nil {
			fab := st.Fabric.TXBytes + st.Fabric.RXBytes
			host := st.Host.TXBytes + st.Host.RXBytes
			f.dpuFabric, f.dpuHost, f.agent = &fab, &host, &st
		} else {
			f.dpuErr = err
		}
	}
	if mem != nil {
		var st farmem.ServerStats
		if err := mem.ServiceStats(ctx, memServer, &st); err == nil {
			b := st.Link.TXBytes + st.Link.RXBytes
			f.memLink = &b
		} else {
			f.memErr = err
		}
	}
	return f
}

// delta returns after less before, or nil with why under key in
// NotMeasured: a reading that failed, or counters that went back (the
// service restarted during the run: the difference would wrap).
func (r *graphRunReport) delta(key string, before, after *uint64, errBefore, errAfter error) *uint64 {
	switch {
	case errBefore != nil || errAfter != nil:
		r.NotMeasured[key] = fmt.Sprintf("the service did not answer: %v", cmp.Or(errBefore, errAfter))
		return nil
	case before == nil || after == nil:
		return nil
	case *after < *before:
		r.NotMeasured[key] = "its counters went back during the run (the service restarted): run again"
		return nil
	}
	d := *after - *before
	return &d
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// regionCacheDelta is what the DPU agent's caches did for region between
// two snapshots of its stats (farmem.AgentStats.Cache), with the hit rate
// of farmem.HitRate over the reads of the mapping whose counters are host.
func regionCacheDelta(before, after *farmem.AgentStats, region uint32, host fmap.Stats, asked bool) (*cacheDelta, string) {
	if !asked {
		return nil, "not measured (no --dpu-socket)"
	}
	if before == nil || after == nil {
		return nil, "not measured (the DPU agent's stats could not be read)"
	}
	find := func(st *farmem.AgentStats) farmem.RegionCacheStats {
		for _, r := range st.Cache.Regions {
			if r.Region == region {
				return r
			}
		}
		return farmem.RegionCacheStats{}
	}
	b, a := find(before), find(after)
	if a.StaticHits < b.StaticHits || a.Hits < b.Hits || a.Misses < b.Misses || a.Bypassed < b.Bypassed ||
		a.OutsideDynamic < b.OutsideDynamic || a.Waited < b.Waited || a.PrefetchIssued < b.PrefetchIssued ||
		a.PrefetchUsed < b.PrefetchUsed || a.EvictedUnused < b.EvictedUnused || a.Invalidated < b.Invalidated ||
		a.Hinted < b.Hinted || after.Cache.Switches < before.Cache.Switches {
		// The differences would wrap.
		return nil, "not measured (the DPU agent's counters went back during the run: it restarted; run again)"
	}
	d := &cacheDelta{RegionCacheStats: a.Since(b), Switches: after.Cache.Switches - before.Cache.Switches, On: after.Cache.On}
	d.Region = region
	d.HitRate, d.Reads = farmem.HitRate(d.RegionCacheStats, host)
	d.PrefetchBytes = d.PrefetchIssued * after.Cache.EntrySize
	return d, ""
}
