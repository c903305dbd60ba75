package daemon

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

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

// TestAssignIDsReuse: a new rule gets an ID live in the previous set only
// when 1..MaxID has no other left, and then the lowest such ID that the
// new set does not keep, so that any set of up to MaxID rules fits.
func TestAssignIDsReuse(t *testing.T) {
	set := func(prefix string, n int) rules.Set {
		s := rules.Set{Rules: make([]rules.Rule, n)}
		for i := range n {
			s.Rules[i].Name = fmt.Sprintf("%s%d", prefix, i)
		}
		return s
	}
	for _, tc := range []struct {
		name       string
		prev, next rules.Set
		// IDs of next's rules by position; unlisted ones are only
		// checked to be distinct and in 1..MaxID.
		want map[int]uint32
	}{
		{name: "40000 replaced by 40000 renamed", prev: set("old-", 40000), next: set("new-", 40000),
			// 40001..65535 first, then old-0's, old-1's, ...
			want: map[int]uint32{0: 40001, rules.MaxID - 40000 - 1: rules.MaxID, rules.MaxID - 40000: 1, 39999: 40000 - (rules.MaxID - 40000)}},
		{name: "all of MaxID renamed", prev: set("old-", rules.MaxID), next: set("new-", rules.MaxID),
			want: map[int]uint32{0: 1, rules.MaxID - 1: rules.MaxID}},
		{name: "kept rules keep theirs, the rest reused", prev: set("x", rules.MaxID),
			next: rules.Set{Rules: append(set("new-", rules.MaxID-2).Rules, rules.Rule{Name: "x1"}, rules.Rule{Name: "x3"})},
			want: map[int]uint32{0: 1, 1: 3, rules.MaxID - 2: 2, rules.MaxID - 1: 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assignIDs(&tc.prev, rules.Set{})
			assignIDs(&tc.next, tc.prev)
			seen := map[uint32]string{}
			for i, r := range tc.next.Rules {
				if r.ID < 1 || r.ID > rules.MaxID {
					t.Fatalf("rule %d %q: ID %d outside 1..%d", i, r.Name, r.ID, rules.MaxID)
				}
				if o, dup := seen[r.ID]; dup {
					t.Fatalf("rule %q: ID %d is also %q's", r.Name, r.ID, o)
				}
				seen[r.ID] = r.Name
				if want, ok := tc.want[i]; ok && r.ID != want {
					t.Errorf("rule %d %q: ID %d, want %d", i, r.Name, r.ID, want)
				}
			}
		})
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
	if got := ruleCounts(t, d); !reflect.DeepEqual(got, want) {
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
		if got := ruleCounts(t, d); !reflect.DeepEqual(got, want) {
			t.Errorf("port %d, loaded %v, upgraded %v: counters %v, want %v", port, d.node.Loaded, d.node.Upgraded != nil, got, want)
		}
		if got := idsOf(d.state.Rules); !reflect.DeepEqual(got, map[string]uint32{"a": 1, "b": 2}) {
			t.Errorf("port %d: state's rule IDs %v, want a 1, b 2", port, got)
		}
		d.Close()
	}
}

// TestRuleFileEditKeepsCounters: the rule file gives no IDs, and counters
// are kept by ID. Edited between two starts, each rule must keep its own
// counters (by name, as the state file records them) and a new rule start
// from zero, also when the restart upgrades the data plane (another port);
// a state file without the record (an earlier version's) zeroes every
// rule's rather than show another rule's history. An edit naming an
// interface not there yet fails the restart's swap: until it appears the
// set is pending, not live, and a rule that is not live yet counts
// nothing, not the history its ID has (a removed rule's); the retry once
// it appears must count the same.
func TestRuleFileEditKeepsCounters(t *testing.T) {
	const ab = `rules:
  - {name: a, priority: 1, match: {proto: udp, dport: 7000}, action: drop}
  - {name: b, priority: 1, match: {proto: udp, dport: 7001}, action: pass}
`
	for _, tc := range []struct {
		name     string
		edited   string
		port     uint16            // of the restart; 0: the same
		noRecord bool              // remove the record from the state file, as an earlier version wrote it
		late     bool              // the edit redirects to late0, which appears after the restart
		interim  string            // the rule file of a restart between the first start and the edit's
		pending  map[string]uint64 // late: the counters before late0 appears
		want     map[string]uint64
	}{
		{name: "inserted at the top", edited: `rules:
  - {name: new, priority: 1, match: {proto: udp, dport: 7009}, action: pass}
  - {name: a, priority: 1, match: {proto: udp, dport: 7000}, action: drop}
  - {name: b, priority: 1, match: {proto: udp, dport: 7001}, action: pass}
`, want: map[string]uint64{"new": 0, "a": 3, "b": 2}},
		{name: "reordered", edited: `rules:
  - {name: b, priority: 1, match: {proto: udp, dport: 7001}, action: pass}
  - {name: a, priority: 1, match: {proto: udp, dport: 7000}, action: drop}
`, want: map[string]uint64{"a": 3, "b": 2}},
		{name: "first removed, one added", edited: `rules:
  - {name: b, priority: 1, match: {proto: udp, dport: 7001}, action: pass}
  - {name: c, priority: 1, match: {proto: udp, dport: 7000}, action: drop}
`, want: map[string]uint64{"b": 2, "c": 0}},
		{name: "inserted at the top, upgraded", port: 5555, edited: `rules:
  - {name: new, priority: 1, match: {proto: udp, dport: 7009}, action: pass}
  - {name: a, priority: 1, match: {proto: udp, dport: 7000}, action: drop}
  - {name: b, priority: 1, match: {proto: udp, dport: 7001}, action: pass}
`, want: map[string]uint64{"new": 0, "a": 3, "b": 2}},
		{name: "state file without the record", noRecord: true, edited: ab, want: map[string]uint64{"a": 0, "b": 0}},
		{name: "inserted at the top, its interface late", late: true, edited: `rules:
  - {name: out, priority: 1, match: {proto: udp, dport: 7009}, action: "redirect:late0"}
  - {name: a, priority: 1, match: {proto: udp, dport: 7000}, action: drop}
  - {name: b, priority: 1, match: {proto: udp, dport: 7001}, action: pass}
`, pending: map[string]uint64{"out": 0, "a": 3, "b": 2}, want: map[string]uint64{"out": 0, "a": 3, "b": 2}},
		{name: "one removed, then one added, its interface late", late: true, interim: `rules:
  - {name: a, priority: 1, match: {proto: udp, dport: 7000}, action: drop}
`, edited: `rules:
  - {name: out, priority: 1, match: {proto: udp, dport: 7009}, action: "redirect:late0"}
  - {name: a, priority: 1, match: {proto: udp, dport: 7000}, action: drop}
`, pending: map[string]uint64{"out": 0, "a": 3}, want: map[string]uint64{"out": 0, "a": 3}},
		{name: "state file without the record, an interface late", noRecord: true, late: true, edited: `rules:
  - {name: out, priority: 1, match: {proto: udp, dport: 7009}, action: "redirect:late0"}
  - {name: a, priority: 1, match: {proto: udp, dport: 7000}, action: drop}
  - {name: b, priority: 1, match: {proto: udp, dport: 7001}, action: pass}
`, pending: map[string]uint64{"out": 0, "a": 0, "b": 0}, want: map[string]uint64{"out": 0, "a": 0, "b": 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, dir := tempConfig(t)
			cfg.Metrics = ""
			cfg.Rules = filepath.Join(dir, "rules.yaml")
			write := func(s string) {
				t.Helper()
				if err := os.WriteFile(cfg.Rules, []byte(s), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			log := slog.New(slog.DiscardHandler)
			write(ab)
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
			d.Close()
			if tc.noRecord {
				st, err := LoadState(cfg.State)
				if err != nil {
					t.Fatal(err)
				}
				st.RuleFileIDs = nil
				if err := st.Save(cfg.State); err != nil {
					t.Fatal(err)
				}
			}
			if tc.interim != "" {
				write(tc.interim)
				d, err := New(cfg, log)
				if err != nil {
					t.Fatal(err)
				}
				d.Close()
			}

			write(tc.edited)
			if tc.port != 0 {
				cfg.Port = tc.port
			}
			// The second start applies the edit; a third, with nothing
			// changed, must find the same. Both run where late0 can
			// appear.
			ns := testenv.NewNetNS(t)
			for i, start := range []string{"restart", "second restart"} {
				testenv.InNetNS(t, ns, func() error {
					d, err := New(cfg, log)
					if err != nil {
						return err
					}
					defer d.Close()
					if tc.late && i == 0 {
						d.mu.Lock()
						_, failed := d.failures["rules"]
						d.mu.Unlock()
						if !failed {
							t.Errorf("%s: rules redirecting to late0 applied before it exists", start)
						}
						if got := ruleCounts(t, d); !reflect.DeepEqual(got, tc.pending) {
							t.Errorf("%s, late0 not there: counters %v, want %v (IDs %v)", start, got, tc.pending, idsOf(d.state.Rules))
						}
						if st, err := d.Status(); err != nil || !st.RulesPending || st.Rules != len(tc.pending) {
							t.Errorf("%s, late0 not there: status: %d rules, pending %v (%v); want %d rules pending", start, st.Rules, st.RulesPending, err, len(tc.pending))
						}
						if st, err := d.Stats(); err != nil || !st.RulesPending {
							t.Errorf("%s, late0 not there: stats say pending %v (%v); want pending", start, st.RulesPending, err)
						}
						if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "late0"}, PeerName: "late1"}); err != nil {
							return err
						}
						d.mu.Lock()
						d.retryRules()
						_, failed = d.failures["rules"]
						d.mu.Unlock()
						if failed {
							t.Errorf("%s: rules not applied once late0 appeared", start)
						}
						if st, err := d.Status(); err != nil || st.RulesPending {
							t.Errorf("%s, late0 there: status: %d rules, pending %v (%v); want them live", start, st.Rules, st.RulesPending, err)
						}
						if st, err := d.Stats(); err != nil || st.RulesPending {
							t.Errorf("%s, late0 there: stats say pending %v (%v); want them live", start, st.RulesPending, err)
						}
					}
					if got := ruleCounts(t, d); !reflect.DeepEqual(got, tc.want) {
						t.Errorf("%s: counters %v, want %v (IDs %v)", start, got, tc.want, idsOf(d.state.Rules))
					}
					return nil
				})
			}
			// The rule file stays the operator's set: the state file holds
			// its IDs, not its rules.
			st, err := LoadState(cfg.State)
			if err != nil {
				t.Fatal(err)
			}
			if st.HasRules || len(st.Rules.Rules) != 0 || len(st.RuleFileIDs) != len(tc.want) {
				t.Errorf("state file: has_rules %v, %d rules, rule_file_ids %v; want only the rule file's IDs", st.HasRules, len(st.Rules.Rules), st.RuleFileIDs)
			}
		})
	}
}

// ruleCounts returns the packets each rule of d counted, by name.
func ruleCounts(t *testing.T, d *Daemon) map[string]uint64 {
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

// TestFreshLateInterfaceKeepsIDs: after a reboot the data plane is fresh,
// and a rule set that redirects to an interface not there yet fails to
// go live; once the interface appears the retry must install the set
// under the IDs the state file gives it (rule 1 was deleted before), so
// that the next start, which installs those IDs over the same counters,
// finds each rule's own.
func TestFreshLateInterfaceKeepsIDs(t *testing.T) {
	const set = `rules:
  - {name: a, priority: 1, match: {proto: udp, dport: 7000}, action: drop}
  - {name: b, priority: 1, match: {proto: udp, dport: 7001}, action: pass}
  - {name: out, priority: 1, match: {proto: udp, dport: 7009}, action: "redirect:late0"}
`
	ids := map[string]uint32{"a": 2, "b": 3, "out": 4}
	for _, tc := range []struct {
		name     string
		ruleFile bool // the rules are the config's rule file's, the state file has their IDs; else the state file's (has_rules)
	}{
		{name: "the state file's rules"},
		{name: "the rule file's", ruleFile: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, dir := tempConfig(t)
			cfg.Metrics = ""
			parsed, err := rules.Parse([]byte(set))
			if err != nil {
				t.Fatal(err)
			}
			var st State
			if tc.ruleFile {
				cfg.Rules = filepath.Join(dir, "rules.yaml")
				if err := os.WriteFile(cfg.Rules, []byte(set), 0o600); err != nil {
					t.Fatal(err)
				}
				st.RuleFileIDs = ids
			} else {
				for i := range parsed.Rules {
					parsed.Rules[i].ID = ids[parsed.Rules[i].Name]
				}
				st.Rules, st.HasRules = *parsed, true
			}
			if err := st.Save(cfg.State); err != nil {
				t.Fatal(err)
			}
			log := slog.New(slog.DiscardHandler)
			ns := testenv.NewNetNS(t)
			testenv.InNetNS(t, ns, func() error {
				d, err := New(cfg, log)
				if err != nil {
					return err
				}
				defer d.Close()
				d.mu.Lock()
				_, failed := d.failures["rules"]
				d.mu.Unlock()
				if !d.node.Loaded || !failed {
					return fmt.Errorf("start: loaded %v, rules failed %v; want a fresh data plane and the rules failing", d.node.Loaded, failed)
				}
				if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "late0"}, PeerName: "late1"}); err != nil {
					return err
				}
				d.mu.Lock()
				d.retryRules()
				_, failed = d.failures["rules"]
				got := idsOf(d.live)
				d.mu.Unlock()
				if failed {
					return errors.New("rules not applied once late0 appeared")
				}
				if !reflect.DeepEqual(got, ids) {
					t.Errorf("IDs after the retry %v, want the state file's %v", got, ids)
				}
				for port, n := range map[uint16]int{7000: 3, 7001: 2} {
					for range n {
						if _, err := d.node.Steer.XDP.Run(&ebpf.RunOptions{Data: testenv.UDPFrame(port)}); err != nil {
							return err
						}
					}
				}
				return nil
			})
			// A restart adopts the data plane and installs the state
			// file's IDs: each rule must find its own counters.
			testenv.InNetNS(t, ns, func() error {
				d, err := New(cfg, log)
				if err != nil {
					return err
				}
				defer d.Close()
				want := map[string]uint64{"a": 3, "b": 2, "out": 0}
				if got := ruleCounts(t, d); !reflect.DeepEqual(got, want) {
					t.Errorf("after the restart: counters %v, want %v (IDs %v)", got, want, idsOf(d.state.Rules))
				}
				return nil
			})
		})
	}
}
