package xsk

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// testEtherType is IEEE 802 "local experimental 1": nothing else on a
// fresh veth uses it.
const testEtherType = 0x88b5

var testMagic = []byte("LVXK")

// testFrame builds an Ethernet frame of size bytes (at least 60) carrying
// seq, with a payload pattern that depends on seq so that a byte in the
// wrong place shows.
func testFrame(seq uint64, size int) []byte {
	size = max(size, 60)
	f := make([]byte, size)
	copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], []byte{0x02, 0, 0, 0, 0, 1})
	binary.BigEndian.PutUint16(f[12:14], testEtherType)
	copy(f[14:18], testMagic)
	binary.BigEndian.PutUint64(f[18:26], seq)
	for i := 26; i < size; i++ {
		f[i] = byte(seq) + byte(i)
	}
	return f
}

// frameSeq returns the sequence number of a test frame.
func frameSeq(f []byte) (uint64, bool) {
	if len(f) < 26 || binary.BigEndian.Uint16(f[12:14]) != testEtherType || !bytes.Equal(f[14:18], testMagic) {
		return 0, false
	}
	return binary.BigEndian.Uint64(f[18:26]), true
}

// testNet is a fresh network namespace holding veth pairs.
type testNet struct {
	ns netns.NsHandle
}

func newTestNet(t testing.TB) *testNet {
	t.Helper()
	testenv.RequirePriv(t)
	return &testNet{ns: testenv.NewNetNS(t)}
}

func (n *testNet) do(t testing.TB, fn func() error) {
	t.Helper()
	testenv.InNetNS(t, n.ns, fn)
}

// veth creates the pair a ⇄ b, with aQueues RX and TX queues on a and one
// TX queue on b (so everything b sends arrives on a's queue 0), IPv6 off
// (no DAD or router solicitations in the way) and both ends up. It returns
// the ifindexes.
func (n *testNet) veth(t testing.TB, a, b string, aQueues int) (int, int) {
	t.Helper()
	return testenv.VethPair(t,
		testenv.VethEnd{NS: n.ns, Name: a, Queues: aQueues},
		testenv.VethEnd{NS: n.ns, Name: b})
}

// jumboVeth is veth with one queue a side and MTU 9000 on both ends: a
// frame larger than a UMEM frame then reaches XDP on a in several buffers.
func (n *testNet) jumboVeth(t testing.TB, a, b string) (int, int) {
	t.Helper()
	return testenv.VethPair(t,
		testenv.VethEnd{NS: n.ns, Name: a, MTU: 9000},
		testenv.VethEnd{NS: n.ns, Name: b, MTU: 9000})
}

// fragsSocket sets up a multi-buffer test: the jumbo pair a ⇄ b, a socket
// opened with scfg on a's queue 0 and fed by a's xdp.frags redirect
// program, and a packet socket on b to send into it. It returns the socket
// and the packet socket.
func (n *testNet) fragsSocket(t testing.TB, a, b string, scfg *SocketConfig) (*Socket, int) {
	t.Helper()
	xa, xb := n.jumboVeth(t, a, b)
	s := n.open(t, xa, 0, nil, scfg)
	setSlot(t, n.redirectFrags(t, xa), s)
	return s, n.packetSock(t, xb)
}

// redirect attaches to ifindex, in driver mode, an XDP program that
// redirects every packet to xsks[ctx->rx_queue_index], falling back to
// XDP_PASS for an empty slot, and returns the map.
func (n *testNet) redirect(t testing.TB, ifindex int) *ebpf.Map {
	t.Helper()
	return n.attachRedirect(t, ifindex, 0)
}

// redirectFrags is redirect with an xdp.frags program
// (BPF_F_XDP_HAS_FRAGS): veth then takes a jumbo MTU, and a frame that
// reaches XDP in several buffers goes to a MultiBuffer socket as a chain of
// descriptors.
func (n *testNet) redirectFrags(t testing.TB, ifindex int) *ebpf.Map {
	t.Helper()
	return n.attachRedirect(t, ifindex, unix.BPF_F_XDP_HAS_FRAGS)
}

func (n *testNet) attachRedirect(t testing.TB, ifindex int, progFlags uint32) *ebpf.Map {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.XSKMap, KeySize: 4, ValueSize: 4, MaxEntries: 4})
	if err != nil {
		t.Fatalf("XSKMAP: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:    "xsk_test",
		Type:    ebpf.XDP,
		License: "GPL",
		Flags:   progFlags,
		Instructions: asm.Instructions{
			asm.LoadMem(asm.R2, asm.R1, 16, asm.Word), // struct xdp_md: rx_queue_index
			asm.LoadMapPtr(asm.R1, m.FD()),
			asm.Mov.Imm(asm.R3, 2), // XDP_PASS
			asm.FnRedirectMap.Call(),
			asm.Return(),
		},
	})
	if err != nil {
		t.Fatalf("load XDP program: %+v", err)
	}
	t.Cleanup(func() { prog.Close() })
	n.do(t, func() error {
		l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifindex, Flags: link.XDPDriverMode})
		if err != nil {
			return fmt.Errorf("attach XDP to %d: %w", ifindex, err)
		}
		t.Cleanup(func() { l.Close() })
		return nil
	})
	return m
}

func setSlot(t testing.TB, m *ebpf.Map, s *Socket) {
	t.Helper()
	if err := m.Update(s.Queue(), uint32(s.FD()), ebpf.UpdateAny); err != nil {
		t.Fatalf("put socket in XSKMAP slot %d: %v", s.Queue(), err)
	}
}

// packetSock opens an AF_PACKET socket on ifindex for testEtherType, with a
// large receive buffer so a burst is not dropped before it is read.
func (n *testNet) packetSock(t testing.TB, ifindex int) int {
	t.Helper()
	var fd int
	n.do(t, func() error {
		var err error
		proto := int(htons(testEtherType))
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return fmt.Errorf("AF_PACKET socket: %w", err)
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20); err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 8<<20); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(testEtherType), Ifindex: ifindex})
	})
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// sendFrames writes into the packet socket pk a test frame of each size,
// numbered from first on, and returns the frames.
func sendFrames(t testing.TB, pk int, first uint64, sizes []int) [][]byte {
	t.Helper()
	frames := make([][]byte, 0, len(sizes))
	for j, size := range sizes {
		f := testFrame(first+uint64(j), size)
		if _, err := unix.Write(pk, f); err != nil {
			t.Fatalf("send frame %d (%d bytes): %v", j, size, err)
		}
		frames = append(frames, f)
	}
	return frames
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// recvPacket reads one incoming frame from an AF_PACKET socket, waiting up
// to timeout.
func recvPacket(fd int, buf []byte, timeout time.Duration) ([]byte, error) {
	deadline := time.Now().Add(timeout)
	for {
		n, from, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT)
		if err == nil {
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
				continue
			}
			return buf[:n], nil
		}
		if !errors.Is(err, unix.EAGAIN) {
			return nil, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, unix.EAGAIN
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, int(min(left, 50*time.Millisecond)/time.Millisecond)+1); err != nil && !errors.Is(err, unix.EINTR) {
			return nil, err
		}
	}
}

// newUMEM creates a UMEM and closes it when the test ends.
func newUMEM(t testing.TB, cfg *UMEMConfig) *UMEM {
	t.Helper()
	u, err := NewUMEM(cfg)
	if err != nil {
		t.Fatalf("NewUMEM(%+v): %v", cfg, err)
	}
	t.Cleanup(func() { u.Close() })
	return u
}

// open creates a socket in the namespace and closes it when the test ends.
func (n *testNet) open(t testing.TB, ifindex int, queue uint32, ucfg *UMEMConfig, scfg *SocketConfig) *Socket {
	t.Helper()
	var s *Socket
	n.do(t, func() error {
		var err error
		s, err = Open(ifindex, queue, ucfg, scfg)
		return err
	})
	t.Cleanup(func() { s.Close() })
	return s
}

func (n *testNet) newSocket(t testing.TB, u *UMEM, ifindex int, queue uint32, scfg *SocketConfig) *Socket {
	t.Helper()
	var s *Socket
	n.do(t, func() error {
		var err error
		s, err = u.NewSocket(ifindex, queue, scfg)
		return err
	})
	t.Cleanup(func() { s.Close() })
	return s
}

// mapping is one line of /proc/self/maps.
type mapping struct {
	start, end uint64
	path       string
}

func readMaps(t testing.TB) []mapping {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m mapping
		fields := strings.Fields(sc.Text())
		if _, err := fmt.Sscanf(fields[0], "%x-%x", &m.start, &m.end); err != nil {
			t.Fatalf("maps line %q: %v", sc.Text(), err)
		}
		if len(fields) >= 6 {
			m.path = strings.Join(fields[5:], " ")
		}
		out = append(out, m)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitFor polls cond every millisecond for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// rxQueued is the number of descriptors on s's RX ring.
func rxQueued(s *Socket) int {
	return int(atomic.LoadUint32(s.rx.producer) - atomic.LoadUint32(s.rx.consumer))
}

// waitRXQueued waits up to 2 s for want descriptors on s's RX ring: the
// kernel has then put every frame sent there.
func waitRXQueued(t *testing.T, s *Socket, want int) {
	t.Helper()
	if !waitFor(2*time.Second, func() bool { return rxQueued(s) == want }) {
		t.Fatalf("%d descriptors on the RX ring, want %d", rxQueued(s), want)
	}
}

// recvPackets receives from s until it has want whole packets (on a
// MultiBuffer socket a packet may take several descriptors) and returns
// their descriptors; it fails the test after 2 s, or on more packets.
func recvPackets(t *testing.T, s *Socket, want int) []Desc {
	t.Helper()
	descs := make([]Desc, 16)
	got, pkts := 0, 0
	if !waitFor(2*time.Second, func() bool {
		k, err := s.RecvBatch(descs[got:])
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range descs[got : got+k] {
			if d.Options&unix.XDP_PKT_CONTD == 0 {
				pkts++
			}
		}
		got += k
		return pkts >= want
	}) || pkts != want {
		t.Fatalf("received %d packets in %d descriptors, want %d: %+v", pkts, got, want, descs[:got])
	}
	return descs[:got]
}
