package rules

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// Changes is what replacing one rule set with another changes, by rule name.
type Changes struct {
	Added   []Rule     // in the new set only
	Removed []Rule     // in the old set only
	Changed [][2]Rule  // old and new versions of rules in both that differ
	Default *[2]Action // old and new default, when it changes
}

// Empty says nothing changes.
func (c Changes) Empty() bool {
	return len(c.Added) == 0 && len(c.Removed) == 0 && len(c.Changed) == 0 && c.Default == nil
}

// Diff compares old and new by rule name. A rule whose new version asks for
// an assigned ID (0) keeps the old one and does not count as changed for it.
// keep, when not nil, says which old rules the replacement leaves alone
// (lovelockd's own): they are never reported removed.
func Diff(old, new *Set, keep func(name string) bool) Changes {
	var c Changes
	if old.Default != new.Default {
		c.Default = &[2]Action{old.Default, new.Default}
	}
	oldBy := map[string]Rule{}
	for _, r := range old.Rules {
		oldBy[r.Name] = r
	}
	newNames := map[string]bool{}
	for _, r := range new.Rules {
		newNames[r.Name] = true
		o, ok := oldBy[r.Name]
		if !ok {
			c.Added = append(c.Added, r)
			continue
		}
		n := r
		if n.ID == 0 {
			n.ID = o.ID
		}
		if !reflect.DeepEqual(o, n) {
			c.Changed = append(c.Changed, [2]Rule{o, r})
		}
	}
	for _, r := range old.Rules {
		if !newNames[r.Name] && (keep == nil || !keep(r.Name)) {
			c.Removed = append(c.Removed, r)
		}
	}
	return c
}

// String writes the changes one per line, as `rules apply` prints them:
//
//   - ingest: priority 100, match dst=10.1.0.0/16 type=ingest-input, action xsk:3
//   - old-rule
//     ~ dns: action pass -> drop
//     ~ default: pass -> drop
func (c Changes) String() string {
	var b strings.Builder
	if c.Default != nil {
		fmt.Fprintf(&b, "~ default: %s -> %s\n", c.Default[0], c.Default[1])
	}
	for _, r := range c.Added {
		fmt.Fprintf(&b, "+ %s: priority %d, match %s, action %s\n", r.Name, r.Priority, MatchString(r.Match), r.Action)
	}
	for _, r := range c.Removed {
		fmt.Fprintf(&b, "- %s\n", r.Name)
	}
	for _, p := range c.Changed {
		o, n := p[0], p[1]
		var parts []string
		if o.Priority != n.Priority {
			parts = append(parts, fmt.Sprintf("priority %d -> %d", o.Priority, n.Priority))
		}
		if om, nm := MatchString(o.Match), MatchString(n.Match); om != nm {
			parts = append(parts, fmt.Sprintf("match %s -> %s", om, nm))
		}
		if o.Action != n.Action {
			parts = append(parts, fmt.Sprintf("action %s -> %s", o.Action, n.Action))
		}
		if n.ID != 0 && o.ID != n.ID {
			parts = append(parts, fmt.Sprintf("id %d -> %d", o.ID, n.ID))
		}
		fmt.Fprintf(&b, "~ %s: %s\n", n.Name, strings.Join(parts, ", "))
	}
	return b.String()
}

// MatchString formats a match as field=value pairs, in file-format terms.
func MatchString(m Match) string {
	var parts []string
	add := func(k, v string) { parts = append(parts, k+"="+v) }
	if m.Iface != "" {
		add("iface", m.Iface)
	}
	if m.Src.IsValid() {
		add("src", m.Src.String())
	}
	if m.Dst.IsValid() {
		add("dst", m.Dst.String())
	}
	if m.Proto != nil {
		add("proto", ProtoName(*m.Proto))
	}
	if m.Sport != nil {
		add("sport", strconv.Itoa(int(*m.Sport)))
	}
	if m.Dport != nil {
		add("dport", strconv.Itoa(int(*m.Dport)))
	}
	if m.Type != nil {
		add("type", m.Type.String())
	}
	if m.Tenant != nil {
		add("tenant", strconv.FormatUint(uint64(*m.Tenant), 10))
	}
	if m.Rank != nil {
		add("rank", m.Rank.String())
	}
	if m.Region != nil {
		add("region", strconv.FormatUint(uint64(*m.Region), 10))
	}
	if len(parts) == 0 {
		return "any"
	}
	return strings.Join(parts, " ")
}
