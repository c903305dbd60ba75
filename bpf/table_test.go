package bpf

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
)

// tableRuleset is n entries of one shape (proto, dport, /32 or /128
// source) with keys from key(i); entry i belongs to rule 1 + i%(MaxRules-1).
func tableRuleset(n int, key func(i int) FlowKey) *Ruleset {
	rs := &Ruleset{Shapes: []Shape{
		{Fields: FieldFamily | FieldProto | FieldDport, SrcLen: 32, MaxPrio: 20},
		{Fields: FieldFamily | FieldProto | FieldDport, SrcLen: 128, MaxPrio: 10},
	}}
	for i := range n {
		k := key(i)
		shape := uint32(0)
		if k.Family == 6 {
			shape = 1
		}
		rs.Entries = append(rs.Entries, Entry{
			Key: RuleKey{Shape: shape, Flow: rs.Shapes[shape].Masked(k)},
			Val: RuleVal{Prio: 10 + 10*(1-shape), Id: uint32(1 + i%(MaxRules-1)), Action: uint16(i % 4), Arg: uint32(i)},
		})
	}
	return rs
}

func v4Key(i int) FlowKey {
	k := FlowKey{Family: 4, Proto: 17, Dport: uint16(i)}
	binary.BigEndian.PutUint32(k.Src[:], 10<<24|uint32(i>>16))
	return k
}

func v6Key(rng *rand.Rand) func(int) FlowKey {
	return func(int) FlowKey {
		k := FlowKey{Family: 6, Proto: 6, Dport: uint16(rng.Uint32())}
		binary.LittleEndian.PutUint64(k.Src[:8], rng.Uint64())
		binary.LittleEndian.PutUint64(k.Src[8:], rng.Uint64())
		return k
	}
}

func TestBuildTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	tests := []struct {
		name string
		rs   *Ruleset
	}{
		{"empty", tableRuleset(0, v4Key)},
		{"one", tableRuleset(1, v4Key)},
		{"sequential ports, full", tableRuleset(MaxRuleEntries, v4Key)},
		{"random IPv6, full", tableRuleset(MaxRuleEntries, v6Key(rng))},
		{"mixed", tableRuleset(5000, func(i int) FlowKey {
			if i%2 == 0 {
				return v4Key(i)
			}
			return v6Key(rng)(i)
		})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.rs.Validate(); err != nil {
				t.Fatal(err)
			}
			tab, err := buildTable(tt.rs)
			if err != nil {
				t.Fatal(err)
			}
			if len(tab.slots) != len(tt.rs.Entries) {
				t.Fatalf("%d slots filled for %d entries", len(tab.slots), len(tt.rs.Entries))
			}
			for i, e := range tab.entries {
				home := homeSlot(tab.seed, keyWords(RuleKey{Shape: uint32(e.Key.Pad) - 1, Flow: e.Key}))
				if d := (tab.slots[i] - home) & (tableSize - 1); d != uint32(e.Probe) || d >= MaxProbe {
					t.Fatalf("entry in slot %d: probe %d, %d slots from home", tab.slots[i], e.Probe, d)
				}
			}
			for _, e := range tt.rs.Entries {
				got, ok := tab.lookup(e.Key)
				if !ok {
					t.Fatalf("rule %d not found", e.Val.Id)
				}
				if got.Id != uint16(e.Val.Id) || got.Prio != e.Val.Prio || got.Action != uint8(e.Val.Action) || got.Arg != e.Val.Arg {
					t.Fatalf("rule %d: found %+v", e.Val.Id, got)
				}
			}
			// Keys of no entry: other ports, other shapes.
			for i := range 1000 {
				k := RuleKey{Shape: 0, Flow: v4Key(MaxRuleEntries + i)}
				if _, ok := tab.lookup(k); ok {
					t.Fatalf("absent key %d found", i)
				}
			}
		})
	}
}

func TestPlaceBoundsProbes(t *testing.T) {
	// Equal keys share a home slot: MaxProbe of them fit, one more not.
	words := make([][7]uint64, MaxProbe)
	if _, ok := place(0, words); !ok {
		t.Fatalf("%d keys with one home slot refused", MaxProbe)
	}
	if _, ok := place(0, append(words, [7]uint64{})); ok {
		t.Fatalf("%d keys with one home slot placed", MaxProbe+1)
	}
	// buildTable tries other seeds, then refuses.
	rs := &Ruleset{Shapes: []Shape{{Fields: FieldDport}}}
	for range MaxProbe + 1 {
		rs.Entries = append(rs.Entries, Entry{Key: RuleKey{}, Val: RuleVal{Id: 1}})
	}
	if _, err := buildTable(rs); !errors.Is(err, ErrRuleset) {
		t.Fatalf("buildTable = %v, want ErrRuleset", err)
	}
}
