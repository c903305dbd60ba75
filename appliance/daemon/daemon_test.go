package daemon

import (
	"path/filepath"
	"reflect"
	"testing"

	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/control/rules"
)

func names(ids ...string) []rules.Rule {
	var out []rules.Rule
	for _, n := range ids {
		out = append(out, rules.Rule{Name: n})
	}
	return out
}

func idsOf(s rules.Set) map[string]uint32 {
	m := map[string]uint32{}
	for _, r := range s.Rules {
		m[r.Name] = r.ID
	}
	return m
}

func TestAssignIDs(t *testing.T) {
	prev := rules.Set{Rules: names("a", "b", "c")}
	assignIDs(&prev, rules.Set{})
	if got := idsOf(prev); !reflect.DeepEqual(got, map[string]uint32{"a": 1, "b": 2, "c": 3}) {
		t.Fatalf("first set: %v", got)
	}
	// b goes, d comes: a and c keep theirs, d must not take b's ID while b's
	// set is still live.
	next := rules.Set{Rules: names("c", "d", "a")}
	assignIDs(&next, prev)
	if got := idsOf(next); !reflect.DeepEqual(got, map[string]uint32{"a": 1, "c": 3, "d": 4}) {
		t.Errorf("second set: %v", got)
	}
	// IDs given by the caller are ignored: the daemon owns them.
	given := rules.Set{Rules: []rules.Rule{{Name: "x", ID: 9}}}
	assignIDs(&given, next)
	if given.Rules[0].ID != 2 {
		t.Errorf("caller ID kept: %d, want 2 (lowest free)", given.Rules[0].ID)
	}
}

func TestStateRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "state.json")
	set, err := rules.Parse([]byte("default: drop\nrules:\n  - {name: a, priority: 1, match: {proto: tcp, dport: 22}, action: pass}\n"))
	if err != nil {
		t.Fatal(err)
	}
	in := State{Attachments: []attach.Attachment{{Iface: "p0", Hook: attach.HookXDP, Mode: attach.ModeNative}}, Rules: *set, HasRules: true}
	if err := in.Save(path); err != nil {
		t.Fatal(err)
	}
	out, err := LoadState(path)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := rules.Format(&in.Rules)
	b, _ := rules.Format(&out.Rules)
	if string(a) != string(b) || !reflect.DeepEqual(in.Attachments, out.Attachments) || !out.HasRules {
		t.Errorf("state changed on disk:\n%+v\n%+v", in, out)
	}
	if s, err := LoadState(filepath.Join(t.TempDir(), "missing.json")); err != nil || s.HasRules {
		t.Errorf("missing state file: %+v, %v; want empty state", s, err)
	}
}
