package bpf

import (
	"encoding/binary"
	"fmt"
)

// The rule table's geometry and hash, as in include/rules.h (tableBits and
// MaxProbe are held to enum rule_limits at compile time, bpf/contract.go;
// hashMul is a 64-bit #define, which the differential tests cover).
const (
	tableBits = 18
	tableSize = 1 << tableBits
	// MaxProbe is how many slots a lookup compares per shape: every entry
	// sits at most MaxProbe-1 slots after its home slot.
	MaxProbe = 16
	hashMul  = 0x9E3779B97F4A7C15
	// seedTries bounds the seeds tried before a rule set is refused.
	seedTries = 8
)

// keyWords returns k as the data plane sees it: the masked flow key with the
// shape's index + 1 in its pad byte, as seven little-endian 8-byte words
// (the rank alone in the last one).
func keyWords(k RuleKey) [7]uint64 {
	var b [56]byte
	f := k.Flow
	binary.LittleEndian.PutUint32(b[0:], f.Ifindex)
	b[4], b[5], b[6], b[7] = f.Family, f.Proto, f.LlType, uint8(k.Shape+1)
	copy(b[8:24], f.Src[:])
	copy(b[24:40], f.Dst[:])
	binary.LittleEndian.PutUint16(b[40:], f.Sport)
	binary.LittleEndian.PutUint16(b[42:], f.Dport)
	binary.LittleEndian.PutUint32(b[44:], f.Tenant)
	binary.LittleEndian.PutUint32(b[48:], f.Rank)
	var w [7]uint64
	for i := range w {
		w[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return w
}

// homeSlot is the slot the data plane starts probing at for key words w.
func homeSlot(seed uint64, w [7]uint64) uint32 {
	h := seed
	for _, x := range w {
		h = (h ^ x) * hashMul
	}
	return uint32(h >> (64 - tableBits))
}

// ruleTable is a rule set laid out as the data plane's open-addressed table:
// entries[i] belongs in slot slots[i]; at maps a slot to 1 + the index of
// its entry in entries (0: empty).
type ruleTable struct {
	seed    uint64
	slots   []uint32
	entries []ruleEntry
	at      []int32
}

// buildTable places rs's entries with Robin Hood linear probing (an entry
// takes the slot of one closer to its home, which moves on), which keeps
// the longest probe short: a few slots at the table's maximum fill. Should
// a seed still put an entry MaxProbe or more slots from home, the next seed
// is tried. rs must be valid (Validate).
func buildTable(rs *Ruleset) (ruleTable, error) {
	words := make([][7]uint64, len(rs.Entries))
	for i, e := range rs.Entries {
		words[i] = keyWords(e.Key)
	}
	for try := range seedTries {
		seed := uint64(try) * hashMul
		if at, ok := place(seed, words); ok {
			t := ruleTable{seed: seed, at: at}
			for slot, i := range at {
				if i == 0 {
					continue
				}
				e := rs.Entries[i-1]
				te := ruleEntry{
					Key:    e.Key.Flow,
					Action: uint8(e.Val.Action),
					Probe:  uint8((uint32(slot) - homeSlot(seed, words[i-1])) & (tableSize - 1)),
					Id:     uint16(e.Val.Id),
					Prio:   e.Val.Prio,
					Arg:    e.Val.Arg,
				}
				te.Key.Pad = uint8(e.Key.Shape + 1) // the shape tag, as in keyWords
				t.slots = append(t.slots, uint32(slot))
				t.entries = append(t.entries, te)
				at[slot] = int32(len(t.entries)) // now indexes t.entries
			}
			return t, nil
		}
	}
	return ruleTable{}, fmt.Errorf("%d entries: no hash seed of %d keeps every probe under %d slots: %w",
		len(rs.Entries), seedTries, MaxProbe, ErrRuleset)
}

// place returns, per slot, 1 + the index of the entry there (0: empty), or
// false if some entry lands MaxProbe or more slots from its home.
func place(seed uint64, words [][7]uint64) ([]int32, bool) {
	at := make([]int32, tableSize)
	home := make([]uint32, len(words))
	for i, w := range words {
		home[i] = homeSlot(seed, w)
	}
	dist := func(i int32, slot uint32) uint32 { return (slot - home[i-1]) & (tableSize - 1) }
	for i := range words {
		cur := int32(i + 1)
		slot := home[i]
		for {
			if at[slot] == 0 {
				at[slot] = cur
				break
			}
			if dist(at[slot], slot) < dist(cur, slot) {
				at[slot], cur = cur, at[slot]
			}
			slot = (slot + 1) & (tableSize - 1)
			if dist(cur, slot) >= MaxProbe {
				return nil, false
			}
		}
	}
	return at, true
}

// lookup is the data plane's probe, in Go, for tests: the entry of key
// k in t, if any.
func (t ruleTable) lookup(k RuleKey) (ruleEntry, bool) {
	w := keyWords(k)
	home := homeSlot(t.seed, w)
	for p := range uint32(MaxProbe) {
		i := t.at[(home+p)&(tableSize-1)]
		if i == 0 || uint32(t.entries[i-1].Probe) < p {
			return ruleEntry{}, false
		}
		e := t.entries[i-1]
		if keyWords(RuleKey{Shape: uint32(e.Key.Pad) - 1, Flow: e.Key}) == w {
			return e, true
		}
	}
	return ruleEntry{}, false
}
