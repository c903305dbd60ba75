package bpf

import (
	"errors"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// TestApplyNotDrained: the flip of active_set is Apply's commit point. A
// wait for the old set's readers that fails after it reports
// ErrNotDrained with the new set live, and the next Apply still works;
// a failure before it changes nothing and is not ErrNotDrained.
func TestApplyNotDrained(t *testing.T) {
	testenv.RequirePriv(t)
	s, err := Load(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	drops := func(port uint16, id uint32) *Ruleset {
		var k RuleKey
		k.Flow.Proto, k.Flow.Dport = 17, port
		return &Ruleset{
			Shapes:  []Shape{{Fields: FieldProto | FieldDport, MaxPrio: 10}},
			Entries: []Entry{{Key: k, Val: RuleVal{Prio: 10, Id: id, Action: uint16(ActionDrop)}}},
		}
	}
	// live checks that port is dropped (the live set's) and the others pass.
	live := func(when string, port uint16) {
		t.Helper()
		for _, p := range []uint16{7000, 7001, 7002} {
			ret, err := s.XDP.Run(&ebpf.RunOptions{Data: testenv.UDPFrame(p)})
			if err != nil {
				t.Fatal(err)
			}
			want := uint32(2) // XDP_PASS
			if p == port {
				want = 1 // XDP_DROP
			}
			if ret != want {
				t.Errorf("%s: port %d verdict %d, want the set dropping %d live", when, p, ret, port)
			}
		}
	}
	if err := s.Apply(drops(7000, 1)); err != nil {
		t.Fatal(err)
	}
	live("first set", 7000)

	s.drainFault = func() error { return unix.ENOMEM }
	err = s.Apply(drops(7001, 2))
	if !errors.Is(err, ErrNotDrained) || !errors.Is(err, unix.ENOMEM) {
		t.Errorf("failed wait after the flip: %v, want ErrNotDrained wrapping ENOMEM", err)
	}
	live("after a failed wait", 7001)

	// A failure before the flip leaves the live set and is not
	// ErrNotDrained.
	if err := s.Apply(drops(7002, 0)); err == nil || errors.Is(err, ErrNotDrained) {
		t.Errorf("invalid set: %v, want an error other than ErrNotDrained", err)
	}
	live("after a refused set", 7001)

	// The next Apply rewrites the slot whose readers were not waited out.
	s.drainFault = nil
	if err := s.Apply(drops(7002, 3)); err != nil {
		t.Fatalf("Apply after a failed wait: %v", err)
	}
	live("third set", 7002)
	if err := s.Apply(drops(7000, 1)); err != nil {
		t.Fatalf("Apply over the second set's slot: %v", err)
	}
	live("fourth set", 7000)
}
