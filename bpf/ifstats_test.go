package bpf_test

import (
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// TestIfaceStats sends real traffic through three interfaces of one node
// (namespace B) with different verdicts and reads the per-interface
// counters: XDP on b1 passes UDP to port 9 and TC egress on b1 drops what B
// sends to port 7 (counted under b1, the interface the packet leaves by);
// XDP on b2 drops UDP to port 7; b3 has ifindex 2000, past the map's own
// slots, and is counted under bpf.IfaceOther. Each counter summed over
// interfaces must equal the global one.
func TestIfaceStats(t *testing.T) {
	testenv.RequirePriv(t)
	nsA, nsB := testenv.NewNetNS(t), testenv.NewNetNS(t)
	_, b1 := testenv.VethPair(t, testenv.VethEnd{NS: nsA, Name: "a1", Addr: "10.99.1.1/24"}, testenv.VethEnd{NS: nsB, Name: "b1", Addr: "10.99.1.2/24"})
	_, b2 := testenv.VethPair(t, testenv.VethEnd{NS: nsA, Name: "a2", Addr: "10.99.2.1/24"}, testenv.VethEnd{NS: nsB, Name: "b2", Addr: "10.99.2.2/24"})
	const bigIndex = 2000
	testenv.InNetNS(t, nsB, func() error {
		// The peer end of a veth created here with the index asked for.
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "b3", Index: bigIndex}, PeerName: "a3", PeerNamespace: netlink.NsFd(int(nsA))})
	})
	testenv.InNetNS(t, nsA, func() error { return addrUp("a3", "10.99.3.1/24") })
	testenv.InNetNS(t, nsB, func() error { return addrUp("b3", "10.99.3.2/24") })
	// (b3 is made by hand: VethPair cannot ask for an ifindex.)

	s, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const dropRule = 1
	if err := s.Apply(dportRules(7, dropRule)); err != nil {
		t.Fatal(err)
	}
	testenv.InNetNS(t, nsB, func() error {
		for _, idx := range []int{b1, b2, bigIndex} {
			l, err := s.AttachXDP(idx, link.XDPDriverMode)
			if err != nil {
				return err
			}
			t.Cleanup(func() { l.Close() })
		}
		l, err := link.AttachTCX(link.TCXOptions{Interface: b1, Program: s.TCEgress, Attach: ebpf.AttachTCXEgress})
		if err != nil {
			return err
		}
		t.Cleanup(func() { l.Close() })
		return nil
	})

	const passB1, dropB2, dropB1Egress, passB3 = 30, 20, 15, 10
	send := func(ip net.IP, port, n int) error {
		// Unconnected: the peer's port unreachable errors are not
		// reported, so none fails (and skips) a later datagram.
		c, err := net.ListenUDP("udp4", nil)
		if err != nil {
			return err
		}
		defer c.Close()
		for range n {
			if _, err := c.WriteTo([]byte("ifstats"), &net.UDPAddr{IP: ip, Port: port}); err != nil {
				return err
			}
		}
		return nil
	}
	testenv.InNetNS(t, nsA, func() error {
		if err := send(net.IPv4(10, 99, 1, 2), 9, passB1); err != nil {
			return err
		}
		if err := send(net.IPv4(10, 99, 2, 2), 7, dropB2); err != nil {
			return err
		}
		return send(net.IPv4(10, 99, 3, 2), 9, passB3)
	})
	testenv.InNetNS(t, nsB, func() error { return send(net.IPv4(10, 99, 1, 1), 7, dropB1Egress) })

	// Wait for the traffic, then read the global and the per-interface
	// counters until the global ones did not move in between.
	var global []bpf.Counter
	var ifs map[uint32][]bpf.Counter
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := s.RuleCounter(dropRule)
		if err != nil {
			t.Fatal(err)
		}
		before, err := s.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if ifs, err = s.IfaceStats(); err != nil {
			t.Fatal(err)
		}
		if global, err = s.Stats(); err != nil {
			t.Fatal(err)
		}
		o := ifs[bpf.IfaceOther]
		if c.Packets == dropB2+dropB1Egress && o != nil && o[bpf.StatNoRule].Packets >= passB3 && slices.Equal(before, global) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("traffic not counted: rule %d counted %+v, want %d; per interface %v", dropRule, c, dropB2+dropB1Egress, ifs)
		}
		time.Sleep(20 * time.Millisecond)
	}

	names := map[uint32]string{uint32(b1): "b1", uint32(b2): "b2", bpf.IfaceOther: "other (b3)"}
	for slot, cs := range ifs {
		if names[slot] == "" {
			t.Errorf("slot %d counted %v: no interface of that index runs the program", slot, cs)
		}
	}
	check := func(slot uint32, st bpf.Stat, op string, want uint64) {
		t.Helper()
		got := ifs[slot]
		if got == nil {
			t.Errorf("%s (slot %d): no counters", names[slot], slot)
			return
		}
		if n := got[st].Packets; (op == "==" && n != want) || (op == ">=" && n < want) {
			t.Errorf("%s %s = %d packets, want %s %d", names[slot], st, n, op, want)
		}
	}
	check(uint32(b1), bpf.StatDrop, "==", dropB1Egress) // by the TC egress hook only
	check(uint32(b1), bpf.StatNoRule, ">=", passB1)     // and ARP and ICMP
	check(uint32(b2), bpf.StatDrop, "==", dropB2)
	check(bpf.IfaceOther, bpf.StatDrop, "==", 0)
	check(bpf.IfaceOther, bpf.StatNoRule, ">=", passB3)
	for _, slot := range []uint32{uint32(b1), uint32(b2), bpf.IfaceOther} {
		if c := ifs[slot]; c != nil && c[bpf.StatRX].Packets != c[bpf.StatPass].Packets+c[bpf.StatDrop].Packets {
			t.Errorf("%s: rx %d, pass %d + drop %d: every packet gets one verdict", names[slot], c[bpf.StatRX].Packets, c[bpf.StatPass].Packets, c[bpf.StatDrop].Packets)
		}
	}
	for st := bpf.Stat(0); st < bpf.NumStats; st++ {
		var sum bpf.Counter
		for _, c := range ifs {
			sum.Packets += c[st].Packets
			sum.Bytes += c[st].Bytes
		}
		if sum != global[st] {
			t.Errorf("%s: per interface sums to %+v, globally %+v", st, sum, global[st])
		}
	}
	t.Logf("per interface: %s", fmtIfs(ifs, names))
}

func fmtIfs(ifs map[uint32][]bpf.Counter, names map[uint32]string) string {
	var out string
	for slot, cs := range ifs {
		out += fmt.Sprintf("\n  %s:", names[slot])
		for st, c := range cs {
			if c.Packets != 0 {
				out += fmt.Sprintf(" %s=%d/%dB", bpf.Stat(st), c.Packets, c.Bytes)
			}
		}
	}
	return out
}

// addrUp gives name the address and brings it up.
func addrUp(name, cidr string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(l, a); err != nil {
		return err
	}
	return netlink.LinkSetUp(l)
}
