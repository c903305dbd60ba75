package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// Layouts of the rule set map, generated from include/rules.h.
type (
	// FlowKey is what rules match on (struct flow_key).
	FlowKey = steerFlowKey
	// RuleKey is a rule set map key: a shape index and a masked flow key.
	RuleKey = steerRuleKey
	// RuleVal is a rule set map value: priority, rule ID, action, argument.
	RuleVal = steerRuleVal
	// Shape is a mask shape: which fields are exact and how many prefix bits.
	Shape = steerShape
)

// Limits compiled into the data plane (include/rules.h).
const (
	MaxShapes      = 32     // distinct mask shapes in one rule set
	MaxRules       = 65536  // rule IDs are 1..MaxRules-1; 0 counts default verdicts
	MaxRuleEntries = 262144 // map entries in one rule set, META entries included
	MaxXSKQueues   = 64     // slots of the AF_XDP socket map
	metaShape      = ^uint32(0)
	metaHdr        = ^uint32(0)
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
)

// Action is what the data plane does with a packet (enum action).
type Action uint16

// Actions.
const (
	ActionPass     Action = 0 // to the kernel stack
	ActionDrop     Action = 1 // nowhere
	ActionRedirect Action = 2 // out of interface Arg
	ActionXSK      Action = 3 // to the AF_XDP socket in slot Arg (XDP only; TC passes)
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

// Entry is one rule set map entry.
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
	if n := len(rs.Entries) + len(rs.Shapes) + 1; n > MaxRuleEntries {
		return fmt.Errorf("%d map entries, the data plane holds %d: %w", n, MaxRuleEntries, ErrRuleset)
	}
	for i := 1; i < len(rs.Shapes); i++ {
		if rs.Shapes[i].MaxPrio > rs.Shapes[i-1].MaxPrio {
			return fmt.Errorf("shape %d has a higher priority than shape %d: %w", i, i-1, ErrRuleset)
		}
	}
	seen := make(map[RuleKey]uint32, len(rs.Entries))
	for _, e := range rs.Entries {
		if id, dup := seen[e.Key]; dup {
			return fmt.Errorf("rules %d and %d compile to the same key: %w", id, e.Val.Id, ErrRuleset)
		}
		seen[e.Key] = e.Val.Id
		if int(e.Key.Shape) >= len(rs.Shapes) {
			return fmt.Errorf("entry for rule %d names shape %d of %d: %w", e.Val.Id, e.Key.Shape, len(rs.Shapes), ErrRuleset)
		}
		if e.Val.Id == 0 || e.Val.Id >= MaxRules {
			return fmt.Errorf("rule ID %d outside 1..%d: %w", e.Val.Id, MaxRules-1, ErrRuleset)
		}
	}
	return nil
}

// metaEntries encodes the shapes and the header as META entries. The C side
// reads their values as struct shape and struct ruleset_hdr, which have
// rule_val's size; the packing below follows those structs' layouts.
func (rs *Ruleset) metaEntries() []Entry {
	out := make([]Entry, 0, len(rs.Shapes)+1)
	for i, sh := range rs.Shapes {
		var k RuleKey
		k.Shape, k.Flow.Ifindex = metaShape, uint32(i)
		// struct shape: fields, src_len, dst_len, rank_len | max_prio | pad.
		out = append(out, Entry{Key: k, Val: RuleVal{
			Prio: uint32(sh.Fields) | uint32(sh.SrcLen)<<8 | uint32(sh.DstLen)<<16 | uint32(sh.RankLen)<<24,
			Id:   sh.MaxPrio,
		}})
	}
	var k RuleKey
	k.Shape, k.Flow.Ifindex = metaShape, metaHdr
	// struct ruleset_hdr: nshapes | default_id | default_action, pad | default_arg.
	out = append(out, Entry{Key: k, Val: RuleVal{
		Prio: uint32(len(rs.Shapes)), Action: uint16(rs.DefaultAction), Arg: rs.DefaultArg,
	}})
	return out
}

// Apply installs rs as the live rule set, atomically: it fills a new map and
// swaps it into the one-slot rulesets array. When Apply returns, no packet is
// still being classified by the previous set (the kernel waits for running
// programs when a map-in-map slot changes).
func (s *Steer) Apply(rs *Ruleset) error {
	if err := rs.Validate(); err != nil {
		return err
	}
	m, err := ebpf.NewMap(s.inner.Copy())
	if err != nil {
		return fmt.Errorf("steer: create rule set map: %w", err)
	}
	defer m.Close()

	entries := append(rs.metaEntries(), rs.Entries...)
	keys := make([]RuleKey, len(entries))
	vals := make([]RuleVal, len(entries))
	for i, e := range entries {
		keys[i], vals[i] = e.Key, e.Val
	}
	if _, err := m.BatchUpdate(keys, vals, nil); err != nil {
		return fmt.Errorf("steer: fill rule set map (%d entries): %w", len(entries), err)
	}
	if err := s.rulesets.Update(uint32(0), m, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("steer: swap in rule set: %w", err)
	}
	return nil
}
