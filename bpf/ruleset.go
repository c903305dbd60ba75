package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// FlowKey is what rules match on (struct flow_key, generated from
// include/parse.h).
type FlowKey = steerFlowKey

// RuleKey is the key of a compiled rule: a shape index and a flow key masked
// by that shape.
type RuleKey struct {
	Shape uint32
	Flow  FlowKey
}

// RuleVal is the verdict of a compiled rule.
type RuleVal struct {
	Prio   uint32 // higher wins
	Id     uint32 // rule ID, 1..MaxRules-1: index of its counters
	Action uint16 // an Action
	Arg    uint32 // ifindex for ActionRedirect, queue for ActionXSK
}

// Layouts of the rule table and its shapes (include/rules.h).
type (
	ruleEntry = steerRuleEntry
	shapeset  = steerShapeset
)

// Shape is a mask shape: which fields are matched exactly and how many
// prefix bits of the addresses and the rank. The data plane stores it as a
// mask over the flow key (Mask).
type Shape struct {
	Fields  uint8  // Field* bits
	SrcLen  uint8  // source prefix bits (0..32 for IPv4 keys, 0..128 for IPv6)
	DstLen  uint8  // destination prefix bits
	RankLen uint8  // high bits of the Lovelock rank (0..32)
	MaxPrio uint32 // highest priority among the shape's rules
}

// Mask returns the flow key mask of the shape: a packet's key ANDed with it
// is the key its rules are stored under.
func (sh Shape) Mask() FlowKey {
	var m FlowKey
	ones := func(bit uint8) uint32 {
		if sh.Fields&bit != 0 {
			return ^uint32(0)
		}
		return 0
	}
	m.Ifindex = ones(FieldIfindex)
	m.Family = uint8(ones(FieldFamily))
	m.Proto = uint8(ones(FieldProto))
	m.LlType = uint8(ones(FieldLLType))
	m.Sport = uint16(ones(FieldSport))
	m.Dport = uint16(ones(FieldDport))
	m.Tenant = ones(FieldTenant)
	// Pad masks nothing (a packet's key has pad 0): it carries the
	// shape's flags to the data plane.
	if sh.Fields&FieldLovelock != 0 {
		m.Pad = uint8(steerShapeFlagsSHAPE_LOVELOCK)
	}
	prefix(m.Src[:], int(sh.SrcLen))
	prefix(m.Dst[:], int(sh.DstLen))
	if sh.RankLen > 0 {
		m.Rank = ^uint32(0) << (32 - min(uint32(sh.RankLen), 32))
	}
	return m
}

// prefix sets the first bits bits of b.
func prefix(b []byte, bits int) {
	for i := range b {
		switch {
		case bits >= 8:
			b[i] = 0xff
		case bits > 0:
			b[i] = 0xff << (8 - bits)
		}
		bits -= 8
	}
}

// Masked returns k with only the shape's bits kept.
func (sh Shape) Masked(k FlowKey) FlowKey {
	m := sh.Mask()
	k.Ifindex &= m.Ifindex
	k.Family &= m.Family
	k.Proto &= m.Proto
	k.LlType &= m.LlType
	k.Pad = 0
	for i := range k.Src {
		k.Src[i] &= m.Src[i]
		k.Dst[i] &= m.Dst[i]
	}
	k.Sport &= m.Sport
	k.Dport &= m.Dport
	k.Tenant &= m.Tenant
	k.Rank &= m.Rank
	return k
}

// Limits compiled into the data plane (enum rule_limits in
// include/rules.h). The build fails when one differs from the value bpf2go
// generated (bpf/contract.go), and Load checks the map sizes against the
// object (checkSpec), so none can drift from the C side unnoticed.
const (
	MaxShapes      = len(shapeset{}.Shapes) // distinct mask shapes in one rule set (MAX_SHAPES)
	MaxRules       = 65536                  // rule IDs are 1..MaxRules-1; 0 counts default verdicts (MAX_RULES: rule_stats' size)
	MaxRuleEntries = tableSize / 2          // entries in one rule set (MAX_RULE_ENTRIES: half the table's slots)
	// MaxXSKQueues bounds the queue of an xsk:<queue> action. It is
	// Lovelock's choice, not a C limit: sockets are found by (interface,
	// queue) in a map of MaxXSKSockets slots.
	MaxXSKQueues = 64
)

// Shape.Fields bits: fields matched exactly.
const (
	FieldIfindex uint8 = 1 << iota
	FieldFamily
	FieldProto
	FieldLLType
	FieldSport
	FieldDport
	FieldTenant
	// FieldLovelock is no field: it marks a shape whose rules match
	// Lovelock fields (type, tenant, rank), which match valid Lovelock
	// packets only. The data plane skips such a shape for UDP to the
	// Lovelock port whose Lovelock header failed its checks: that packet
	// is classified on its L3/L4 fields, and its Lovelock fields are zero,
	// which a tenant 0 or rank 0 rule would otherwise match
	// (SHAPE_LOVELOCK in include/rules.h).
	FieldLovelock
)

// Action is what the data plane does with a packet (enum action). The
// values come from the object's BTF through bpf2go (steerAction).
type Action uint16

// Actions.
const (
	ActionPass     = Action(steerActionACT_PASS)     // to the kernel stack
	ActionDrop     = Action(steerActionACT_DROP)     // nowhere
	ActionRedirect = Action(steerActionACT_REDIRECT) // out of interface Arg
	ActionXSK      = Action(steerActionACT_XSK)      // to the AF_XDP socket in slot Arg (XDP only; TC passes)
)

func (a Action) String() string {
	switch a {
	case ActionPass:
		return "pass"
	case ActionDrop:
		return "drop"
	case ActionRedirect:
		return "redirect"
	case ActionXSK:
		return "xsk"
	}
	return fmt.Sprintf("action(%d)", uint16(a))
}

// Entry is one compiled rule: the key it is stored under and its verdict.
type Entry struct {
	Key RuleKey
	Val RuleVal
}

// Ruleset is a compiled rule set as the kernel stores it. control/rules
// builds it; Validate checks the invariants the C lookup relies on.
type Ruleset struct {
	// Shapes in lookup order: descending MaxPrio.
	Shapes []Shape
	// Entries keyed by shape index and masked flow key.
	Entries []Entry
	// DefaultAction and DefaultArg apply to malformed packets and packets
	// no rule matches.
	DefaultAction Action
	DefaultArg    uint32
}

// ErrRuleset reports a rule set the data plane cannot hold.
var ErrRuleset = errors.New("invalid compiled rule set")

// Validate checks limits and ordering.
func (rs *Ruleset) Validate() error {
	if len(rs.Shapes) > MaxShapes {
		return fmt.Errorf("%d mask shapes, the data plane holds %d: %w", len(rs.Shapes), MaxShapes, ErrRuleset)
	}
	if n := len(rs.Entries); n > MaxRuleEntries {
		return fmt.Errorf("%d entries, the data plane holds %d: %w", n, MaxRuleEntries, ErrRuleset)
	}
	for i := 1; i < len(rs.Shapes); i++ {
		if rs.Shapes[i].MaxPrio > rs.Shapes[i-1].MaxPrio {
			return fmt.Errorf("shape %d has a higher priority than shape %d: %w", i, i-1, ErrRuleset)
		}
	}
	seen := make(map[RuleKey]uint32, len(rs.Entries))
	for _, e := range rs.Entries {
		if int(e.Key.Shape) < len(rs.Shapes) && rs.Shapes[e.Key.Shape].Masked(e.Key.Flow) != e.Key.Flow {
			return fmt.Errorf("entry for rule %d has bits outside its shape's mask: %w", e.Val.Id, ErrRuleset)
		}
		if id, dup := seen[e.Key]; dup {
			return fmt.Errorf("rules %d and %d compile to the same key: %w", id, e.Val.Id, ErrRuleset)
		}
		seen[e.Key] = e.Val.Id
		if int(e.Key.Shape) >= len(rs.Shapes) {
			return fmt.Errorf("entry for rule %d names shape %d of %d: %w", e.Val.Id, e.Key.Shape, len(rs.Shapes), ErrRuleset)
		}
		if e.Val.Action > 0xff {
			return fmt.Errorf("rule %d has action %d: %w", e.Val.Id, e.Val.Action, ErrRuleset)
		}
		if e.Val.Id == 0 || e.Val.Id >= MaxRules {
			return fmt.Errorf("rule ID %d outside 1..%d: %w", e.Val.Id, MaxRules-1, ErrRuleset)
		}
	}
	return nil
}

// ErrNotDrained reports an Apply whose new rule set is live, but whose
// wait for the readers of the previous one failed. The set was applied:
// callers keep it as their state and warn. The next Apply waits the
// readers out before it rewrites their slot.
var ErrNotDrained = errors.New("the new rule set is live; readers of the previous one were not waited out")

// Apply installs rs as the live rule set, atomically. The data plane has two
// slots, each a rule table and the shapeset built for it, and active_set
// names the live one. Apply fills a fresh table for the other slot and puts
// it there, which returns only after the kernel waited for every running
// program, so no packet still reads that slot when Apply rewrites its
// shapeset; then it flips active_set, and replaces the old slot's table with
// itself to wait out that slot's readers in the same way, so that when
// Apply returns no packet is still being classified by the previous set.
//
// The flip is the commit point. An error before it leaves the previous set
// live. An error after it wraps ErrNotDrained: the new set is live and the
// caller must treat it as applied. Its slot is safe all the same, since the
// next Apply, in this process or another, waits out the slot's readers
// before it rewrites it.
func (s *Steer) Apply(rs *Ruleset) error {
	if err := rs.Validate(); err != nil {
		return err
	}
	t, err := buildTable(rs)
	if err != nil {
		return err
	}
	var live uint32
	if err := s.activeSet.Lookup(uint32(0), &live); err != nil {
		return fmt.Errorf("steer: read live slot: %w", err)
	}
	live &= 1
	slot := 1 - live

	m, err := ebpf.NewMap(s.inner.Copy())
	if err != nil {
		return fmt.Errorf("steer: create rule table: %w", err)
	}
	defer m.Close()
	if len(t.slots) > 0 {
		if _, err := m.BatchUpdate(t.slots, t.entries, nil); err != nil {
			return fmt.Errorf("steer: fill rule table (%d entries): %w", len(t.slots), err)
		}
	}
	ss := shapeset{Nshapes: uint32(len(rs.Shapes)), DefaultAction: uint16(rs.DefaultAction), DefaultArg: rs.DefaultArg, Seed: t.seed}
	for i, sh := range rs.Shapes {
		ss.Shapes[i].Mask, ss.Shapes[i].MaxPrio = sh.Mask(), sh.MaxPrio
	}
	// Putting the table in waits out the slot's readers, which the Apply
	// that left the slot did too unless its wait failed (ErrNotDrained):
	// only then is the shapeset, rewritten in place, safe to write.
	if err := s.rulesets.Update(slot, m, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("steer: install rule set map: %w", err)
	}
	if err := s.shapesets.Update(slot, &ss, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("steer: write shapes: %w", err)
	}
	if err := s.activeSet.Update(uint32(0), slot, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("steer: swap in rule set: %w", err)
	}
	if err := s.waitReaders(live); err != nil {
		return fmt.Errorf("%w: %w", ErrNotDrained, err)
	}
	return nil
}

// waitReaders returns once no program can still be using slot: it writes the
// slot's map back into its place, and the kernel waits for running programs
// before a map-in-map update returns.
func (s *Steer) waitReaders(slot uint32) error {
	if s.drainFault != nil {
		if err := s.drainFault(); err != nil {
			return fmt.Errorf("steer: wait for readers of the old rule set: %w", err)
		}
	}
	var id ebpf.MapID
	if err := s.rulesets.Lookup(slot, &id); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil // never installed: nothing can be using it
		}
		return fmt.Errorf("steer: read old rule set: %w", err)
	}
	old, err := ebpf.NewMapFromID(id)
	if err != nil {
		return fmt.Errorf("steer: open old rule set: %w", err)
	}
	defer old.Close()
	if err := s.rulesets.Update(slot, old, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("steer: wait for readers of the old rule set: %w", err)
	}
	return nil
}
