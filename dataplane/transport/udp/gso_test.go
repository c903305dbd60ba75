package udp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
)

// run describes the packets of a test batch: n datagrams of size bytes to
// destination dst (an index into the test's receivers).
type run struct{ dst, n, size int }

// makePkts builds the datagrams of runs, each one's bytes unique: its index
// in the batch, then a pattern of it.
func makePkts(dsts []netip.AddrPort, runs []run) []transport.Packet {
	var pkts []transport.Packet
	for _, r := range runs {
		for range r.n {
			d := make([]byte, r.size)
			for j := range d {
				d[j] = byte(len(pkts)*7 + j)
			}
			if r.size >= 4 {
				binary.BigEndian.PutUint32(d, uint32(len(pkts)))
			}
			pkts = append(pkts, transport.Packet{Addr: dsts[r.dst], Data: d})
		}
	}
	return pkts
}

// gsoSize reads the UDP_SEGMENT size of message i, or 0 without one.
func (s *scratch) gsoSize(i int) int {
	h := &s.hdrs[i].Hdr
	if h.Controllen == 0 {
		return 0
	}
	ch := (*unix.Cmsghdr)(unsafe.Pointer(h.Control))
	if ch.Level != unix.SOL_UDP || ch.Type != unix.UDP_SEGMENT || ch.Len != uint64(unix.CmsgLen(2)) {
		return -1
	}
	return int(*(*uint16)(unsafe.Add(unsafe.Pointer(h.Control), unix.CmsgLen(0))))
}

// TestGSOFill checks how fill groups one system call's datagrams into
// messages: which runs coalesce, with which gso_size, and where they split.
func TestGSOFill(t *testing.T) {
	if cmsgSpace > int(unsafe.Sizeof(scratch{}.cmsgs[0])) {
		t.Fatalf("a UDP_SEGMENT control message needs %d bytes, scratch has %d", cmsgSpace, unsafe.Sizeof(scratch{}.cmsgs[0]))
	}
	c := listenT(t, Options{GSO: true})
	dsts := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1000"), netip.MustParseAddrPort("127.0.0.1:1001")}
	type msg struct{ segs, gso int } // gso 0: a plain message
	for _, tc := range []struct {
		name string
		runs []run
		off  bool // GSO off
		want []msg
	}{
		{"lone datagram stays plain", []run{{0, 1, 100}}, false, []msg{{1, 0}}},
		{"a chunk's eight", []run{{0, 7, 8776}, {0, 1, 4680}}, false, []msg{{7, 8776}, {1, 0}}}, // 66112 bytes
		{"a short last fits", []run{{0, 7, 8776}, {0, 1, 4075}}, false, []msg{{8, 8776}}},
		{"short last ends the run", []run{{0, 3, 100}, {0, 1, 50}, {0, 2, 100}}, false, []msg{{4, 100}, {2, 100}}},
		{"longer one starts a new run", []run{{0, 2, 100}, {0, 2, 200}}, false, []msg{{2, 100}, {2, 200}}},
		{"equal size after the short one", []run{{0, 1, 100}, {0, 1, 50}, {0, 1, 50}}, false, []msg{{2, 100}, {1, 0}}},
		{"destinations alternate", []run{{0, 1, 100}, {1, 1, 100}, {0, 1, 100}, {1, 1, 100}}, false,
			[]msg{{1, 0}, {1, 0}, {1, 0}, {1, 0}}},
		{"two destinations' runs", []run{{0, 3, 100}, {1, 3, 100}}, false, []msg{{3, 100}, {3, 100}}},
		{"64 segments in one message", []run{{0, 64, 10}}, false, []msg{{64, 10}}},
		{"65507 bytes at most", []run{{0, 9, 8000}}, false, []msg{{8, 8000}, {1, 0}}},
		{"exactly 65507 bytes", []run{{0, 7, 9000}, {0, 1, 2507}, {0, 1, 1}}, false, []msg{{8, 9000}, {1, 0}}},
		{"empty datagrams stay plain", []run{{0, 3, 0}}, false, []msg{{1, 0}, {1, 0}, {1, 0}}},
		{"GSO off", []run{{0, 3, 100}}, true, []msg{{1, 0}, {1, 0}, {1, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pkts := makePkts(dsts, tc.runs)
			s := newScratch()
			k, m, bad := c.fill(s, pkts, !tc.off)
			if k != len(pkts) || bad != nil {
				t.Fatalf("fill took %d of %d datagrams: %v", k, len(pkts), bad)
			}
			var got []msg
			next := 0
			for i := range m {
				h := &s.hdrs[i].Hdr
				if s.first[i] != next || h.Iov != &s.iovs[next] {
					t.Fatalf("message %d starts at datagram %d, want %d", i, s.first[i], next)
				}
				for j := range int(h.Iovlen) {
					if int(s.iovs[next+j].Len) != len(pkts[next+j].Data) {
						t.Fatalf("message %d, iovec %d: %d bytes, want %d", i, j, s.iovs[next+j].Len, len(pkts[next+j].Data))
					}
				}
				got = append(got, msg{int(h.Iovlen), s.gsoSize(i)})
				next += int(h.Iovlen)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("messages %v, want %v", got, tc.want)
			}
		})
	}
}

// testNets are fresh network namespaces, removed when the test ends.
type testNets []netns.NsHandle

func newTestNets(t *testing.T, k int) testNets {
	t.Helper()
	nets := make(testNets, k)
	for i := range nets {
		nets[i] = testenv.NewNetNS(t)
	}
	return nets
}

// vethNets creates two namespaces joined by the veth pair a ⇄ b, a in the
// first and b in the second (their NS is set here), and returns them and
// b's index.
func vethNets(t *testing.T, a, b testenv.VethEnd) (testNets, int) {
	t.Helper()
	nets := newTestNets(t, 2)
	a.NS, b.NS = nets[0], nets[1]
	_, bIdx := testenv.VethPair(t, a, b)
	return nets, bIdx
}

// listen opens a Conn on addr in namespace i and closes it when the test
// ends.
func (nets testNets) listen(t *testing.T, i int, addr string, opts Options) *Conn {
	t.Helper()
	var c *Conn
	testenv.InNetNS(t, nets[i], func() error {
		var err error
		c, err = Listen(netip.MustParseAddrPort(addr), opts)
		return err
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// recvExact receives want datagrams from c in large buffers.
func recvExact(t *testing.T, c *Conn, want int) []transport.Packet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var got []transport.Packet
	for len(got) < want {
		pkts := bufs(64, 1<<16)
		n, err := c.Recv(ctx, pkts)
		if err != nil {
			t.Fatalf("after %d of %d datagrams: %v", len(got), want, err)
		}
		got = append(got, pkts[:n]...)
	}
	return got
}

// checkArrived checks that each receiver got exactly the datagrams sent to
// it, in order, with their bytes and boundaries, from src.
func checkArrived(t *testing.T, src netip.AddrPort, rcv []*Conn, sent []transport.Packet) {
	t.Helper()
	for i, r := range rcv {
		var want []transport.Packet
		for _, p := range sent {
			if p.Addr == r.LocalAddr() {
				want = append(want, p)
			}
		}
		got := recvExact(t, r, len(want))
		for j := range want {
			if !bytes.Equal(got[j].Data, want[j].Data) {
				t.Fatalf("receiver %d, datagram %d: %d bytes, want %d (or bytes differ)", i, j, len(got[j].Data), len(want[j].Data))
			}
			if got[j].Addr != src {
				t.Fatalf("receiver %d, datagram %d from %v, want %v", i, j, got[j].Addr, src)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		n, _ := r.Recv(ctx, bufs(1, 1<<16))
		cancel()
		if n != 0 {
			t.Fatalf("receiver %d: a datagram beyond the %d sent", i, len(want))
		}
	}
}

// gsoCases are batches sent end to end, on loopback and on veth.
var gsoCases = []struct {
	name string
	runs []run
}{
	{"chunks of eight", []run{{0, 7, 8776}, {0, 1, 4680}, {0, 7, 8776}, {0, 1, 4680}}},
	{"mixed sizes", []run{{0, 3, 1000}, {0, 1, 10}, {0, 2, 1000}, {0, 4, 3000}, {0, 1, 1}, {0, 1, 0}, {0, 2, 5}}},
	{"mixed destinations", []run{{0, 3, 1000}, {1, 3, 1000}, {0, 1, 1000}, {1, 1, 999}, {0, 5, 700}, {1, 2, 700}}},
	{"run of 200 small", []run{{0, 200, 100}}},
	{"run longer than 65507 bytes", []run{{0, 30, 8972}, {0, 1, 17}}},
	{"two runs over several calls", []run{{0, 100, 512}, {1, 100, 512}}},
}

// TestGSOSendRecv sends runs over IPv4 and IPv6 loopback with GSO on and
// checks that every datagram arrives whole and separate, that Send counts
// datagrams, and that the kernel took the UDP_SEGMENT messages (GSO stays
// on).
func TestGSOSendRecv(t *testing.T) {
	for _, local := range []string{"127.0.0.1:0", "[::1]:0"} {
		t.Run(local, func(t *testing.T) {
			listen := func(opts Options) *Conn {
				c, err := Listen(netip.MustParseAddrPort(local), opts)
				if err != nil {
					if local[0] == '[' {
						t.Skipf("no IPv6 loopback: %v", err)
					}
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = c.Close() })
				return c
			}
			for _, tc := range gsoCases {
				t.Run(tc.name, func(t *testing.T) {
					a := listen(Options{GSO: true})
					rcv := []*Conn{listen(Options{}), listen(Options{})}
					pkts := makePkts([]netip.AddrPort{rcv[0].LocalAddr(), rcv[1].LocalAddr()}, tc.runs)
					n, err := a.Send(pkts)
					if n != len(pkts) || err != nil {
						t.Fatalf("Send = %d, %v; want %d", n, err, len(pkts))
					}
					if !a.GSO() {
						t.Error("the kernel refused GSO on loopback")
					}
					checkArrived(t, a.LocalAddr(), rcv, pkts)
				})
			}
		})
	}
}

// TestGSOSendAllocs checks that a Send with runs allocates nothing once its
// scratch is pooled (not under the race detector, whose sync.Pool drops
// items at random).
func TestGSOSendAllocs(t *testing.T) {
	a := listenT(t, Options{GSO: true})
	b := listenT(t, Options{ReadBuffer: 16 << 20})
	pkts := makePkts([]netip.AddrPort{b.LocalAddr()}, []run{{0, 7, 1000}, {0, 1, 100}, {0, 4, 500}})
	allocs := testing.AllocsPerRun(100, func() {
		if n, err := a.Send(pkts); n != len(pkts) || err != nil {
			t.Fatalf("Send = %d, %v", n, err)
		}
	})
	if allocs != 0 && !raceEnabled {
		t.Errorf("%.1f allocations per Send", allocs)
	}
	if !a.GSO() {
		t.Error("the kernel refused GSO on loopback")
	}
}

// TestGSOSendErrors checks that Send's count and error name the datagram
// that cannot go when it sits in or after a run.
func TestGSOSendErrors(t *testing.T) {
	a := listenT(t, Options{GSO: true, MaxPayload: 1000})
	b := listenT(t, Options{})
	for _, tc := range []struct {
		name string
		bad  transport.Packet
		want error
	}{
		{"too big", transport.Packet{Addr: b.LocalAddr(), Data: make([]byte, 1001)}, transport.ErrTooBig},
		{"no address", transport.Packet{Data: make([]byte, 100)}, transport.ErrAddr},
	} {
		for _, before := range []int{0, 1, 5, 63, 64, 70} {
			t.Run(fmt.Sprintf("%s after %d", tc.name, before), func(t *testing.T) {
				pkts := makePkts([]netip.AddrPort{b.LocalAddr()}, []run{{0, before, 100}})
				pkts = append(pkts, tc.bad)
				pkts = append(pkts, makePkts([]netip.AddrPort{b.LocalAddr()}, []run{{0, 3, 100}})...)
				n, err := a.Send(pkts)
				if n != before || !errors.Is(err, tc.want) {
					t.Fatalf("Send = %d, %v; want %d, %v", n, err, before, tc.want)
				}
				checkArrived(t, a.LocalAddr(), []*Conn{b}, pkts[:before])
			})
		}
	}
}

// TestGSOFallback makes the kernel refuse UDP_SEGMENT (it does on a socket
// with SO_NO_CHECK) with a run first in a call and after a plain message:
// the Conn turns GSO off and sends every datagram without it.
func TestGSOFallback(t *testing.T) {
	for _, tc := range []struct {
		name string
		runs []run
	}{
		{"run first", []run{{0, 8, 1000}, {0, 1, 10}}},
		{"run after a plain message", []run{{0, 1, 10}, {0, 1, 20}, {0, 5, 1000}, {0, 1, 3}}},
		{"runs over several calls", []run{{0, 150, 300}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := listenT(t, Options{GSO: true})
			b := listenT(t, Options{})
			rc, _ := a.SyscallConn()
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_NO_CHECK, 1)
			}); err != nil || serr != nil {
				t.Fatal(err, serr)
			}
			pkts := makePkts([]netip.AddrPort{b.LocalAddr()}, tc.runs)
			n, err := a.Send(pkts)
			if n != len(pkts) || err != nil {
				t.Fatalf("Send = %d, %v; want %d", n, err, len(pkts))
			}
			if a.GSO() {
				t.Error("GSO still on after the kernel refused it")
			}
			checkArrived(t, a.LocalAddr(), []*Conn{b}, pkts)
		})
	}
}

// xdpDropJumbo is an XDP program that passes frames up to 9014 bytes (a
// 9000-byte MTU) and drops longer ones: a run that reached it unsegmented
// would be lost. It takes multi-buffer frames, as veth requires of a
// program on a link with an MTU above a page.
func xdpDropJumbo(t *testing.T) *ebpf.Program {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL", Flags: unix.BPF_F_XDP_HAS_FRAGS,
		Instructions: asm.Instructions{
			asm.FnXdpGetBuffLen.Call(), // of the context in R1
			asm.Mov.Reg(asm.R1, asm.R0),
			asm.Mov.Imm(asm.R0, 2), // XDP_PASS
			asm.JLE.Imm(asm.R1, 9014, "pass"),
			asm.Mov.Imm(asm.R0, 1), // XDP_DROP
			asm.Return().WithSymbol("pass"),
		}})
	if err != nil {
		t.Fatalf("load XDP program: %v", err)
	}
	t.Cleanup(func() { _ = prog.Close() })
	return prog
}

// TestGSOVeth sends the runs between two network namespaces over a veth
// pair: with GSO through (the run crosses veth in one buffer and is split
// at the receiving socket), with XDP attached to the receiving end (veth
// then clears the sender's GSO features and the kernel splits the run in
// software before XDP sees it), and with a 1500-byte MTU under 2000-byte
// datagrams (the kernel refuses GSO for segments the path cannot carry;
// the Conn falls back to IP fragmentation). Needs root.
func TestGSOVeth(t *testing.T) {
	testenv.RequirePriv(t)
	for _, mode := range []struct {
		name string
		mtu  int
		xdp  bool
		size int // datagrams of size bytes at most: the payloads are cut to it
	}{
		{"gso", 9000, false, 8972},
		{"xdp on receiver", 9000, true, 8972},
		{"segments over the mtu", 1500, false, 2000},
	} {
		t.Run(mode.name, func(t *testing.T) {
			ns, bIdx := vethNets(t,
				testenv.VethEnd{Name: "gso0", Addr: "10.97.0.1/24", MTU: mode.mtu},
				testenv.VethEnd{Name: "gso1", Addr: "10.97.0.2/24", MTU: mode.mtu})
			if mode.xdp {
				prog := xdpDropJumbo(t)
				testenv.InNetNS(t, ns[1], func() error {
					l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: bIdx, Flags: link.XDPDriverMode})
					if err != nil {
						return fmt.Errorf("attach XDP: %w", err)
					}
					t.Cleanup(func() { _ = l.Close() })
					return nil
				})
			}
			for _, tc := range gsoCases {
				t.Run(tc.name, func(t *testing.T) {
					a := ns.listen(t, 0, "10.97.0.1:0", Options{GSO: true})
					rcv := []*Conn{ns.listen(t, 1, "10.97.0.2:0", Options{}), ns.listen(t, 1, "10.97.0.2:0", Options{})}
					runs := slices.Clone(tc.runs)
					wantOff := false // a run of segments too large for the path
					for i := range runs {
						runs[i].size = min(runs[i].size, mode.size)
						wantOff = wantOff || runs[i].n > 1 && runs[i].size > MaxPayloadForMTU(mode.mtu, false)
					}
					pkts := makePkts([]netip.AddrPort{rcv[0].LocalAddr(), rcv[1].LocalAddr()}, runs)
					// Pace by call, so that the small receive buffers of
					// the far namespace do not drop (veth delivers in the
					// sender's context).
					for i := 0; i < len(pkts); i += 32 {
						part := pkts[i:min(len(pkts), i+32)]
						n, err := a.Send(part)
						if n != len(part) || err != nil {
							t.Fatalf("Send = %d, %v; want %d", n, err, len(part))
						}
					}
					if a.GSO() == wantOff {
						t.Errorf("GSO on: %v, want %v", a.GSO(), !wantOff)
					}
					checkArrived(t, a.LocalAddr(), rcv, pkts)
				})
			}
		})
	}
}

// TestGSOPeerRefused sends runs to a peer that the kernel refuses with or
// without GSO (EINVAL: it is reached over a veth, and the socket is bound
// to 127.0.0.1) alone and after runs to a peer it takes (on loopback): Send
// counts the datagrams before the refused run and fails with EINVAL, and GSO
// stays on for the peer that takes it. Needs root.
func TestGSOPeerRefused(t *testing.T) {
	ns, _ := vethNets(t,
		testenv.VethEnd{Name: "gsor0", Addr: "10.98.0.1/24"},
		testenv.VethEnd{Name: "gsor1", Addr: "10.98.0.2/24"})
	for _, tc := range []struct {
		name string
		runs []run // dst 0: the loopback peer, 1: the refused one
		good int   // datagrams before the first to the refused peer
	}{
		{"refused run alone", []run{{1, 8, 1000}}, 0},
		{"refused datagram alone", []run{{1, 1, 1000}}, 0},
		{"refused run after good ones", []run{{0, 8, 1000}, {0, 3, 100}, {1, 8, 1000}, {0, 8, 1000}}, 11},
		{"refused run after a batch", []run{{0, 70, 100}, {1, 4, 100}}, 70},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := ns.listen(t, 0, "127.0.0.1:0", Options{GSO: true})
			b := ns.listen(t, 0, "127.0.0.1:0", Options{})
			far := ns.listen(t, 1, "10.98.0.2:0", Options{})
			pkts := makePkts([]netip.AddrPort{b.LocalAddr(), far.LocalAddr()}, tc.runs)
			if n, err := a.Send(pkts); n != tc.good || !errors.Is(err, unix.EINVAL) {
				t.Fatalf("Send = %d, %v; want %d, %v", n, err, tc.good, unix.EINVAL)
			}
			if !a.GSO() {
				t.Error("GSO turned off by a peer the kernel refuses without GSO too")
			}
			more := makePkts([]netip.AddrPort{b.LocalAddr()}, []run{{0, 8, 1000}})
			if n, err := a.Send(more); n != len(more) || err != nil {
				t.Fatalf("Send to %v = %d, %v; want %d", b.LocalAddr(), n, err, len(more))
			}
			if !a.GSO() {
				t.Error("GSO off after a send to the loopback peer")
			}
			checkArrived(t, a.LocalAddr(), []*Conn{b}, append(slices.Clone(pkts[:tc.good]), more...))
			checkArrived(t, a.LocalAddr(), []*Conn{far}, nil)
		})
	}
}
