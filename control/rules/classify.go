package rules

import (
	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// Verdict is what a classifier decided for one packet.
type Verdict struct {
	// RuleID is the matching rule's ID, 0 for the default action.
	RuleID uint32
	// Action and Arg are what the data plane does: Arg is the ifindex of a
	// redirect and the queue of an xsk action.
	Action bpf.Action
	Arg    uint32
	// Status is the parser's verdict on the packet's headers. Malformed
	// packets (Status.Malformed) get the default action, except those
	// with BadLovelock.
	Status wire.Status
	// BadLovelock: UDP to the Lovelock port whose L3/L4 headers are valid
	// and whose Lovelock header alone failed its checks
	// (wire.Frame.BadLovelock). Status is malformed, and rules without
	// Lovelock fields match its L3/L4 fields.
	BadLovelock bool
}

// Classifier is the Go reference classifier: the data plane's semantics
// without its data structures. It parses with wire.ParseFrame and scans the
// rules as written, linearly, for the highest-priority match, so tests that
// compare it with the BPF classifier check Compile's tuple-space encoding
// too. It is for tests and tools, not for the packet path. A Classifier is
// safe for concurrent use.
type Classifier struct {
	c *checked
}

// NewClassifier validates s as Validate does and returns its classifier.
// port is the Lovelock UDP port (0: the wire default), as the data plane was
// loaded with.
func NewClassifier(s *Set, resolve Resolver, port uint16) (*Classifier, error) {
	c, _, err := check(s, resolve, port)
	if err != nil {
		return nil, err
	}
	return &Classifier{c: c}, nil
}

// Classify decides what the data plane does with frame arriving on the
// interface ifindex.
func (cl *Classifier) Classify(frame []byte, ifindex uint32) Verdict {
	c := cl.c
	fr, err := wire.ParseFrame(frame, c.port)
	v := Verdict{Action: c.defAction, Arg: c.defArg, Status: wire.StatusOf(err), BadLovelock: fr.BadLovelock}
	if v.Status.Malformed() && !v.BadLovelock {
		return v
	}
	var best *checkedRule
	for i := range c.rules {
		r := &c.rules[i]
		if (best == nil || r.prio > best.prio) && r.matches(&fr.Flow, ifindex, v.Status) {
			best = r
		}
	}
	if best != nil {
		v.RuleID, v.Action, v.Arg = best.id, best.action, best.arg
	}
	return v
}

// matches says whether the rule, as written, matches a well-formed packet,
// or one whose Lovelock header alone is bad (st is then malformed, and
// Lovelock fields match nothing). It reads Match, not the compiled key, on
// purpose.
func (r *checkedRule) matches(f *wire.Flow, ifindex uint32, st wire.Status) bool {
	m := &r.m
	switch {
	case r.ifindex != 0 && ifindex != r.ifindex:
		return false
	case m.Src.IsValid() && !m.Src.Contains(f.Src):
		return false
	case m.Dst.IsValid() && !m.Dst.Contains(f.Dst):
		return false
	case m.Proto != nil && f.Proto != *m.Proto:
		return false
	case m.Sport != nil && f.Sport != *m.Sport:
		return false
	case m.Dport != nil && f.Dport != *m.Dport:
		return false
	case !m.hasLovelock():
		return true
	}
	// Lovelock fields match valid Lovelock packets only.
	switch {
	case st != wire.StatusOK:
		return false
	case m.Type != nil && f.Type != *m.Type:
		return false
	case m.Tenant != nil && f.Tenant != *m.Tenant:
		return false
	case m.Rank != nil && (f.Rank < m.Rank.Lo || f.Rank > m.Rank.Hi):
		return false
	case m.Region != nil && f.Rank != *m.Region:
		return false
	}
	return true
}
