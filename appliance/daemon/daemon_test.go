package daemon

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/lovelock-dpu/lovelock/appliance/config"
	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/control/testenv"
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

// tempConfig is lovelockd's default configuration with its pins on a
// fresh bpffs and its state and socket in a temporary directory, also
// returned.
func tempConfig(t *testing.T) (config.Config, string) {
	t.Helper()
	dir := t.TempDir()
	cfg := config.Defaults()
	cfg.PinDir = filepath.Join(testenv.BPFFS(t), "lovelock")
	cfg.State = filepath.Join(dir, "state.json")
	cfg.Socket = filepath.Join(dir, "api.sock")
	return cfg, dir
}

// TestConfigRulesKeepCounters: rules from the config's rule file have no
// IDs; a restart over the same pins, and an upgrade to another port, must
// find them under the IDs they had and leave their counters alone.
func TestConfigRulesKeepCounters(t *testing.T) {
	cfg, dir := tempConfig(t)
	cfg.Metrics = ""
	cfg.Rules = filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(cfg.Rules, []byte(`rules:
  - {name: a, priority: 1, match: {proto: udp, dport: 7000}, action: drop}
  - {name: b, priority: 1, match: {proto: udp, dport: 7001}, action: pass}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	counts := func(d *Daemon) map[string]uint64 {
		t.Helper()
		st, err := d.Stats()
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]uint64{}
		for _, r := range st.Rules {
			m[r.Name] = r.Counter.Packets
		}
		return m
	}
	d, err := New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	for port, n := range map[uint16]int{7000: 3, 7001: 2} {
		for range n {
			if _, err := d.node.Steer.XDP.Run(&ebpf.RunOptions{Data: testenv.UDPFrame(port)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := map[string]uint64{"a": 3, "b": 2}
	if got := counts(d); !reflect.DeepEqual(got, want) {
		t.Fatalf("counters after traffic: %v, want %v", got, want)
	}
	d.Close()

	// A restart adopts the pins; an upgrade (another port) carries the
	// counters into new maps. Neither may zero them.
	for _, port := range []uint16{cfg.Port, 5555} {
		cfg.Port = port
		d, err := New(cfg, log)
		if err != nil {
			t.Fatal(err)
		}
		if got := counts(d); !reflect.DeepEqual(got, want) {
			t.Errorf("port %d, loaded %v, upgraded %v: counters %v, want %v", port, d.node.Loaded, d.node.Upgraded != nil, got, want)
		}
		if got := idsOf(d.state.Rules); !reflect.DeepEqual(got, map[string]uint32{"a": 1, "b": 2}) {
			t.Errorf("port %d: state's rule IDs %v, want a 1, b 2", port, got)
		}
		d.Close()
	}
}
