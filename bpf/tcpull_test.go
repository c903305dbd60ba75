package bpf_test

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// TestTCNonlinearGSO sends UDP GSO super-packets to the Lovelock port out of
// a veth whose TC egress hook runs the classifier. The stack hands such a
// packet to the hook with only its IP and UDP headers linear and the
// payload, Lovelock header included, in page fragments (veth has
// scatter-gather), so the hook must pull the header in (tc_steer pulls only
// header bytes, then parses again). Every packet must come out a valid
// Lovelock packet matching its rule, none malformed. BPF_PROG_TEST_RUN
// cannot build such an skb (its data is linear), hence real traffic.
func TestTCNonlinearGSO(t *testing.T) {
	testenv.RequirePriv(t)
	nsA, nsB := testenv.NewNetNS(t), testenv.NewNetNS(t)
	vethPair(t, nsA, nsB)

	s, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const ruleID = 7
	rs := &bpf.Ruleset{DefaultAction: bpf.ActionPass, Shapes: []bpf.Shape{{Fields: bpf.FieldLLType | bpf.FieldTenant, MaxPrio: 10}}}
	var k bpf.RuleKey
	k.Flow.LlType, k.Flow.Tenant = 0x30, 42 // ping of tenant 42
	rs.Entries = append(rs.Entries, bpf.Entry{Key: k, Val: bpf.RuleVal{Prio: 10, Id: ruleID, Action: uint16(bpf.ActionPass)}})
	if err := s.Apply(rs); err != nil {
		t.Fatal(err)
	}

	const packets, segment, payload = 20, 1000, 3000
	testenv.InNetNS(t, nsA, func() error {
		a, err := netlink.LinkByName("a")
		if err != nil {
			return err
		}
		l, err := link.AttachTCX(link.TCXOptions{Interface: a.Attrs().Index, Program: s.TCEgress, Attach: ebpf.AttachTCXEgress})
		if err != nil {
			return err
		}
		defer l.Close()

		// Unconnected: the peer's port unreachable errors are not reported.
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 99, 0, 1)})
		if err != nil {
			return err
		}
		defer c.Close()
		rc, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_SEGMENT, segment)
		}); err != nil {
			return err
		}
		if serr != nil {
			return serr // UDP GSO: Linux 4.18, below every kernel Lovelock supports
		}
		msg := make([]byte, payload)
		copy(msg, lovelockPing(1))
		binary.BigEndian.PutUint32(msg[4:], 42)          // tenant
		binary.BigEndian.PutUint32(msg[20:], payload-24) // length: the rest of the super-packet
		for range packets {
			if _, err := c.WriteToUDP(msg, &net.UDPAddr{IP: net.IPv4(10, 99, 0, 2), Port: 61440}); err != nil {
				return err
			}
		}
		// Counted before the packets leave the hook; the link may go.
		return nil
	})

	var got []bpf.Counter
	var rule bpf.Counter
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if got, err = s.Stats(); err != nil {
			t.Fatal(err)
		}
		if rule, err = s.RuleCounter(ruleID); err != nil {
			t.Fatal(err)
		}
		if rule.Packets >= packets {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if rule.Packets != packets || rule.Bytes < packets*payload {
		t.Errorf("rule %d counted %d packets, %d bytes; want %d super-packets of over %d bytes", ruleID, rule.Packets, rule.Bytes, packets, payload)
	}
	if got[bpf.StatLovelock].Packets != packets {
		t.Errorf("lovelock packets = %d, want %d", got[bpf.StatLovelock].Packets, packets)
	}
	if got[bpf.StatMalformed].Packets != 0 {
		t.Errorf("malformed packets = %d, want 0 (a header past the linear part read as truncated?)", got[bpf.StatMalformed].Packets)
	}
}
