package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/control/netdev"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/control/testenv"
)

func writeFile(t *testing.T, name, data string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRulesApply: .json is strict JSON, a rule without a match that drops
// needs --force, apply prints what it changes, and --dry-run checks the
// interfaces and prints what would change without applying.
func TestRulesApply(t *testing.T) {
	svc := &fakeService{set: rules.Set{Default: rules.Pass(), Rules: []rules.Rule{
		{Name: "old", Priority: 1, Action: rules.Pass()},
		{Name: "dns", Priority: 5, Match: rules.Match{Dport: new(uint16(53)), Proto: new(uint8(17))}, Action: rules.Pass()},
		{Name: "lovelockd:msg-0", Priority: 9, Action: rules.XSK(0)},
	}}}
	sock := serveFake(t, svc)

	// The file: invalid JSON, and a drop without a match.
	bad := writeFile(t, "r.json", `{"rules": [{"name":"a","action":"drop",}]}`)
	if _, _, err := runCLI(sock, "rules", "apply", "-f", bad); err == nil || !strings.Contains(err.Error(), "r.json: line 1: invalid JSON") {
		t.Errorf("trailing comma: err = %v, want invalid JSON with its line", err)
	}
	sweep := writeFile(t, "r.json", `{"rules": [{"name":"a","action":"drop"}]}`)
	if _, _, err := runCLI(sock, "rules", "apply", "-f", sweep); err == nil || !strings.Contains(err.Error(), `rule "a" (drop) has no match`) || !strings.Contains(err.Error(), "--force") {
		t.Errorf("rule without a match: err = %v, want a refusal naming the rule and --force", err)
	}
	if svc.applied != 0 {
		t.Fatalf("refused files were applied %d times", svc.applied)
	}
	_, stderr, err := runCLI(sock, "rules", "apply", "-f", sweep, "--force")
	if err != nil || !strings.Contains(stderr, `warning: rule "a" (drop) has no match`) || svc.applied != 1 {
		t.Errorf("--force: err = %v, stderr %q, applied %d", err, stderr, svc.applied)
	}

	// Errors name the rule and its line.
	badPort := writeFile(t, "r.yaml", "rules:\n  - name: a\n    action: drop\n    match: {dport: 53}\n  - name: b\n    match: {dport: x}\n    action: drop\n")
	if _, _, err := runCLI(sock, "rules", "apply", "-f", badPort); err == nil || !strings.Contains(err.Error(), `r.yaml:5: rule "b": match: dport`) {
		t.Errorf("bad rule: err = %v, want file:line and name", err)
	}

	// The diff, against the set lovelockd has (its own rules are kept).
	svc.set = rules.Set{Default: rules.Pass(), Rules: []rules.Rule{
		{Name: "old", ID: 1, Priority: 1, Match: rules.Match{Dport: new(uint16(1))}, Action: rules.Pass()},
		{Name: "dns", ID: 2, Priority: 5, Match: rules.Match{Dport: new(uint16(53)), Proto: new(uint8(17))}, Action: rules.Pass()},
		{Name: "same", ID: 3, Priority: 6, Match: rules.Match{Dport: new(uint16(99)), Proto: new(uint8(17))}, Action: rules.Pass()},
		{Name: "lovelockd:msg-0", ID: 4, Priority: 9, Match: rules.Match{Dport: new(uint16(61440)), Proto: new(uint8(17))}, Action: rules.XSK(0)},
	}}
	file := writeFile(t, "r.yaml", `default: drop
rules:
  - {name: dns, priority: 5, match: {proto: udp, dport: 53}, action: drop}
  - {name: same, priority: 6, match: {proto: udp, dport: 99}, action: pass}
  - {name: web, priority: 7, match: {proto: tcp, dport: 443}, action: pass}
`)
	want := []string{
		"~ default: pass -> drop",
		"+ web: priority 7, match proto=tcp dport=443, action pass",
		"- old",
		"~ dns: action pass -> drop",
	}
	out, _, err := runCLI(sock, "rules", "apply", "-f", file, "--dry-run")
	if err != nil {
		t.Fatalf("dry run: %v", err)
	}
	for _, w := range append(want, "would change: 1 added, 1 removed, 1 changed", "3 rules pass lovelockd's checks") {
		if !strings.Contains(out, w) {
			t.Errorf("dry run output lacks %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "same") || strings.Contains(out, "lovelockd:msg") || svc.applied != 1 {
		t.Errorf("dry run: unchanged or owned rules listed, or applied (%d):\n%s", svc.applied, out)
	}
	out, _, err = runCLI(sock, "rules", "apply", "-f", file)
	if err != nil || svc.applied != 2 {
		t.Fatalf("apply: %v (applied %d)", err, svc.applied)
	}
	for _, w := range append(want, "changed: 1 added, 1 removed, 1 changed") {
		if !strings.Contains(out, w) {
			t.Errorf("apply output lacks %q:\n%s", w, out)
		}
	}

	// --dry-run resolves interfaces.
	noIface := writeFile(t, "r.yaml", "rules:\n  - {name: out, match: {dport: 1}, action: 'redirect:no-such-if0'}\n")
	if _, _, err := runCLI(sock, "rules", "apply", "-f", noIface, "--dry-run"); err == nil || !strings.Contains(err.Error(), "no-such-if0") {
		t.Errorf("dry run with a missing interface: err = %v", err)
	}
}

// TestRulesDryRunPort: --dry-run validates Lovelock fields against the
// node's port, which lovelockd reports, and says so when it assumed the
// default because lovelockd did not answer.
func TestRulesDryRunPort(t *testing.T) {
	svc := &fakeService{status: api.Status{Port: 5555}}
	sock := serveFake(t, svc)
	// A Lovelock rule matches UDP to the node's port: it overlaps the
	// second rule at port 5555 only.
	file := writeFile(t, "r.yaml", `rules:
  - {name: tenant1, priority: 5, match: {tenant: 1}, action: pass}
  - {name: udp5555, priority: 5, match: {proto: udp, dport: 5555}, action: drop}
`)
	if _, _, err := runCLI(sock, "rules", "apply", "-f", file, "--dry-run"); err == nil || !strings.Contains(err.Error(), `"tenant1" and 2 "udp5555" both have priority 5`) {
		t.Errorf("dry run on a node of port 5555: err = %v, want the overlap", err)
	}
	// No lovelockd: the default port, where the rules do not overlap,
	// and a note that says so.
	out, stderr, err := runCLI(filepath.Join(t.TempDir(), "none.sock"), "rules", "apply", "-f", file, "--dry-run")
	if err != nil || !strings.Contains(out, "2 rules parse and validate") || !strings.Contains(stderr, "for the default Lovelock port 61440") {
		t.Errorf("dry run without lovelockd: err = %v, stdout %q, stderr %q", err, out, stderr)
	}
}

func TestRuleAddForce(t *testing.T) {
	svc := &fakeService{set: rules.Set{Default: rules.Pass()}}
	sock := serveFake(t, svc)
	if _, _, err := runCLI(sock, "rule", "add", "--name", "all", "--priority", "1", "--action", "drop"); err == nil || !strings.Contains(err.Error(), "--force") {
		t.Errorf("rule add without a match: err = %v", err)
	}
	if len(svc.set.Rules) != 0 {
		t.Fatalf("refused rule added")
	}
	if _, _, err := runCLI(sock, "rule", "add", "--name", "all", "--priority", "1", "--action", "drop", "--force"); err != nil || len(svc.set.Rules) != 1 {
		t.Errorf("rule add --force: %v", err)
	}
}

// TestRuleAddPriority: --priority is optional, 0 by default, as a rule
// file's priority is (docs/rules.md).
func TestRuleAddPriority(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want uint32
	}{
		{[]string{"--name", "dns", "--proto", "udp", "--dport", "53", "--action", "drop"}, 0},
		{[]string{"--name", "web", "--proto", "tcp", "--dport", "443", "--action", "pass", "--priority", "7"}, 7},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			svc := &fakeService{set: rules.Set{Default: rules.Pass()}}
			sock := serveFake(t, svc)
			if _, _, err := runCLI(sock, append([]string{"rule", "add"}, tc.args...)...); err != nil {
				t.Fatal(err)
			}
			if len(svc.set.Rules) != 1 || svc.set.Rules[0].Priority != tc.want {
				t.Errorf("rules %+v, want one of priority %d", svc.set.Rules, tc.want)
			}
		})
	}
}

// TestStatsJSON: counter keys are lower case, and --watch --output json
// prints JSON lines, with rates from the second sample on.
func TestStatsJSON(t *testing.T) {
	sock := serveFake(t, &fakeService{})
	out, _, err := runCLI(sock, "stats", "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `"packets": 100`) || !strings.Contains(out, `"bytes": 1000`) || strings.Contains(out, "Packets") {
		t.Errorf("stats JSON keys:\n%s", out)
	}
	out, _, err = runCLI(sock, "stats", "--watch", "--count", "2", "--interval", "1ms", "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 JSON lines, got %d:\n%s", len(lines), out)
	}
	var samples [2]struct {
		Verdicts map[string]struct{ Packets uint64 } `json:"verdicts"`
		Rates    *struct {
			IntervalS float64                               `json:"interval_s"`
			Verdicts  map[string]struct{ PPS, BPS float64 } `json:"verdicts"`
			Rules     map[string]struct{ PPS, BPS float64 } `json:"rules"`
		} `json:"rates"`
	}
	for i, l := range lines {
		if err := json.Unmarshal([]byte(l), &samples[i]); err != nil {
			t.Fatalf("line %d is not one JSON document: %v\n%s", i+1, err, l)
		}
	}
	if samples[0].Rates != nil {
		t.Errorf("first sample has rates: %+v", samples[0].Rates)
	}
	r := samples[1].Rates
	if r == nil || r.IntervalS != 1 || r.Verdicts["rx"].PPS != 100 || r.Verdicts["rx"].BPS != 8000 || r.Rules["web"].PPS != 100 {
		t.Errorf("second sample's rates: %+v", r)
	}
}

// TestStatsIfaces: the per-interface table has a row per interface with
// each counter's packets and the rx rate; JSON carries the same counters,
// and --watch JSON lines their rates.
func TestStatsIfaces(t *testing.T) {
	sock := serveFake(t, &fakeService{})
	out, _, err := runCLI(sock, "stats", "--watch", "--count", "2", "--interval", "1ms")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out, "\nIFACE "); n != 2 {
		t.Fatalf("want a per-interface table in each of 2 samples, got %d:\n%s", n, out)
	}
	// The second sample's: 140 packets on p0 (passed), 60 on pf0hpf (dropped).
	last := out[strings.LastIndex(out, "\nIFACE ")+1:]
	rows := map[string][]string{}
	for _, l := range strings.Split(last, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			rows[f[0]] = f
		}
	}
	head := rows["IFACE"]
	want := map[string]map[string]string{
		"p0":     {"RX": "140", "PASS": "140", "DROP": "0", "REDIRECT": "0"},
		"pf0hpf": {"RX": "60", "PASS": "0", "DROP": "60", "REDIRECT": "0"},
	}
	if head == nil {
		t.Fatalf("no per-interface table:\n%s", last)
	}
	for iface, cols := range want {
		row := rows[iface]
		if len(row) < len(head) {
			t.Errorf("%s: row %q, header %q", iface, row, head)
			continue
		}
		for col, v := range cols {
			if i := slices.Index(head, col); i < 0 || row[i] != v {
				t.Errorf("%s %s: row %q under header %q, want %s", iface, col, row, head, v)
			}
		}
	}
	if !strings.Contains(last, "70 pps") || !strings.Contains(last, "30 pps") {
		t.Errorf("rx rates of p0 (70 pps) and pf0hpf (30 pps) missing:\n%s", last)
	}

	out, _, err = runCLI(sock, "stats", "--watch", "--count", "2", "--interval", "1ms", "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var s struct {
		Interfaces map[string]map[string]struct{ Packets uint64 } `json:"interfaces"`
		Rates      struct {
			Interfaces map[string]map[string]struct{ PPS float64 } `json:"interfaces"`
		} `json:"rates"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &s); err != nil {
		t.Fatal(err)
	}
	if s.Interfaces["pf0hpf"]["drop"].Packets != 120 || s.Rates.Interfaces["pf0hpf"]["drop"].PPS != 30 || s.Rates.Interfaces["p0"]["rx"].PPS != 70 {
		t.Errorf("JSON per interface: %+v", s)
	}
}

// TestRuleListPending: a set that did not go live is listed under a line
// that says so (before, it looked live).
func TestRuleListPending(t *testing.T) {
	for _, pending := range []bool{false, true} {
		svc := &fakeService{status: api.Status{Rules: 1, RulesPending: pending},
			set: rules.Set{Default: rules.Pass(), Rules: []rules.Rule{{Name: "a", ID: 1, Priority: 1, Match: rules.Match{Iface: "late0"}, Action: rules.Drop()}}}}
		out, _, err := runCLI(serveFake(t, svc), "rule", "list")
		if err != nil || !strings.Contains(out, "late0") || strings.Contains(out, "pending:") != pending {
			t.Errorf("pending %v: err = %v, output:\n%s", pending, err, out)
		}
	}
}

// TestRulesDryRunXDPRedirect: --dry-run runs lovelockd's check of
// redirects from native XDP hooks (the fake's CheckRules runs it as
// lovelockd does, on the hooks its status lists; appliance/daemon's
// TestXDPRedirectChecked checks lovelockd's own):
// to a bridge from one it fails naming the rule and the device; from a TC
// hook or a generic XDP one, and to a veth whose peer runs an XDP program,
// it passes. Without lovelockd the hooks are unknown, and the redirect to
// the bridge is a warning.
func TestRulesDryRunXDPRedirect(t *testing.T) {
	ns := testenv.NewNetNS(t)
	for _, name := range []string{"xin", "pinned", "pinnedgen", "gen", "tcin", "vout"} {
		testenv.VethPair(t, testenv.VethEnd{NS: ns, Name: name}, testenv.VethEnd{NS: ns, Name: name + "-peer"})
	}
	testenv.XDPPassOn(t, ns, "vout-peer")
	testenv.XDPPassGenericOn(t, ns, "pinnedgen")
	var noFamily error
	testenv.InNetNS(t, ns, func() error {
		if _, err := netdev.DevXDPFeatures(1); errors.Is(err, netdev.ErrNoFamily) {
			noFamily = err
			return nil
		}
		return netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}})
	})
	if noFamily != nil {
		t.Skipf("the kernel cannot say: %v", noFamily)
	}
	// xin is asked for in native XDP; pinned and pinnedgen run XDP in a
	// mode the status does not give (pinned native, the default, as it
	// runs none here; pinnedgen generic, as the kernel says); gen in
	// generic XDP; tcin in TC.
	svc := &fakeService{status: api.Status{Links: []attach.LinkStatus{
		{Attachment: attach.Attachment{Iface: "xin", Hook: attach.HookXDP, Mode: attach.ModeNative}},
		{Attachment: attach.Attachment{Iface: "pinned", Hook: attach.HookXDP}, Live: true},
		{Attachment: attach.Attachment{Iface: "pinnedgen", Hook: attach.HookXDP}, Live: true},
		{Attachment: attach.Attachment{Iface: "gen", Hook: attach.HookXDP, Mode: attach.ModeGeneric}},
		{Attachment: attach.Attachment{Iface: "tcin", Hook: attach.HookTCIngress}, Live: true},
	}}, ns: &ns}
	sock := serveFake(t, svc)
	for _, tc := range []struct {
		name, from, to string
		sock           string // "": the fake lovelockd's
		err, warning   string // in the error or a warning line; both "": passes
	}{
		{name: "native xdp to a bridge", from: "xin", to: "br0",
			err: `rules: rule 1 "out": redirect to br0 from the native XDP hook on xin: br0 (bridge) cannot transmit XDP frames`},
		{name: "pinned xdp to a bridge", from: "pinned", to: "br0", err: "from the native XDP hook on pinned"},
		{name: "generic xdp to a bridge", from: "gen", to: "br0"},
		{name: "pinned generic xdp to a bridge", from: "pinnedgen", to: "br0"},
		{name: "tc to a bridge", from: "tcin", to: "br0"},
		{name: "native xdp to a veth whose peer runs an XDP program", from: "xin", to: "vout"},
		{name: "no lovelockd", from: "xin", to: "br0", sock: filepath.Join(t.TempDir(), "none.sock"),
			warning: `warning: rules: rule 1 "out": redirect to br0: br0 (bridge) cannot transmit XDP frames`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := writeFile(t, "r.yaml", fmt.Sprintf("rules:\n  - {name: out, priority: 1, match: {iface: %s, proto: udp}, action: 'redirect:%s'}\n", tc.from, tc.to))
			if tc.sock == "" {
				tc.sock = sock
			}
			var out, stderr string
			var err error
			testenv.InNetNS(t, ns, func() error {
				out, stderr, err = runCLI(tc.sock, "rules", "apply", "-f", file, "--dry-run")
				return nil
			})
			switch {
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("err = %v, want one with %q", err, tc.err)
			case tc.err == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.err == "" && tc.sock == sock && !strings.Contains(out, "1 rules pass lovelockd's checks"),
				tc.err == "" && tc.sock != sock && !strings.Contains(out, "1 rules parse and validate"):
				t.Errorf("stdout %q", out)
			}
			if (tc.warning == "") != !strings.Contains(stderr, "warning:") || !strings.Contains(stderr, tc.warning) {
				t.Errorf("stderr %q, want warning %q", stderr, tc.warning)
			}
		})
	}
	if svc.applied != 0 {
		t.Errorf("a dry run applied %d times", svc.applied)
	}
}
