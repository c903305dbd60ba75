package rules

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

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
