package rules

import (
	"cmp"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"slices"
	"strings"

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

// shapeKey is a mask shape before it gets its index.
type shapeKey struct {
	fields                  uint8
	srcLen, dstLen, rankLen uint8
}

// entry is one map entry to be: rule r's key under shape.
type entry struct {
	rule  int32 // index into checked.rules
	shape shapeKey
	key   bpf.FlowKey // masked under shape
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
			bad("proto 0 without src or dst: the data plane's key holds protocol 0 for non-IP frames too; add src or dst (0.0.0.0/0 or ::/0 for any address) to pick a family")
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

// expand turns rules into entries, one per rank block (one when the rule
// does not match the rank).
func expand(rules []checkedRule) []entry {
	n := 0
	for i := range rules {
		n += max(1, len(rules[i].ranks))
	}
	ents := make([]entry, 0, n)
	for i := range rules {
		r := &rules[i]
		sh := shapeKey{fields: r.fields, srcLen: r.srcLen, dstLen: r.dstLen}
		if r.ranks == nil {
			ents = append(ents, entry{rule: int32(i), shape: sh, key: r.key})
			continue
		}
		for _, rp := range r.ranks {
			sh.rankLen = rp.bits
			k := r.key
			k.Rank = rp.value
			ents = append(ents, entry{rule: int32(i), shape: sh, key: k})
		}
	}
	return ents
}

// project masks k under shape sh, exactly as the data plane keys its
// entries (bpf.Shape.Masked).
func project(k bpf.FlowKey, sh shapeKey) bpf.FlowKey {
	return bpf.Shape{Fields: sh.fields, SrcLen: sh.srcLen, DstLen: sh.dstLen, RankLen: sh.rankLen}.Masked(k)
}

// common is the shape two shapes share: fields both match, the shorter
// prefixes. Two entries can match one packet exactly when their keys agree
// under the common shape: a field only one of them matches constrains
// nothing the other cares about.
func common(a, b shapeKey) shapeKey {
	return shapeKey{
		fields: a.fields & b.fields,
		srcLen: min(a.srcLen, b.srcLen), dstLen: min(a.dstLen, b.dstLen), rankLen: min(a.rankLen, b.rankLen),
	}
}

// overlaps rejects two rules of one priority that can match one packet:
// the C lookup's choice between them would depend on shape order. Within a
// priority, entries are hashed per shape and every pair of shapes is
// compared by projecting onto their common shape: O(shapes² · entries), no
// pairwise comparison of rules.
func overlaps(rules []checkedRule, ents []entry) error {
	byPrio := make([]int32, len(ents))
	for i := range byPrio {
		byPrio[i] = int32(i)
	}
	prio := func(e int32) uint32 { return rules[ents[e].rule].prio }
	slices.SortFunc(byPrio, func(a, b int32) int { return cmp.Or(cmp.Compare(prio(a), prio(b)), cmp.Compare(a, b)) })
	var l errList
	reported := map[[2]int32]bool{}
	for lo := 0; lo < len(byPrio); {
		hi := lo + 1
		for hi < len(byPrio) && prio(byPrio[hi]) == prio(byPrio[lo]) {
			hi++
		}
		group := byPrio[lo:hi]
		lo = hi
		if len(group) < 2 {
			continue
		}
		byShape := map[shapeKey][]int32{}
		for _, e := range group {
			byShape[ents[e].shape] = append(byShape[ents[e].shape], e)
		}
		shapes := sortedShapes(byShape)
		for i, a := range shapes {
			for _, b := range shapes[i:] {
				c := common(a, b)
				seen := make(map[bpf.FlowKey]int32, len(byShape[a]))
				for _, e := range byShape[a] {
					k := project(ents[e].key, c)
					if _, ok := seen[k]; !ok {
						seen[k] = e
					}
				}
				for _, e := range byShape[b] {
					if a == b {
						// One map serves both sides: look before adding.
						e0, ok := seen[ents[e].key]
						if !ok || e0 == e {
							continue
						}
						reportOverlap(&l, reported, rules, ents, e0, e)
						continue
					}
					if e0, ok := seen[project(ents[e].key, c)]; ok {
						reportOverlap(&l, reported, rules, ents, e0, e)
					}
				}
			}
		}
	}
	return l.err()
}

func reportOverlap(l *errList, reported map[[2]int32]bool, rules []checkedRule, ents []entry, e0, e1 int32) {
	r0, r1 := ents[e0].rule, ents[e1].rule
	if r0 == r1 {
		return
	}
	if r0 > r1 {
		r0, r1, e0, e1 = r1, r0, e1, e0
	}
	if reported[[2]int32{r0, r1}] {
		return
	}
	reported[[2]int32{r0, r1}] = true
	a, b := &rules[r0], &rules[r1]
	l.add(fmt.Errorf("rules %d %q and %d %q both have priority %d and both match %s: give one a different priority or make their matches disjoint",
		a.idx+1, a.name, b.idx+1, b.name, a.prio, describe(intersect(&ents[e0], &ents[e1]))))
}

// intersect is the entry that matches what both entries match: each field
// from whichever constrains it, each prefix at the longer length.
func intersect(a, b *entry) entry {
	out := entry{shape: shapeKey{
		fields: a.shape.fields | b.shape.fields,
		srcLen: max(a.shape.srcLen, b.shape.srcLen), dstLen: max(a.shape.dstLen, b.shape.dstLen),
		rankLen: max(a.shape.rankLen, b.shape.rankLen),
	}}
	for _, e := range []*entry{a, b} {
		k := project(e.key, e.shape)
		f := e.shape.fields
		if f&bpf.FieldIfindex != 0 {
			out.key.Ifindex = k.Ifindex
		}
		if f&bpf.FieldFamily != 0 {
			out.key.Family = k.Family
		}
		if f&bpf.FieldProto != 0 {
			out.key.Proto = k.Proto
		}
		if f&bpf.FieldLLType != 0 {
			out.key.LlType = k.LlType
		}
		if f&bpf.FieldSport != 0 {
			out.key.Sport = k.Sport
		}
		if f&bpf.FieldDport != 0 {
			out.key.Dport = k.Dport
		}
		if f&bpf.FieldTenant != 0 {
			out.key.Tenant = k.Tenant
		}
		if e.shape.srcLen == out.shape.srcLen {
			out.key.Src = k.Src
		}
		if e.shape.dstLen == out.shape.dstLen {
			out.key.Dst = k.Dst
		}
		if e.shape.rankLen == out.shape.rankLen {
			out.key.Rank = k.Rank
		}
	}
	return out
}

// describe writes an entry's match in the file format's words.
func describe(e entry) string {
	var parts []string
	f, k := e.shape.fields, e.key
	if f&bpf.FieldIfindex != 0 {
		parts = append(parts, fmt.Sprintf("ifindex %d", k.Ifindex))
	}
	addr := func(b [16]uint8, n uint8) string {
		if k.Family == 4 {
			return netip.PrefixFrom(netip.AddrFrom4([4]byte(b[:4])), int(n)).String()
		}
		return netip.PrefixFrom(netip.AddrFrom16(b), int(n)).String()
	}
	if f&bpf.FieldFamily != 0 {
		if e.shape.srcLen > 0 {
			parts = append(parts, "src "+addr(k.Src, e.shape.srcLen))
		}
		if e.shape.dstLen > 0 {
			parts = append(parts, "dst "+addr(k.Dst, e.shape.dstLen))
		}
		if e.shape.srcLen == 0 && e.shape.dstLen == 0 {
			parts = append(parts, fmt.Sprintf("IPv%d", k.Family))
		}
	}
	if f&bpf.FieldProto != 0 {
		parts = append(parts, "proto "+ProtoName(k.Proto))
	}
	if f&bpf.FieldSport != 0 {
		parts = append(parts, fmt.Sprintf("sport %d", k.Sport))
	}
	if f&bpf.FieldDport != 0 {
		parts = append(parts, fmt.Sprintf("dport %d", k.Dport))
	}
	if f&bpf.FieldLLType != 0 {
		parts = append(parts, "type "+wire.Type(k.LlType).String())
	}
	if f&bpf.FieldTenant != 0 {
		parts = append(parts, fmt.Sprintf("tenant %d", k.Tenant))
	}
	if e.shape.rankLen > 0 {
		lo := k.Rank
		hi := lo | uint32(uint64(1)<<(32-e.shape.rankLen)-1)
		parts = append(parts, "rank "+RankRange{Lo: lo, Hi: hi}.String())
	}
	if len(parts) == 0 {
		return "every packet"
	}
	return strings.Join(parts, ", ")
}

// describeShape names a shape's fields and prefix lengths.
func describeShape(sh shapeKey) string {
	var parts []string
	for _, f := range []struct {
		bit  uint8
		name string
	}{
		{bpf.FieldIfindex, "iface"}, {bpf.FieldFamily, "family"}, {bpf.FieldProto, "proto"},
		{bpf.FieldSport, "sport"}, {bpf.FieldDport, "dport"}, {bpf.FieldLLType, "type"}, {bpf.FieldTenant, "tenant"},
	} {
		if sh.fields&f.bit != 0 {
			parts = append(parts, f.name)
		}
	}
	if sh.srcLen > 0 {
		parts = append(parts, fmt.Sprintf("src/%d", sh.srcLen))
	}
	if sh.dstLen > 0 {
		parts = append(parts, fmt.Sprintf("dst/%d", sh.dstLen))
	}
	if sh.rankLen > 0 {
		parts = append(parts, fmt.Sprintf("rank/%d", sh.rankLen))
	}
	if len(parts) == 0 {
		return "(match all)"
	}
	return strings.Join(parts, " ")
}

func sortedShapes[V any](m map[shapeKey]V) []shapeKey {
	out := make([]shapeKey, 0, len(m))
	for sh := range m {
		out = append(out, sh)
	}
	slices.SortFunc(out, compareShapes)
	return out
}

func compareShapes(a, b shapeKey) int {
	return cmp.Or(cmp.Compare(a.fields, b.fields), cmp.Compare(a.srcLen, b.srcLen),
		cmp.Compare(a.dstLen, b.dstLen), cmp.Compare(a.rankLen, b.rankLen))
}

// tooManyShapes explains which fields and prefix lengths make the shapes.
func tooManyShapes(rules []checkedRule, ents []entry, shapes map[shapeKey]int) error {
	type use struct {
		rules   int
		example int32
	}
	uses := map[shapeKey]*use{}
	lastRule := map[shapeKey]int32{}
	for _, e := range ents {
		u := uses[e.shape]
		if u == nil {
			u = &use{example: e.rule}
			uses[e.shape] = u
			lastRule[e.shape] = -1
		}
		if lastRule[e.shape] != e.rule {
			u.rules++
			lastRule[e.shape] = e.rule
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "rules: the set needs %d mask shapes, the data plane holds %d; each distinct combination of matched fields and prefix lengths is one shape (one hash lookup per packet):",
		len(shapes), bpf.MaxShapes)
	list := sortedShapes(shapes)
	slices.SortStableFunc(list, func(a, b shapeKey) int { return cmp.Compare(uses[b].rules, uses[a].rules) })
	const maxListed = 40
	for i, sh := range list {
		if i == maxListed {
			fmt.Fprintf(&b, "\n  ... and %d more shapes", len(list)-maxListed)
			break
		}
		u := uses[sh]
		fmt.Fprintf(&b, "\n  %-40s %6d rules, e.g. %q", describeShape(sh), u.rules, rules[u.example].name)
	}
	lens := func(get func(shapeKey) uint8) []int {
		set := map[uint8]bool{}
		for sh := range shapes {
			if n := get(sh); n > 0 {
				set[n] = true
			}
		}
		var ns []int
		for n := range set {
			ns = append(ns, int(n))
		}
		slices.Sort(ns)
		return ns
	}
	var hints []string
	for _, p := range []struct {
		name string
		lens []int
	}{
		{"src", lens(func(s shapeKey) uint8 { return s.srcLen })},
		{"dst", lens(func(s shapeKey) uint8 { return s.dstLen })},
	} {
		if len(p.lens) > 1 {
			hints = append(hints, fmt.Sprintf("use fewer distinct %s prefix lengths (in use: %v)", p.name, p.lens))
		}
	}
	if rl := lens(func(s shapeKey) uint8 { return s.rankLen }); len(rl) > 1 {
		var split []string
		for i := range rules {
			if r := &rules[i]; len(r.ranks) > 1 && len(split) < 5 {
				split = append(split, fmt.Sprintf("%q rank %v needs %d", r.name, *r.m.Rank, len(r.ranks)))
			}
		}
		hint := fmt.Sprintf("align rank ranges to powers of two: a range splits into aligned blocks, each block length a shape (in use: %v)", rl)
		if len(split) > 0 {
			hint += "; " + strings.Join(split, ", ")
		}
		hints = append(hints, hint)
	}
	hints = append(hints, "match the same set of fields in more rules")
	fmt.Fprintf(&b, "\nto reduce them: %s", strings.Join(hints, "; "))
	return errors.New(b.String())
}

// Compile validates s as Validate does and compiles it into the rule set the
// data plane holds: one shape per distinct (exact fields, src, dst and rank
// prefix lengths), ordered by descending highest priority, and one entry per
// rule and rank block, keyed as C's mask_flow masks a packet's flow key. A
// rank range becomes one entry per aligned power-of-two block, each block
// length its own shape; a region is an exact rank. When two rules yield the
// same key under the same shape, the lower priority one can never win and is
// left out. The output is deterministic: the same set gives the same
// entries in the same order.
func Compile(s *Set, resolve Resolver, port uint16) (*bpf.Ruleset, error) {
	c, ents, err := check(s, resolve, port)
	if err != nil {
		return nil, err
	}
	maxPrio := map[shapeKey]uint32{}
	for i := range ents {
		e := &ents[i]
		if p, ok := maxPrio[e.shape]; !ok || c.rules[e.rule].prio > p {
			maxPrio[e.shape] = c.rules[e.rule].prio
		}
	}
	shapes := sortedShapes(maxPrio)
	slices.SortStableFunc(shapes, func(a, b shapeKey) int { return cmp.Compare(maxPrio[b], maxPrio[a]) })
	index := make(map[shapeKey]uint32, len(shapes))
	rs := &bpf.Ruleset{DefaultAction: c.defAction, DefaultArg: c.defArg, Shapes: make([]bpf.Shape, len(shapes))}
	for i, sh := range shapes {
		index[sh] = uint32(i)
		rs.Shapes[i] = bpf.Shape{Fields: sh.fields, SrcLen: sh.srcLen, DstLen: sh.dstLen, RankLen: sh.rankLen, MaxPrio: maxPrio[sh]}
	}
	// Entries by shape, then in rule order: a bucket per shape.
	buckets := make([][]bpf.Entry, len(shapes))
	for i := range ents {
		e := &ents[i]
		r := &c.rules[e.rule]
		si := index[e.shape]
		buckets[si] = append(buckets[si], bpf.Entry{
			Key: bpf.RuleKey{Shape: si, Flow: project(e.key, e.shape)},
			Val: bpf.RuleVal{Prio: r.prio, Id: r.id, Action: uint16(r.action), Arg: r.arg},
		})
	}
	rs.Entries = slices.Concat(buckets...)
	if err := rs.Validate(); err != nil {
		return nil, fmt.Errorf("rules: compiled set: %w", err)
	}
	return rs, nil
}
