package farmem

import (
	"context"
	"net/netip"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
)

// TestVethFabric runs the host client and the DPU agent in one network
// namespace and the memory node in another, joined by a veth pair with the
// testbed's 9000-byte MTU: real kernel UDP, jumbo datagrams, 64 KiB chunks
// in eight fragments. The memory node's receive buffer is small enough
// that the kernel drops bursts, and the fabric sockets also lose, duplicate
// and reorder. The data comes back exact and the retransmissions are
// counted. Needs root.
func TestVethFabric(t *testing.T) {
	testenv.RequirePriv(t)
	open := vethPair(t)
	lw := &lossyWrap{seed: 5, drop: 0.02, dup: 0.02, reorder: 0.05}
	srvTr := open(1, netip.AddrPort{}, 96<<10)
	srv, _ := startServer(t, t.TempDir(), lw.wrap(srvTr))
	host := open(0, netip.MustParseAddrPort("127.0.0.1:0"), 0)
	fabric := lw.wrap(open(0, netip.AddrPort{}, 0))
	cfg := AgentConfig{Config: testConfig(), Servers: []ServerSpec{{Addr: srv.Addr()}}}
	agent, err := NewAgent(cfg, AgentOptions{HostTransports: []transport.Transport{host}, FabricTransports: []transport.Transport{fabric}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, agent.Run)
	c, err := NewClient(ClientOptions{Config: testConfig(), Server: agent.Addr(), Tenant: 1, Transport: open(0, netip.MustParseAddrPort("127.0.0.1:0"), 0)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, err := c.Alloc(context.Background(), 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	workload(t, r, 8, 8, 10)
	as := agent.Stats()
	dropped, duplicated, reordered := lw.counts()
	t.Logf("injected %d dropped, %d duplicated, %d reordered; agent %+v; server %+v", dropped, duplicated, reordered, as, srv.Stats())
	if as.Fabric.Retransmits == 0 || as.Fabric.Timeouts != 0 {
		t.Errorf("fabric retransmits %d, timeouts %d", as.Fabric.Retransmits, as.Fabric.Timeouts)
	}
	if as.Fabric.TXDatagrams <= as.Forwarded {
		t.Errorf("%d datagrams for %d requests: chunks did not span several jumbo datagrams", as.Fabric.TXDatagrams, as.Forwarded)
	}
}

// vethPair joins two fresh network namespaces by a veth pair with the
// testbed's 9000-byte MTU (10.98.0.1 and .2) and returns a function that
// opens a kernel UDP transport in namespace n: on addr, or on the pair's
// address of n when addr is zero.
func vethPair(t testing.TB) func(n int, addr netip.AddrPort, rbuf int) transport.Transport {
	ns := []netns.NsHandle{testenv.NewNetNS(t), testenv.NewNetNS(t)}
	addrs := []netip.Addr{netip.MustParseAddr("10.98.0.1"), netip.MustParseAddr("10.98.0.2")}
	testenv.VethPair(t,
		testenv.VethEnd{NS: ns[0], Name: "fm0", Addr: addrs[0].String() + "/24", MTU: 9000},
		testenv.VethEnd{NS: ns[1], Name: "fm1", Addr: addrs[1].String() + "/24", MTU: 9000})
	return func(n int, addr netip.AddrPort, rbuf int) transport.Transport {
		if !addr.IsValid() {
			addr = netip.AddrPortFrom(addrs[n], 0)
		}
		var c *udp.Conn
		var err error
		testenv.InNetNS(t, ns[n], func() error {
			c, err = udp.Listen(addr, udp.Options{MaxPayload: udp.MaxPayloadForMTU(9000, false), ReadBuffer: rbuf})
			return err
		})
		return c
	}
}

// TestVethOwnSockets runs the parties on the kernel UDP sockets they open
// for themselves (kernelUDP, with GSO) across a 9000-MTU veth pair: the
// memory node in one namespace, the agent and the clients in the other,
// one client through the agent and one to the memory node directly. A
// chunk's datagrams cross veth as GSO runs and are split at the receiving
// sockets; the data comes back exact. Needs root.
func TestVethOwnSockets(t *testing.T) {
	testenv.RequirePriv(t)
	ns := []netns.NsHandle{testenv.NewNetNS(t), testenv.NewNetNS(t)}
	testenv.VethPair(t,
		testenv.VethEnd{NS: ns[0], Name: "fg0", Addr: "10.96.0.1/24", MTU: 9000},
		testenv.VethEnd{NS: ns[1], Name: "fg1", Addr: "10.96.0.2/24", MTU: 9000})
	var srv *Server
	testenv.InNetNS(t, ns[1], func() error {
		var err error
		srv, err = NewServer(ServerOptions{Config: testConfig(), StateDir: t.TempDir(), Capacity: 64 << 20,
			Addr: netip.MustParseAddrPort("10.96.0.2:0")})
		return err
	})
	run(t, srv.Run)
	var agent *Agent
	clients := make([]*Client, 2)
	testenv.InNetNS(t, ns[0], func() error {
		var err error
		agent, err = NewAgent(AgentConfig{Config: testConfig(), Listen: netip.MustParseAddrPort("127.0.0.1:0"),
			Servers: []ServerSpec{{Addr: srv.Addr()}}}, AgentOptions{})
		if err != nil {
			return err
		}
		for i, to := range []netip.AddrPort{agent.Addr(), srv.Addr()} {
			if clients[i], err = NewClient(ClientOptions{Config: testConfig(), Server: to, Tenant: 1}); err != nil {
				return err
			}
		}
		return nil
	})
	run(t, agent.Run)
	for i, c := range clients {
		defer c.Close()
		r, err := c.Alloc(context.Background(), 4<<20)
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		workload(t, r, uint64(i), 8, 10)
	}
	t.Logf("agent host link %+v, fabric %+v; server link %+v", agent.Stats().Host, agent.Stats().Fabric, srv.Stats().Link)
}
