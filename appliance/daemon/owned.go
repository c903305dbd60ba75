package daemon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/rules"
)

// lovelockd's own rules (api.OwnedRulePrefix, api.OwnedPriority) live only
// in memory: they are merged with the operator's set at every swap, and
// the state file keeps the operator's set alone. The data plane outlives
// the daemon, so a daemon that dies without removing them leaves them
// live; the next daemon's first swap (reconcile) replaces the live set with
// the operator's, and its agent installs them again.

// operatorSet checks a rule set an operator sent: it may not use the name
// prefix or the priority band of lovelockd's own rules. A rule that is
// identical (but for its ID) to one of owned, as `lovelock rules -o json`
// lists them, is dropped from the set instead: a listed set applies back.
func operatorSet(set rules.Set, owned []rules.Rule) (rules.Set, error) {
	set.Rules = slices.Clone(set.Rules)
	var errs []string
	keep := set.Rules[:0]
	for _, r := range set.Rules {
		switch {
		case api.IsOwned(r.Name):
			if slices.ContainsFunc(owned, func(o rules.Rule) bool { return sameRule(o, r) }) {
				continue
			}
			errs = append(errs, fmt.Sprintf("rule %q: names starting with %q belong to lovelockd's own rules (the messaging agent's AF_XDP steering, see 'lovelock rule list'); rename it",
				r.Name, api.OwnedRulePrefix))
		case r.Priority >= api.OwnedPriority:
			errs = append(errs, fmt.Sprintf("rule %q: priority %d is in the band lovelockd reserves for its own rules (%d and up); use a lower one",
				r.Name, r.Priority, api.OwnedPriority))
		default:
			keep = append(keep, r)
		}
	}
	set.Rules = keep
	if len(errs) > 0 {
		return set, &api.BadRequestError{Err: fmt.Errorf("rules: %s", strings.Join(errs, "; "))}
	}
	return set, nil
}

// sameRule compares two rules as the rule file writes them, IDs aside.
func sameRule(a, b rules.Rule) bool {
	a.ID, b.ID = 0, 0
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}

// shadowed returns a warning for each operator rule that can match a
// packet one of lovelockd's own rules matches: lovelockd's rules have the
// higher priority, so the operator's rule does not see those packets.
func shadowed(op rules.Set, owned []rules.Rule, port uint16) []string {
	var out []string
	for _, r := range op.Rules {
		var hit []string
		for _, o := range owned {
			if overlaps(r.Match, o.Match, port) {
				hit = append(hit, o.Name)
			}
		}
		if len(hit) == 0 {
			continue
		}
		more := ""
		if len(hit) > 1 {
			more = fmt.Sprintf(" and %d more", len(hit)-1)
		}
		out = append(out, fmt.Sprintf("rule %q (priority %d) also matches the messaging agent's traffic, which lovelockd's rule %s%s (priority %d) takes first",
			r.Name, r.Priority, hit[0], more, api.OwnedPriority))
	}
	return out
}

// overlaps reports whether a packet exists that both m and own match. own
// is one of msgRules' matches: an interface, a /32 destination, a
// Lovelock type, tenant and single rank, which imply UDP to port.
func overlaps(m, own rules.Match, port uint16) bool {
	rank := own.Rank.Lo
	switch {
	case m.Iface != "" && m.Iface != own.Iface:
	case m.Dst.IsValid() && !m.Dst.Contains(own.Dst.Addr()):
	case m.Src.IsValid() && m.Src.Addr().Is4() != own.Dst.Addr().Is4():
	case m.Proto != nil && *m.Proto != 17:
	case m.Dport != nil && *m.Dport != port:
	case m.Type != nil && *m.Type != *own.Type:
	case m.Tenant != nil && *m.Tenant != *own.Tenant:
	case m.Rank != nil && (rank < m.Rank.Lo || rank > m.Rank.Hi):
	case m.Region != nil && *m.Region != rank:
	default:
		return true
	}
	return false
}
