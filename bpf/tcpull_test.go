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

// TestTCNonlinearGSO sends UDP GSO runs to the Lovelock port, as far
// memory's kernel sockets send them (udp.Options.GSO): each run is one
// UDP_SEGMENT message of datagrams of segment bytes and a shorter last one,
// each with its own Lovelock header whose length is that datagram's payload
// less the header. The stack hands the run to a TC hook as one GSO
// super-packet, whose UDP length is the whole run's, with only its IP and UDP
// headers linear and the payload, Lovelock header included, in page
// fragments (veth has scatter-gather), so the hook must pull the header in
// (tc_steer pulls only header bytes, then parses again) and check its length
// against the first datagram's payload (skb->gso_size), not the run's. The
// runs go through a veth's TC egress hook, and in a second pair through its
// peer's TC ingress hook (veth hands the run over whole). Every run with
// per-datagram headers must come out a valid Lovelock packet matching its
// rule, none malformed; a run whose first header claims anything else
// (the whole run's payload, or a length that fits nothing) stays malformed
// (bad length), and the Lovelock rule does not match it.
// BPF_PROG_TEST_RUN cannot build such an skb (its data is linear), hence
// real traffic.
func TestTCNonlinearGSO(t *testing.T) {
	testenv.RequirePriv(t)
	const runs, segment, last = 20, 1000, 600
	const payload = 2*segment + last // three datagrams
	s, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rs := &bpf.Ruleset{DefaultAction: bpf.ActionPass, Shapes: []bpf.Shape{{Fields: bpf.FieldLLType | bpf.FieldTenant, MaxPrio: 10}}}
	var k bpf.RuleKey
	k.Flow.LlType, k.Flow.Tenant = 0x30, 42 // ping of tenant 42
	rs.Entries = append(rs.Entries, bpf.Entry{Key: k, Val: bpf.RuleVal{Prio: 10, Id: tcGSORule, Action: uint16(bpf.ActionPass)}})
	if err := s.Apply(rs); err != nil {
		t.Fatal(err)
	}
	for _, hook := range []string{"egress", "ingress"} {
		for _, c := range []struct {
			name   string
			length uint32 // the first datagram's Lovelock length
			valid  bool
		}{
			{"per-datagram", segment - 24, true},
			{"whole-run", payload - 24, false},
			{"insane", 5, false},
		} {
			t.Run(hook+"/"+c.name, func(t *testing.T) {
				msg := make([]byte, payload)
				for off := 0; off < payload; off += segment {
					n := min(segment, payload-off)
					copy(msg[off:], lovelockPing(uint32(off)))
					binary.BigEndian.PutUint32(msg[off+4:], 42)            // tenant
					binary.BigEndian.PutUint32(msg[off+20:], uint32(n-24)) // length: this datagram's
				}
				binary.BigEndian.PutUint32(msg[20:], c.length)
				got, rule := tcGSORuns(t, s, hook, segment, msg, runs)
				wantLL, wantBad, wantRule := uint64(runs), uint64(0), uint64(runs)
				if !c.valid {
					wantLL, wantBad, wantRule = 0, runs, 0
				}
				if rule.Packets != wantRule || (c.valid && rule.Bytes < runs*payload) {
					t.Errorf("rule counted %d packets, %d bytes; want %d runs of over %d bytes", rule.Packets, rule.Bytes, wantRule, payload)
				}
				if got[bpf.StatLovelock].Packets != wantLL {
					t.Errorf("lovelock packets = %d, want %d", got[bpf.StatLovelock].Packets, wantLL)
				}
				if got[bpf.StatMalformed].Packets != wantBad {
					t.Errorf("malformed packets = %d, want %d (a header past the linear part read as truncated, or its length checked against the run?)", got[bpf.StatMalformed].Packets, wantBad)
				}
			})
		}
	}
}

// tcGSORuns sends msg runs times as one UDP GSO message of segment-byte
// datagrams from a fresh veth's end a to its peer b, with s's TC hook on a's
// egress or b's ingress. s has a rule of ID tcGSORule. It returns what the
// global counters and the rule's counted meanwhile, once the hook has seen
// every run.
func tcGSORuns(t *testing.T, s *bpf.Steer, hook string, segment int, msg []byte, runs int) ([]bpf.Counter, bpf.Counter) {
	t.Helper()
	nsA, nsB := testenv.NewNetNS(t), testenv.NewNetNS(t)
	vethPair(t, nsA, nsB)
	counters := func() ([]bpf.Counter, bpf.Counter) {
		got, err := s.Stats()
		if err != nil {
			t.Fatal(err)
		}
		rule, err := s.RuleCounter(tcGSORule)
		if err != nil {
			t.Fatal(err)
		}
		return got, rule
	}
	before, ruleBefore := counters()

	ns, name, prog, attach := nsA, "a", s.TCEgress, ebpf.AttachTCXEgress
	if hook == "ingress" {
		ns, name, prog, attach = nsB, "b", s.TCIngress, ebpf.AttachTCXIngress
	}
	testenv.InNetNS(t, ns, func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		tl, err := link.AttachTCX(link.TCXOptions{Interface: l.Attrs().Index, Program: prog, Attach: attach})
		if err != nil {
			return err
		}
		t.Cleanup(func() { tl.Close() })
		return nil
	})

	testenv.InNetNS(t, nsA, func() error {
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
		for range runs {
			if _, err := c.WriteToUDP(msg, &net.UDPAddr{IP: net.IPv4(10, 99, 0, 2), Port: 61440}); err != nil {
				return err
			}
		}
		return nil
	})

	var got []bpf.Counter
	var rule bpf.Counter
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		got, rule = counters()
		for i := range got {
			got[i].Packets -= before[i].Packets
			got[i].Bytes -= before[i].Bytes
		}
		rule.Packets -= ruleBefore.Packets
		rule.Bytes -= ruleBefore.Bytes
		if got[bpf.StatLovelock].Packets+got[bpf.StatMalformed].Packets >= uint64(runs) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Every run is valid or malformed; the hook also sees the veths' own
	// traffic (ARP, IPv6 neighbour discovery), which is neither.
	if n := got[bpf.StatLovelock].Packets + got[bpf.StatMalformed].Packets; n != uint64(runs) {
		t.Errorf("the hook saw %d Lovelock packets, valid or malformed; want %d GSO runs (the stack segmented them before the hook?)", n, runs)
	}
	return got, rule
}

const tcGSORule = 7
