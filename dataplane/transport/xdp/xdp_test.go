package xdp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
	"github.com/lovelock-dpu/lovelock/dataplane/xsk"
)

// fakeTransport is a Transport without a socket, for the frame code.
func fakeTransport(local netip.AddrPort, peer netip.Addr, peerMAC [6]byte) *Transport {
	t := &Transport{
		local: local, localMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, mtu: 1500,
		maxPayload: 1500 - Overhead, ttl: time.Hour, neigh: make(map[netip.Addr]neighEntry),
	}
	t.neigh[peer] = neighEntry{mac: peerMAC, expires: time.Now().Add(time.Hour)}
	return t
}

func TestBuildParse(t *testing.T) {
	a := netip.MustParseAddrPort("10.1.0.1:61440")
	b := netip.MustParseAddrPort("10.1.0.2:5000")
	tx := fakeTransport(a, b.Addr(), [6]byte{2, 0, 0, 0, 0, 2})
	rx := fakeTransport(b, a.Addr(), [6]byte{2, 0, 0, 0, 0, 1})
	for _, sum := range []bool{true, false} {
		tx.noUDPSum = !sum
		for _, size := range []int{0, 1, 17, 1472} {
			data := bytes.Repeat([]byte{byte(size)}, size)
			f, err := tx.build(make([]byte, 1514), &transport.Packet{Addr: b, Data: data})
			if err != nil {
				t.Fatal(err)
			}
			if len(f) != 42+size {
				t.Fatalf("frame of %d bytes for %d payload", len(f), size)
			}
			if sum {
				// Verify the UDP checksum over the pseudo-header.
				ps := []byte{10, 1, 0, 1, 10, 1, 0, 2, 0, 17, byte((8 + size) >> 8), byte(8 + size)}
				if c := checksum(f[34:], uint32(checksum(ps, 0))); c != 0xffff {
					t.Errorf("size %d: UDP checksum does not verify (%#x)", size, c)
				}
			} else if f[40] != 0 || f[41] != 0 {
				t.Errorf("NoUDPChecksum: checksum %x", f[40:42])
			}
			p := transport.Packet{Data: make([]byte, 2000)}
			if !rx.parse(f, &p) {
				t.Fatalf("size %d: own frame dropped: %+v", size, rx.Stats())
			}
			if p.Addr != a || !bytes.Equal(p.Data, data) {
				t.Fatalf("size %d: got %v %d bytes", size, p.Addr, len(p.Data))
			}
			// Every truncation is dropped, never delivered, never panics.
			for n := range len(f) {
				q := transport.Packet{Data: make([]byte, 2000)}
				if rx.parse(f[:n], &q) {
					t.Fatalf("size %d: frame cut to %d bytes delivered", size, n)
				}
			}
			// A multi-buffer frame's headers are parsed in its first
			// buffer: any first buffer gives the whole frame's verdict,
			// or asks for the buffers joined when the headers run past it.
			off, end, src, r := rx.parseHeaders(f, len(f))
			if r != hdrOK || src != a || !bytes.Equal(f[off:end], data) {
				t.Fatalf("size %d: parseHeaders %d..%d from %v: %v", size, off, end, src, r)
			}
			for n := 1; n < len(f); n++ {
				o, e, s, r := rx.parseHeaders(f[:n], len(f))
				if r != hdrShort && (r != hdrOK || o != off || e != end || s != src) {
					t.Fatalf("size %d: headers in a first buffer of %d bytes: %d..%d from %v: %v", size, n, o, e, s, r)
				}
				if r == hdrShort && n >= off {
					t.Fatalf("size %d: a first buffer of %d bytes holds the %d bytes of headers, yet short", size, n, off)
				}
			}
			// Ethernet padding after the datagram is ignored.
			if !rx.parse(append(bytes.Clone(f), 0, 0, 0, 0), &p) || !bytes.Equal(p.Data, data) {
				t.Errorf("size %d: padded frame not delivered intact", size)
			}
		}
	}
	// Short buffer: cut to capacity.
	f, _ := tx.build(make([]byte, 1514), &transport.Packet{Addr: b, Data: []byte("hello world")})
	p := transport.Packet{Data: make([]byte, 5)}
	if !rx.parse(f, &p) || string(p.Data) != "hello" || rx.Stats().RXTrunc != 1 {
		t.Errorf("short buffer: %q, %+v", p.Data, rx.Stats())
	}

	// Drops, by kind.
	before := rx.Stats()
	mod := func(fn func(f []byte)) []byte { g := bytes.Clone(f); fn(g); return g }
	bad := map[string][]byte{
		"arp":         mod(func(f []byte) { f[12], f[13] = 0x08, 0x06 }),
		"tcp":         mod(func(f []byte) { f[23] = 6; fixIP(f) }),
		"fragment":    mod(func(f []byte) { f[20] = 0x20; fixIP(f) }),
		"other dst":   mod(func(f []byte) { f[33] = 9; fixIP(f) }),
		"other port":  mod(func(f []byte) { f[37]++ }),
		"ip checksum": mod(func(f []byte) { f[24]++ }),
		"udp len":     mod(func(f []byte) { f[39] = 200 }),
		"ip len":      mod(func(f []byte) { f[17] = 255; fixIP(f) }),
		"version":     mod(func(f []byte) { f[14] = 0x65; fixIP(f) }),
		"ihl":         mod(func(f []byte) { f[14] = 0x44; fixIP(f) }),
	}
	for name, g := range bad {
		if rx.parse(g, &p) {
			t.Errorf("%s: delivered", name)
		}
	}
	after := rx.Stats()
	if d := after.RXNotUDP - before.RXNotUDP; d != 3 {
		t.Errorf("RXNotUDP +%d, want 3", d)
	}
	if d := after.RXWrongDest - before.RXWrongDest; d != 2 {
		t.Errorf("RXWrongDest +%d, want 2", d)
	}
	if d := after.RXMalformed - before.RXMalformed; d != 5 {
		t.Errorf("RXMalformed +%d, want 5", d)
	}

	// Send-side refusals.
	if _, err := tx.build(make([]byte, 1514), &transport.Packet{Addr: b, Data: make([]byte, 1473)}); !errors.Is(err, transport.ErrTooBig) {
		t.Errorf("1473 bytes: %v", err)
	}
	for _, d := range []string{"[::1]:5", "10.1.0.2:0", "0.0.0.0:5", "224.0.0.1:5"} {
		if _, err := tx.build(make([]byte, 1514), &transport.Packet{Addr: netip.MustParseAddrPort(d), Data: []byte("x")}); !errors.Is(err, transport.ErrAddr) {
			t.Errorf("%s: %v", d, err)
		}
	}
}

// fixIP recomputes the IPv4 header checksum of an Ethernet frame.
// TestParseAgreesWithSteering holds the receiver's own parser to the
// steering parser's verdicts (wire.ParseFrame, which the C parser agrees
// with) on frames carrying a valid Lovelock packet to the receiver's port:
// the receiver delivers exactly those the data plane calls valid. The cases
// are issue 10's: an outer 802.1ad tag (which the receiver walked and the
// steering parser does not), a UDP length past the IP datagram, an IPv4
// total length below the header length, and Ethernet padding.
func TestParseAgreesWithSteering(t *testing.T) {
	a := netip.MustParseAddrPort("10.1.0.1:40000")
	b := netip.AddrPortFrom(netip.MustParseAddr("10.1.0.2"), wire.DefaultPort)
	tx := fakeTransport(a, b.Addr(), [6]byte{2, 0, 0, 0, 0, 2})
	rx := fakeTransport(b, a.Addr(), [6]byte{2, 0, 0, 0, 0, 1})
	h := wire.Header{Version: wire.Version, Type: wire.TypePing}
	f, err := tx.build(make([]byte, 1514), &transport.Packet{Addr: b, Data: h.AppendTo(nil, make([]byte, 16))})
	if err != nil {
		t.Fatal(err)
	}
	f = bytes.Clone(f)
	tag := func(tpid uint16, g []byte) []byte {
		return slices.Concat(g[:12], []byte{byte(tpid >> 8), byte(tpid), 0, 100}, g[12:])
	}
	mod := func(fn func(g []byte)) []byte { g := bytes.Clone(f); fn(g); fixIP(g); return g }
	pad := append(bytes.Clone(f), make([]byte, 20)...)
	for name, g := range map[string][]byte{
		"plain":                   f,
		"802.1q":                  tag(0x8100, f),
		"802.1ad":                 tag(0x88a8, f),
		"802.1ad-802.1q":          tag(0x88a8, tag(0x8100, f)),
		"udp-past-ip-datagram":    mod(func(g []byte) { binary.BigEndian.PutUint16(g[16:], 28) }),
		"ipv4-total-below-header": mod(func(g []byte) { binary.BigEndian.PutUint16(g[16:], 19) }),
		"ipv4-total-past-frame":   mod(func(g []byte) { binary.BigEndian.PutUint16(g[16:], uint16(len(g)-13)) }),
		"padding-after-datagram":  pad,
		"udp-len-into-the-padding": func() []byte {
			g := bytes.Clone(pad)
			binary.BigEndian.PutUint16(g[38:], uint16(len(f)-34+1))
			return g
		}(),
	} {
		_, perr := wire.ParseFrame(g, wire.DefaultPort)
		steered := perr == nil
		p := transport.Packet{Data: make([]byte, 2000)}
		if got := rx.parse(g, &p); got != steered {
			t.Errorf("%s: receiver delivers: %v; steering parser: %v", name, got, wire.StatusOf(perr))
		}
	}
}

func fixIP(f []byte) {
	ip := f[14:34]
	ip[10], ip[11] = 0, 0
	c := ^checksum(ip, 0)
	ip[10], ip[11] = byte(c>>8), byte(c)
}

// pair is two network namespaces joined by a veth: dpu (the xdp
// transport's side, with the steering program in native mode) and host.
type pair struct {
	dpu, host     netns.NsHandle
	dpuIf, hostIf int
	steer         *bpf.Steer
}

const (
	testPort = 7000 // not the Lovelock port: the steering program treats payloads as opaque
	dpuIP    = "10.77.0.1"
	hostIP   = "10.77.0.2"
)

func newPair(t *testing.T) *pair {
	t.Helper()
	testenv.RequirePriv(t)
	p := &pair{dpu: testenv.NewNetNS(t), host: testenv.NewNetNS(t)}
	p.dpuIf, p.hostIf = testenv.VethPair(t,
		testenv.VethEnd{NS: p.dpu, Name: "xa", Addr: dpuIP + "/24"},
		testenv.VethEnd{NS: p.host, Name: "xb", Addr: hostIP + "/24"})
	s, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	p.steer = s
	var k bpf.RuleKey
	k.Flow.Proto, k.Flow.Dport = 17, testPort
	rs := &bpf.Ruleset{
		Shapes:  []bpf.Shape{{Fields: bpf.FieldProto | bpf.FieldDport, MaxPrio: 10}},
		Entries: []bpf.Entry{{Key: k, Val: bpf.RuleVal{Prio: 10, Id: 1, Action: uint16(bpf.ActionXSK), Arg: 0}}},
	}
	if err := s.Apply(rs); err != nil {
		t.Fatal(err)
	}
	testenv.InNetNS(t, p.dpu, func() error {
		l, err := s.AttachXDP(p.dpuIf, link.XDPDriverMode)
		if err != nil {
			return err
		}
		t.Cleanup(func() { l.Close() })
		return nil
	})
	return p
}

// setup turns IPv6 off on name, gives it addr/24 and brings it up.
// open opens an xdp transport in the dpu namespace and registers it.
func (p *pair) open(t *testing.T, opts Options) *Transport {
	t.Helper()
	opts.Interface, opts.Queue = "xa", 0
	opts.Addr = netip.AddrPortFrom(netip.MustParseAddr(dpuIP), testPort)
	if opts.Socket == nil {
		opts.Socket = &xsk.SocketConfig{Mode: xsk.ModeCopy}
	}
	var tr *Transport
	testenv.InNetNS(t, p.dpu, func() error {
		var err error
		tr, err = Open(opts)
		return err
	})
	t.Cleanup(func() { tr.Close() })
	if err := p.steer.SetXSK(tr.Ifindex(), tr.Queue(), tr.FD()); err != nil {
		t.Fatal(err)
	}
	return tr
}

// hostConn opens a kernel UDP socket in the host namespace.
func (p *pair) hostConn(t *testing.T) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	testenv.InNetNS(t, p.host, func() error {
		var err error
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(hostIP+":0")))
		return err
	})
	t.Cleanup(func() { c.Close() })
	return c
}

func payload(i, size int) []byte {
	b := make([]byte, size)
	for j := range b {
		b[j] = byte(i*7 + j)
	}
	if size >= 2 {
		b[0], b[1] = byte(i>>8), byte(i)
	}
	return b
}

func TestVethReceive(t *testing.T) {
	p := newPair(t)
	tr := p.open(t, Options{})
	if tr.MaxPayload() != 1472 {
		t.Errorf("MaxPayload %d, want 1472", tr.MaxPayload())
	}
	t.Logf("mode %v", tr.Mode())
	c := p.hostConn(t)
	src := c.LocalAddr().(*net.UDPAddr).AddrPort()
	sizes := []int{1, 2, 100, 1000, 1472}
	const count = 200
	want := make(map[string]bool)
	for i := range count {
		b := payload(i, sizes[i%len(sizes)])
		want[string(b)] = true
		if _, err := c.WriteToUDPAddrPort(b, tr.LocalAddr()); err != nil {
			t.Fatal(err)
		}
		if i%50 == 49 {
			time.Sleep(5 * time.Millisecond) // stay within the rings on 2 cores
		}
	}
	pkts := make([]transport.Packet, 16)
	for i := range pkts {
		pkts[i].Data = make([]byte, tr.MaxPayload())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got := 0
	for got < count {
		for i := range pkts {
			pkts[i].Data = pkts[i].Data[:cap(pkts[i].Data)]
		}
		n, err := tr.Recv(ctx, pkts)
		if err != nil {
			t.Fatalf("after %d datagrams: %v (stats %+v)", got, err, tr.Stats())
		}
		for _, pk := range pkts[:n] {
			if pk.Addr != src {
				t.Fatalf("source %v, want %v", pk.Addr, src)
			}
			if !want[string(pk.Data)] {
				t.Fatalf("unexpected or duplicate datagram of %d bytes", len(pk.Data))
			}
			delete(want, string(pk.Data))
		}
		got += n
	}
	if st := tr.Stats(); st.RXPackets != count {
		t.Errorf("stats %+v", st)
	}
	// Nothing left: a done context makes Recv a poll.
	done, cancelDone := context.WithCancel(context.Background())
	cancelDone()
	if n, err := tr.Recv(done, pkts); n != 0 || !errors.Is(err, context.Canceled) {
		t.Errorf("empty poll: %d, %v", n, err)
	}
	// A waiting datagram is returned even with a done context.
	if _, err := c.WriteToUDPAddrPort([]byte("late"), tr.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		n, err := tr.Recv(done, pkts)
		if n == 1 && string(pkts[0].Data) == "late" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("late datagram not returned under a done context: %d %v", n, err)
		}
		time.Sleep(time.Millisecond)
	}
	// Deadline, then Close wakes a blocked Recv.
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	if _, err := tr.Recv(short, pkts); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("deadline: %v", err)
	}
	closeWakesRecv(t, tr, pkts)
	if err := tr.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := tr.Send([]transport.Packet{{Addr: src, Data: []byte("x")}}); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Send after Close: %v", err)
	}
	if c, err := p.steer.RuleCounter(1); err != nil || c.Packets < count+1 {
		t.Errorf("xsk rule counter %+v, %v", c, err)
	}
}

// recvAll reads n datagrams at c and returns them by content, with their
// source addresses.
func recvAll(t *testing.T, c *net.UDPConn, n int) map[string]netip.AddrPort {
	t.Helper()
	got := make(map[string]netip.AddrPort)
	buf := make([]byte, 2048)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for len(got) < n {
		k, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("after %d of %d datagrams: %v", len(got), n, err)
		}
		got[string(buf[:k])] = from
	}
	return got
}

func TestVethSend(t *testing.T) {
	p := newPair(t)
	tr := p.open(t, Options{})
	c := p.hostConn(t)
	dst := c.LocalAddr().(*net.UDPAddr).AddrPort()

	// The neighbour table is empty: the first datagram takes the kernel
	// fallback socket, which also resolves the neighbour.
	if n, err := tr.Send([]transport.Packet{{Addr: dst, Data: []byte("first")}}); n != 1 || err != nil {
		t.Fatalf("first Send: %d, %v", n, err)
	}
	if st := tr.Stats(); st.TXFallback != 1 || st.TXPackets != 0 {
		t.Errorf("first datagram: stats %+v, want one fallback", st)
	}
	if got := recvAll(t, c, 1); got["first"] != tr.LocalAddr() {
		t.Fatalf("first datagram: %v", got)
	}
	// Wait for the kernel to resolve the neighbour.
	deadline := time.Now().Add(3 * time.Second)
	for {
		tr.neighMu.Lock()
		_, err := tr.lookup(dst.Addr())
		tr.neighMu.Unlock()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("neighbour never resolved: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}

	const count = 300
	sizes := []int{0, 1, 64, 999, 1472}
	pkts := make([]transport.Packet, count)
	for i := range pkts {
		pkts[i] = transport.Packet{Addr: dst, Data: payload(i, sizes[i%len(sizes)])}
	}
	sent := 0
	for sent < count {
		// Batches of 100, received in between: the host socket's buffer
		// must not overflow.
		n, err := tr.Send(pkts[sent : sent+100])
		if err != nil || n != 100 {
			t.Fatalf("Send: %d, %v", n, err)
		}
		got := recvAll(t, c, len(dedup(pkts[sent:sent+100])))
		for _, pk := range pkts[sent : sent+100] {
			if from, ok := got[string(pk.Data)]; !ok || from != tr.LocalAddr() {
				t.Fatalf("datagram of %d bytes: from %v, present %v", len(pk.Data), from, ok)
			}
		}
		sent += n
	}
	st := tr.Stats()
	if st.TXPackets != count || st.TXFallback != 1 {
		t.Errorf("stats %+v", st)
	}
	if _, err := tr.Send([]transport.Packet{{Addr: dst, Data: make([]byte, 1473)}}); !errors.Is(err, transport.ErrTooBig) {
		t.Errorf("1473 bytes: %v", err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}

	// Without fallback an unresolved next hop is refused; resolved ones go.
	tr2 := p.open(t, Options{NoFallback: true})
	nowhere := netip.MustParseAddrPort("10.77.0.99:5")
	n, err := tr2.Send([]transport.Packet{{Addr: dst, Data: []byte("a")}, {Addr: nowhere, Data: []byte("b")}, {Addr: dst, Data: []byte("c")}})
	if n != 1 || !errors.Is(err, ErrNoNeighbour) || !errors.Is(err, transport.ErrAddr) {
		t.Errorf("NoFallback: %d, %v", n, err)
	}
	if got := recvAll(t, c, 1); got["a"] != tr2.LocalAddr() {
		t.Errorf("NoFallback: got %v", got)
	}
	if st := tr2.Stats(); st.TXNoNeighbour != 1 || st.TXPackets != 1 {
		t.Errorf("NoFallback stats %+v", st)
	}
}

// dedup returns the distinct payloads of pkts.
func dedup(pkts []transport.Packet) map[string]bool {
	m := make(map[string]bool)
	for _, p := range pkts {
		m[string(p.Data)] = true
	}
	return m
}

// TestMessaging runs a node whose agent worker receives and sends on the
// xdp transport (DPU namespace) and whose two clients use kernel UDP
// sockets (host namespace), and checks exact delivery of every message.
func TestMessaging(t *testing.T) {
	p := newPair(t)
	tr := p.open(t, Options{})
	var sockA, sockB *udp.Conn
	testenv.InNetNS(t, p.host, func() error {
		var err error
		opts := udp.Options{MaxPayload: tr.MaxPayload()}
		if sockA, err = udp.Listen(netip.MustParseAddrPort(hostIP+":0"), opts); err != nil {
			return err
		}
		sockB, err = udp.Listen(netip.MustParseAddrPort(hostIP+":0"), opts)
		return err
	})
	cfg := messaging.Defaults()
	cfg.Mode = messaging.ModeDPU
	cfg.Workers = 1
	cfg.Nodes = []messaging.Node{{
		Name:  "node0",
		Agent: tr.LocalAddr(),
		Clients: []messaging.ClientSpec{
			{Name: "a", Addr: sockA.LocalAddr(), Ranks: messaging.Range(0, 1)},
			{Name: "b", Addr: sockB.LocalAddr(), Ranks: messaging.Range(2, 3)},
		},
	}}
	agent, err := messaging.NewAgent(cfg, "node0", messaging.AgentOptions{Transports: []transport.Transport{tr}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	agentDone := make(chan error, 1)
	go func() { agentDone <- agent.Run(ctx) }()
	var senders sync.WaitGroup
	defer func() {
		cancel()
		senders.Wait()
		<-agentDone
	}()
	a, err := messaging.NewClient(cfg, "node0", "a", messaging.ClientOptions{Transport: sockA})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := messaging.NewClient(cfg, "node0", "b", messaging.ClientOptions{Transport: sockB})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	const count = 2000
	want := make(map[string]int)
	senders.Go(func() {
		for i := range count {
			m := payload(i, 8+i%900)
			if err := a.SendContext(ctx, uint32(2+i%2), m); err != nil {
				t.Errorf("send %d: %v", i, err)
				return
			}
		}
		if err := a.Flush(ctx); err != nil {
			t.Errorf("flush: %v", err)
		}
	})
	for i := range count {
		want[fmt.Sprintf("%d/%x", 2+i%2, payload(i, 8+i%900))]++
	}
	for i := range count {
		m, err := b.Recv(ctx)
		if err != nil {
			t.Fatalf("after %d messages: %v (transport %+v)", i, err, tr.Stats())
		}
		k := fmt.Sprintf("%d/%x", m.Rank, m.Payload)
		if want[k] == 0 {
			t.Fatalf("unexpected or duplicate message to rank %d, %d bytes", m.Rank, len(m.Payload))
		}
		want[k]--
	}
	st := tr.Stats()
	t.Logf("xdp transport: %+v", st)
	if st.RXPackets == 0 || st.TXPackets == 0 {
		t.Errorf("the agent did not use the AF_XDP path: %+v", st)
	}
}

// closeWakesRecv checks that Close makes a Recv blocked on tr return
// transport.ErrClosed.
func closeWakesRecv(t *testing.T, tr transport.Transport, pkts []transport.Packet) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		_, err := tr.Recv(context.Background(), pkts)
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, transport.ErrClosed) {
			t.Errorf("Recv after Close: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not wake Recv")
	}
}

// checksumRef is the Internet checksum a 16-bit word at a time (RFC 1071).
func checksumRef(b []byte, sum uint32) uint16 {
	for len(b) >= 2 {
		sum += uint32(b[0])<<8 | uint32(b[1])
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

// TestChecksum: the 32-byte-step checksum equals the 16-bit one for every
// length up to 300 and jumbo ones, any start sum, any bytes (zeros and
// 0xff included).
func TestChecksum(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, fill := range []string{"random", "zero", "ones"} {
		for n := 0; n < 9000; n++ {
			if n > 300 && n%97 != 0 && n != 8972 && n != 8999 {
				continue
			}
			b := make([]byte, n)
			for i := range b {
				switch fill {
				case "random":
					b[i] = byte(rng.Uint32())
				case "ones":
					b[i] = 0xff
				}
			}
			for _, sum := range []uint32{0, 1, 0xffff, 0x1fffe, rng.Uint32() >> 4} {
				if got, want := checksum(b, sum), checksumRef(b, sum); got != want {
					t.Fatalf("%s, %d bytes, sum %#x: %#x, want %#x", fill, n, sum, got, want)
				}
			}
		}
	}
}

// TestRecvInvalidFlood floods the socket with frames that the steering
// program hands it and Recv drops (UDP to the transport's port, but to
// another address or with a bad IPv4 header checksum), written into the
// host end of the veth through an AF_PACKET socket, and checks that a Recv
// whose context is done returns while the flood goes on, after one batch:
// a receiver that only ever finds invalid frames still sees its context
// end.
func TestRecvInvalidFlood(t *testing.T) {
	p := newPair(t)
	tr := p.open(t, Options{})
	wrongDest := testenv.UDPFrame(testPort) // to 10.0.0.2
	fixIP(wrongDest)
	badSum := testenv.UDPFrame(testPort)
	copy(badSum[14+16:], netip.MustParseAddr(dpuIP).AsSlice())
	fixIP(badSum)
	badSum[14+10] ^= 0xff
	for _, tc := range []struct {
		name  string
		frame []byte
	}{
		{"wrong destination", wrongDest},
		{"bad header checksum", badSum},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fd int
			testenv.InNetNS(t, p.host, func() error {
				var err error
				fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0) // sends only
				return err
			})
			defer unix.Close(fd)
			_ = unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var once sync.Once
			end := func() { once.Do(func() { close(stop); wg.Wait() }) }
			defer end()
			for range 3 { // more than Recv drops, on 2 cores
				wg.Go(func() {
					to := &unix.SockaddrLinklayer{Ifindex: p.hostIf, Halen: 6} // Sendto writes into it
					for {
						select {
						case <-stop:
							return
						default:
						}
						for range 64 {
							_ = unix.Sendto(fd, tc.frame, 0, to) // ENOBUFS and the like: the flood goes on
						}
					}
				})
			}
			// The flood reaches the socket (the steering program's
			// xsk rule counts it).
			rule := func() uint64 {
				c, err := p.steer.RuleCounter(1)
				if err != nil {
					t.Fatal(err)
				}
				return c.Packets
			}
			for start, at := rule(), time.Now(); rule() < start+1000; time.Sleep(time.Millisecond) {
				if time.Since(at) > 5*time.Second {
					t.Fatalf("the flood does not reach the socket: %d frames in 5 s", rule()-start)
				}
			}
			pkts := make([]transport.Packet, 64)
			for i := range pkts {
				pkts[i].Data = make([]byte, tr.MaxPayload())
			}
			dropped := func() uint64 { s := tr.Stats(); return s.RXNotUDP + s.RXWrongDest + s.RXMalformed }
			before := dropped()
			done, cancelDone := context.WithCancel(context.Background())
			cancelDone()
			type result struct {
				n   int
				err error
			}
			res := make(chan result, 1)
			go func() {
				n, err := tr.Recv(done, pkts[:1])
				res <- result{n, err}
			}()
			select {
			case r := <-res:
				if r.n != 0 || !errors.Is(r.err, context.Canceled) {
					t.Errorf("Recv = %d, %v; want 0, %v", r.n, r.err, context.Canceled)
				}
				// The ring is full of flood frames: the Recv takes one
				// batch (one frame), drops it and sees its context done.
				if d := dropped() - before; d != 1 {
					t.Errorf("Recv under a done context dropped %d frames, want 1 (one batch): stats %+v", d, tr.Stats())
				}
			case <-time.After(5 * time.Second):
				end()
				<-res
				t.Fatalf("Recv under a done context did not return within 5 s of flood (stats %+v)", tr.Stats())
			}
		})
	}
}
