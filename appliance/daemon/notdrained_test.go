package daemon

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// TestApplyNotDrained: a swap whose new set went live but whose wait for
// the old set's readers failed (bpf.ErrNotDrained) is applied. The daemon
// keeps the new set as its state, saves it, and warns; a service's
// reserved rules count as reserved.
func TestApplyNotDrained(t *testing.T) {
	cfg, _ := tempConfig(t)
	cfg.Metrics = ""
	d, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	drop := func(name string, port int) rules.Set {
		t.Helper()
		set, err := rules.Parse(fmt.Appendf(nil, "rules: [{name: %s, priority: 1, match: {proto: udp, dport: %d}, action: drop}]\n", name, port))
		if err != nil {
			t.Fatal(err)
		}
		return *set
	}
	verdict := func(port uint16) uint32 {
		t.Helper()
		ret, err := d.node.Steer.XDP.Run(&ebpf.RunOptions{Data: testenv.UDPFrame(port)})
		if err != nil {
			t.Fatal(err)
		}
		return ret
	}
	if _, err := d.ApplyRules(drop("a", 7000)); err != nil {
		t.Fatal(err)
	}
	d.swap = func(rs *bpf.Ruleset) error {
		if err := d.node.Steer.Apply(rs); err != nil {
			return err
		}
		return fmt.Errorf("%w: steer: wait for readers of the old rule set: %w", bpf.ErrNotDrained, unix.ENOMEM)
	}

	res, err := d.ApplyRules(drop("b", 7001))
	if err != nil {
		t.Fatalf("ApplyRules with the new set live: %v, want it applied", err)
	}
	if !slices.ContainsFunc(res.Warnings, func(w string) bool { return strings.Contains(w, "not waited out") }) {
		t.Errorf("warnings %q say nothing of the readers not waited out", res.Warnings)
	}
	if verdict(7001) != 1 || verdict(7000) != 2 {
		t.Errorf("data plane: 7000 %d, 7001 %d; want b's set live (7001 dropped)", verdict(7000), verdict(7001))
	}
	if live, _ := d.Rules(); len(live.Rules) != 1 || live.Rules[0].Name != "b" {
		t.Errorf("live rules %+v, want b", live.Rules)
	}
	saved, err := LoadState(cfg.State)
	if err != nil {
		t.Fatal(err)
	}
	if len(saved.Rules.Rules) != 1 || saved.Rules.Rules[0].Name != "b" {
		t.Errorf("state file's rules %+v, want b", saved.Rules.Rules)
	}

	// A service's reserved rules, swapped in so, are reserved.
	own := drop(api.OwnedRulePrefix+"svc", 7002).Rules
	own[0].Priority = api.OwnedPriority
	warnings, err := steering{d}.Reserve("svc", own)
	if err != nil {
		t.Fatalf("Reserve with the new set live: %v, want it reserved", err)
	}
	if !slices.ContainsFunc(warnings, func(w string) bool { return strings.Contains(w, "not waited out") }) {
		t.Errorf("Reserve's warnings %q say nothing of the readers not waited out", warnings)
	}
	d.mu.Lock()
	reserved, owned := len(d.reserved["svc"]), len(d.owned)
	d.mu.Unlock()
	if reserved != 1 || owned != 1 || verdict(7002) != 1 {
		t.Errorf("reserved %d, owned %d, 7002 verdict %d; want svc's rule reserved and live", reserved, owned, verdict(7002))
	}

	// The next swap waits as usual.
	d.swap = nil
	if res, err := d.ApplyRules(drop("c", 7003)); err != nil || len(res.Warnings) != 0 {
		t.Fatalf("ApplyRules after: %+v, %v", res, err)
	}
	if verdict(7003) != 1 || verdict(7001) != 2 || verdict(7002) != 1 {
		t.Errorf("data plane: 7001 %d, 7002 %d, 7003 %d; want c's set and svc's rule live", verdict(7001), verdict(7002), verdict(7003))
	}
}

// TestApplyReusesIDs: replacing 40000 live rules with 40000 renamed ones
// needs more new IDs than 1..MaxID has left, so some rules take the IDs of
// removed ones; their counters must start from zero once the old set is
// gone, also when the swap's wait for the old set's readers failed (which
// the warnings then say). A set that cannot fit is refused in one line.
func TestApplyReusesIDs(t *testing.T) {
	const n = 40000
	set := func(prefix string, n int) rules.Set {
		udp := uint8(unix.IPPROTO_UDP)
		s := rules.Set{Rules: make([]rules.Rule, n)}
		for i := range n {
			port := uint16(1000 + i)
			s.Rules[i] = rules.Rule{Name: fmt.Sprintf("%s%d", prefix, i), Priority: 1, Match: rules.Match{Proto: &udp, Dport: &port}, Action: rules.Drop()}
		}
		return s
	}
	for _, tc := range []struct {
		name       string
		notDrained bool
	}{
		{name: "drained"},
		{name: "not drained", notDrained: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _ := tempConfig(t)
			cfg.Metrics = ""
			d, err := New(cfg, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if _, err := d.ApplyRules(set("old-", n)); err != nil {
				t.Fatal(err)
			}
			// old-0 (ID 1, port 1000) counts 3 packets.
			for range 3 {
				if _, err := d.node.Steer.XDP.Run(&ebpf.RunOptions{Data: testenv.UDPFrame(1000)}); err != nil {
					t.Fatal(err)
				}
			}
			if tc.notDrained {
				d.swap = func(rs *bpf.Ruleset) error {
					if err := d.node.Steer.Apply(rs); err != nil {
						return err
					}
					return fmt.Errorf("%w: steer: wait for readers of the old rule set: %w", bpf.ErrNotDrained, unix.ENOMEM)
				}
			}
			res, err := d.ApplyRules(set("new-", n))
			if err != nil {
				t.Fatalf("replacing %d rules with %d renamed ones: %v", n, n, err)
			}
			reuses := slices.ContainsFunc(res.Warnings, func(w string) bool { return strings.Contains(w, "took the IDs of removed rules") })
			if reuses != tc.notDrained {
				t.Errorf("warnings %q: say the reused IDs may count old packets %v, want %v", res.Warnings, reuses, tc.notDrained)
			}
			st, err := d.Stats()
			if err != nil {
				t.Fatal(err)
			}
			var took *api.RuleStat
			for i, r := range st.Rules {
				if r.ID == 1 {
					took = &st.Rules[i]
				}
			}
			if took == nil || took.Name == "old-0" || took.Counter.Packets != 0 {
				t.Errorf("ID 1 (old-0's, 3 packets) after the swap: %+v, want a new rule's, from zero", took)
			}
		})
	}

	// More rules than IDs: one line that says how many and the limit.
	cfg, _ := tempConfig(t)
	cfg.Metrics = ""
	d, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	own := set(api.OwnedRulePrefix+"svc-", 1).Rules
	own[0].Priority = api.OwnedPriority
	if _, err := (steering{d}).Reserve("svc", own); err != nil {
		t.Fatal(err)
	}
	_, err = d.ApplyRules(set("r-", rules.MaxID))
	want := fmt.Sprintf("%d rules (%d of yours, 1 of lovelockd's own for its services), the data plane counts at most %d", rules.MaxID+1, rules.MaxID, rules.MaxID)
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), want) {
		t.Errorf("applying %d rules beside 1 of lovelockd's: %v; want one line saying %q", rules.MaxID, err, want)
	}
}
