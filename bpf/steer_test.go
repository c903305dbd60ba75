package bpf_test

import (
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// vethPair puts veth "a" (10.99.0.1) in nsA and its peer "b" (10.99.0.2) in
// nsB, both up, and returns b's ifindex.
func vethPair(t *testing.T, nsA, nsB netns.NsHandle) int {
	t.Helper()
	_, ifindex := testenv.VethPair(t,
		testenv.VethEnd{NS: nsA, Name: "a", Addr: "10.99.0.1/24"},
		testenv.VethEnd{NS: nsB, Name: "b", Addr: "10.99.0.2/24"})
	return ifindex
}

// lovelockPing is a valid Lovelock header of type PING with no payload.
func lovelockPing(seq uint32) []byte {
	b := make([]byte, 24)
	b[0], b[1] = 1, 0x30
	binary.BigEndian.PutUint32(b[16:], seq)
	return b
}

// TestSteerPinAttach proves the pipeline end to end: the program loads,
// pins, attaches natively to a veth through a link that outlives the loading
// process's handles, classifies real traffic, and detaches when unpinned.
func TestSteerPinAttach(t *testing.T) {
	testenv.RequirePriv(t)
	nsA, nsB := testenv.NewNetNS(t), testenv.NewNetNS(t)
	ifindex := vethPair(t, nsA, nsB)
	pinDir := filepath.Join(testenv.BPFFS(t), "lovelock")

	s, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Pin(pinDir); err != nil {
		t.Fatal(err)
	}
	var l link.Link
	testenv.InNetNS(t, nsB, func() error {
		l, err = s.AttachXDP(ifindex, link.XDPDriverMode)
		return err
	})
	linkPin := filepath.Join(pinDir, "link_b")
	if err := l.Pin(linkPin); err != nil {
		t.Fatal(err)
	}
	// Drop every handle of this process: only the pins keep it alive now.
	l.Close()
	s.Close()

	const lovelock, other = 50, 20
	testenv.InNetNS(t, nsA, func() error {
		for i := range lovelock + other {
			port, payload := 61440, lovelockPing(uint32(i))
			if i >= lovelock {
				port, payload = 9, []byte("not lovelock")
			}
			if err := sendUDP(port, payload); err != nil {
				return err
			}
		}
		return nil
	})

	var got []bpf.Counter
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if got, err = bpf.ReadPinnedStats(pinDir); err != nil {
			t.Fatal(err)
		}
		if got[bpf.StatLovelock].Packets >= lovelock && got[bpf.StatNoRule].Packets >= lovelock+other {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got[bpf.StatLovelock].Packets != lovelock {
		t.Errorf("lovelock packets = %d, want %d", got[bpf.StatLovelock].Packets, lovelock)
	}
	// With no rule set every packet passes; ARP and IPv6 neighbour
	// traffic come on top of ours.
	if got[bpf.StatPass].Packets < lovelock+other {
		t.Errorf("passed packets = %d, want >= %d", got[bpf.StatPass].Packets, lovelock+other)
	}
	if got[bpf.StatMalformed].Packets != 0 {
		t.Errorf("malformed packets = %d, want 0", got[bpf.StatMalformed].Packets)
	}
	if rx := got[bpf.StatRX].Packets; rx != got[bpf.StatPass].Packets {
		t.Errorf("rx = %d, passed = %d: every packet must get a verdict", rx, got[bpf.StatPass].Packets)
	}

	// Still attached with no process holding it; removing the pin detaches.
	assertXDP(t, nsB, true)
	if err := os.Remove(linkPin); err != nil {
		t.Fatal(err)
	}
	assertXDP(t, nsB, false)
}

func assertXDP(t *testing.T, ns netns.NsHandle, want bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		var attached bool
		testenv.InNetNS(t, ns, func() error {
			l, err := netlink.LinkByName("b")
			if err != nil {
				return err
			}
			attached = l.Attrs().Xdp != nil && l.Attrs().Xdp.Attached
			return nil
		})
		if attached == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("xdp attached = %v, want %v", attached, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func sendUDP(port int, payload []byte) error {
	c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(10, 99, 0, 2), Port: port})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write(payload)
	return err
}

// TestPort reads the Lovelock port back from loaded and pinned programs.
func TestPort(t *testing.T) {
	testenv.RequirePriv(t)
	for _, want := range []uint16{0, 5555} {
		s, err := bpf.Load(bpf.Options{Port: want})
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(testenv.BPFFS(t), "p")
		if err := s.Pin(dir); err != nil {
			t.Fatal(err)
		}
		s.Close()
		p, err := bpf.OpenPinned(dir)
		if err != nil {
			t.Fatal(err)
		}
		got, err := p.Port()
		p.Close()
		if want == 0 {
			want = 61440
		}
		if err != nil || got != want {
			t.Errorf("port of pins loaded for %d: %d, %v", want, got, err)
		}
	}
}
