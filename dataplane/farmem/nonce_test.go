package farmem

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
)

// dropReplies drops every datagram its owner sends while armed, and says
// when it dropped the first: the request was applied, its reply lost.
type dropReplies struct {
	transport.Transport
	armed   atomic.Bool
	once    sync.Once
	dropped chan struct{}
}

func newDropReplies(tr transport.Transport) *dropReplies {
	return &dropReplies{Transport: tr, dropped: make(chan struct{})}
}

func (d *dropReplies) Send(pkts []transport.Packet) (int, error) {
	if d.armed.Load() {
		d.once.Do(func() { close(d.dropped) })
		return len(pkts), nil
	}
	return d.Transport.Send(pkts)
}

// TestRepeatAcrossServerRestart: a writer's open and a create, each
// applied by a memory node that lost its reply and then restarted, are
// answered when the client retransmits them to the restarted node (the
// reply cache is gone) as the first time: the open gets its own lease
// back instead of ErrWriterBusy against it, the create the region it made
// instead of a second one that nothing would free.
func TestRepeatAcrossServerRestart(t *testing.T) {
	cfg := testConfig()
	cfg.LeaseTTL = Duration(time.Hour)
	start := func(dir string, tr transport.Transport) (*Server, *running) {
		t.Helper()
		s, err := NewServer(ServerOptions{Config: cfg, StateDir: dir, Capacity: 1 << 20, Transport: tr})
		if err != nil {
			t.Fatal(err)
		}
		return s, run(t, s.Run)
	}
	ctx := context.Background()

	t.Run("open", func(t *testing.T) {
		dir := t.TempDir()
		tr := newDropReplies(listen(t, loopback))
		s, r1 := start(dir, tr)
		addr := s.Addr()
		ri, err := s.Create(2, 4096, true, "")
		if err != nil {
			t.Fatal(err)
		}
		c := newClientTTL(t, addr, 2, time.Hour, listen(t, loopback))
		tr.armed.Store(true)
		type opened struct {
			r   *Region
			err error
		}
		done := make(chan opened, 1)
		go func() { r, err := c.Open(ctx, ri.ID, true); done <- opened{r, err} }()
		<-tr.dropped
		r1.stop()
		s2, _ := start(dir, listen(t, addr))
		o := <-done
		if o.err != nil {
			t.Fatalf("open for writing retransmitted across a restart: %v", o.err)
		}
		if _, err := o.r.WriteAt([]byte("mine"), 0); err != nil {
			t.Fatalf("write with the lease the repeated open got: %v", err)
		}
		if w := s2.Stats().Writers; w != 1 {
			t.Fatalf("%d writer leases, want 1", w)
		}
		other := newClientTTL(t, addr, 2, time.Hour, listen(t, loopback))
		if _, err := other.Open(ctx, ri.ID, true); !errors.Is(err, ErrWriterBusy) {
			t.Fatalf("another writer's open: %v, want ErrWriterBusy", err)
		}
		if err := o.r.Close(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("create", func(t *testing.T) {
		dir := t.TempDir()
		tr := newDropReplies(listen(t, loopback))
		s, r1 := start(dir, tr)
		addr := s.Addr()
		c := newClientTTL(t, addr, 2, time.Hour, listen(t, loopback))
		tr.armed.Store(true)
		type created struct {
			ri  RegionInfo
			err error
		}
		done := make(chan created, 1)
		go func() {
			ri, err := c.Create(ctx, 4096, CreateOptions{Writable: true})
			done <- created{ri, err}
		}()
		<-tr.dropped
		r1.stop()
		s2, _ := start(dir, listen(t, addr))
		cr := <-done
		if cr.err != nil {
			t.Fatalf("create retransmitted across a restart: %v", cr.err)
		}
		if got := s2.List(0); len(got) != 1 || got[0].ID != cr.ri.ID || got[0].Size != 4096 {
			t.Fatalf("after one create the node lists %+v, want the one region %d", got, cr.ri.ID)
		}
	})
}

// TestRepeatAcrossAgentRestart: the same through a DPU agent that stops
// after it forwarded the open or create and before the memory node's reply
// reached it; the host retransmits to the agent's next run, which forwards
// the request under a new ID that the memory node's reply cache does not
// know.
func TestRepeatAcrossAgentRestart(t *testing.T) {
	srvTr := newDropReplies(listen(t, loopback))
	cfg := testConfig()
	cfg.LeaseTTL = Duration(time.Hour)
	s, err := NewServer(ServerOptions{Config: cfg, StateDir: t.TempDir(), Capacity: 1 << 20, Transport: srvTr})
	if err != nil {
		t.Fatal(err)
	}
	run(t, s.Run)
	ri, err := s.Create(2, 4096, true, "")
	if err != nil {
		t.Fatal(err)
	}
	host := listen(t, loopback)
	agentAddr := host.LocalAddr()
	_, run1 := startAgent(t, host, []netip.AddrPort{s.Addr()}, nil)
	c := newClientTTL(t, agentAddr, 2, time.Hour, listen(t, loopback))
	ctx := context.Background()
	if _, err := c.List(ctx); err != nil { // the agent learns the node's regions
		t.Fatal(err)
	}

	srvTr.armed.Store(true)
	opened := make(chan error, 1)
	var r *Region
	go func() {
		var err error
		r, err = c.Open(ctx, ri.ID, true)
		opened <- err
	}()
	<-srvTr.dropped
	created := make(chan error, 1)
	var cri RegionInfo
	go func() {
		var err error
		cri, err = c.Create(ctx, 8192, CreateOptions{Writable: true})
		created <- err
	}()
	// Both applied (the create too: wait for its region), no reply out.
	deadline := time.Now().Add(10 * time.Second)
	for len(s.List(0)) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the create never reached the memory node")
		}
		time.Sleep(5 * time.Millisecond)
	}
	run1.stop()
	srvTr.armed.Store(false)
	startAgent(t, listen(t, agentAddr), []netip.AddrPort{s.Addr()}, nil)
	if err := <-opened; err != nil {
		t.Fatalf("open for writing forwarded again by a restarted agent: %v", err)
	}
	if _, err := r.WriteAt([]byte("mine"), 0); err != nil {
		t.Fatalf("write with the lease the repeated open got: %v", err)
	}
	if err := <-created; err != nil {
		t.Fatalf("create forwarded again by a restarted agent: %v", err)
	}
	if got := s.List(0); len(got) != 2 || got[1].ID != cri.ID || got[1].Size != 8192 {
		t.Fatalf("after one create the node lists %+v, want region %d and the created %d", got, ri.ID, cri.ID)
	}
}

// TestNoncelessPeers: requests without a nonce (peers that predate it send
// zeros there) work as before: each create makes a region, a second
// writer's open is refused.
func TestNoncelessPeers(t *testing.T) {
	s, _ := startServer(t, t.TempDir(), listen(t, loopback))
	c := newClient(t, s.Addr(), 2)
	ctx := context.Background()
	for range 2 {
		k := &call{rec: Record{Op: OpCreate, Offset: 4096, Aux: CreateWritable}}
		if err := c.do(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	regions := s.List(0)
	if len(regions) != 2 {
		t.Fatalf("two creates without a nonce made %d regions", len(regions))
	}
	for i, want := range []error{nil, ErrWriterBusy} {
		k := &call{rec: Record{Op: OpOpen, Region: regions[0].ID, Aux: 1}}
		if err := c.do(ctx, k); !errors.Is(err, want) && (want != nil || err != nil) {
			t.Fatalf("open %d without a nonce: %v, want %v", i, err, want)
		}
	}
}

// TestRepeatedCreateSameNode: with several memory nodes, a create that a
// restarted DPU agent forwards again (same nonce, no reply cache, its turn
// counter back at the start) reaches the node that made the region and gets
// it back, instead of making a second region on another node. The second
// agent stands for the first's next run; the first agent's earlier creates
// moved its turn over the nodes.
func TestRepeatedCreateSameNode(t *testing.T) {
	var nodes []netip.AddrPort
	var servers []*Server
	for i := range 2 {
		s, err := NewServer(ServerOptions{Config: testConfig(), StateDir: t.TempDir(), Capacity: 1 << 20,
			IDBase: uint32(1 + i<<20), Transport: listen(t, loopback)})
		if err != nil {
			t.Fatal(err)
		}
		run(t, s.Run)
		nodes, servers = append(nodes, s.Addr()), append(servers, s)
	}
	ctx := context.Background()
	for i, tc := range []struct {
		name  string
		prior int // creates through the first agent before the repeated one
		nonce uint64
	}{
		{"first create, even nonce", 0, 0x10},
		{"first create, odd nonce", 0, 0x11},
		{"after one create, even nonce", 1, 0x20},
		{"after one create, odd nonce", 1, 0x21},
		{"after two creates, odd nonce", 2, 0x31},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tenant := uint32(10 + i)
			first, _ := startAgent(t, listen(t, loopback), nodes, nil)
			c := newClient(t, first.Addr(), tenant)
			for range tc.prior {
				if _, err := c.Create(ctx, 4096, CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			create := func(c *Client) uint32 {
				t.Helper()
				k := &call{rec: Record{Op: OpCreate, Offset: 4096, Aux: CreateWritable}}
				k.rec.setNonce(tc.nonce)
				if err := c.do(ctx, k); err != nil {
					t.Fatal(err)
				}
				return k.reply.Region
			}
			id := create(c)
			next, _ := startAgent(t, listen(t, loopback), nodes, nil)
			if again := create(newClient(t, next.Addr(), tenant)); again != id {
				t.Errorf("the repeated create through the restarted agent got region %d, want %d", again, id)
			}
			held := 0
			for _, s := range servers {
				held += len(s.List(tenant))
			}
			if held != tc.prior+1 {
				t.Errorf("the nodes hold %d regions of the tenant after %d creates and a repeat, want %d", held, tc.prior+1, tc.prior+1)
			}
		})
	}
}

// TestCreateUnansweredNamesSize: a create no memory node answers fails
// naming its size, not its Region field, which holds half of its nonce.
func TestCreateUnansweredNamesSize(t *testing.T) {
	silent := listen(t, loopback) // bound, never read
	t.Cleanup(func() { silent.Close() })
	cfg := testConfig()
	cfg.Tries, cfg.MaxRetransmitTimeout = 3, Duration(10*time.Millisecond)
	c, err := NewClient(ClientOptions{Config: cfg, Server: silent.LocalAddr(), Tenant: 1, Transport: listen(t, loopback)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_, err = c.Create(t.Context(), 4096, CreateOptions{Writable: true})
	t.Log(err)
	if !errors.Is(err, ErrUnavailable) || regionNumber.MatchString(err.Error()) || !strings.Contains(err.Error(), "create of 4096 bytes") {
		t.Fatalf("an unanswered create: %v, want ErrUnavailable naming its size and no region", err)
	}
}
