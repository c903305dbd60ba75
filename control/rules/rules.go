// Package rules owns Lovelock's steering rules: their model and file format
// (YAML or JSON), their validation, their compilation into the tuple-space
// rule set the data plane looks packets up in (bpf.Ruleset: one hash table
// per mask shape), and a Go reference classifier with the data plane's
// semantics that tests hold the BPF classifier against. Nothing else turns
// rules into map entries.
//
// A rule matches on fields of the flow key the data plane extracts
// (wire.Flow plus the ingress interface): ingress interface, IPv4 or IPv6
// source and destination prefixes, IP protocol, L4 ports, and the Lovelock
// type, tenant and destination rank or region. The highest-priority matching
// rule decides; packets no rule matches and malformed packets get the set's
// default action. docs/rules.md describes the format, the validation rules and
// how rules compile into shapes.
package rules

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// Set is a whole rule set: what the data plane holds at one time.
type Set struct {
	// Default applies to packets no rule matches and to malformed packets.
	Default Action
	// Rules in file order. Their order matters only for assigning IDs.
	Rules []Rule
}

// Rule is one steering rule.
type Rule struct {
	// Name identifies the rule in errors and listings; required, unique.
	Name string
	// ID indexes the rule's counters in the data plane, 1..MaxID. 0 means
	// "assign one": such rules get the lowest IDs no other rule names, in
	// rule order (see IDs).
	ID uint32
	// Priority orders rules; the highest matching priority wins. Two rules
	// with the same priority must not both match any packet.
	Priority uint32
	// Match says which packets the rule applies to; an empty Match matches
	// every well-formed packet.
	Match Match
	// Action is what happens to matching packets.
	Action Action
}

// Match is a rule's conditions. Every set field must match; unset fields
// (zero Prefix, empty Iface, nil pointers) match anything, so a pointer to 0
// matches the value 0.
type Match struct {
	// Iface is the ingress interface's name, resolved to an ifindex when the
	// set is compiled.
	Iface string
	// Src and Dst are source and destination prefixes. A prefix implies its
	// address family (0.0.0.0/0 matches every IPv4 packet); src and dst must
	// agree on it. Host bits must be zero.
	Src, Dst netip.Prefix
	// Proto is the IP protocol (after IPv6 extension headers).
	Proto *uint8
	// Sport and Dport are exact TCP or UDP ports; they need Proto tcp or udp.
	Sport, Dport *uint16
	// Type is the Lovelock message type; it must be a known wire.Type.
	Type *wire.Type
	// Tenant is the Lovelock tenant.
	Tenant *uint32
	// Rank is the Lovelock destination rank, a single one (Lo == Hi) or an
	// inclusive range.
	Rank *RankRange
	// Region is the Lovelock destination region: the same header field as
	// Rank, matched exactly. A rule sets at most one of Rank and Region.
	Region *uint32
}

// RankRange is an inclusive range of Lovelock destination ranks.
type RankRange struct {
	Lo, Hi uint32
}

// String formats r as the file format writes it: "5" or "3-9".
func (r RankRange) String() string {
	if r.Lo == r.Hi {
		return strconv.FormatUint(uint64(r.Lo), 10)
	}
	return fmt.Sprintf("%d-%d", r.Lo, r.Hi)
}

// hasLovelock reports whether m matches on a Lovelock header field; such a
// rule matches valid Lovelock packets only.
func (m *Match) hasLovelock() bool {
	return m.Type != nil || m.Tenant != nil || m.Rank != nil || m.Region != nil
}

// MaxID is the highest rule ID: the data plane has counters for IDs
// 0..bpf.MaxRules-1, and 0 counts default verdicts.
const MaxID = bpf.MaxRules - 1

// Action is what the data plane does with a packet: pass it to the kernel,
// drop it, redirect it out of an interface, or hand it to the AF_XDP socket
// of a queue. Its text form is "pass", "drop", "redirect:<iface>" or
// "xsk:<queue>".
type Action struct {
	// Verb is the kind of action.
	Verb bpf.Action
	// Iface is the interface a redirect sends packets out of.
	Iface string
	// Queue is the xsk slot (0..bpf.MaxXSKQueues-1) for ActionXSK. On TC
	// hooks, where AF_XDP sockets are out of reach, and while the slot holds
	// no socket, xsk packets pass to the kernel.
	Queue uint32
}

// Pass is the action that hands packets to the kernel stack.
func Pass() Action { return Action{Verb: bpf.ActionPass} }

// Drop is the action that drops packets.
func Drop() Action { return Action{Verb: bpf.ActionDrop} }

// Redirect is the action that sends packets out of iface.
func Redirect(iface string) Action { return Action{Verb: bpf.ActionRedirect, Iface: iface} }

// XSK is the action that hands packets to the AF_XDP socket of queue.
func XSK(queue uint32) Action { return Action{Verb: bpf.ActionXSK, Queue: queue} }

// ParseAction parses "pass", "drop", "redirect:<iface>" or "xsk:<queue>".
func ParseAction(s string) (Action, error) {
	verb, arg, hasArg := strings.Cut(s, ":")
	switch verb {
	case "pass", "drop":
		if hasArg {
			return Action{}, fmt.Errorf("action %q: %s takes no argument", s, verb)
		}
		if verb == "pass" {
			return Pass(), nil
		}
		return Drop(), nil
	case "redirect":
		if arg == "" {
			return Action{}, fmt.Errorf("action %q: want redirect:<iface>", s)
		}
		return Redirect(arg), nil
	case "xsk":
		q, err := strconv.ParseUint(arg, 10, 32)
		if err != nil || q >= bpf.MaxXSKQueues {
			return Action{}, fmt.Errorf("action %q: want xsk:<queue> with queue 0..%d", s, bpf.MaxXSKQueues-1)
		}
		return XSK(uint32(q)), nil
	case "":
		return Action{}, errors.New("no action: want pass, drop, redirect:<iface> or xsk:<queue>")
	}
	return Action{}, fmt.Errorf("action %q: want pass, drop, redirect:<iface> or xsk:<queue>", s)
}

// String formats a as ParseAction reads it.
func (a Action) String() string {
	switch a.Verb {
	case bpf.ActionRedirect:
		return "redirect:" + a.Iface
	case bpf.ActionXSK:
		return "xsk:" + strconv.FormatUint(uint64(a.Queue), 10)
	}
	return a.Verb.String()
}

// MarshalText implements encoding.TextMarshaler with String's form.
func (a Action) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseAction.
func (a *Action) UnmarshalText(b []byte) error {
	v, err := ParseAction(string(b))
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// Resolver maps an interface name to its ifindex. Compile, Validate and
// NewClassifier call it for every interface a set names (once per name).
type Resolver func(name string) (ifindex int, err error)

// LinkResolver resolves names among the interfaces of the calling thread's
// network namespace.
func LinkResolver(name string) (int, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return 0, err
	}
	return ifi.Index, nil
}

// ProtoName returns the file format's name for an IP protocol (udp, tcp,
// icmp, icmpv6), or its number.
func ProtoName(p uint8) string {
	switch p {
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 58:
		return "icmpv6"
	}
	return strconv.Itoa(int(p))
}

// ParseProto parses an IP protocol name (udp, tcp, icmp, icmpv6) or
// number (0..255).
func ParseProto(s string) (uint8, error) {
	switch s {
	case "icmp":
		return 1, nil
	case "tcp":
		return 6, nil
	case "udp":
		return 17, nil
	case "icmpv6":
		return 58, nil
	}
	n, err := strconv.ParseUint(s, 10, 8)
	if err != nil {
		return 0, fmt.Errorf("proto %q: want udp, tcp, icmp, icmpv6 or a number 0..255", s)
	}
	return uint8(n), nil
}

// ParseType parses a Lovelock type name as wire.Type's String writes it
// ("bundle", "mem-read", ...) or a number, which must be a known type.
func ParseType(s string) (wire.Type, error) {
	for _, t := range wire.Types() {
		if t.String() == s {
			return t, nil
		}
	}
	n, err := strconv.ParseUint(s, 0, 8)
	if err != nil {
		return 0, fmt.Errorf("lovelock type %q: want one of %s, or its number", s, typeNames())
	}
	if t := wire.Type(n); !t.Known() {
		return 0, fmt.Errorf("lovelock type %#02x is not a known type (%s): no valid packet carries it", n, typeNames())
	}
	return wire.Type(n), nil
}

func typeNames() string {
	var names []string
	for _, t := range wire.Types() {
		names = append(names, t.String())
	}
	return strings.Join(names, ", ")
}

// ParseRank parses a rank "5" or an inclusive range "3-9".
func ParseRank(s string) (RankRange, error) {
	lo, hi, isRange := strings.Cut(s, "-")
	l, err := strconv.ParseUint(strings.TrimSpace(lo), 10, 32)
	if err != nil {
		return RankRange{}, fmt.Errorf("rank %q: want a number or a range lo-hi (0..%d)", s, uint32(1<<32-1))
	}
	h := l
	if isRange {
		if h, err = strconv.ParseUint(strings.TrimSpace(hi), 10, 32); err != nil {
			return RankRange{}, fmt.Errorf("rank %q: want a number or a range lo-hi (0..%d)", s, uint32(1<<32-1))
		}
	}
	return RankRange{Lo: uint32(l), Hi: uint32(h)}, nil
}
