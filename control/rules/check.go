package rules

import (
	"errors"
	"fmt"
	"math/bits"
	"net/netip"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// maxErrors bounds how many problems one error reports; a set of 64k rules
// with one mistake repeated should not print 64k lines.
const maxErrors = 10

// checked is a validated set: every name resolved, every rule turned into
// the exact values and prefixes it matches. Validate, Compile and
// NewClassifier share it.
type checked struct {
	port      uint16
	defAction bpf.Action
	defArg    uint32
	rules     []checkedRule // in set order
}

type checkedRule struct {
	idx     int // position in the set
	name    string
	id      uint32
	prio    uint32
	action  bpf.Action
	arg     uint32
	ifindex uint32 // 0: any interface
	m       Match  // as written, for the reference classifier

	// What Compile puts into the key: exact fields (bpf.Field* bits) with
	// their values in key, and prefix lengths, with the prefixes masked in
	// key. The Lovelock implications (proto udp, dport = port) are applied.
	fields         uint8
	key            bpf.FlowKey
	srcLen, dstLen uint8
	ranks          []rankPrefix // nil: rank not matched
}

// rankPrefix is an aligned block of ranks: the top bits of value.
type rankPrefix struct {
	value uint32
	bits  uint8
}

// errList collects problems up to maxErrors and counts the rest.
type errList struct {
	errs []error
	more int
}

func (l *errList) add(err error) {
	if len(l.errs) < maxErrors {
		l.errs = append(l.errs, fmt.Errorf("rules: %w", err))
	} else {
		l.more++
	}
}

func (l *errList) err() error {
	if l.more > 0 {
		l.errs = append(l.errs, fmt.Errorf("rules: and %d more problems", l.more))
	}
	return errors.Join(l.errs...)
}

// Validate checks s as Compile does, without touching the data plane: every
// rule's fields, names and IDs, the interfaces through resolve, the shape and
// entry limits, and that no two rules with the same priority can match the
// same packet. port is the Lovelock UDP port the data plane runs with (0: the
// wire default); rules with Lovelock fields match it. The error lists up to
// ten problems, each naming its rule.
func Validate(s *Set, resolve Resolver, port uint16) error {
	_, _, err := check(s, resolve, port)
	return err
}

// IDs returns the ID of each rule of s, in order, as Compile and Classify
// use them: explicit IDs as written, 0 replaced by the lowest IDs no rule
// names, in rule order.
func IDs(s *Set) ([]uint32, error) {
	var l errList
	ids := assignIDs(s, &l)
	if err := l.err(); err != nil {
		return nil, err
	}
	return ids, nil
}

func assignIDs(s *Set, l *errList) []uint32 {
	if len(s.Rules) > MaxID {
		l.add(fmt.Errorf("%d rules, the data plane counts at most %d", len(s.Rules), MaxID))
		return nil
	}
	ids := make([]uint32, len(s.Rules))
	owner := make(map[uint32]int, len(s.Rules)) // ID -> rule index
	for i, r := range s.Rules {
		if r.ID == 0 {
			continue
		}
		if r.ID > MaxID {
			l.add(ruleError(i, r.Name, fmt.Errorf("id %d outside 1..%d", r.ID, MaxID)))
			continue
		}
		if j, dup := owner[r.ID]; dup {
			l.add(ruleError(i, r.Name, fmt.Errorf("id %d is also rule %d %q's", r.ID, j+1, s.Rules[j].Name)))
			continue
		}
		owner[r.ID] = i
		ids[i] = r.ID
	}
	next := uint32(1)
	for i, r := range s.Rules {
		if r.ID != 0 {
			continue
		}
		for {
			if _, taken := owner[next]; !taken {
				break
			}
			next++
		}
		ids[i] = next
		next++
	}
	return ids
}

// check validates s and expands it into entries.
func check(s *Set, resolve Resolver, port uint16) (*checked, []entry, error) {
	if port == 0 {
		port = wire.DefaultPort
	}
	c := &checked{port: port}
	var l errList
	res := &resolver{fn: resolve, cache: map[string]uint32{}}

	var err error
	if c.defAction, c.defArg, err = res.action(s.Default); err != nil {
		l.add(fmt.Errorf("default: %w", err))
	}
	ids := assignIDs(s, &l)
	if ids == nil && len(s.Rules) > 0 {
		return nil, nil, l.err()
	}
	names := make(map[string]int, len(s.Rules))
	c.rules = make([]checkedRule, 0, len(s.Rules))
	for i := range s.Rules {
		r := &s.Rules[i]
		if r.Name != "" {
			if j, dup := names[r.Name]; dup {
				l.add(ruleError(i, r.Name, fmt.Errorf("name also used by rule %d", j+1)))
			}
			names[r.Name] = i
		}
		cr, errs := checkRule(i, r, res, port)
		for _, err := range errs {
			l.add(ruleError(i, r.Name, err))
		}
		cr.id = ids[i]
		c.rules = append(c.rules, cr)
	}
	if err := l.err(); err != nil {
		return nil, nil, err
	}

	ents := expand(c.rules)
	shapes := map[shapeKey]int{}
	for _, e := range ents {
		shapes[e.shape]++
	}
	if len(shapes) > bpf.MaxShapes {
		return nil, nil, tooManyShapes(c.rules, ents, shapes)
	}
	kept := dedupe(c.rules, ents)
	if len(kept) > bpf.MaxRuleEntries {
		return nil, nil, fmt.Errorf("rules: %d rules compile to %d table entries (rank ranges split into aligned blocks), the data plane holds %d: use fewer rules, or rank ranges aligned to powers of two",
			len(c.rules), len(kept), bpf.MaxRuleEntries)
	}
	if err := overlaps(c.rules, ents); err != nil {
		return nil, nil, err
	}
	return c, kept, nil
}

// dedupe keeps one entry per (shape, key): the highest priority one. A rule
// whose entry loses can never win there (the same packets match the winner),
// so the data plane does not need it. Equal priorities are overlaps, which
// check reports.
func dedupe(rules []checkedRule, ents []entry) []entry {
	type slot struct {
		shape shapeKey
		key   bpf.FlowKey
	}
	best := make(map[slot]int32, len(ents))
	for i := range ents {
		e := &ents[i]
		sl := slot{e.shape, e.key}
		if j, ok := best[sl]; !ok || rules[e.rule].prio > rules[ents[j].rule].prio {
			best[sl] = int32(i)
		}
	}
	if len(best) == len(ents) {
		return ents
	}
	kept := make([]entry, 0, len(best))
	for i := range ents {
		if best[slot{ents[i].shape, ents[i].key}] == int32(i) {
			kept = append(kept, ents[i])
		}
	}
	return kept
}

// resolver resolves each interface name once.
type resolver struct {
	fn    Resolver
	cache map[string]uint32
}

func (r *resolver) ifindex(name string) (uint32, error) {
	if idx, ok := r.cache[name]; ok {
		return idx, nil
	}
	if r.fn == nil {
		return 0, fmt.Errorf("interface %q: no resolver to look it up", name)
	}
	idx, err := r.fn(name)
	if err != nil {
		return 0, fmt.Errorf("unknown interface %q: %w", name, err)
	}
	if idx <= 0 || idx > 1<<32-1 {
		return 0, fmt.Errorf("interface %q: resolver returned ifindex %d", name, idx)
	}
	r.cache[name] = uint32(idx)
	return uint32(idx), nil
}

func (r *resolver) action(a Action) (bpf.Action, uint32, error) {
	switch a.Verb {
	case bpf.ActionPass, bpf.ActionDrop:
		return a.Verb, 0, nil
	case bpf.ActionRedirect:
		if a.Iface == "" {
			return 0, 0, errors.New("action redirect: no interface")
		}
		idx, err := r.ifindex(a.Iface)
		if err != nil {
			return 0, 0, fmt.Errorf("action %s: %w", a, err)
		}
		return a.Verb, idx, nil
	case bpf.ActionXSK:
		if a.Queue >= bpf.MaxXSKQueues {
			return 0, 0, fmt.Errorf("action %s: queue outside 0..%d", a, bpf.MaxXSKQueues-1)
		}
		return a.Verb, a.Queue, nil
	}
	return 0, 0, fmt.Errorf("action %s: unknown", a)
}

// checkRule validates one rule and works out its key.
func checkRule(i int, r *Rule, res *resolver, port uint16) (checkedRule, []error) {
	m := r.Match
	cr := checkedRule{idx: i, name: r.Name, prio: r.Priority, m: m}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if r.Name == "" {
		bad("no name: every rule needs a unique name")
	}
	var err error
	if cr.action, cr.arg, err = res.action(r.Action); err != nil {
		errs = append(errs, err)
	}
	if m.Iface != "" {
		if cr.ifindex, err = res.ifindex(m.Iface); err != nil {
			errs = append(errs, fmt.Errorf("iface: %w", err))
		}
		cr.fields |= bpf.FieldIfindex
		cr.key.Ifindex = cr.ifindex
	}

	// Prefixes: host bits clear, one family.
	var family uint8
	for _, p := range []struct {
		name string
		pfx  netip.Prefix
		dst  *[16]uint8
		len  *uint8
	}{{"src", m.Src, &cr.key.Src, &cr.srcLen}, {"dst", m.Dst, &cr.key.Dst, &cr.dstLen}} {
		if !p.pfx.Addr().IsValid() {
			continue
		}
		if !p.pfx.IsValid() {
			bad("%s: prefix length out of range for %v", p.name, p.pfx.Addr())
			continue
		}
		if masked := p.pfx.Masked(); masked != p.pfx {
			bad("%s %v has host bits set: write %v for the network, or %v for the host", p.name, p.pfx, masked,
				netip.PrefixFrom(p.pfx.Addr(), p.pfx.Addr().BitLen()))
			continue
		}
		f := uint8(6)
		if p.pfx.Addr().Is4() {
			f = 4
		}
		if family != 0 && family != f {
			bad("src %v and dst %v are of different address families: no packet matches both", m.Src, m.Dst)
			continue
		}
		family = f
		copy(p.dst[:], p.pfx.Addr().AsSlice())
		*p.len = uint8(p.pfx.Bits())
	}
	if family != 0 {
		cr.fields |= bpf.FieldFamily
		cr.key.Family = family
	}

	proto := m.Proto
	if proto != nil {
		switch {
		case *proto == 0 && family == 0:
			bad("proto 0 without src or dst: the data plane's key holds protocol 0 for non-IP frames too; add src or dst (0.0.0.0/0 for any IPv4 address) to pick a family")
		case family == 6 && ipv6ExtHeader(*proto):
			bad("proto %d with IPv6 prefixes: the data plane walks past IPv6 extension headers (hop-by-hop, routing, fragment, destination options, AH) and matches the protocol after them, so no well-formed packet matches; match that protocol (udp, tcp, esp, ...) instead", *proto)
		case *proto == 1 && family == 6:
			bad("proto icmp with IPv6 prefixes: IPv6 carries icmpv6 (58)")
		case *proto == 58 && family == 4:
			bad("proto icmpv6 with IPv4 prefixes: IPv4 carries icmp (1)")
		}
	}
	dport := m.Dport
	if m.hasLovelock() {
		// The classifier fills Lovelock fields for valid Lovelock packets
		// only, and a well-formed UDP packet to the Lovelock port is one:
		// matching proto udp and dport port makes a tenant 0 or rank 0
		// rule miss every other packet, whose key holds zeros there.
		if proto != nil && *proto != 17 {
			bad("proto %s with Lovelock fields (type, tenant, rank, region): those match Lovelock packets, which are udp", ProtoName(*proto))
		}
		if dport != nil && *dport != port {
			bad("dport %d with Lovelock fields (type, tenant, rank, region): those match Lovelock packets, which go to port %d", *dport, port)
		}
		proto, dport = new(uint8(17)), new(port)
		// UDP to the port whose Lovelock header is bad is classified on
		// its L3/L4 fields, with zeros in the Lovelock ones: the data
		// plane skips shapes of rules like this one for it.
		cr.fields |= bpf.FieldLovelock
	}
	if proto != nil {
		cr.fields |= bpf.FieldProto
		cr.key.Proto = *proto
	}
	for _, p := range []struct {
		name string
		port *uint16
		bit  uint8
		dst  *uint16
	}{{"sport", m.Sport, bpf.FieldSport, &cr.key.Sport}, {"dport", dport, bpf.FieldDport, &cr.key.Dport}} {
		if p.port == nil {
			continue
		}
		if proto == nil || (*proto != 6 && *proto != 17) {
			bad("%s %d needs proto tcp or udp: ports are read from TCP and UDP headers only", p.name, *p.port)
		}
		cr.fields |= p.bit
		*p.dst = *p.port
	}
	if m.Type != nil {
		if !m.Type.Known() {
			bad("lovelock type %v is not a known type: no valid packet carries it", *m.Type)
		}
		cr.fields |= bpf.FieldLLType
		cr.key.LlType = uint8(*m.Type)
	}
	if m.Tenant != nil {
		cr.fields |= bpf.FieldTenant
		cr.key.Tenant = *m.Tenant
	}
	switch {
	case m.Rank != nil && m.Region != nil:
		bad("rank %v and region %d: both match the Lovelock destination field; set one", *m.Rank, *m.Region)
	case m.Rank != nil && m.Rank.Lo > m.Rank.Hi:
		bad("rank range %d-%d is empty: lo > hi", m.Rank.Lo, m.Rank.Hi)
	case m.Rank != nil:
		cr.ranks = splitRange(m.Rank.Lo, m.Rank.Hi)
	case m.Region != nil:
		cr.ranks = []rankPrefix{{value: *m.Region, bits: 32}}
	}
	return cr, errs
}

// splitRange covers lo..hi with the fewest aligned power-of-two blocks, as
// (value, prefix length) pairs in ascending order: at most 62.
func splitRange(lo, hi uint32) []rankPrefix {
	var out []rankPrefix
	for l, h := uint64(lo), uint64(hi); l <= h; {
		// The largest block aligned at l that ends by h.
		size := uint64(1) << 32
		if l != 0 {
			size = l & -l
		}
		for l+size-1 > h {
			size >>= 1
		}
		out = append(out, rankPrefix{value: uint32(l), bits: uint8(32 - bits.TrailingZeros64(size))})
		l += size
	}
	return out
}

// ipv6ExtHeader reports whether proto is an IPv6 extension header that the
// data plane's parser walks past (bpf/include/parse.h, skip_ipv6_ext): an
// IPv6 key holds it only for a fragment whose fragment header names it.
func ipv6ExtHeader(proto uint8) bool {
	switch proto {
	case 0, 43, 44, 51, 60: // hop-by-hop, routing, fragment, AH, destination options
		return true
	}
	return false
}
