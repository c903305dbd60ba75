package service

import (
	"net/netip"
	"slices"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/rules"
)

// FragmentRules returns reserved rules that pass to the kernel the IP
// fragments of a service's UDP datagrams: those to its addresses (to) and
// those from its peers (from). A datagram larger than the path's MTU
// arrives in fragments, which the data plane classifies on L3 alone, with
// ports 0 and no Lovelock fields (docs/steering.md): the service's rules on
// a Lovelock type or a port miss them, and under an operator's `default:
// drop` every fragmented request would be dropped, retransmitted and fail
// without a word. The kernel reassembles what passes.
//
// The rules match UDP with source and destination port 0, which only
// fragments carry (a datagram with port 0 is invalid), so they are
// disjoint from every rule on a port or a Lovelock field: they take no
// traffic from the operator's rules or from other reserved ones. Rules to
// an address have api.OwnedPriority and rules from one the next priority,
// since a fragment from a peer to the service matches both. They are named
// by address, not by service: two services on one address reserve the
// same rule, and Merge keeps one.
func FragmentRules(to, from []netip.Addr) []rules.Rule {
	var out []rules.Rule
	add := func(dir string, prio uint32, addrs []netip.Addr, match func(netip.Prefix) rules.Match) {
		seen := map[netip.Addr]bool{}
		for _, a := range addrs {
			a = a.Unmap()
			if !a.IsValid() || seen[a] {
				continue
			}
			seen[a] = true
			m := match(netip.PrefixFrom(a, a.BitLen()))
			udp, zero := uint8(17), uint16(0)
			m.Proto, m.Sport, m.Dport = &udp, &zero, &zero
			out = append(out, rules.Rule{Name: api.OwnedRulePrefix + "fragments/" + dir + "/" + a.String(), Priority: prio, Match: m, Action: rules.Pass()})
		}
	}
	add("to", api.OwnedPriority, to, func(p netip.Prefix) rules.Match { return rules.Match{Dst: p} })
	add("from", api.OwnedPriority+1, from, func(p netip.Prefix) rules.Match { return rules.Match{Src: p} })
	return out
}

// sameRule reports whether a and b are one rule: same name, priority,
// match and action.
func sameRule(a, b rules.Rule) bool {
	return a.Name == b.Name && a.Priority == b.Priority && a.Action == b.Action &&
		rules.MatchString(a.Match) == rules.MatchString(b.Match)
}

// dedupe drops rules identical to an earlier one (FragmentRules of two
// services on one address), keeping the first.
func dedupe(rs []rules.Rule) []rules.Rule {
	out := rs[:0:0]
	for _, r := range rs {
		if !slices.ContainsFunc(out, func(o rules.Rule) bool { return sameRule(o, r) }) {
			out = append(out, r)
		}
	}
	return out
}
