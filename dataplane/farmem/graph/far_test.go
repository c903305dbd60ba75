package graph

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem/fmap"
)

// The far-memory tests run the engine in the test process over a
// transparent mapping whose faults are served by a host agent in another
// process (the test binary re-executed with GRAPH_HELPER set: TestMain), as in
// production: a fault handler inside the faulting process can deadlock it
// (docs/farmem-mapping.md). The agent serves region N from the file DIR/N.
const helperEnv = "GRAPH_HELPER"

// TestMain runs the host agent of the far-memory tests instead of the tests
// when started by startAgent.
//
// With GRAPH_HELPER=fabric the helper also runs a memory server and a DPU
// agent on loopback and serves each mapping from a far-memory client's
// region through that agent, the path of the testbed in one process; it
// writes the agent's address to DIR/agent.addr.
func TestMain(m *testing.M) {
	if role := os.Getenv(helperEnv); role != "" {
		if err := helperAgent(role); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// helperAgent serves mappings as role ("agent" or "fabric") until SIGTERM.
func helperAgent(role string) error {
	if role != "agent" && role != "fabric" {
		return fmt.Errorf("unknown role %q", role)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	dir := os.Getenv("GRAPH_DIR")
	open := func(_ context.Context, r fmap.RegionRef) (fmap.Backend, error) { return openFile(dir, r) }
	if role == "fabric" {
		client, err := startFabric(ctx, dir)
		if err != nil {
			return err
		}
		defer client.Close()
		open = func(ctx context.Context, r fmap.RegionRef) (fmap.Backend, error) {
			return client.Open(ctx, uint32(r.ID), false)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: os.Getenv("GRAPH_SOCK"), Net: "unix"})
	if err != nil {
		return err
	}
	agent := &fmap.Agent{Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	return agent.Serve(ctx, ln, open)
}

// helperCache is the helper's DPU agent's cache: small entries, an arena
// of three of them (well below the test graphs, so entries are evicted),
// regions out of the dynamic cache until a test
// advises otherwise, and bandwidths that keep the adaptive switch on (a
// threshold of ~0), so that each prefetcher really serves the reads.
var helperCache = farmem.CacheConfig{
	Size: 192 << 10, EntrySize: 64 << 10, Prefetcher: farmem.PrefetchOff,
	BNet: 1, BIntra: 1 << 40,
}

// startFabric starts a memory server and a DPU agent on loopback and
// returns a client of the agent; DIR/agent.addr gets the agent's address,
// and DIR/stats.sock answers each connection with the agent's AgentStats
// in JSON.
func startFabric(ctx context.Context, dir string) (*farmem.Client, error) {
	server, err := farmem.NewServer(farmem.ServerOptions{
		StateDir: filepath.Join(dir, "mem-state"), Capacity: 1 << 30, Addr: netip.MustParseAddrPort("127.0.0.1:0"),
	})
	if err != nil {
		return nil, err
	}
	go server.Run(ctx)
	agent, err := farmem.NewAgent(farmem.AgentConfig{
		Listen:  netip.MustParseAddrPort("127.0.0.1:0"),
		Servers: []farmem.ServerSpec{{Addr: server.Addr()}},
		Cache:   helperCache,
	}, farmem.AgentOptions{})
	if err != nil {
		return nil, err
	}
	go agent.Run(ctx)
	sl, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "stats.sock"), Net: "unix"})
	if err != nil {
		return nil, err
	}
	context.AfterFunc(ctx, func() { sl.Close() })
	go func() {
		for {
			c, err := sl.Accept()
			if err != nil {
				return
			}
			json.NewEncoder(c).Encode(agent.Stats())
			c.Close()
		}
	}()
	client, err := farmem.NewClient(farmem.ClientOptions{Server: agent.Addr()})
	if err != nil {
		return nil, err
	}
	tmp := filepath.Join(dir, "agent.addr.tmp")
	if err := os.WriteFile(tmp, []byte(agent.Addr().String()), 0o600); err != nil {
		return nil, err
	}
	return client, os.Rename(tmp, filepath.Join(dir, "agent.addr"))
}

func openFile(dir string, r fmap.RegionRef) (fmap.Backend, error) {
	f, err := os.Open(filepath.Join(dir, strconv.FormatUint(r.ID, 10)))
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return fileBackend{f, st.Size()}, nil
}

// fileBackend is a read-only region in a file.
type fileBackend struct {
	*os.File
	size int64
}

func (b fileBackend) Size() int64 { return b.size }
func (b fileBackend) Sync() error { return nil }
func (b fileBackend) WriteAt([]byte, int64) (int, error) {
	return 0, errors.New("read-only region")
}

// farAgent is the helper process and the directory it serves.
type farAgent struct {
	sock, dir string
	next      uint64
}

func startAgent(t *testing.T, role string) *farAgent {
	t.Helper()
	testenv.RequirePriv(t)
	dir := t.TempDir()
	a := &farAgent{sock: filepath.Join(dir, "agent.sock"), dir: dir}
	cmd := exec.Command(os.Args[0], "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+role, "GRAPH_SOCK="+a.sock, "GRAPH_DIR="+dir)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	// The socket file appears at bind, when the listener is ready.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := os.Stat(a.sock)
		if err == nil {
			return a
		}
		if time.Now().After(deadline) {
			t.Fatalf("host agent did not listen on %s: %v", a.sock, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// add stores a CSR image as a region and returns its ID.
func (a *farAgent) add(t *testing.T, b []byte) uint64 {
	a.next++
	if err := os.WriteFile(filepath.Join(a.dir, strconv.FormatUint(a.next, 10)), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return a.next
}

// TestFarMemory runs each app on generated and fixture graphs whose CSR
// lives in far memory, mapped with a host buffer of a third of the
// footprint, and requires the same answer as the in-memory copy; on the
// generated graphs the buffer must really have evicted and refetched.
func TestFarMemory(t *testing.T) {
	a := startAgent(t, "agent")
	type input struct {
		name      string
		n         uint64
		edges     []Edge
		symmetric bool
		chunk     int
	}
	n12, e12, _ := RMAT(12, 8, 5)
	n14, e14, _ := RMAT(14, 8, 6)
	inputs := []input{
		{name: "rmat12 4KiB chunks", n: n12, edges: e12, symmetric: true, chunk: 4 << 10},
		{name: "rmat12 directed 4KiB chunks", n: n12, edges: e12, chunk: 4 << 10},
		{name: "rmat14 64KiB chunks", n: n14, edges: e14, symmetric: true, chunk: 64 << 10},
		{name: "karate", n: 34, edges: karate, symmetric: true, chunk: 4 << 10},
		{name: "two components", n: 6, edges: pairs(1, 0, 2, 1, 4, 3), symmetric: true, chunk: 4 << 10},
	}
	p := Params{Source: -1, Samples: 32, BCSources: 2, Seed: 11}
	for _, in := range inputs {
		t.Run(in.name, func(t *testing.T) {
			local, img := build(t, in.n, in.edges, in.symmetric)
			id := a.add(t, img)
			ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
			defer cancel()
			buffer := int64(len(img)) / 3
			far, m, err := MapRegion(ctx, a.sock, id, fmap.Options{ChunkSize: in.chunk, BufferBytes: buffer})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			for _, app := range Apps {
				if !in.symmetric && (app == Components || app == Radii) {
					continue
				}
				want, err := Run(ctx, NewEngine(local, Options{Workers: 2}), app, p)
				if err != nil {
					t.Fatal(err)
				}
				got, err := Run(ctx, NewEngine(far, Options{Workers: 4}), app, p)
				if err != nil {
					t.Fatalf("%s through far memory: %v", app, err)
				}
				if err := Compare(got, want, DefaultTolerance); err != nil {
					t.Errorf("through far memory: %v", err)
				}
				if app == BFS || app == Components {
					// the integer apps are exact; the reference agrees too
					ref := newRef(in.n, in.edges, in.symmetric).run(local, app, p)
					if err := Compare(got, ref, 0); err != nil {
						t.Errorf("against the sequential reference: %v", err)
					}
				}
			}
			st, err := m.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			chunks := (len(img) + in.chunk - 1) / in.chunk
			t.Logf("%d bytes, %d chunks of %d, buffer %d chunks: %s", len(img), chunks, in.chunk, st.Capacity, fmt.Sprintf("%+v", st))
			if st.Resident > st.Capacity {
				t.Errorf("%d chunks resident in a buffer of %d", st.Resident, st.Capacity)
			}
			if chunks >= 3*2 && (st.Evictions == 0 || st.Faults <= uint64(chunks)) {
				t.Errorf("stats %+v over %d chunks: want evictions and refetches with a third of the footprint", st, chunks)
			}
		})
	}
}

// TestFarMemoryLost truncates a mapped graph's region file on the host
// agent's side, so that every chunk not resident fails to fetch: with a
// short fmap.Options.FetchTimeout the agent poisons such a chunk, and each
// app's run ends with an error wrapping ErrFarMemory (not a crash, not a
// hang), while the mapping's Close names the poisoned chunks.
func TestFarMemoryLost(t *testing.T) {
	a := startAgent(t, "agent")
	n, edges, _ := RMAT(12, 8, 5)
	_, img := build(t, n, edges, true)
	id := a.add(t, img)
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	far, m, err := MapRegion(ctx, a.sock, id, fmap.Options{ChunkSize: 4 << 10, BufferBytes: int64(len(img)) / 8,
		FetchTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(a.dir, strconv.FormatUint(id, 10)), 0); err != nil {
		t.Fatal(err)
	}
	for _, app := range []App{BFS, PageRank} {
		_, err := Run(ctx, NewEngine(far, Options{Workers: 4}), app, Params{Source: -1})
		t.Logf("%s: %v", app, err)
		if !errors.Is(err, ErrFarMemory) {
			t.Errorf("%s over a lost region: %v, want an error wrapping ErrFarMemory", app, err)
		}
	}
	err = m.Close()
	t.Logf("Close: %v", err)
	if err == nil || !strings.Contains(err.Error(), "poisoned") {
		t.Errorf("Close after poisoned chunks: %v, want them named", err)
	}
}

// TestFarMemoryFabric uploads a graph through the DPU agent with the
// explicit API (Upload) and runs every app over a mapping whose chunks
// travel host agent → DPU agent → memory server over UDP, with a host
// buffer of a third of the footprint: each answer equals the in-memory
// one.
func TestFarMemoryFabric(t *testing.T) {
	a := startAgent(t, "fabric")
	addr, err := os.ReadFile(filepath.Join(a.dir, "agent.addr"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	client, err := farmem.NewClient(farmem.ClientOptions{Server: netip.MustParseAddrPort(string(addr))})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	n, edges, _ := RMAT(13, 8, 21)
	local, img := build(t, n, edges, true)
	id, err := Upload(ctx, client, img)
	if err != nil {
		t.Fatal(err)
	}
	far, m, err := MapRegion(ctx, a.sock, uint64(id), fmap.Options{ChunkSize: 16 << 10, BufferBytes: int64(len(img)) / 3})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	p := Params{Source: -1, Samples: 16, BCSources: 2, Seed: 3}
	for _, app := range Apps {
		want, err := Run(ctx, NewEngine(local, Options{Workers: 2}), app, p)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Run(ctx, NewEngine(far, Options{Workers: 4}), app, p)
		if err != nil {
			t.Fatalf("%s through far memory: %v", app, err)
		}
		if err := Compare(got, want, DefaultTolerance); err != nil {
			t.Errorf("through far memory: %v", err)
		}
	}
	st, err := m.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d bytes in region %d: %+v", len(img), id, st)
	if st.Evictions == 0 {
		t.Errorf("stats %+v: no evictions with a buffer of a third of the footprint", st)
	}
}

// agentStats asks the fabric helper for its DPU agent's counters.
func (a *farAgent) agentStats(t *testing.T) farmem.AgentStats {
	t.Helper()
	c, err := net.Dial("unix", filepath.Join(a.dir, "stats.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var st farmem.AgentStats
	if err := json.NewDecoder(c).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

func regionCache(st farmem.AgentStats, id uint32) farmem.RegionCacheStats {
	for _, r := range st.Cache.Regions {
		if r.Region == id {
			return r
		}
	}
	return farmem.RegionCacheStats{}
}

// TestFarMemoryCaches runs every app over a graph uploaded through a DPU
// agent with caches, mapped with a host buffer of a third of the
// footprint, once per caching option of lovelock graph run: the offsets
// in the static cache, the dynamic cache with each prefetcher (hints: the
// engine's, through MappingHinter and fmap's advise op), and both. Each
// answer equals the in-memory one, and the agent's counters show that the
// option served reads: static hits, dynamic hits, prefetches, hints.
func TestFarMemoryCaches(t *testing.T) {
	a := startAgent(t, "fabric")
	addr, err := os.ReadFile(filepath.Join(a.dir, "agent.addr"))
	if err != nil {
		t.Fatal(err)
	}
	client, err := farmem.NewClient(farmem.ClientOptions{Server: netip.MustParseAddrPort(string(addr))})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	n, edges, _ := RMAT(13, 8, 23)
	local, img := build(t, n, edges, true)
	p := Params{Source: -1, Samples: 16, BCSources: 2, Seed: 3, Iterations: 5}
	for _, mode := range []struct{ cache, prefetch, scope string }{
		{"static", "", ""}, {"dynamic", "adjacent", ""}, {"dynamic", "adjacent", "region"}, {"dynamic", "stride", ""},
		{"dynamic", "hints", ""}, {"static", "hints", ""},
	} {
		t.Run(mode.cache+"/"+mode.prefetch+"/"+mode.scope, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
			defer cancel()
			caching, err := ParseCaching(mode.cache, mode.prefetch, mode.scope)
			if err != nil {
				t.Fatal(err)
			}
			id, err := Upload(ctx, client, img)
			if err != nil {
				t.Fatal(err)
			}
			defer client.Free(context.Background(), id)
			far, m, err := MapRegion(ctx, a.sock, uint64(id), fmap.Options{ChunkSize: 16 << 10, BufferBytes: int64(len(img)) / 3})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if _, err := caching.Apply(ctx, m, far); err != nil {
				t.Fatal(err)
			}
			o := Options{Workers: 4, HintAhead: 128 << 10, HintGrain: uint64(helperCache.EntrySize)}
			var h *MappingHinter
			if caching.Hints() {
				h = NewMappingHinter(ctx, m, 16<<10)
				o.Hints = h
			}
			for _, app := range Apps {
				want, err := Run(ctx, NewEngine(local, Options{Workers: 2}), app, p)
				if err != nil {
					t.Fatal(err)
				}
				got, err := Run(ctx, NewEngine(far, o), app, p)
				if err != nil {
					t.Fatalf("%s through far memory: %v", app, err)
				}
				if err := Compare(got, want, DefaultTolerance); err != nil {
					t.Errorf("%+v: through far memory: %v", caching, err)
				}
			}
			st, err := m.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			rc := regionCache(a.agentStats(t), id)
			t.Logf("%+v: mapping %+v; agent cache %+v", caching, st, rc)
			if st.Evictions == 0 {
				t.Errorf("no evictions with a buffer of a third of the footprint: %+v", st)
			}
			if caching.Static && (rc.StaticHits == 0 || rc.StaticBytes != uint64(far.Offsets()[0].Size)) {
				t.Errorf("static offsets: %+v, want static hits and %d static bytes", rc, far.Offsets()[0].Size)
			}
			if caching.Prefetcher != "off" && (rc.Hits == 0 || rc.PrefetchIssued == 0 || rc.Prefetcher != caching.Prefetcher) {
				t.Errorf("dynamic cache with %s: %+v, want hits and prefetches", caching.Prefetcher, rc)
			}
			// The dynamic cache holds the edge arrays only, unless told
			// the whole region; without the static cache the offsets'
			// reads then pass it by.
			switch {
			case caching.Prefetcher == "off":
			case caching.WholeRegion && (rc.DynamicRanges != 1 || rc.OutsideDynamic != 0):
				t.Errorf("dynamic cache over the whole region: %+v, want 1 range and no read outside it", rc)
			case !caching.WholeRegion && rc.DynamicRanges != len(far.Edges()):
				t.Errorf("dynamic edge cache: %+v, want %d ranges", rc, len(far.Edges()))
			case !caching.WholeRegion && !caching.Static && rc.OutsideDynamic == 0:
				t.Errorf("dynamic edge cache: %+v, want the offsets' reads outside it", rc)
			}
			if h != nil {
				hs := h.Close()
				t.Logf("hints: %+v", hs)
				if hs.Errors != 0 || hs.Batches == 0 || rc.Hinted == 0 {
					t.Errorf("hints: %+v, agent %+v: want hints sent without errors and entries loaded for them", hs, rc)
				}
			}
		})
	}
}
