package farmem

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// fakeClock is an injectable clock for leases.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestLeaseExpiry: a writer that goes away without closing (its client
// stops renewing) holds the region for at most one lease TTL; then
// another writer gets it, and the old lease no longer writes.
func TestLeaseExpiry(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	cfg := testConfig()
	cfg.LeaseTTL = Duration(time.Hour) // no renewal fires during the test
	s, err := NewServer(ServerOptions{Config: cfg, StateDir: t.TempDir(), Capacity: 1 << 20, Transport: listen(t, loopback), Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	run(t, s.Run)
	ctx := context.Background()
	gone := newClient(t, s.Addr(), 2)
	r1, err := gone.Alloc(ctx, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r1.WriteAt([]byte("old"), 0); err != nil {
		t.Fatal(err)
	}
	next := newClient(t, s.Addr(), 2)
	if _, err := next.Open(ctx, r1.ID(), true); !errors.Is(err, ErrWriterBusy) {
		t.Fatalf("while the lease lives: %v, want ErrWriterBusy", err)
	}
	clock.Advance(time.Hour - time.Second)
	if _, err := next.Open(ctx, r1.ID(), true); !errors.Is(err, ErrWriterBusy) {
		t.Fatalf("a second before expiry: %v, want ErrWriterBusy", err)
	}
	clock.Advance(2 * time.Second)
	r2, err := next.Open(ctx, r1.ID(), true)
	if err != nil {
		t.Fatalf("after expiry: %v", err)
	}
	if _, err := r2.WriteAt([]byte("new"), 0); err != nil {
		t.Fatal(err)
	}
	// The vanished writer's lease is dead; its client tries to take the
	// lease again once and is refused.
	if _, err := r1.WriteAt([]byte("xxx"), 0); !errors.Is(err, ErrWriterBusy) {
		t.Fatalf("write with an expired lease: %v, want ErrWriterBusy", err)
	}
	got := make([]byte, 3)
	if _, err := r2.ReadAt(got, 0); err != nil || string(got) != "new" {
		t.Fatalf("got %q, %v", got, err)
	}
}

// TestLeaseAfterRestart: a lease granted before a restart holds for one
// TTL after it (expiry times are not written, renewals extend it); a
// writer that died before the restart frees the region after that TTL,
// and a released lease is not restored.
func TestLeaseAfterRestart(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	cfg := testConfig()
	cfg.LeaseTTL = Duration(time.Hour)
	dir := t.TempDir()
	start := func(tr transport.Transport) (*Server, *running) {
		t.Helper()
		s, err := NewServer(ServerOptions{Config: cfg, StateDir: dir, Capacity: 1 << 20, Transport: tr, Now: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		return s, run(t, s.Run)
	}
	s, r1 := start(listen(t, loopback))
	addr := s.Addr()
	ctx := context.Background()
	gone := newClient(t, addr, 2)
	held, err := gone.Alloc(ctx, 4096)
	if err != nil {
		t.Fatal(err)
	}
	closed, err := gone.Alloc(ctx, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := closed.Close(); err != nil {
		t.Fatal(err)
	}
	r1.stop()
	clock.Advance(50 * time.Minute) // the old expiry is 10 minutes away
	s2, _ := start(listen(t, addr))
	if w := s2.Stats().Writers; w != 1 {
		t.Fatalf("%d writer leases after the restart, want 1 (the closed region's was released)", w)
	}
	next := newClient(t, addr, 2)
	if _, err := next.Open(ctx, held.ID(), true); !errors.Is(err, ErrWriterBusy) {
		t.Fatalf("after the restart: %v, want ErrWriterBusy", err)
	}
	if _, err := next.Open(ctx, closed.ID(), true); err != nil {
		t.Fatalf("the released region after the restart: %v", err)
	}
	clock.Advance(time.Hour - time.Second) // past the old expiry, inside the restored TTL
	if _, err := next.Open(ctx, held.ID(), true); !errors.Is(err, ErrWriterBusy) {
		t.Fatalf("a second before the restored lease expires: %v, want ErrWriterBusy", err)
	}
	clock.Advance(2 * time.Second)
	r, err := next.Open(ctx, held.ID(), true)
	if err != nil {
		t.Fatalf("once the restored lease expired: %v", err)
	}
	if _, err := r.WriteAt([]byte("new"), 0); err != nil {
		t.Fatal(err)
	}
}

// TestPreloadAndList: a region preloaded from a file on the memory node
// reads back as the file (padded with zeros to a larger size), is listed
// for its tenant only, and is gone after Free.
func TestPreloadAndList(t *testing.T) {
	preloads := t.TempDir()
	srv, err := NewServer(ServerOptions{Config: testConfig(), StateDir: t.TempDir(), Capacity: 64 << 20, PreloadDir: preloads, Transport: listen(t, loopback)})
	if err != nil {
		t.Fatal(err)
	}
	run(t, srv.Run)
	agent, _ := startAgent(t, listen(t, loopback), []netip.AddrPort{srv.Addr()}, nil)
	file := filepath.Join(preloads, "graph.csr")
	content := bytes.Repeat([]byte("0123456789abcdef"), 20000) // 320000 bytes
	if err := os.WriteFile(file, content, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c := newClient(t, agent.Addr(), 6)
	for _, tc := range []struct {
		name string
		size uint64
	}{{"file size", 0}, {"padded", 400000}} {
		t.Run(tc.name, func(t *testing.T) {
			ri, err := c.Create(ctx, tc.size, CreateOptions{Preload: file})
			if err != nil {
				t.Fatal(err)
			}
			want := append([]byte(nil), content...)
			want = append(want, make([]byte, max(int(tc.size), len(content))-len(content))...)
			if ri.Size != uint64(len(want)) {
				t.Fatalf("size %d, want %d", ri.Size, len(want))
			}
			r, err := c.Open(ctx, ri.ID, false)
			if err != nil {
				t.Fatal(err)
			}
			checkRegion(t, r, want)
		})
	}
	list, err := c.List(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("list %+v, %v", list, err)
	}
	if l, _ := newClient(t, agent.Addr(), 7).List(ctx); len(l) != 0 {
		t.Fatalf("another tenant lists %+v", l)
	}
	if len(srv.List(0)) != 2 {
		t.Fatalf("the infrastructure tenant lists %+v", srv.List(0))
	}
	if err := c.Free(ctx, list[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Open(ctx, list[0].ID, false); !errors.Is(err, ErrUnknownRegion) {
		t.Fatalf("open after free: %v", err)
	}
	if st := srv.Stats(); st.Regions != 1 || st.Used != list[1].Size {
		t.Fatalf("server after free: %+v", st)
	}
}

// TestAgentLearnsRegions: with two memory nodes and no regions in its
// config, the agent routes each region to the node that serves it, learnt
// from the nodes' list answers (regions created behind its back, through
// lovelockd's API) and from the creates it forwards.
func TestAgentLearnsRegions(t *testing.T) {
	s1, _ := startServer(t, t.TempDir(), listen(t, loopback))
	s2dir := t.TempDir()
	s2, err := NewServer(ServerOptions{Config: testConfig(), StateDir: s2dir, Capacity: 1 << 20, IDBase: 1000, Transport: listen(t, loopback)})
	if err != nil {
		t.Fatal(err)
	}
	run(t, s2.Run)
	agent, _ := startAgent(t, listen(t, loopback), []netip.AddrPort{s1.Addr(), s2.Addr()}, nil)
	ctx := context.Background()
	c := newClient(t, agent.Addr(), 3)
	r1, err := c.Alloc(ctx, 8192) // through the agent: on the node its nonce picks
	if err != nil {
		t.Fatal(err)
	}
	ri2, err := s2.Create(3, 8192, true, "") // behind the agent's back
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c.Open(ctx, ri2.ID, true)
	if err != nil {
		t.Fatalf("region %d on the second node: %v", ri2.ID, err)
	}
	for i, r := range []*Region{r1, r2} {
		if _, err := r.WriteAt([]byte{byte(i + 1)}, 100); err != nil {
			t.Fatal(err)
		}
	}
	want1 := uint64(0) // bytes for the first node: r1's, if it holds it
	if len(s1.List(0)) == 1 {
		want1 = 1
	}
	if s1.Stats().WriteBytes != want1 || s2.Stats().WriteBytes != 2-want1 {
		t.Fatalf("writes reached %d and %d bytes, want %d and %d (each region's byte on its node)",
			s1.Stats().WriteBytes, s2.Stats().WriteBytes, want1, 2-want1)
	}
	if _, err := c.Open(ctx, 4242, false); !errors.Is(err, ErrUnknownRegion) {
		t.Fatalf("region on no node: %v", err)
	}
	if st := agent.Stats(); st.Regions != 2 || st.Errors.UnknownRegion != 1 {
		t.Fatalf("agent knows %d regions, unknown %d", st.Regions, st.Errors.UnknownRegion)
	}
}

// TestAgentPlacesCreates: with two memory nodes, creates through the agent
// spread over them (by their nonces), a create that a full node refuses
// lands on the other, and only when both are full does the host get
// ErrNoSpace.
func TestAgentPlacesCreates(t *testing.T) {
	small, err := NewServer(ServerOptions{Config: testConfig(), StateDir: t.TempDir(), Capacity: 512 << 10, Transport: listen(t, loopback)})
	if err != nil {
		t.Fatal(err)
	}
	run(t, small.Run)
	big, err := NewServer(ServerOptions{Config: testConfig(), StateDir: t.TempDir(), Capacity: 2 << 20, IDBase: 1000, Transport: listen(t, loopback)})
	if err != nil {
		t.Fatal(err)
	}
	run(t, big.Run)
	agent, _ := startAgent(t, listen(t, loopback), []netip.AddrPort{small.Addr(), big.Addr()}, nil)
	ctx := context.Background()
	c := newClient(t, agent.Addr(), 3)
	// 384 KiB each: one fits the small node, five the big one.
	var made []RegionInfo
	for {
		ri, err := c.Create(ctx, 384<<10, CreateOptions{Writable: true})
		if errors.Is(err, ErrNoSpace) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, ri)
		if len(made) > 6 {
			t.Fatalf("%d regions of 384 KiB on 2.5 MiB of nodes", len(made))
		}
	}
	if len(made) != 6 || len(small.List(0)) != 1 || len(big.List(0)) != 5 {
		t.Fatalf("%d creates succeeded, %d on the small node and %d on the big one; want 6, 1 and 5", len(made), len(small.List(0)), len(big.List(0)))
	}
	// Each region is routed to the node that holds it.
	for i, ri := range made {
		r, err := c.Open(ctx, ri.ID, true)
		if err != nil {
			t.Fatalf("region %d: %v", ri.ID, err)
		}
		if _, err := r.WriteAt([]byte{byte(i)}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if got := small.Stats().WriteBytes + big.Stats().WriteBytes; got != 6 {
		t.Fatalf("%d bytes written on the nodes, want 6", got)
	}
	if st := agent.Stats(); st.Errors.NoSpace != 1 {
		t.Fatalf("agent counted %d ErrNoSpace answers, want 1 (the create both nodes refused)", st.Errors.NoSpace)
	}
}

// TestAgentListsAllNodes: a list through the agent holds every node's
// regions in ID order, each once, across pages cut both by the nodes and
// by the agent's smaller datagrams.
func TestAgentListsAllNodes(t *testing.T) {
	nodeCfg := testConfig()
	nodeCfg.MaxDatagram = MinDatagram + 100 // 30 entries a page
	var nodes []*Server
	var want []uint32
	for i, base := range []uint32{1, 1000} {
		s, err := NewServer(ServerOptions{Config: nodeCfg, StateDir: t.TempDir(), Capacity: 1 << 20, IDBase: base, Transport: listen(t, loopback)})
		if err != nil {
			t.Fatal(err)
		}
		run(t, s.Run)
		nodes = append(nodes, s)
		for range 45 - 10*i {
			ri, err := s.Create(3, 4096, false, "")
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, ri.ID)
		}
		if _, err := s.Create(4, 4096, false, ""); err != nil { // another tenant's
			t.Fatal(err)
		}
	}
	for _, maxDatagram := range []int{MinDatagram, DefaultMaxDatagram} { // 25 entries a page, and more than a node's
		agentCfg := AgentConfig{Config: testConfig()}
		agentCfg.MaxDatagram = maxDatagram
		for _, s := range nodes {
			agentCfg.Servers = append(agentCfg.Servers, ServerSpec{Addr: s.Addr()})
		}
		a, err := NewAgent(agentCfg, AgentOptions{HostTransports: []transport.Transport{listen(t, loopback)}, FabricTransports: []transport.Transport{listen(t, loopback)}})
		if err != nil {
			t.Fatal(err)
		}
		run(t, a.Run)
		c := newClient(t, a.Addr(), 3)
		got, err := c.List(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var ids []uint32
		for _, ri := range got {
			ids = append(ids, ri.ID)
		}
		if !slices.Equal(ids, want) {
			t.Fatalf("agent datagrams of %d bytes: listed %d regions %v\nwant %d %v", maxDatagram, len(ids), ids, len(want), want)
		}
	}
}

func TestMergeLists(t *testing.T) {
	infos := func(ids ...uint32) []RegionInfo {
		var out []RegionInfo
		for _, id := range ids {
			out = append(out, RegionInfo{ID: id})
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		parts [][]RegionInfo
		more  []bool
		room  int
		want  []uint32
		cut   bool
	}{
		{"all whole", [][]RegionInfo{infos(1, 5), infos(3, 9)}, []bool{false, false}, 10, []uint32{1, 3, 5, 9}, false},
		{"empty nodes", [][]RegionInfo{nil, nil}, []bool{false, false}, 10, nil, false},
		{"agent's room cuts", [][]RegionInfo{infos(1, 5), infos(3, 9)}, []bool{false, false}, 3, []uint32{1, 3, 5}, true},
		{"a node's cut holds back higher IDs", [][]RegionInfo{infos(1, 2, 4), infos(3, 9)}, []bool{true, false}, 10, []uint32{1, 2, 3, 4}, true},
		{"the lowest cut wins", [][]RegionInfo{infos(1, 6), infos(3, 5)}, []bool{true, true}, 10, []uint32{1, 3, 5}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, cut := mergeLists(tc.parts, tc.more, tc.room)
			var ids []uint32
			for _, ri := range got {
				ids = append(ids, ri.ID)
			}
			if !slices.Equal(ids, tc.want) || cut != tc.cut {
				t.Fatalf("got %v cut %v, want %v cut %v", ids, cut, tc.want, tc.cut)
			}
		})
	}
}

// TestAgentWarnsOfSharedIDs: two memory nodes with the same id_base hand
// out the same region IDs; the agent cannot route such an ID to both, and
// says so in its log.
func TestAgentWarnsOfSharedIDs(t *testing.T) {
	var cfg AgentConfig
	cfg.Config = testConfig()
	for range 2 {
		s, err := NewServer(ServerOptions{Config: testConfig(), StateDir: t.TempDir(), Capacity: 1 << 20, Transport: listen(t, loopback)})
		if err != nil {
			t.Fatal(err)
		}
		run(t, s.Run)
		if _, err := s.Create(3, 4096, false, ""); err != nil {
			t.Fatal(err)
		}
		cfg.Servers = append(cfg.Servers, ServerSpec{Addr: s.Addr()})
	}
	var logged testenv.SyncBuffer
	a, err := NewAgent(cfg, AgentOptions{HostTransports: []transport.Transport{listen(t, loopback)}, FabricTransports: []transport.Transport{listen(t, loopback)},
		Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	run(t, a.Run)
	if _, err := newClient(t, a.Addr(), 3).List(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logged.String(), "give each node its own id_base") {
		t.Fatalf("no warning of region 1 on both nodes; the log:\n%s", logged.String())
	}
}

// TestUnknownRegionNeedsEveryNode: a region on a memory node that is down
// when the agent looks for it is unavailable, not unknown: the agent did
// not hear every node's list, so it cannot say the region is gone (the
// host's mapping poisons a chunk at once on an unknown region). Once the
// node is back, the region opens, and an ID no node has is unknown.
func TestUnknownRegionNeedsEveryNode(t *testing.T) {
	ctx := context.Background()
	up, _ := startServer(t, t.TempDir(), listen(t, loopback))
	dir := t.TempDir()
	s, err := NewServer(ServerOptions{Config: testConfig(), StateDir: dir, Capacity: 1 << 20, IDBase: 1000, Transport: listen(t, loopback)})
	if err != nil {
		t.Fatal(err)
	}
	down := run(t, s.Run)
	ri, err := s.Create(3, 4096, false, "")
	if err != nil {
		t.Fatal(err)
	}
	addr := s.Addr()
	down.stop()

	// An agent that gives up on the dead node sooner than the client gives
	// up on the agent, so that the client hears the agent's answer.
	acfg := AgentConfig{Config: testConfig(), Servers: []ServerSpec{{Addr: up.Addr()}, {Addr: addr}}}
	acfg.Tries = 8
	a, err := NewAgent(acfg, AgentOptions{HostTransports: []transport.Transport{listen(t, loopback)}, FabricTransports: []transport.Transport{listen(t, loopback)}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, a.Run)
	c := newClient(t, a.Addr(), 3)
	for _, id := range []uint32{ri.ID, 5000} {
		start := time.Now()
		_, err := c.Open(ctx, id, false)
		t.Logf("region %d: %v after %v", id, err, time.Since(start))
		if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrUnknownRegion) {
			t.Fatalf("region %d with its node down: %v, want ErrUnavailable", id, err)
		}
	}

	// A write to a region no node listed is answered, not forwarded: its
	// bytes are not counted as sent to a memory node.
	p := rawPeer{t, listen(t, loopback), a.Addr()}
	p.send(AppendDatagram(nil, wire.Header{Type: wire.TypeMemWrite, Tenant: 3, Dst: 5000}, 0,
		Record{Op: OpWrite, Region: 5000, ID: 1, Size: 3, Aux: 1, Data: []byte("abc")}))
	if got := p.reply(); got.Status != StatusUnavailable {
		t.Fatalf("raw write to region 5000 with its node down: %v, want %v", got.Status, StatusUnavailable)
	}
	if wb := a.Stats().WriteBytes; wb != 0 {
		t.Fatalf("the agent counts %d write bytes forwarded, want 0", wb)
	}

	s2, err := NewServer(ServerOptions{Config: testConfig(), StateDir: dir, Capacity: 1 << 20, IDBase: 1000, Transport: listen(t, addr)})
	if err != nil {
		t.Fatal(err)
	}
	run(t, s2.Run)
	r, err := c.Open(ctx, ri.ID, false)
	if err != nil {
		t.Fatalf("region %d with its node back: %v", ri.ID, err)
	}
	r.Close()
	if _, err := c.Open(ctx, 5000, false); !errors.Is(err, ErrUnknownRegion) {
		t.Fatalf("region 5000, on no node: %v, want ErrUnknownRegion", err)
	}
}

// TestPreloadDir: a create over the network preloads only from the memory
// node's preload_dir (by a name relative to it, or an absolute path inside
// it); a path outside it, a link from inside it to outside, or any preload
// when it is not set, is refused with ErrBadRequest and creates nothing.
// Server.Create, lovelockd's API for the node's operator, preloads from
// anywhere.
func TestPreloadDir(t *testing.T) {
	preloads, outside := t.TempDir(), t.TempDir()
	write := func(path, body string) {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(preloads, "in.bin"), "inside")
	write(filepath.Join(outside, "secret"), "secret")
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(preloads, "link")); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, dir := range []string{preloads, ""} {
		srv, err := NewServer(ServerOptions{Config: testConfig(), StateDir: t.TempDir(), Capacity: 1 << 20, PreloadDir: dir, Transport: listen(t, loopback)})
		if err != nil {
			t.Fatal(err)
		}
		run(t, srv.Run)
		c := newClient(t, srv.Addr(), 0)
		for _, tc := range []struct {
			path string
			ok   bool
		}{
			{"in.bin", dir != ""},
			{filepath.Join(preloads, "in.bin"), dir != ""},
			{filepath.Join(preloads, "..", filepath.Base(outside), "secret"), false},
			{filepath.Join(outside, "secret"), false},
			{"link", false},
			{"/etc/passwd", false},
		} {
			ri, err := c.Create(ctx, 0, CreateOptions{Preload: tc.path})
			if tc.ok != (err == nil) || err != nil && !errors.Is(err, ErrBadRequest) {
				t.Errorf("preload_dir %q: create preloading %s: %v, want ok %v", dir, tc.path, err, tc.ok)
				continue
			}
			if tc.ok && ri.Size != uint64(len("inside")) {
				t.Errorf("preload_dir %q: %s: region of %d bytes", dir, tc.path, ri.Size)
			}
		}
		if got := len(srv.List(0)); got != map[bool]int{true: 2, false: 0}[dir != ""] {
			t.Errorf("preload_dir %q: %d regions after the creates", dir, got)
		}
		if _, err := srv.Create(0, 0, false, filepath.Join(outside, "secret")); err != nil {
			t.Errorf("preload_dir %q: the operator's create from outside it: %v", dir, err)
		}
	}
}

// TestForwardedCountsHostRequests: with two memory nodes, a list asks both
// and a create that both refuse as full asks both: each host request is
// forwarded once, its second node is fan-out, and the batch size is host
// requests per task batch. Before, Forwarded counted every node asked
// (4 of 2 host requests), so it exceeded HostRequests and AvgBatch
// overstated the aggregation.
func TestForwardedCountsHostRequests(t *testing.T) {
	var addrs []netip.AddrPort
	for _, base := range []uint32{1, 1000} {
		s, err := NewServer(ServerOptions{Config: testConfig(), StateDir: t.TempDir(), Capacity: 1 << 20, IDBase: base, Transport: listen(t, loopback)})
		if err != nil {
			t.Fatal(err)
		}
		run(t, s.Run)
		addrs = append(addrs, s.Addr())
	}
	agent, _ := startAgent(t, listen(t, loopback), addrs, nil)
	ctx := context.Background()
	c := newClient(t, agent.Addr(), 3)
	before := agent.Stats()
	if _, err := c.List(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, 4<<20, CreateOptions{}); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("create of 4 MiB on two 1 MiB nodes: %v, want ErrNoSpace", err)
	}
	st := agent.Stats()
	hostReqs := st.HostRequests - before.HostRequests
	fwd, fan, batches := st.Forwarded-before.Forwarded, st.FanOut-before.FanOut, st.Batches-before.Batches
	// Each host request asks both nodes, in a batch each. A loaded machine
	// may make the client send one again after its timeout, which the
	// agent takes as one more host request (a list is not answered from
	// the reply cache), and a resend that meets its original in flight
	// shares the original's batches (the agent aggregates): so 4 batches
	// for the list and the create, and at most 2 a host request.
	if hostReqs < 2 || fwd != hostReqs || fan != hostReqs || batches < 4 || batches > 2*hostReqs {
		t.Errorf("a list and a create, each asking 2 nodes: %d host requests, %d forwarded, %d fan-out in %d batches; want n ≥ 2, n, n in 4 to 2n",
			hostReqs, fwd, fan, batches)
	}
	if st.Forwarded > st.HostRequests || st.AvgBatch != float64(st.Forwarded)/float64(st.Batches) {
		t.Errorf("stats %+v: want forwarded at most the host requests, and the batch size host requests per batch", st)
	}
	if own := st.Fabric.Requests - st.Forwarded - st.FanOut; st.OwnRequests != own {
		t.Errorf("own requests %d, want the fabric's %d requests less forwarded and fan-out: %d", st.OwnRequests, st.Fabric.Requests, own)
	}
}
