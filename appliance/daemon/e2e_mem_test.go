package daemon_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/cli"
	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem/fmap"
)

// memCluster is far memory on the testbed: lovelockd as memory server on
// mem0, as far-memory agent on dpu0 and as host agent on host0.
type memCluster struct {
	mem, dpu, host *daemonProc
	hostSocket     string
}

func startMemCluster(t *testing.T) memCluster {
	t.Helper()
	spec := bed(t)
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c := memCluster{hostSocket: filepath.Join(dir, "farmem.sock")}
	c.mem = startDaemon(t, spec, "mem0", "--config", file("mem0.yaml", fmt.Sprintf(`
memory_server: {addr: "10.77.0.20:61440", state_dir: %q, capacity: 256MiB}
`, filepath.Join(dir, "mem0-state"))))
	c.dpu = startDaemon(t, spec, "dpu0", "--config", file("dpu0.yaml", `
far_memory: {listen: "10.77.0.10:61440", servers: [{addr: "10.77.0.20:61440"}]}
`))
	c.host = startDaemon(t, spec, "host0", "--config", file("host0.yaml", fmt.Sprintf(`
far_memory_host: {agent: "10.77.0.10:61440", socket: %q}
`, c.hostSocket)))
	for _, d := range []*daemonProc{c.mem, c.dpu, c.host} {
		eventually(t, d.node+"'s far-memory service running", func() bool {
			svcs, err := d.client().Services(context.Background())
			return err == nil && len(svcs) == 1 && svcs[0].State == api.ServiceRunning
		})
	}
	return c
}

// TestFarMemory: a program on host0 maps a region of mem0 through dpu0's
// agent and host0's host agent; random writes through a buffer of an
// eighth of the region come back exact after eviction, after Close and a
// new mapping, and after mem0's lovelockd restarts; the agents count the
// traffic.
func TestFarMemory(t *testing.T) {
	c := startMemCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const size = 16 << 20
	var info farmem.RegionInfo
	if err := c.mem.client().ServiceCall(ctx, http.MethodPost, "memserver", "regions", api.MemCreate{Size: size, Writable: true}, &info); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, size)
	rng := rand.New(rand.NewPCG(1, 2))
	m, err := fmap.Map(ctx, c.hostSocket, fmap.RegionRef{ID: uint64(info.ID), Name: "e2e"}, fmap.Options{BufferBytes: size / 8})
	if err != nil {
		t.Fatal(err)
	}
	mem := m.Bytes()
	for range 2000 {
		off := rng.IntN(size - 4096)
		n := 1 + rng.IntN(4096)
		for i := off; i < off+n; i++ {
			b := byte(rng.Uint32())
			mem[i], want[i] = b, b
		}
	}
	if !bytes.Equal(mem, want) {
		t.Fatal("the mapping does not read back what was written through it (after eviction)")
	}
	st, err := m.Stats(ctx)
	if err != nil || st.Evictions == 0 {
		t.Errorf("mapping stats %+v, %v: want evictions with a buffer of an eighth", st, err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	check := func(what string) {
		t.Helper()
		m, err := fmap.Map(ctx, c.hostSocket, fmap.RegionRef{ID: uint64(info.ID), ReadOnly: true}, fmap.Options{BufferBytes: size / 8})
		if err != nil {
			t.Fatalf("%s: map: %v", what, err)
		}
		defer m.Close()
		if !bytes.Equal(m.Bytes(), want) {
			t.Fatalf("%s: the region differs from what was written", what)
		}
	}
	check("after Close")

	c.mem.stop(syscall.SIGTERM)
	c.mem.start()
	check("after mem0's lovelockd restarted")

	var agent farmem.AgentStats
	if err := c.dpu.client().ServiceStats(ctx, "farmem", &agent); err != nil {
		t.Fatal(err)
	}
	if agent.HostRequests == 0 || agent.Forwarded < agent.HostRequests || agent.ReadBytes < 2*size || agent.WriteBytes == 0 {
		t.Errorf("dpu0's agent stats %+v: want the mappings' traffic counted", agent)
	}
	var host api.MemHostStats
	if err := c.host.client().ServiceStats(ctx, "memhost", &host); err != nil || host.Client.Link.Requests == 0 {
		t.Errorf("host0's host agent stats %+v, %v", host, err)
	}
}

// TestFarMemoryAgentKilled: dpu0's lovelockd is SIGKILLed while writers on
// host0 write through its agent, and started again. Every write either
// fails with an error the writer sees or is acknowledged, and every
// acknowledged write is on mem0 afterwards.
func TestFarMemoryAgentKilled(t *testing.T) {
	c := startMemCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const writers, perWriter, size = 4, 64, 64 << 10
	var info farmem.RegionInfo
	if err := c.mem.client().ServiceCall(ctx, http.MethodPost, "memserver", "regions",
		api.MemCreate{Size: writers * perWriter * size, Writable: true}, &info); err != nil {
		t.Fatal(err)
	}
	var cl *farmem.Client
	if err := c.mem.spec.Run("host0", func() error {
		var err error
		cl, err = farmem.NewClient(farmem.ClientOptions{Server: netip.MustParseAddrPort("10.77.0.10:61440")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	r, err := cl.Open(ctx, info.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	chunkOf := func(i int) []byte { return bytes.Repeat([]byte{byte(i), byte(i >> 8), 0xa5, 0x5a}, size/4) }
	acked := make([][]bool, writers)
	failed := 0
	var mu sync.Mutex
	var wg sync.WaitGroup
	half := make(chan struct{})
	var once sync.Once
	for w := range writers {
		acked[w] = make([]bool, perWriter)
		wg.Go(func() {
			for k := range perWriter {
				if k == perWriter/4 {
					once.Do(func() { close(half) })
				}
				i := w*perWriter + k
				if _, err := r.WriteAt(chunkOf(i), int64(i)*size); err != nil {
					mu.Lock()
					failed++
					mu.Unlock()
					continue
				}
				acked[w][k] = true
			}
		})
	}
	<-half
	c.dpu.stop(syscall.SIGKILL)
	c.dpu.start()
	wg.Wait()
	var after farmem.AgentStats
	if err := c.dpu.client().ServiceStats(ctx, "farmem", &after); err != nil || after.HostRequests == 0 {
		t.Errorf("the restarted agent's stats %+v, %v: want the writes that waited for it", after, err)
	}

	got := make([]byte, size)
	n := 0
	for w := range writers {
		for k := range perWriter {
			if !acked[w][k] {
				continue
			}
			n++
			i := w*perWriter + k
			if _, err := r.ReadAt(got, int64(i)*size); err != nil {
				t.Fatalf("read chunk %d back: %v", i, err)
			}
			if !bytes.Equal(got, chunkOf(i)) {
				t.Errorf("chunk %d was acknowledged but mem0 holds something else", i)
			}
		}
	}
	t.Logf("%d writes acknowledged, %d failed with an error while dpu0's lovelockd was down", n, failed)
	if n == 0 {
		t.Fatal("no write was acknowledged")
	}
}

// TestFarMemoryErrors: what lovelockd answers for bad far-memory requests,
// and a second writer refused through the whole path.
func TestFarMemoryErrors(t *testing.T) {
	c := startMemCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var info farmem.RegionInfo
	if err := c.mem.client().ServiceCall(ctx, http.MethodPost, "memserver", "regions", api.MemCreate{Size: 1 << 20, Writable: true}, &info); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		call func() error
		want string
	}{
		{"over capacity", func() error {
			return c.mem.client().ServiceCall(ctx, http.MethodPost, "memserver", "regions", api.MemCreate{Size: 1 << 30}, nil)
		}, "server full"},
		{"no size", func() error {
			return c.mem.client().ServiceCall(ctx, http.MethodPost, "memserver", "regions", api.MemCreate{}, nil)
		}, "give a size"},
		{"free unknown", func() error {
			return c.mem.client().ServiceCall(ctx, http.MethodDelete, "memserver", "regions/999", nil, nil)
		}, "unknown region"},
		{"no memory server on a DPU", func() error {
			return c.dpu.client().ServiceCall(ctx, http.MethodGet, "memserver", "regions", nil, nil)
		}, "runs no memserver service"},
		{"map an unknown region", func() error {
			_, err := fmap.Map(ctx, c.hostSocket, fmap.RegionRef{ID: 999}, fmap.Options{})
			return err
		}, "unknown region"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
	m, err := fmap.Map(ctx, c.hostSocket, fmap.RegionRef{ID: uint64(info.ID)}, fmap.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := fmap.Map(ctx, c.hostSocket, fmap.RegionRef{ID: uint64(info.ID)}, fmap.Options{}); err == nil ||
		!bytes.Contains([]byte(err.Error()), []byte("already has a writer")) {
		t.Errorf("second writer: %v, want refused", err)
	}
	// The CLI over the same API.
	lovelock := func(d *daemonProc, args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := cli.Run(ctx, cli.App(&out, &errOut), append([]string{"lovelock", "--socket", d.socket}, args...))
		return out.String() + errOut.String(), err
	}
	if out, err := lovelock(c.mem, "mem", "create", "--size", "2MiB", "--tenant", "7"); err != nil || !strings.Contains(out, "2MiB, tenant 7, writable false") {
		t.Errorf("mem create: %v\n%s", err, out)
	}
	if out, err := lovelock(c.mem, "mem", "regions", "--tenant", "7", "-o", "json"); err != nil || strings.Count(out, `"id"`) != 1 || !strings.Contains(out, `"tenant": 7`) {
		t.Errorf("mem regions --tenant 7: %v\n%s", err, out)
	}
	if out, err := lovelock(c.mem, "mem", "stats"); err != nil || !strings.Contains(out, "memory server: 2 regions (at most 1024) of 2 tenants, 1 with a writer") {
		t.Errorf("mem stats on mem0: %v\n%s", err, out)
	}
	if out, err := lovelock(c.dpu, "mem", "stats"); err != nil || !strings.Contains(out, "far-memory agent: 1 memory nodes") {
		t.Errorf("mem stats on dpu0: %v\n%s", err, out)
	}
	if out, err := lovelock(c.dpu, "mem", "regions"); err == nil || !strings.Contains(out+err.Error(), "runs no memory server") {
		t.Errorf("mem regions on dpu0: %v\n%s", err, out)
	}
	if out, err := lovelock(c.mem, "mem", "free", fmt.Sprint(info.ID+1), "--tenant", "7"); err != nil || !strings.Contains(out, "freed") {
		t.Errorf("mem free: %v\n%s", err, out)
	}

	var errs farmem.AgentStats
	if err := c.dpu.client().ServiceStats(ctx, "farmem", &errs); err != nil || errs.Errors.UnknownRegion == 0 || errs.Errors.WriterBusy == 0 {
		t.Errorf("agent error counters %+v, %v", errs.Errors, err)
	}
}

// TestFarMemoryRegionFreed: a region freed on mem0 while host0 maps it.
// The first touch of a chunk not yet fetched raises SIGBUS at once, though
// the mapping's fetch timeout is an hour: host0's agent learns from the
// memory node that the region is unknown, which no retry fixes, and
// poisons the chunk; Close names the chunk and the cause.
func TestFarMemoryRegionFreed(t *testing.T) {
	c := startMemCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	info, m := c.mapNewRegion(ctx, t)
	b := m.Bytes()
	if b[0] != 0 {
		t.Fatalf("a new region reads %d", b[0])
	}
	c.freeRegion(ctx, t, info.ID)
	start := time.Now()
	v, fault, ok := testenv.ReadByte(b, len(b)-1)
	if ok {
		t.Fatalf("the last byte of a freed region read %d, as if it were there", v)
	}
	t.Logf("SIGBUS at offset %d after %v", fault-uintptr(unsafe.Pointer(&b[0])), time.Since(start))
	err := m.Close()
	if err == nil || !strings.Contains(err.Error(), "its data is lost") || !strings.Contains(err.Error(), "unknown region") {
		t.Fatalf("Close: %v, want the poisoned chunk, its data lost: unknown region", err)
	}
}

// mapNewRegion creates a 1 MiB region on mem0 through its API and maps it
// read-only on host0, with an hour's fetch timeout: a touch that fails
// sooner was poisoned for good.
func (c memCluster) mapNewRegion(ctx context.Context, t *testing.T) (farmem.RegionInfo, *fmap.Mapping) {
	t.Helper()
	var info farmem.RegionInfo
	if err := c.mem.client().ServiceCall(ctx, http.MethodPost, "memserver", "regions", api.MemCreate{Size: 1 << 20}, &info); err != nil {
		t.Fatal(err)
	}
	m, err := fmap.Map(ctx, c.hostSocket, fmap.RegionRef{ID: uint64(info.ID), ReadOnly: true}, fmap.Options{FetchTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return info, m
}

// freeRegion frees region id on mem0 through its API.
func (c memCluster) freeRegion(ctx context.Context, t *testing.T, id uint32) {
	t.Helper()
	if err := c.mem.client().ServiceCall(ctx, http.MethodDelete, "memserver", fmt.Sprintf("regions/%d", id), nil, nil); err != nil {
		t.Fatal(err)
	}
}

// TestFarMemoryCachedRegionFreed: TestFarMemoryRegionFreed with the region
// in dpu0's static cache. mem0 tells dpu0 of the free, so a chunk not yet
// fetched, touched 100 ms after it, raises SIGBUS instead of reading the
// freed bytes from dpu0's cache (which, before the notice, served them
// until its next list of mem0's regions, up to 2 s); `lovelock mem stats`
// shows the notice on both nodes.
func TestFarMemoryCachedRegionFreed(t *testing.T) {
	c := startMemCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	info, m := c.mapNewRegion(ctx, t)
	if res, err := m.Advise(ctx, fmap.Advice{Static: []fmap.Extent{{Offset: 0, Size: 1 << 20}}}); err != nil || !res.Static {
		t.Fatalf("static advice: %+v, %v", res, err)
	}
	b := m.Bytes()
	if b[0] != 0 {
		t.Fatalf("a new region reads %d", b[0])
	}
	var st farmem.AgentStats
	if err := c.dpu.client().ServiceStats(ctx, "farmem", &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Cache.Regions) != 1 || st.Cache.Regions[0].Region != info.ID || st.Cache.Regions[0].StaticHits == 0 {
		t.Fatalf("dpu0's cache %+v: want region %d's first chunk served from its static range", st.Cache.Regions, info.ID)
	}
	c.freeRegion(ctx, t, info.ID)
	time.Sleep(100 * time.Millisecond)
	if v, _, ok := testenv.ReadByte(b, len(b)-1); ok {
		t.Fatalf("100 ms after the free, the last byte of the freed region read %d from dpu0's cache, as if it were there", v)
	}
	if err := m.Close(); err == nil || !strings.Contains(err.Error(), "unknown region") {
		t.Fatalf("Close: %v, want the poisoned chunk, its data lost: unknown region", err)
	}
	lovelock := func(d *daemonProc, args ...string) string {
		var out, errOut bytes.Buffer
		if err := cli.Run(ctx, cli.App(&out, &errOut), append([]string{"lovelock", "--socket", d.socket}, args...)); err != nil {
			t.Fatalf("lovelock %v: %v\n%s", args, err, errOut.String())
		}
		return out.String()
	}
	if out := lovelock(c.mem, "mem", "stats"); !strings.Contains(out, "freed notices sent 1 ") {
		t.Errorf("mem stats on mem0: want one freed notice sent\n%s", out)
	}
	if out := lovelock(c.dpu, "mem", "stats"); !strings.Contains(out, ", 1 regions dropped from the caches, 0 refused") {
		t.Errorf("mem stats on dpu0: want the region dropped by mem0's notice\n%s", out)
	}
}
