package daemon

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/rules"
)

// TestCheckRules: CheckRules refuses what ApplyRules refuses, also what the
// operator's file alone cannot show (lovelockd's priority band, the rule
// count with lovelockd's own rules, this node's interfaces and port), warns
// as the apply does, and changes nothing: not the live set, not the state
// file. Before, 'rules apply --dry-run' checked the file alone in the CLI
// and passed all three refusals below.
func TestCheckRules(t *testing.T) {
	cfg, _ := tempConfig(t)
	cfg.Metrics = ""
	d, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	parse := func(doc string) rules.Set {
		t.Helper()
		set, err := rules.Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		return *set
	}
	if _, err := d.ApplyRules(parse("rules: [{name: live, priority: 1, match: {proto: udp, dport: 7000}, action: drop}]\n")); err != nil {
		t.Fatal(err)
	}
	// A service's own rule, on the Lovelock port.
	own := parse(fmt.Sprintf("rules: [{name: %q, priority: %d, match: {type: bundle}, action: drop}]\n", api.OwnedRulePrefix+"svc", api.OwnedPriority)).Rules
	if _, err := (steering{d}).Reserve("svc", own); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(cfg.State)
	if err != nil {
		t.Fatal(err)
	}
	full := rules.Set{Rules: make([]rules.Rule, rules.MaxID)}
	for i := range full.Rules {
		full.Rules[i] = rules.Rule{Name: fmt.Sprintf("r%d", i), Priority: uint32(i), Action: rules.Pass()}
	}

	for _, tc := range []struct {
		name         string
		set          rules.Set
		err, warning string
		live         int
	}{
		{name: "band", set: parse(fmt.Sprintf("rules: [{name: top, priority: %d, match: {dport: 1, proto: udp}, action: drop}]\n", api.OwnedPriority)),
			err: "is in the band lovelockd reserves"},
		{name: "too many with lovelockd's own", set: full, err: fmt.Sprintf("(%d of yours, 1 of lovelockd's own for its services), the data plane counts at most %d: remove 1", rules.MaxID, rules.MaxID)},
		{name: "missing interface", set: parse("rules: [{name: out, match: {dport: 1, proto: udp}, action: 'redirect:no-such-if0'}]\n"), err: "no-such-if0"},
		{name: "overlaps a service's rule", set: parse(fmt.Sprintf("rules: [{name: udp, priority: 2, match: {proto: udp, dport: %d}, action: pass}]\n", cfg.Port)),
			warning: `rule "udp" (priority 2) also matches a service's traffic`, live: 2},
		{name: "good", set: parse("rules: [{name: a, priority: 1, match: {proto: udp, dport: 7001}, action: drop}, {name: b, priority: 1, match: {proto: udp, dport: 7002}, action: drop}]\n"), live: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := d.CheckRules(tc.set)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want it to say %q", err, tc.err)
				}
				// The apply refuses it alike.
				if _, err := d.ApplyRules(tc.set); err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("ApplyRules: err = %v, want it to say %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Rules != tc.live || res.Owned != 1 {
				t.Errorf("%+v, want %d rules live with 1 of lovelockd's own", res, tc.live)
			}
			if got := strings.Join(res.Warnings, "\n"); tc.warning != "" && !strings.Contains(got, tc.warning) || tc.warning == "" && got != "" {
				t.Errorf("warnings %q, want %q", got, tc.warning)
			}
		})
	}
	live, _ := d.Rules()
	if len(live.Rules) != 2 || live.Rules[0].Name != "live" {
		t.Errorf("live set %+v changed, want live and svc's rule", live.Rules)
	}
	after, err := os.ReadFile(cfg.State)
	if err != nil || !bytes.Equal(before, after) {
		t.Errorf("state file changed (%v):\n%s\nvs\n%s", err, before, after)
	}
}
