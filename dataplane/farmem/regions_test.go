package farmem

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
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
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	agent, _ := startAgent(t, listen(t, loopback), []netip.AddrPort{srv.Addr()}, nil)
	file := filepath.Join(t.TempDir(), "graph.csr")
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
	r1, err := c.Alloc(ctx, 8192) // through the agent: on the first node
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
	if s1.Stats().WriteBytes != 1 || s2.Stats().WriteBytes != 1 {
		t.Fatalf("writes reached %d and %d bytes, want one per node", s1.Stats().WriteBytes, s2.Stats().WriteBytes)
	}
	if _, err := c.Open(ctx, 4242, false); !errors.Is(err, ErrUnknownRegion) {
		t.Fatalf("region on no node: %v", err)
	}
	if st := agent.Stats(); st.Regions != 2 || st.Errors.UnknownRegion != 1 {
		t.Fatalf("agent knows %d regions, unknown %d", st.Regions, st.Errors.UnknownRegion)
	}
}
