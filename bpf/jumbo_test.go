package bpf_test

import (
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/xsk"
)

// TestJumboFrames attaches the classifier natively to a veth with a 9000-byte
// MTU (refused to XDP programs without multi-buffer support) and sends
// datagrams of 8000 bytes, which veth hands to XDP in several pages: a pass
// rule delivers them whole, a drop rule drops them, counters count every
// byte, and an xsk rule passes them to the stack (an AF_XDP socket without
// XDP_USE_SG cannot take them) while a small datagram reaches the socket.
func TestJumboFrames(t *testing.T) {
	testenv.RequirePriv(t)
	nsA, nsB := testenv.NewNetNS(t), testenv.NewNetNS(t)
	ifindex := vethPair(t, nsA, nsB)
	testenv.InNetNS(t, nsA, func() error { return setMTU("a", 9000) })
	testenv.InNetNS(t, nsB, func() error { return setMTU("b", 9000) })

	s, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var l link.Link
	testenv.InNetNS(t, nsB, func() error {
		l, err = s.AttachXDP(ifindex, link.XDPDriverMode)
		return err
	})
	defer l.Close()

	const dropPort, xskPort, passPort = 7000, 7001, 7002
	rs := dportRules(dropPort, 1)
	var k bpf.RuleKey
	k.Flow.Proto, k.Flow.Dport = 17, xskPort
	rs.Entries = append(rs.Entries, bpf.Entry{Key: k, Val: bpf.RuleVal{Prio: 10, Id: 2, Action: uint16(bpf.ActionXSK), Arg: 0}})
	if err := s.Apply(rs); err != nil {
		t.Fatal(err)
	}
	var sock *xsk.Socket
	testenv.InNetNS(t, nsB, func() error {
		sock, err = xsk.Open(ifindex, 0, nil, nil)
		return err
	})
	defer sock.Close()
	if err := s.SetXSK(ifindex, 0, sock.FD()); err != nil {
		t.Fatal(err)
	}

	// Kernel sockets on every port, to see what the stack got.
	conns := map[int]*net.UDPConn{}
	testenv.InNetNS(t, nsB, func() error {
		for _, port := range []int{dropPort, xskPort, passPort} {
			c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 99, 0, 2), Port: port})
			if err != nil {
				return err
			}
			t.Cleanup(func() { c.Close() })
			conns[port] = c
		}
		return nil
	})

	jumbo := bytes.Repeat([]byte("lovelock"), 1000) // 8000 bytes
	const frameLen = 8000 + 8 + 20 + 14
	before, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	testenv.InNetNS(t, nsA, func() error {
		for _, port := range []int{passPort, dropPort, xskPort} {
			if err := sendUDP(port, jumbo); err != nil {
				return err
			}
		}
		return sendUDP(xskPort, []byte("small"))
	})

	read := func(port int) []byte {
		t.Helper()
		buf := make([]byte, 9000)
		conns[port].SetReadDeadline(time.Now().Add(time.Second))
		n, err := conns[port].Read(buf)
		if err != nil {
			return nil
		}
		return buf[:n]
	}
	if got := read(passPort); !bytes.Equal(got, jumbo) {
		t.Errorf("pass rule: the stack got %d bytes, want the %d sent", len(got), len(jumbo))
	}
	if got := read(xskPort); !bytes.Equal(got, jumbo) {
		t.Errorf("xsk rule, jumbo frame: the stack got %d bytes, want the %d sent", len(got), len(jumbo))
	}
	var frames [][]byte
	deadline := time.Now().Add(2 * time.Second)
	for len(frames) == 0 && time.Now().Before(deadline) {
		if _, err := sock.TryReceive(func(f []byte) { frames = append(frames, bytes.Clone(f)) }); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(frames) != 1 || !bytes.HasSuffix(frames[0], []byte("small")) {
		t.Errorf("AF_XDP socket got %d frames, want the small datagram", len(frames))
	}
	if got := read(dropPort); got != nil {
		t.Errorf("drop rule: the stack got %d bytes", len(got))
	}
	if got := read(xskPort); got != nil {
		t.Errorf("xsk rule: the stack also got the small datagram")
	}

	after, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	delta := func(i bpf.Stat) bpf.Counter {
		return bpf.Counter{Packets: after[i].Packets - before[i].Packets, Bytes: after[i].Bytes - before[i].Bytes}
	}
	if d := delta(bpf.StatDrop); d.Packets != 1 || d.Bytes != frameLen {
		t.Errorf("drop counter %+v, want 1 packet of %d bytes", d, frameLen)
	}
	if d := delta(bpf.StatXSKMiss); d.Packets != 1 || d.Bytes != frameLen {
		t.Errorf("xsk_miss counter %+v, want 1 packet of %d bytes", d, frameLen)
	}
	if d := delta(bpf.StatXSK); d.Packets != 1 {
		t.Errorf("xsk counter %+v, want 1 packet", d)
	}
	if c, err := s.RuleCounter(1); err != nil || c.Bytes != frameLen {
		t.Errorf("rule 1 counter %+v (%v), want %d bytes", c, err, frameLen)
	}
}

func setMTU(name string, mtu int) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	return netlink.LinkSetMTU(l, mtu)
}
