package rules

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/lovelock-dpu/lovelock/bpf"
)

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
