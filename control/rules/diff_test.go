package rules

import (
	"flag"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

var (
	diffSets    = flag.Int("rules.sets", 10, "generated rule sets TestDifferential compares on")
	diffPackets = flag.Int("rules.packets", 15000, "generated packets per rule set")
	diffSeed    = flag.Uint64("rules.seed", 0, "seed for TestDifferential (0: from the clock)")
)

// TestDifferential runs generated packets through the steering program and
// the Go reference classifier under generated rule sets (several templates
// of mask shapes, rank ranges, IPv4 and IPv6 prefixes, overlapping rules at
// different priorities, malformed packets) and fails on the first
// disagreement. The default run compares 10 × 15000 packets; -rules.sets,
// -rules.packets and -rules.seed make it longer or replay a seed.
func TestDifferential(t *testing.T) {
	h := newHarness(t, 0)
	seed := *diffSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay with -rules.seed=%d)", seed, seed)
	g := newGen(seed, wire.DefaultPort)

	start := time.Now()
	var (
		total, matched, malformed int
		maxShapes                 int
	)
	for set := range *diffSets {
		s := g.ruleSet(t, h.resolve, 40+set*40)
		rs, err := Compile(s, h.resolve, 0)
		if err != nil {
			t.Fatal(err)
		}
		maxShapes = max(maxShapes, len(rs.Shapes))
		a, err := h.apply(s)
		if err != nil {
			t.Fatalf("set %d: %v", set, err)
		}
		hits := map[uint32]bool{}
		err = h.inNS(func() error {
			for i := range *diffPackets {
				frame, iface := g.packet(t, s)
				v, d, err := a.run(frame, uint32(h.ifaces[iface]))
				if err != nil {
					return err
				}
				if d != "" {
					text, _ := Format(s)
					t.Fatalf("set %d packet %d on %s: %s\nframe % x\nrules:\n%s", set, i, iface, d, frame, text)
				}
				hits[v.RuleID] = true
				if v.RuleID != 0 {
					matched++
				}
				if v.Status.Malformed() {
					malformed++
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("set %d: %v", set, err)
		}
		if err := a.checkStats(); err != nil {
			t.Fatalf("set %d: %v", set, err)
		}
		total += *diffPackets
		t.Logf("set %d: %d rules, %d shapes, %d entries, default %v; %d of the rules matched a packet",
			set, len(s.Rules), len(rs.Shapes), len(rs.Entries), s.Default, len(hits)-1)
	}
	t.Logf("%d packets in %v, zero disagreements: %d matched a rule, %d malformed; up to %d shapes in a set",
		total, time.Since(start).Round(time.Millisecond), matched, malformed, maxShapes)
	// A generator that stopped reaching rules, or malformed packets, or
	// many shapes would make the comparison hollow.
	if total >= 100000 {
		if matched < total/2 || malformed < total/50 || maxShapes < 8 {
			t.Errorf("weak coverage: %d of %d matched, %d malformed, at most %d shapes", matched, total, malformed, maxShapes)
		}
	}
}
