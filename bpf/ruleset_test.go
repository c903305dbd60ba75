package bpf_test

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// dportRules drops UDP to port with rule ID id; everything else passes.
func dportRules(port uint16, id uint32) *bpf.Ruleset {
	var k bpf.RuleKey
	k.Flow.Proto, k.Flow.Dport = 17, port
	return &bpf.Ruleset{
		Shapes:  []bpf.Shape{{Fields: bpf.FieldProto | bpf.FieldDport, MaxPrio: 10}},
		Entries: []bpf.Entry{{Key: k, Val: bpf.RuleVal{Prio: 10, Id: id, Action: uint16(bpf.ActionDrop)}}},
	}
}

const (
	xdpDrop = 1
	xdpPass = 2
)

func TestApplyClassify(t *testing.T) {
	testenv.RequirePriv(t)
	s, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	run := func(frame []byte) uint32 {
		t.Helper()
		ret, err := s.XDP.Run(&ebpf.RunOptions{Data: frame})
		if err != nil {
			t.Fatal(err)
		}
		return ret
	}
	if got := run(testenv.UDPFrame(7000)); got != xdpPass {
		t.Errorf("no rule set: verdict %d, want pass", got)
	}
	if err := s.Apply(dportRules(7000, 1)); err != nil {
		t.Fatal(err)
	}
	if got := run(testenv.UDPFrame(7000)); got != xdpDrop {
		t.Errorf("dport 7000: verdict %d, want drop", got)
	}
	if got := run(testenv.UDPFrame(7001)); got != xdpPass {
		t.Errorf("dport 7001: verdict %d, want pass (default)", got)
	}
	if c, err := s.RuleCounter(1); err != nil || c.Packets != 1 {
		t.Errorf("rule 1 counter = %+v, %v; want 1 packet", c, err)
	}
	if c, err := s.RuleCounter(0); err != nil || c.Packets != 2 {
		t.Errorf("default counter = %+v, %v; want 2 packets (before and after the set)", c, err)
	}

	bad := dportRules(7000, 0)
	if err := s.Apply(bad); err == nil {
		t.Error("rule ID 0 accepted")
	}
	if got := run(testenv.UDPFrame(7000)); got != xdpDrop {
		t.Errorf("a refused set changed the live one: verdict %d", got)
	}
}

// BenchmarkApply measures a whole rule set swap (dominated by the kernel's
// RCU grace period when the map-in-map slot changes).
func BenchmarkApply(b *testing.B) {
	testenv.RequirePriv(b)
	s, err := bpf.Load(bpf.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	start := time.Now()
	for i := 0; b.Loop(); i++ {
		if err := s.Apply(dportRules(uint16(7000+i%2), uint32(1+i%2))); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N), "µs/swap")
}

// TestApplyFullTable fills the rule table to its limit and checks that the
// program finds sampled entries (through its probe, from the seed and the
// placement Go chose) and no others.
func TestApplyFullTable(t *testing.T) {
	testenv.RequirePriv(t)
	s, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	shape := bpf.Shape{Fields: bpf.FieldFamily | bpf.FieldProto | bpf.FieldDport, SrcLen: 32, MaxPrio: 10}
	rs := &bpf.Ruleset{Shapes: []bpf.Shape{shape}}
	// Entry i: UDP from 10.0.0.(i>>16) to port i&0xffff, rule 1 + i%65535.
	frameOf := func(i int) []byte {
		f := testenv.UDPFrame(uint16(i))
		f[14+15] = byte(i >> 16)
		return f
	}
	for i := range bpf.MaxRuleEntries {
		var k bpf.FlowKey
		k.Family, k.Proto, k.Dport = 4, 17, uint16(i)
		copy(k.Src[:], []byte{10, 0, 0, byte(i >> 16)})
		rs.Entries = append(rs.Entries, bpf.Entry{
			Key: bpf.RuleKey{Flow: k},
			Val: bpf.RuleVal{Prio: 10, Id: uint32(1 + i%(bpf.MaxRules-1)), Action: uint16(bpf.ActionDrop)},
		})
	}
	if err := s.Apply(rs); err != nil {
		t.Fatal(err)
	}
	for n := range 2000 {
		i := (n * 7919) % bpf.MaxRuleEntries
		if n < 10 {
			i = bpf.MaxRuleEntries - 1 - n
		}
		ret, err := s.XDP.Run(&ebpf.RunOptions{Data: frameOf(i)})
		if err != nil {
			t.Fatal(err)
		}
		if ret != xdpDrop {
			t.Fatalf("entry %d: verdict %d, want drop", i, ret)
		}
		// Absent: a source no entry has.
		f := frameOf(i)
		f[14+15] = 7
		if ret, err = s.XDP.Run(&ebpf.RunOptions{Data: f}); err != nil {
			t.Fatal(err)
		} else if ret != xdpPass {
			t.Fatalf("absent key %d: verdict %d, want pass", i, ret)
		}
	}
	// The entry found is the right one: its rule counts the packet.
	for _, i := range []int{0, 65534, 65535, 99999, bpf.MaxRuleEntries - 1} {
		id := uint32(1 + i%(bpf.MaxRules-1))
		before, err := s.RuleCounter(id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.XDP.Run(&ebpf.RunOptions{Data: frameOf(i)}); err != nil {
			t.Fatal(err)
		}
		after, err := s.RuleCounter(id)
		if err != nil {
			t.Fatal(err)
		}
		if after.Packets != before.Packets+1 {
			t.Fatalf("entry %d: rule %d counted %d packets, want 1", i, id, after.Packets-before.Packets)
		}
	}

	// One entry more is refused, and the installed set stays.
	rs.Entries = append(rs.Entries, bpf.Entry{Key: bpf.RuleKey{}, Val: bpf.RuleVal{Id: 1}})
	if err := s.Apply(rs); !errors.Is(err, bpf.ErrRuleset) {
		t.Fatalf("Apply over the limit = %v, want ErrRuleset", err)
	}
	if ret, _ := s.XDP.Run(&ebpf.RunOptions{Data: frameOf(5)}); ret != xdpDrop {
		t.Fatalf("after a refused Apply: verdict %d, want drop", ret)
	}
}

// TestTCGSODefaultDrop runs the TC egress classifier on a host's own GSO
// super-packets under `default: drop` and rules that pass TCP and UDP: a BIG
// TCP packet (IPv4 total length 0) and a UDP tunnel packet over it (UDP
// length 0 too). As GSO packets (gso_size set, as the stack hands them to the
// hook) they are well-formed and pass; the same frames outside GSO are
// malformed and get the default.
func TestTCGSODefaultDrop(t *testing.T) {
	testenv.RequirePriv(t)
	s, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rs := &bpf.Ruleset{DefaultAction: bpf.ActionDrop, Shapes: []bpf.Shape{{Fields: bpf.FieldProto, MaxPrio: 10}}}
	for i, proto := range []uint8{6, 17} {
		var k bpf.RuleKey
		k.Flow.Proto = proto
		rs.Entries = append(rs.Entries, bpf.Entry{Key: k, Val: bpf.RuleVal{Prio: 10, Id: uint32(i + 1), Action: uint16(bpf.ActionPass)}})
	}
	if err := s.Apply(rs); err != nil {
		t.Fatal(err)
	}
	kern, err := btf.LoadKernelSpec()
	if err != nil {
		t.Fatal(err)
	}
	var skb *btf.Struct
	if err := kern.TypeByName("__sk_buff", &skb); err != nil {
		t.Fatal(err)
	}
	gso := make([]byte, skb.Size)
	for _, m := range skb.Members {
		if m.Name == "gso_size" {
			binary.NativeEndian.PutUint32(gso[m.Offset.Bytes():], 1448)
		}
	}
	bigTCP := append(testenv.UDPFrame(80), make([]byte, 40)...)
	bigTCP[14+9] = 6
	binary.BigEndian.PutUint16(bigTCP[14+2:], 0) // the length does not fit 16 bits
	tunnel := append(testenv.UDPFrame(4789), make([]byte, 40)...)
	binary.BigEndian.PutUint16(tunnel[14+2:], 0)
	binary.BigEndian.PutUint16(tunnel[14+20+4:], 0)
	const tcOK, tcShot = 0, 2
	for name, f := range map[string][]byte{"big-tcp": bigTCP, "udp-tunnel": tunnel} {
		ret, err := s.TCEgress.Run(&ebpf.RunOptions{Data: f, Context: gso})
		if err != nil {
			t.Fatal(err)
		}
		if ret != tcOK {
			t.Errorf("%s GSO packet: verdict %d, want %d (pass: it is well-formed)", name, ret, tcOK)
		}
		ret, err = s.TCEgress.Run(&ebpf.RunOptions{Data: f, Context: make([]byte, skb.Size)})
		if err != nil {
			t.Fatal(err)
		}
		if ret != tcShot {
			t.Errorf("%s frame outside GSO: verdict %d, want %d (malformed: default drop)", name, ret, tcShot)
		}
	}
}
