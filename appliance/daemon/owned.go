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
			errs = append(errs, fmt.Sprintf("rule %q: names starting with %q belong to lovelockd's own rules (the steering of its services' traffic, see 'lovelock rule list'); rename it",
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
		out = append(out, fmt.Sprintf("rule %q (priority %d) also matches a service's traffic, which lovelockd's rule %s%s (priority %d) takes first",
			r.Name, r.Priority, hit[0], more, api.OwnedPriority))
	}
	return out
}

// overlaps reports whether a packet can exist that both m and own match,
// field by field: two set fields that exclude each other make the matches
// disjoint. Lovelock header fields imply UDP to port.
func overlaps(m, own rules.Match, port uint16) bool {
	proto, dport := lovelockImplied(own, port)
	mproto, mdport := lovelockImplied(m, port)
	dstFamily := own.Dst
	if !dstFamily.IsValid() {
		dstFamily = own.Src
	}
	switch {
	case m.Iface != "" && own.Iface != "" && m.Iface != own.Iface:
	case m.Dst.IsValid() && own.Dst.IsValid() && !m.Dst.Overlaps(own.Dst):
	case m.Src.IsValid() && own.Src.IsValid() && !m.Src.Overlaps(own.Src):
	case (m.Src.IsValid() || m.Dst.IsValid()) && dstFamily.IsValid() && familyOf(m) != dstFamily.Addr().Is4():
	case mproto != nil && proto != nil && *mproto != *proto:
	case mdport != nil && dport != nil && *mdport != *dport:
	case m.Sport != nil && own.Sport != nil && *m.Sport != *own.Sport:
	case m.Type != nil && own.Type != nil && *m.Type != *own.Type:
	case m.Tenant != nil && own.Tenant != nil && *m.Tenant != *own.Tenant:
	case !destOverlaps(m, own):
	default:
		return true
	}
	return false
}

// lovelockImplied returns m's protocol and destination port, with the UDP
// and port that its Lovelock header fields imply.
func lovelockImplied(m rules.Match, port uint16) (*uint8, *uint16) {
	if m.Type != nil || m.Tenant != nil || m.Rank != nil || m.Region != nil {
		udp := uint8(17)
		return &udp, &port
	}
	return m.Proto, m.Dport
}

// familyOf says whether m's prefixes are IPv4 (they agree on the family).
func familyOf(m rules.Match) bool {
	if m.Dst.IsValid() {
		return m.Dst.Addr().Is4()
	}
	return m.Src.Addr().Is4()
}

// destOverlaps compares the Lovelock destination field, which Rank (a
// range) and Region (one value) both match.
func destOverlaps(m, own rules.Match) bool {
	lo1, hi1, ok1 := destRange(m)
	lo2, hi2, ok2 := destRange(own)
	return !ok1 || !ok2 || (lo1 <= hi2 && lo2 <= hi1)
}

func destRange(m rules.Match) (lo, hi uint32, ok bool) {
	switch {
	case m.Rank != nil:
		return m.Rank.Lo, m.Rank.Hi, true
	case m.Region != nil:
		return *m.Region, *m.Region, true
	}
	return 0, 0, false
}
