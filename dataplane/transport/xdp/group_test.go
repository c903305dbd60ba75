package xdp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
	"github.com/lovelock-dpu/lovelock/dataplane/xsk"
)

// trio is a DPU namespace with two interfaces, as a DPU's agent sees its
// host (xa, 10.77.0.1, peer xb in host: 10.77.0.2 and 10.77.0.3) and the
// fabric (ya, 10.78.0.1, peer yb in far: 10.78.0.2, which routes
// 10.77.0.0/24 through the DPU). xa has two queues, so that a packet can
// arrive on a queue without a socket. The steering program runs in native
// mode on xa and ya with one rule: UDP to testPort -> xsk:0. The DPU has
// permanent neighbour entries for 10.77.0.2 and 10.78.0.2, none for
// 10.77.0.3.
type trio struct {
	dpu, host, far netns.NsHandle
	xa, ya         int
	xbMAC, ybMAC   net.HardwareAddr
	steer          *bpf.Steer
}

const (
	hostIP2 = "10.77.0.3"
	dpuIP2  = "10.78.0.1"
	farIP   = "10.78.0.2"
)

func newTrio(t *testing.T) *trio {
	t.Helper()
	testenv.RequirePriv(t)
	tr := &trio{dpu: testenv.NewNetNS(t), host: testenv.NewNetNS(t), far: testenv.NewNetNS(t)}
	tr.xa, _ = testenv.VethPair(t,
		testenv.VethEnd{NS: tr.dpu, Name: "xa", Addr: dpuIP + "/24", Queues: 2},
		testenv.VethEnd{NS: tr.host, Name: "xb", Addr: hostIP + "/24", Queues: 2})
	tr.ya, _ = testenv.VethPair(t,
		testenv.VethEnd{NS: tr.dpu, Name: "ya", Addr: dpuIP2 + "/24"},
		testenv.VethEnd{NS: tr.far, Name: "yb", Addr: farIP + "/24"})
	var xaMAC, yaMAC net.HardwareAddr
	testenv.InNetNS(t, tr.host, func() error {
		l, err := netlink.LinkByName("xb")
		if err != nil {
			return err
		}
		tr.xbMAC = l.Attrs().HardwareAddr
		a, _ := netlink.ParseAddr(hostIP2 + "/24")
		return netlink.AddrAdd(l, a)
	})
	testenv.InNetNS(t, tr.far, func() error {
		l, err := netlink.LinkByName("yb")
		if err != nil {
			return err
		}
		tr.ybMAC = l.Attrs().HardwareAddr
		_, dst, _ := net.ParseCIDR("10.77.0.0/24")
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Gw: net.ParseIP(dpuIP2)})
	})
	testenv.InNetNS(t, tr.dpu, func() error {
		for _, n := range []struct {
			idx int
			ip  string
			mac net.HardwareAddr
		}{{tr.xa, hostIP, tr.xbMAC}, {tr.ya, farIP, tr.ybMAC}} {
			if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: n.idx, Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
				IP: net.ParseIP(n.ip), HardwareAddr: n.mac}); err != nil {
				return err
			}
		}
		xa, _ := netlink.LinkByIndex(tr.xa)
		ya, _ := netlink.LinkByIndex(tr.ya)
		xaMAC, yaMAC = xa.Attrs().HardwareAddr, ya.Attrs().HardwareAddr
		return nil
	})
	// The peers know the DPU's MACs, so the first datagrams need no ARP.
	for _, n := range []struct {
		ns  netns.NsHandle
		dev string
		ip  string
		mac *net.HardwareAddr
	}{{tr.host, "xb", dpuIP, &xaMAC}, {tr.far, "yb", dpuIP2, &yaMAC}} {
		testenv.InNetNS(t, n.ns, func() error {
			l, err := netlink.LinkByName(n.dev)
			if err != nil {
				return err
			}
			return netlink.NeighSet(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
				IP: net.ParseIP(n.ip), HardwareAddr: *n.mac})
		})
	}
	s, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	tr.steer = s
	var k bpf.RuleKey
	k.Flow.Proto, k.Flow.Dport = 17, testPort
	if err := s.Apply(&bpf.Ruleset{
		Shapes:  []bpf.Shape{{Fields: bpf.FieldProto | bpf.FieldDport, MaxPrio: 10}},
		Entries: []bpf.Entry{{Key: k, Val: bpf.RuleVal{Prio: 10, Id: 1, Action: uint16(bpf.ActionXSK), Arg: 0}}},
	}); err != nil {
		t.Fatal(err)
	}
	testenv.InNetNS(t, tr.dpu, func() error {
		for _, idx := range []int{tr.xa, tr.ya} {
			l, err := s.AttachXDP(idx, link.XDPDriverMode)
			if err != nil {
				return err
			}
			t.Cleanup(func() { l.Close() })
		}
		return nil
	})
	return tr
}

// open opens the Group of worker 0 on xa and ya and registers its sockets.
func (tr *trio) open(t *testing.T, opts GroupOptions) *Group {
	t.Helper()
	opts.Interfaces = []string{"xa", "ya"}
	opts.Addr = netip.AddrPortFrom(netip.MustParseAddr(dpuIP), testPort)
	if opts.Socket == nil {
		opts.Socket = &xsk.SocketConfig{Mode: xsk.ModeCopy}
	}
	var gs []*Group
	testenv.InNetNS(t, tr.dpu, func() (err error) {
		gs, err = OpenGroups(opts, 1, udp.Options{})
		return err
	})
	g := gs[0]
	t.Cleanup(func() { g.Close() })
	for _, x := range g.Transports() {
		set := tr.steer.SetXSK
		if x.MultiBuffer() {
			set = tr.steer.SetXSKMultiBuffer
		}
		if err := set(x.Ifindex(), x.Queue(), x.FD()); err != nil {
			t.Fatal(err)
		}
	}
	return g
}

// conn opens a kernel UDP socket on addr:0 in ns.
func conn(t *testing.T, ns netns.NsHandle, addr string) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	testenv.InNetNS(t, ns, func() (err error) {
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr+":0")))
		return err
	})
	t.Cleanup(func() { c.Close() })
	return c
}

func addrOf(c *net.UDPConn) netip.AddrPort { return c.LocalAddr().(*net.UDPAddr).AddrPort() }

// recvN reads n datagrams from g and counts them by source.
func recvN(t *testing.T, g *Group, n int) map[netip.AddrPort]int {
	t.Helper()
	pkts := make([]transport.Packet, 16)
	for i := range pkts {
		pkts[i].Data = make([]byte, 2048)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	from := map[netip.AddrPort]int{}
	for got := 0; got < n; {
		k, err := g.Recv(ctx, pkts)
		if err != nil {
			t.Fatalf("after %d of %d datagrams: %v (stats %+v)", got, n, err, g.Stats())
		}
		for _, p := range pkts[:k] {
			from[p.Addr]++
		}
		got += k
	}
	return from
}

func cpuTime() time.Duration {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestGroupRecv receives on both interfaces' AF_XDP sockets, fairly, and
// on the kernel socket what XDP passed to the stack: packets that arrived
// on a queue without a socket, and packets for an unregistered socket.
func TestGroupRecv(t *testing.T) {
	tr := newTrio(t)
	g := tr.open(t, GroupOptions{})
	if g.MaxPayload() != 1472 {
		t.Errorf("MaxPayload %d, want 1472", g.MaxPayload())
	}
	// xa has two queues: the host's flows land on one by their hash.
	h, h1 := tr.hostConnOnQueue(t, g, 0), tr.hostConnOnQueue(t, g, 1)
	f := conn(t, tr.far, farIP)
	base := g.Stats()
	const n = 100
	for i := range n {
		for _, c := range []*net.UDPConn{h, f} {
			if _, err := c.WriteToUDPAddrPort(payload(i, 64), g.LocalAddr()); err != nil {
				t.Fatal(err)
			}
		}
	}
	time.Sleep(20 * time.Millisecond) // let both rings fill
	// The first two calls start with different sockets: both are served
	// although each alone could fill every batch.
	pkts := make([]transport.Packet, 16)
	for i := range pkts {
		pkts[i].Data = make([]byte, 2048)
	}
	first := map[netip.AddrPort]int{}
	for range 2 {
		k, err := g.Recv(context.Background(), pkts)
		if err != nil || k != len(pkts) {
			t.Fatalf("Recv: %d, %v", k, err)
		}
		for _, p := range pkts[:k] {
			first[p.Addr]++
		}
	}
	if first[addrOf(h)] != 16 || first[addrOf(f)] != 16 {
		t.Errorf("first two batches by source %v: want 16 from each", first)
	}
	from := recvN(t, g, 2*n-32)
	from[addrOf(h)] += first[addrOf(h)]
	from[addrOf(f)] += first[addrOf(f)]
	if from[addrOf(h)] != n || from[addrOf(f)] != n {
		t.Errorf("by source %v, want %d each", from, n)
	}
	st := g.Stats()
	if st.Sockets[0].Interface != "xa" || st.Sockets[0].Transport.RXPackets-base.Sockets[0].Transport.RXPackets != n ||
		st.Sockets[1].Interface != "ya" || st.Sockets[1].Transport.RXPackets != n || st.KernelRX != base.KernelRX {
		t.Errorf("stats %+v: want %d more on each AF_XDP socket, none more on the kernel socket", st, n)
	}

	// h1's flow arrives on xa's queue 1: its rule says xsk:0, the kernel
	// cannot hand it to queue 0's socket, the steering program passes it
	// (xsk_miss) and the kernel socket receives it.
	miss0 := missCount(t, tr.steer)
	for i := range 10 {
		if _, err := h1.WriteToUDPAddrPort(payload(i, 10), g.LocalAddr()); err != nil {
			t.Fatal(err)
		}
	}
	if got := recvN(t, g, 10); got[addrOf(h1)] != 10 {
		t.Fatalf("queue 1 datagrams: %v", got)
	}
	if d := g.Stats().KernelRX - st.KernelRX; d != 10 {
		t.Errorf("queue 1 datagrams: kernel RX +%d, want 10", d)
	}
	if d := missCount(t, tr.steer) - miss0; d != 10 {
		t.Errorf("xsk_miss +%d, want 10", d)
	}
	st = g.Stats()

	// Without ya's socket registered, far's datagrams take the kernel
	// socket too.
	if err := tr.steer.ClearXSK(tr.ya, 0); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		f.WriteToUDPAddrPort(payload(i, 10), g.LocalAddr())
	}
	if got := recvN(t, g, 10); got[addrOf(f)] != 10 {
		t.Errorf("unregistered socket: %v", got)
	}
	if st2 := g.Stats(); st2.KernelRX-st.KernelRX != 10 || st2.Sockets[1].Transport.RXPackets != n {
		t.Errorf("unregistered socket: stats %+v", st)
	}

	// Idle: a Recv waits out its deadline in poll(2), not spinning.
	cpu0 := cpuTime()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if k, err := g.Recv(ctx, pkts); k != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("idle Recv: %d, %v", k, err)
	}
	if el := time.Since(start); el < 280*time.Millisecond || el > time.Second {
		t.Errorf("idle Recv returned after %v, want 300ms", el)
	}
	if c := cpuTime() - cpu0; c > 60*time.Millisecond {
		t.Errorf("idle Recv used %v of CPU in 300ms: spinning?", c)
	}
	// A done context polls.
	done, cancelDone := context.WithCancel(context.Background())
	cancelDone()
	if k, err := g.Recv(done, pkts); k != 0 || !errors.Is(err, context.Canceled) {
		t.Errorf("poll: %d, %v", k, err)
	}
	// Close wakes a blocked Recv.
	closeWakesRecv(t, g, pkts)
	if _, err := g.Send([]transport.Packet{{Addr: addrOf(h), Data: []byte("x")}}); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Send after Close: %v", err)
	}
}

// hostConnOnQueue opens host sockets until one whose flow the veth puts on
// xa's queue q (the hash of its addresses and ports decides): a probe
// datagram reaches the AF_XDP socket (queue 0) or the kernel socket.
func (tr *trio) hostConnOnQueue(t *testing.T, g *Group, q int) *net.UDPConn {
	t.Helper()
	for range 64 {
		c := conn(t, tr.host, hostIP)
		before := g.Stats().KernelRX
		if _, err := c.WriteToUDPAddrPort([]byte("probe"), g.LocalAddr()); err != nil {
			t.Fatal(err)
		}
		recvN(t, g, 1)
		if kernel := g.Stats().KernelRX > before; kernel == (q != 0) {
			return c
		}
		c.Close()
	}
	t.Fatalf("no host flow landed on xa queue %d in 64 tries", q)
	return nil
}

func missCount(t *testing.T, s *bpf.Steer) uint64 {
	t.Helper()
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return st[bpf.StatXSKMiss].Packets
}

// TestGroupSend sends one mixed batch: each datagram leaves through the
// AF_XDP socket of the interface its route uses; a local destination and a
// next hop without a neighbour entry go through the kernel socket, and the
// AF_XDP path takes over once the kernel resolved the neighbour.
func TestGroupSend(t *testing.T) {
	tr := newTrio(t)
	g := tr.open(t, GroupOptions{MissTTL: 50 * time.Millisecond})
	h, h2, f := conn(t, tr.host, hostIP), conn(t, tr.host, hostIP2), conn(t, tr.far, farIP)
	local := conn(t, tr.dpu, dpuIP2) // routed through lo

	var batch []transport.Packet
	want := map[*net.UDPConn]int{}
	for i := range 60 {
		c := []*net.UDPConn{h, f, h, f, local, h2}[i%6]
		if c == h2 && want[h2] > 0 {
			c = h // one datagram to the unresolved next hop
		}
		batch = append(batch, transport.Packet{Addr: addrOf(c), Data: payload(i, 100+i)})
		want[c]++
	}
	if n, err := g.Send(batch); n != len(batch) || err != nil {
		t.Fatalf("Send: %d, %v", n, err)
	}
	for c, n := range want {
		got := recvAll(t, c, n)
		for _, from := range got {
			if from != g.LocalAddr() {
				t.Errorf("datagram to %v from %v, want %v", addrOf(c), from, g.LocalAddr())
			}
		}
	}
	st := g.Stats()
	if st.Sockets[0].Transport.TXPackets != uint64(want[h]) || st.Sockets[1].Transport.TXPackets != uint64(want[f]) ||
		st.KernelTX != uint64(want[local]) || st.KernelFallback != 1 {
		t.Errorf("stats %+v; want %d on xa, %d on ya, %d kernel (local), 1 fallback", st, want[h], want[f], want[local])
	}

	// The fallback made the kernel resolve 10.77.0.3; after MissTTL the
	// AF_XDP path carries it.
	deadline := time.Now().Add(3 * time.Second)
	for {
		time.Sleep(60 * time.Millisecond)
		before := g.Stats().Sockets[0].Transport.TXPackets
		if _, err := g.Send([]transport.Packet{{Addr: addrOf(h2), Data: []byte("resolved?")}}); err != nil {
			t.Fatal(err)
		}
		recvAll(t, h2, 1)
		if g.Stats().Sockets[0].Transport.TXPackets == before+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10.77.0.3 never took the AF_XDP path: %+v", g.Stats())
		}
	}

	// Refusals come before anything is sent.
	n, err := g.Send([]transport.Packet{{Addr: addrOf(h), Data: []byte("a")}, {Addr: addrOf(h), Data: make([]byte, 1473)}, {Addr: addrOf(f), Data: []byte("c")}})
	if n != 1 || !errors.Is(err, transport.ErrTooBig) {
		t.Errorf("too big: %d, %v", n, err)
	}
	recvAll(t, h, 1)
	n, err = g.Send([]transport.Packet{{Addr: netip.MustParseAddrPort("[fd00::1]:5"), Data: []byte("a")}})
	if n != 0 || !errors.Is(err, transport.ErrAddr) {
		t.Errorf("IPv6: %d, %v", n, err)
	}
	time.Sleep(20 * time.Millisecond)
	_ = f.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if k, _, err := f.ReadFromUDPAddrPort(make([]byte, 16)); err == nil {
		t.Errorf("a datagram after the refused one was sent (%d bytes)", k)
	}
}

// TestGroupErrors checks the configuration errors.
func TestGroupErrors(t *testing.T) {
	tr := newTrio(t)
	testenv.InNetNS(t, tr.dpu, func() error {
		addr := netip.AddrPortFrom(netip.MustParseAddr(dpuIP), testPort)
		for _, c := range []struct {
			name string
			opts GroupOptions
			n    int
			want string
		}{
			{"unknown interface", GroupOptions{Interfaces: []string{"xa", "nope0"}, Addr: addr}, 1, `interface "nope0"`},
			{"queues", GroupOptions{Interfaces: []string{"xa", "ya"}, Addr: addr}, 2, "interface ya has 1 RX queues, 2 workers need 2"},
			{"twice", GroupOptions{Interfaces: []string{"xa", "xa"}, Addr: addr}, 1, "listed twice"},
			{"no interfaces", GroupOptions{Addr: addr}, 1, "at least one interface"},
		} {
			gs, err := OpenGroups(c.opts, c.n, udp.Options{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
			}
			for _, g := range gs {
				g.Close()
			}
		}
		// Everything was closed: the port is free again.
		c, err := udp.Listen(addr, udp.Options{})
		if err != nil {
			t.Errorf("port still held after failed opens: %v", err)
		} else {
			c.Close()
		}
		return nil
	})
}

// TestGroupJumboMTU runs the trio at MTU 9000 (the steering program is
// xdp.frags, so veth takes it): MaxPayload is capped at 3478 bytes, the
// most that reaches XDP in one buffer on veth (SingleBufferFrame), and a
// datagram of exactly that size sent through a Group arrives on the peer
// Group's AF_XDP socket, both ways, while one byte more arrives as a
// multi-buffer frame, which the steering program passes to the stack
// (xsk_miss), and reaches the Group through its kernel socket.
func TestGroupJumboMTU(t *testing.T) {
	if got := MaxPayloadForMTU(1500); got != 1472 {
		t.Errorf("MaxPayloadForMTU(1500) = %d, want 1472", got)
	}
	if got := MaxPayloadForMTU(9000); got != 3478 {
		t.Errorf("MaxPayloadForMTU(9000) = %d, want 3478", got)
	}
	tr := newTrio(t)
	for _, n := range []struct {
		ns   netns.NsHandle
		devs []string
	}{{tr.dpu, []string{"xa", "ya"}}, {tr.host, []string{"xb"}}, {tr.far, []string{"yb"}}} {
		testenv.InNetNS(t, n.ns, func() error {
			for _, d := range n.devs {
				l, err := netlink.LinkByName(d)
				if err != nil {
					return err
				}
				if err := netlink.LinkSetMTU(l, 9000); err != nil {
					return fmt.Errorf("%s: MTU 9000 with XDP attached: %w", d, err)
				}
			}
			return nil
		})
	}
	g := tr.open(t, GroupOptions{})
	const want = SingleBufferFrame - 14 - Overhead // 3478
	if g.MaxPayload() != want {
		t.Fatalf("Group MaxPayload %d at MTU 9000, want %d", g.MaxPayload(), want)
	}
	for _, x := range g.Transports() {
		if x.MaxPayload() != want || x.mtu != 9000 {
			t.Errorf("%s: MaxPayload %d at MTU %d, want %d at 9000", x.ifname, x.MaxPayload(), x.mtu, want)
		}
	}

	// A second Group in far, on yb, with a steering program of its own.
	fs, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	var k bpf.RuleKey
	k.Flow.Proto, k.Flow.Dport = 17, testPort
	if err := fs.Apply(&bpf.Ruleset{
		Shapes:  []bpf.Shape{{Fields: bpf.FieldProto | bpf.FieldDport, MaxPrio: 10}},
		Entries: []bpf.Entry{{Key: k, Val: bpf.RuleVal{Prio: 10, Id: 1, Action: uint16(bpf.ActionXSK), Arg: 0}}},
	}); err != nil {
		t.Fatal(err)
	}
	var fg *Group
	testenv.InNetNS(t, tr.far, func() error {
		l, err := netlink.LinkByName("yb")
		if err != nil {
			return err
		}
		xl, err := fs.AttachXDP(l.Attrs().Index, link.XDPDriverMode)
		if err != nil {
			return err
		}
		t.Cleanup(func() { xl.Close() })
		gs, err := OpenGroups(GroupOptions{Interfaces: []string{"yb"}, Addr: netip.AddrPortFrom(netip.MustParseAddr(farIP), testPort),
			Socket: &xsk.SocketConfig{Mode: xsk.ModeCopy}}, 1, udp.Options{})
		if err != nil {
			return err
		}
		fg = gs[0]
		return nil
	})
	t.Cleanup(func() { fg.Close() })
	fx := fg.Transports()[0]
	if err := fs.SetXSK(fx.Ifindex(), fx.Queue(), fx.FD()); err != nil {
		t.Fatal(err)
	}
	if fg.MaxPayload() != want {
		t.Fatalf("far Group MaxPayload %d, want %d", fg.MaxPayload(), want)
	}

	// exactly sends a MaxPayload datagram from one Group to the other and
	// checks that it arrived whole on the receiver's AF_XDP socket on iface.
	exactly := func(from, to *Group, toSteer *bpf.Steer, iface int) {
		t.Helper()
		before, miss := to.Stats(), missCount(t, toSteer)
		data := payload(7, want)
		if n, err := from.Send([]transport.Packet{{Addr: to.LocalAddr(), Data: data}}); n != 1 || err != nil {
			t.Fatalf("Send %d bytes: %d, %v", want, n, err)
		}
		pkts := []transport.Packet{{Data: make([]byte, 9000)}}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		n, err := to.Recv(ctx, pkts)
		if n != 1 || err != nil || pkts[0].Addr != from.LocalAddr() || string(pkts[0].Data) != string(data) {
			t.Fatalf("Recv: %d, %v (%d bytes from %v)", n, err, len(pkts[0].Data), pkts[0].Addr)
		}
		after := to.Stats()
		if d := after.Sockets[iface].Transport.RXPackets - before.Sockets[iface].Transport.RXPackets; d != 1 ||
			after.KernelRX != before.KernelRX || missCount(t, toSteer) != miss {
			t.Errorf("%d bytes to %v: AF_XDP %s +%d, kernel socket +%d, xsk_miss +%d; want 1, 0, 0", want, to.LocalAddr(),
				after.Sockets[iface].Interface, d, after.KernelRX-before.KernelRX, missCount(t, toSteer)-miss)
		}
	}
	exactly(g, fg, fs, 0)       // dpu → far: out of ya's AF_XDP socket, into yb's
	exactly(fg, g, tr.steer, 1) // far → dpu: out of yb's, into ya's
	if st := g.Stats(); st.Sockets[1].Transport.TXPackets != 1 || st.KernelTX+st.KernelFallback != 0 {
		t.Errorf("the dpu Group sent through %+v, want ya's AF_XDP socket", st)
	}
	if n, err := g.Send([]transport.Packet{{Addr: fg.LocalAddr(), Data: make([]byte, want+1)}}); n != 0 || !errors.Is(err, transport.ErrTooBig) {
		t.Errorf("%d bytes: %d, %v; want ErrTooBig", want+1, n, err)
	}

	// One byte more, from a kernel socket in far: a 3521-byte frame, two
	// buffers at XDP, passed to the stack, received on the kernel socket.
	c := conn(t, tr.far, farIP)
	before, miss := g.Stats(), missCount(t, tr.steer)
	if _, err := c.WriteToUDPAddrPort(payload(8, want+1), g.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	if got := recvN(t, g, 1); got[addrOf(c)] != 1 {
		t.Fatalf("%d bytes: got %v", want+1, got)
	}
	if st := g.Stats(); st.KernelRX != before.KernelRX+1 || missCount(t, tr.steer) != miss+1 {
		t.Errorf("%d bytes: kernel socket +%d, xsk_miss +%d; want 1 and 1", want+1, st.KernelRX-before.KernelRX, missCount(t, tr.steer)-miss)
	}
}

// TestGroupMultiBuffer: at MTU 9000, Groups whose sockets are bound with
// XDP_USE_SG (GroupOptions.MultiBuffer) and registered as taking
// multi-buffer frames carry datagrams up to the MTU less 28 on the AF_XDP
// path both ways, in several UMEM frames and XDP buffers, with nothing on
// the kernel sockets and no xsk_miss; so do datagrams from a kernel socket.
func TestGroupMultiBuffer(t *testing.T) {
	if got := MaxPayloadForMTUMulti(9000); got != 8972 {
		t.Errorf("MaxPayloadForMTUMulti(9000) = %d, want 8972", got)
	}
	if got := MaxPayloadForMTUMulti(1500); got != 1472 {
		t.Errorf("MaxPayloadForMTUMulti(1500) = %d, want 1472", got)
	}
	tr := newTrio(t)
	for _, n := range []struct {
		ns   netns.NsHandle
		devs []string
	}{{tr.dpu, []string{"xa", "ya"}}, {tr.host, []string{"xb"}}, {tr.far, []string{"yb"}}} {
		testenv.InNetNS(t, n.ns, func() error {
			for _, d := range n.devs {
				l, err := netlink.LinkByName(d)
				if err != nil {
					return err
				}
				if err := netlink.LinkSetMTU(l, 9000); err != nil {
					return fmt.Errorf("%s: MTU 9000: %w", d, err)
				}
			}
			return nil
		})
	}
	const want = 9000 - Overhead // 8972
	g := tr.open(t, GroupOptions{MultiBuffer: true})
	if g.MaxPayload() != want {
		t.Fatalf("Group MaxPayload %d at MTU 9000, want %d", g.MaxPayload(), want)
	}
	for _, x := range g.Transports() {
		if !x.MultiBuffer() || x.MaxPayload() != want {
			t.Errorf("%s: multi-buffer %v, MaxPayload %d; want true, %d", x.ifname, x.MultiBuffer(), x.MaxPayload(), want)
		}
	}

	fs, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	var k bpf.RuleKey
	k.Flow.Proto, k.Flow.Dport = 17, testPort
	if err := fs.Apply(&bpf.Ruleset{
		Shapes:  []bpf.Shape{{Fields: bpf.FieldProto | bpf.FieldDport, MaxPrio: 10}},
		Entries: []bpf.Entry{{Key: k, Val: bpf.RuleVal{Prio: 10, Id: 1, Action: uint16(bpf.ActionXSK), Arg: 0}}},
	}); err != nil {
		t.Fatal(err)
	}
	var fg *Group
	testenv.InNetNS(t, tr.far, func() error {
		l, err := netlink.LinkByName("yb")
		if err != nil {
			return err
		}
		xl, err := fs.AttachXDP(l.Attrs().Index, link.XDPDriverMode)
		if err != nil {
			return err
		}
		t.Cleanup(func() { xl.Close() })
		gs, err := OpenGroups(GroupOptions{Interfaces: []string{"yb"}, Addr: netip.AddrPortFrom(netip.MustParseAddr(farIP), testPort),
			Socket: &xsk.SocketConfig{Mode: xsk.ModeCopy}, MultiBuffer: true}, 1, udp.Options{})
		if err != nil {
			return err
		}
		fg = gs[0]
		return nil
	})
	t.Cleanup(func() { fg.Close() })
	fx := fg.Transports()[0]
	if err := fs.SetXSKMultiBuffer(fx.Ifindex(), fx.Queue(), fx.FD()); err != nil {
		t.Fatal(err)
	}

	// exactly sends a batch of datagrams of the given sizes from one Group
	// to the other and checks that they arrived whole, in order, on the
	// receiver's AF_XDP socket on iface.
	exactly := func(from, to *Group, toSteer *bpf.Steer, iface int, sizes []int) {
		t.Helper()
		before, miss := to.Stats(), missCount(t, toSteer)
		var out []transport.Packet
		for i, n := range sizes {
			out = append(out, transport.Packet{Addr: to.LocalAddr(), Data: payload(i+1, n)})
		}
		if n, err := from.Send(out); n != len(out) || err != nil {
			t.Fatalf("Send %v: %d, %v", sizes, n, err)
		}
		for i := range out {
			pkts := []transport.Packet{{Data: make([]byte, 9000)}}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			n, err := to.Recv(ctx, pkts)
			cancel()
			if n != 1 || err != nil || pkts[0].Addr != from.LocalAddr() || string(pkts[0].Data) != string(out[i].Data) {
				t.Fatalf("datagram %d (%d bytes): Recv %d, %v (%d bytes from %v)", i, sizes[i], n, err, len(pkts[0].Data), pkts[0].Addr)
			}
		}
		after := to.Stats()
		if d := after.Sockets[iface].Transport.RXPackets - before.Sockets[iface].Transport.RXPackets; d != uint64(len(sizes)) ||
			after.KernelRX != before.KernelRX || missCount(t, toSteer) != miss {
			t.Errorf("%v bytes to %v: AF_XDP %s +%d, kernel socket +%d, xsk_miss +%d; want %d, 0, 0", sizes, to.LocalAddr(),
				after.Sockets[iface].Interface, d, after.KernelRX-before.KernelRX, missCount(t, toSteer)-miss, len(sizes))
		}
	}
	sizes := []int{1, 3478, 3479, 4000, 8000, want}
	exactly(g, fg, fs, 0, sizes)       // dpu → far: out of ya's AF_XDP socket, into yb's
	exactly(fg, g, tr.steer, 1, sizes) // far → dpu: out of yb's, into ya's
	if st := g.Stats(); st.Sockets[1].Transport.TXPackets != uint64(len(sizes)) || st.KernelTX+st.KernelFallback != 0 {
		t.Errorf("the dpu Group sent through %+v, want ya's AF_XDP socket", st)
	}
	// A chained datagram's payload is copied from its buffers straight
	// into the caller's, and cut to its capacity there.
	big := payload(7, 8000)
	if n, err := g.Send([]transport.Packet{{Addr: fg.LocalAddr(), Data: big}}); n != 1 || err != nil {
		t.Fatalf("Send 8000: %d, %v", n, err)
	}
	trunc := fg.Stats().Sockets[0].Transport.RXTrunc
	pkts := []transport.Packet{{Data: make([]byte, 5000)}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	n, err := fg.Recv(ctx, pkts)
	cancel()
	if n != 1 || err != nil || string(pkts[0].Data) != string(big[:5000]) || fg.Stats().Sockets[0].Transport.RXTrunc != trunc+1 {
		t.Errorf("8000 bytes into 5000: %d, %v, %d bytes, truncations +%d; want the first 5000, one truncation", n, err, len(pkts[0].Data),
			fg.Stats().Sockets[0].Transport.RXTrunc-trunc)
	}
	if n, err := g.Send([]transport.Packet{{Addr: fg.LocalAddr(), Data: make([]byte, want+1)}}); n != 0 || !errors.Is(err, transport.ErrTooBig) {
		t.Errorf("%d bytes: %d, %v; want ErrTooBig", want+1, n, err)
	}

	// From a kernel socket in far: a jumbo frame in three XDP buffers,
	// handed to the multi-buffer socket, not passed to the stack.
	c := conn(t, tr.far, farIP)
	before, miss := g.Stats(), missCount(t, tr.steer)
	if _, err := c.WriteToUDPAddrPort(payload(9, want), g.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	if got := recvN(t, g, 1); got[addrOf(c)] != 1 {
		t.Fatalf("%d bytes: got %v", want, got)
	}
	if st := g.Stats(); st.KernelRX != before.KernelRX || missCount(t, tr.steer) != miss ||
		st.Sockets[1].Transport.RXPackets != before.Sockets[1].Transport.RXPackets+1 {
		t.Errorf("%d bytes from a kernel socket: kernel socket +%d, xsk_miss +%d, AF_XDP +%d; want 0, 0, 1", want,
			st.KernelRX-before.KernelRX, missCount(t, tr.steer)-miss, st.Sockets[1].Transport.RXPackets-before.Sockets[1].Transport.RXPackets)
	}
}

// TestMultiBufferBatchSize: a MultiBuffer socket whose SocketConfig.BatchSize
// is smaller than the frames of one jumbo datagram (three 3840-byte frames
// for 8000 bytes at MTU 9000 in copy mode) still delivers it whole: a
// receive takes up to BatchSize datagrams, each with all of its frames.
func TestMultiBufferBatchSize(t *testing.T) {
	tr := newTrio(t)
	for _, n := range []struct {
		ns   netns.NsHandle
		devs []string
	}{{tr.dpu, []string{"xa", "ya"}}, {tr.far, []string{"yb"}}} {
		testenv.InNetNS(t, n.ns, func() error {
			for _, d := range n.devs {
				l, err := netlink.LinkByName(d)
				if err != nil {
					return err
				}
				if err := netlink.LinkSetMTU(l, 9000); err != nil {
					return fmt.Errorf("%s: MTU 9000: %w", d, err)
				}
			}
			return nil
		})
	}
	c := conn(t, tr.far, farIP)
	sizes := []int{8000, 100, 9000 - Overhead, 4000, 1}
	for _, bs := range []int{1, 2, 3, 64} {
		t.Run(fmt.Sprintf("batch %d", bs), func(t *testing.T) {
			g := tr.open(t, GroupOptions{MultiBuffer: true, Socket: &xsk.SocketConfig{Mode: xsk.ModeCopy, BatchSize: bs}})
			defer g.Close()
			before := g.Stats()
			for i, n := range sizes {
				if _, err := c.WriteToUDPAddrPort(payload(i+1, n), g.LocalAddr()); err != nil {
					t.Fatal(err)
				}
			}
			for i, n := range sizes {
				pkts := []transport.Packet{{Data: make([]byte, 9000)}}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				k, err := g.Recv(ctx, pkts)
				cancel()
				if k != 1 || err != nil || string(pkts[0].Data) != string(payload(i+1, n)) {
					t.Fatalf("datagram %d (%d bytes): Recv %d, %v, %d bytes (stats %+v)", i, n, k, err, len(pkts[0].Data), g.Stats().Sockets[1].Transport)
				}
			}
			after := g.Stats()
			if d := after.Sockets[1].Transport.RXPackets - before.Sockets[1].Transport.RXPackets; d != uint64(len(sizes)) ||
				after.Sockets[1].Transport.RXMalformed != before.Sockets[1].Transport.RXMalformed {
				t.Errorf("AF_XDP on ya +%d datagrams, +%d malformed; want %d, 0", d,
					after.Sockets[1].Transport.RXMalformed-before.Sockets[1].Transport.RXMalformed, len(sizes))
			}
		})
	}
}

// TestGroupSendClosing: a Group whose AF_XDP socket on one interface is
// closed under a Send (Close racing it; here that socket alone is closed)
// returns, like any failing socket, the index of the first datagram that
// path did not send, wrapping transport.ErrClosed, and sends what comes
// before it on the other paths: pkts[:n] went out.
func TestGroupSendClosing(t *testing.T) {
	tr := newTrio(t)
	for _, tc := range []struct {
		name   string
		closed int    // the interface whose socket is closed: 0 xa (host), 1 ya (far)
		to     string // the datagrams' destinations: h host, f far
		n      int
		host   []int // the datagrams host and far receive
		far    []int
	}{
		// The host's datagrams go first (xa's bucket), then far's fail.
		{"far closed", 1, "hfh", 1, []int{0, 2}, nil},
		// The host's fail first; far's datagram before it still goes.
		{"host closed", 0, "fhf", 1, nil, []int{0}},
		{"first closed", 0, "hff", 0, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := tr.open(t, GroupOptions{})
			defer g.Close()
			h, f := conn(t, tr.host, hostIP), conn(t, tr.far, farIP)
			if err := g.Transports()[tc.closed].Close(); err != nil {
				t.Fatal(err)
			}
			var pkts []transport.Packet
			for i, d := range tc.to {
				c := map[rune]*net.UDPConn{'h': h, 'f': f}[d]
				pkts = append(pkts, transport.Packet{Addr: addrOf(c), Data: payload(i, 100)})
			}
			n, err := g.Send(pkts)
			if n != tc.n || !errors.Is(err, transport.ErrClosed) {
				t.Errorf("Send = %d, %v; want %d, ErrClosed", n, err, tc.n)
			}
			for _, r := range []struct {
				c    *net.UDPConn
				want []int
			}{{h, tc.host}, {f, tc.far}} {
				got := recvAll(t, r.c, len(r.want))
				for _, i := range r.want {
					if _, ok := got[string(pkts[i].Data)]; !ok {
						t.Errorf("%v: datagram %d did not arrive", addrOf(r.c), i)
					}
				}
				_ = r.c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
				if k, _, err := r.c.ReadFromUDPAddrPort(make([]byte, 2048)); err == nil {
					t.Errorf("%v: a datagram beyond the %d expected (%d bytes)", addrOf(r.c), len(r.want), k)
				}
			}
		})
	}
}

// TestGroupSendKeepsNoBuffers checks that the scratch a Send puts back in
// the pool holds none of the caller's datagrams once it returns, when a
// path before the last one took the longest batch. It looks at the pooled
// scratch itself: what a Send leaves there is only kept alive, never sent
// or read again, so no datagram shows it. A pool that dropped the scratch
// (as the race detector's does at random) passes.
func TestGroupSendKeepsNoBuffers(t *testing.T) {
	tr := newTrio(t)
	g := tr.open(t, GroupOptions{})
	h, f := conn(t, tr.host, hostIP), conn(t, tr.far, farIP)
	var batch []transport.Packet
	for i := range 12 {
		c := h // 10 on xa, the first path, and 2 on ya
		if i >= 10 {
			c = f
		}
		batch = append(batch, transport.Packet{Addr: addrOf(c), Data: payload(i, 100)})
	}
	if n, err := g.Send(batch); n != len(batch) || err != nil {
		t.Fatalf("Send: %d, %v", n, err)
	}
	recvAll(t, h, 10)
	recvAll(t, f, 2)
	s := g.txPool.Get().(*groupScratch)
	defer g.txPool.Put(s)
	for i, p := range s.batch[:cap(s.batch)] {
		if p.Data != nil || p.Addr.IsValid() {
			t.Fatalf("pooled scratch keeps entry %d of a sent batch (to %v, %d bytes); cap %d", i, p.Addr, len(p.Data), cap(s.batch))
		}
	}
}
