package bpf_test

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/xsk"
)

// xdpMd is struct xdp_md as BPF_PROG_TEST_RUN takes it: data_end must be
// the data's length, data_meta and egress_ifindex zero.
type xdpMd struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

const xdpRedirect = 4

// TestXSKVerdictCounters runs an xsk verdict through xdp_steer while the
// queue's socket is open and after it closed. A closed socket leaves the
// XSKMAP, but not its xsk_slots entry (lovelockd died without unregistering
// it): the redirect then falls back to XDP_PASS, and the packet must be
// counted as what happened to it, xsk_miss and pass, not xsk.
func TestXSKVerdictCounters(t *testing.T) {
	testenv.RequirePriv(t)
	nsA, nsB := testenv.NewNetNS(t), testenv.NewNetNS(t)
	ifindex := vethPair(t, nsA, nsB)

	s, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const port = 7001
	var k bpf.RuleKey
	k.Flow.Proto, k.Flow.Dport = 17, port
	if err := s.Apply(&bpf.Ruleset{
		Shapes:  []bpf.Shape{{Fields: bpf.FieldProto | bpf.FieldDport, MaxPrio: 10}},
		Entries: []bpf.Entry{{Key: k, Val: bpf.RuleVal{Prio: 10, Id: 1, Action: uint16(bpf.ActionXSK), Arg: 0}}},
	}); err != nil {
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

	frame := testenv.UDPFrame(port)
	for _, c := range []struct {
		name               string
		closeFirst         bool
		ret                uint32
		xsk, xskMiss, pass uint64
	}{
		{"socket open", false, xdpRedirect, 1, 0, 0},
		{"socket closed, slot left", true, xdpPass, 0, 1, 1},
	} {
		if c.closeFirst {
			if err := sock.Close(); err != nil {
				t.Fatal(err)
			}
		}
		before, err := s.Stats()
		if err != nil {
			t.Fatal(err)
		}
		var ret uint32
		// The kernel checks the context's ingress_ifindex against the
		// calling thread's network namespace.
		testenv.InNetNS(t, nsB, func() error {
			ret, err = s.XDP.Run(&ebpf.RunOptions{Data: frame,
				Context: xdpMd{DataEnd: uint32(len(frame)), IngressIfindex: uint32(ifindex)}})
			return err
		})
		after, err := s.Stats()
		if err != nil {
			t.Fatal(err)
		}
		d := func(i bpf.Stat) uint64 { return after[i].Packets - before[i].Packets }
		if ret != c.ret || d(bpf.StatXSK) != c.xsk || d(bpf.StatXSKMiss) != c.xskMiss || d(bpf.StatPass) != c.pass {
			t.Errorf("%s: verdict %d, counters xsk %d xsk_miss %d pass %d; want verdict %d, xsk %d xsk_miss %d pass %d",
				c.name, ret, d(bpf.StatXSK), d(bpf.StatXSKMiss), d(bpf.StatPass), c.ret, c.xsk, c.xskMiss, c.pass)
		}
	}
}
