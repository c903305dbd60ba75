package rules

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

const exampleYAML = `
# Steering for one DPU.
default: pass
rules:
  - name: ingest-low
    id: 10
    priority: 300
    match:
      iface: v0
      dst: 10.1.0.0/16
      type: ingest-input
      tenant: 0
      rank: 0-15
    action: xsk:3
  - name: web
    priority: 100
    match: {src: "fd00:1::/32", proto: tcp, dport: 443, sport: 0}
    action: redirect:v1
  - name: region
    priority: 200
    match: {region: 4096, type: 0x30}
    action: drop
  - name: everything
    action: pass
  - name: gre
    priority: 1
    match: {proto: 47, src: 10.0.0.1}
    action: drop
`

const exampleJSON = `{
	"default": "pass",
	"rules": [
		{"name": "ingest-low", "id": 10, "priority": 300,
		 "match": {"iface": "v0", "dst": "10.1.0.0/16", "type": "ingest-input", "tenant": 0, "rank": "0-15"},
		 "action": "xsk:3"},
		{"name": "web", "priority": 100, "match": {"src": "fd00:1::/32", "proto": "tcp", "dport": 443, "sport": 0}, "action": "redirect:v1"},
		{"name": "region", "priority": 200, "match": {"region": 4096, "type": 48}, "action": "drop"},
		{"name": "everything", "action": "pass"},
		{"name": "gre", "priority": 1, "match": {"proto": 47, "src": "10.0.0.1/32"}, "action": "drop"}
	]
}`

func exampleSet() *Set {
	return &Set{Default: Pass(), Rules: []Rule{
		{Name: "ingest-low", ID: 10, Priority: 300, Action: XSK(3), Match: Match{
			Iface: "v0", Dst: netip.MustParsePrefix("10.1.0.0/16"), Type: new(wire.TypeIngestInput),
			Tenant: new(uint32(0)), Rank: &RankRange{0, 15},
		}},
		{Name: "web", Priority: 100, Action: Redirect("v1"), Match: Match{
			Src: netip.MustParsePrefix("fd00:1::/32"), Proto: new(uint8(6)), Dport: new(uint16(443)), Sport: new(uint16(0)),
		}},
		{Name: "region", Priority: 200, Action: Drop(), Match: Match{Region: new(uint32(4096)), Type: new(wire.TypePing)}},
		{Name: "everything", Action: Pass()},
		{Name: "gre", Priority: 1, Action: Drop(), Match: Match{Proto: new(uint8(47)), Src: netip.MustParsePrefix("10.0.0.1/32")}},
	}}
}

func TestParse(t *testing.T) {
	for name, text := range map[string]string{"yaml": exampleYAML, "json": exampleJSON} {
		s, err := Parse([]byte(text))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if want := exampleSet(); !reflect.DeepEqual(s, want) {
			t.Errorf("%s: parsed\n%#v\nwant\n%#v", name, s, want)
		}
	}
	s, err := Parse([]byte("rules: []"))
	if err != nil || s.Default != Pass() || len(s.Rules) != 0 {
		t.Errorf("no default: %+v, %v; want pass", s, err)
	}
}

func TestFormatRoundTrip(t *testing.T) {
	want := exampleSet()
	text, err := Format(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(text)
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("round trip through\n%s\ngot %#v", text, got)
	}
}

// TestJSON: sets and rules travel as JSON (the daemon's API and state file)
// in the rule file's form, decoded as strictly as Parse.
func TestJSON(t *testing.T) {
	want := exampleSet()
	b, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var got Set
	if err := json.Unmarshal(b, &got); err != nil || !reflect.DeepEqual(&got, want) {
		t.Errorf("set round trip through %s: %+v, %v", b, got, err)
	}
	if !strings.Contains(string(b), `"action":"xsk:3"`) || !strings.Contains(string(b), `"rank":"0-15"`) {
		t.Errorf("not the file form: %s", b)
	}
	b, err = json.Marshal(want.Rules[1])
	if err != nil {
		t.Fatal(err)
	}
	var r Rule
	if err := json.Unmarshal(b, &r); err != nil || !reflect.DeepEqual(r, want.Rules[1]) {
		t.Errorf("rule round trip through %s: %+v, %v", b, r, err)
	}
	for in, msg := range map[string]string{
		`{"name": "a", "action": "drop", "prio": 1}`:            `rules: rule "a": unknown field "prio"`,
		`{"name": "a", "action": "drop", "match": {"port": 1}}`: `rules: rule "a": match: unknown field "port"`,
		`{"action": "drop"}`:                                    "rules: rule: no name",
	} {
		if err := json.Unmarshal([]byte(in), &r); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("Rule from %s: %v, want %q", in, err, msg)
		}
	}
	if err := json.Unmarshal([]byte(`{"default": "pass", "rules": [], "extra": 1}`), &got); err == nil ||
		!strings.Contains(err.Error(), `rules: unknown field "extra"`) {
		t.Errorf("Set with an unknown field: %v", err)
	}
}

func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ name, in, want string }{
		{"yaml-syntax", "rules:\n - name: a\n  action: drop\n", "rules: parse: yaml: line 2: did not find expected"},
		{"json-syntax", `{"rules": [`, "rules: parse: yaml: line 1"},
		{"empty", "", "empty rule file"},
		{"not-an-object", "[1, 2]", "want an object with default, rules, got array"},
		{"unknown-top", "default: pass\nrulez: []\n", `unknown field "rulez" (known: default, rules)`},
		{"duplicate-key", "default: pass\ndefault: drop\n", `key "default" already set`},
		{"rules-not-list", "rules: 5\n", "rules: want a list, got number"},
		{"bad-default", "default: forward\n", `rules: parse: default: action "forward"`},
		{"unknown-rule-field", "rules:\n- {name: a, action: drop, prio: 5}\n", `rule 1 "a": unknown field "prio" (known: name, id, priority, match, action)`},
		{"unknown-match-field", "rules:\n- {name: a, action: drop, match: {port: 80}}\n", `rule 1 "a": match: unknown field "port" (known: iface, src, dst, proto, sport, dport, type, tenant, rank, region)`},
		{"second-rule", "rules:\n- {name: a, action: drop}\n- {name: b, action: jump}\n", `rule 2 "b": action "jump"`},
		{"no-name", "rules:\n- {action: drop}\n", "rule 1: no name"},
		{"no-action", "rules:\n- {name: a}\n", `rule 1 "a": no action`},
		{"bad-prefix", "rules:\n- {name: a, action: drop, match: {src: 10.0.0/8}}\n", `rule 1 "a": match: src: bad prefix "10.0.0/8"`},
		{"bad-addr", "rules:\n- {name: a, action: drop, match: {dst: nowhere}}\n", `match: dst: "nowhere" is neither a prefix nor an address`},
		{"bad-proto", "rules:\n- {name: a, action: drop, match: {proto: sctpx}}\n", `proto "sctpx": want udp, tcp, icmp, icmpv6 or a number 0..255`},
		{"proto-range", "rules:\n- {name: a, action: drop, match: {proto: 256}}\n", `proto "256"`},
		{"port-range", "rules:\n- {name: a, action: drop, match: {proto: tcp, dport: 70000}}\n", "dport: want a whole number 0..65535, have 70000"},
		{"port-negative", "rules:\n- {name: a, action: drop, match: {proto: tcp, sport: -1}}\n", "sport: want a whole number 0..65535, have -1"},
		{"port-list", "rules:\n- {name: a, action: drop, match: {proto: tcp, sport: [1]}}\n", "sport: want a string or a number"},
		{"bad-type", "rules:\n- {name: a, action: drop, match: {type: bundles}}\n", `lovelock type "bundles": want one of bundle, credit`},
		{"unknown-type-number", "rules:\n- {name: a, action: drop, match: {type: 0x7f}}\n", "lovelock type 0x7f is not a known type"},
		{"tenant-range", "rules:\n- {name: a, action: drop, match: {tenant: 4294967296}}\n", "tenant: want a whole number 0..4294967295"},
		{"bad-rank", "rules:\n- {name: a, action: drop, match: {rank: 3..9}}\n", `rank "3..9": want a number or a range lo-hi`},
		{"bad-region", "rules:\n- {name: a, action: drop, match: {region: 1-2}}\n", "region: want a whole number"},
		{"xsk-queue", "rules:\n- {name: a, action: \"xsk:64\"}\n", `action "xsk:64": want xsk:<queue> with queue 0..63`},
		{"redirect-no-iface", "rules:\n- {name: a, action: \"redirect:\"}\n", "want redirect:<iface>"},
		{"drop-arg", "rules:\n- {name: a, action: \"drop:1\"}\n", "drop takes no argument"},
		{"id-range", "rules:\n- {name: a, id: 65536, action: drop}\n", "id: want a whole number 0..65535"},
		{"priority-range", "rules:\n- {name: a, priority: 4294967296, action: drop}\n", "priority: want a whole number 0..4294967295"},
		{"iface-empty", "rules:\n- {name: a, action: drop, match: {iface: \"\"}}\n", "iface: empty name"},
		{"match-not-object", "rules:\n- {name: a, action: drop, match: [1]}\n", "match: want an object"},
	} {
		_, err := Parse([]byte(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to contain %q", c.name, err, c.want)
		}
	}
}

func TestAction(t *testing.T) {
	for _, s := range []string{"pass", "drop", "redirect:eth0", "xsk:0", "xsk:63"} {
		a, err := ParseAction(s)
		if err != nil || a.String() != s {
			t.Errorf("ParseAction(%q) = %v, %v", s, a, err)
		}
		var b Action
		if err := b.UnmarshalText([]byte(s)); err != nil || b != a {
			t.Errorf("UnmarshalText(%q) = %v, %v", s, b, err)
		}
		if text, _ := a.MarshalText(); string(text) != s {
			t.Errorf("MarshalText = %q", text)
		}
	}
	for _, s := range []string{"", "PASS", "xsk:-1", "xsk:x", "xsk", "redirect", "pass:1", "tx:1"} {
		if a, err := ParseAction(s); err == nil {
			t.Errorf("ParseAction(%q) = %v, want an error", s, a)
		}
	}
}

func TestSplitRange(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	cases := [][2]uint32{{0, 0}, {0, 0xffffffff}, {1, 0xffffffff}, {0, 0xfffffffe}, {5, 9}, {3, 3}, {0xffffffff, 0xffffffff}, {100, 199}}
	for range 2000 {
		lo := r.Uint32() >> r.IntN(33)
		hi := lo + r.Uint32()>>r.IntN(33)
		if hi < lo {
			hi = 0xffffffff
		}
		cases = append(cases, [2]uint32{lo, hi})
	}
	for _, c := range cases {
		ps := splitRange(c[0], c[1])
		if len(ps) > 62 {
			t.Errorf("%d-%d: %d blocks", c[0], c[1], len(ps))
		}
		// The blocks are aligned, in order, adjacent, and cover lo..hi.
		next := uint64(c[0])
		for _, p := range ps {
			size := uint64(1) << (32 - p.bits)
			if uint64(p.value) != next || uint64(p.value)%size != 0 {
				t.Fatalf("%d-%d: block %+v at %d", c[0], c[1], p, next)
			}
			next += size
		}
		if next != uint64(c[1])+1 {
			t.Fatalf("%d-%d: blocks end at %d", c[0], c[1], next)
		}
	}
	want := []rankPrefix{{5, 32}, {6, 31}, {8, 31}}
	if got := splitRange(5, 9); !reflect.DeepEqual(got, want) {
		t.Errorf("5-9 = %v, want %v", got, want)
	}
}

func TestIDs(t *testing.T) {
	s := &Set{Rules: []Rule{{Name: "a"}, {Name: "b", ID: 1}, {Name: "c"}, {Name: "d", ID: 3}, {Name: "e"}}}
	ids, err := IDs(s)
	if want := []uint32{2, 1, 4, 3, 5}; err != nil || !reflect.DeepEqual(ids, want) {
		t.Errorf("IDs = %v, %v; want %v", ids, err, want)
	}
}

// resolveAll resolves eth0..eth9 to 10..19.
func resolveAll(name string) (int, error) {
	var n int
	if _, err := fmt.Sscanf(name, "eth%d", &n); err != nil || n > 9 {
		return 0, errNoIface
	}
	return 10 + n, nil
}

func TestValidateErrors(t *testing.T) {
	r := func(name string, prio uint32, m Match, a Action) Rule {
		return Rule{Name: name, Priority: prio, Match: m, Action: a}
	}
	pfx := netip.MustParsePrefix
	tcp, udp := new(uint8(6)), new(uint8(17))
	for _, c := range []struct {
		name  string
		rules []Rule
		def   Action
		want  string
	}{
		{"host-bits", []Rule{r("a", 1, Match{Src: pfx("10.1.2.3/16")}, Drop())}, Pass(),
			`rules: rule 1 "a": src 10.1.2.3/16 has host bits set: write 10.1.0.0/16 for the network, or 10.1.2.3/32 for the host`},
		{"host-bits-v6", []Rule{r("a", 1, Match{Dst: pfx("fd00::1/64")}, Drop())}, Pass(), "dst fd00::1/64 has host bits set: write fd00::/64"},
		{"bad-prefix-len", []Rule{r("a", 1, Match{Src: netip.PrefixFrom(netip.MustParseAddr("10.0.0.0"), 33)}, Drop())}, Pass(),
			"src: prefix length out of range for 10.0.0.0"},
		{"mixed-families", []Rule{r("a", 1, Match{Src: pfx("10.0.0.0/8"), Dst: pfx("fd00::/8")}, Drop())}, Pass(),
			"src 10.0.0.0/8 and dst fd00::/8 are of different address families"},
		{"port-without-proto", []Rule{r("a", 1, Match{Dport: new(uint16(80))}, Drop())}, Pass(), "dport 80 needs proto tcp or udp"},
		{"port-with-icmp", []Rule{r("a", 1, Match{Proto: new(uint8(1)), Sport: new(uint16(80))}, Drop())}, Pass(), "sport 80 needs proto tcp or udp"},
		{"lovelock-tcp", []Rule{r("a", 1, Match{Proto: tcp, Tenant: new(uint32(3))}, Drop())}, Pass(),
			"proto tcp with Lovelock fields (type, tenant, rank, region): those match Lovelock packets, which are udp"},
		{"lovelock-port", []Rule{r("a", 1, Match{Proto: udp, Dport: new(uint16(53)), Type: new(wire.TypePing)}, Drop())}, Pass(),
			"dport 53 with Lovelock fields (type, tenant, rank, region): those match Lovelock packets, which go to port 61440"},
		{"proto-0", []Rule{r("a", 1, Match{Proto: new(uint8(0))}, Drop())}, Pass(), "proto 0 without src or dst"},
		{"ipv6-ah", []Rule{r("a", 1, Match{Proto: new(uint8(51)), Dst: pfx("fd00::/8")}, Drop())}, Pass(), "walks past IPv6 extension headers"},
		{"ipv6-proto-0", []Rule{r("a", 1, Match{Proto: new(uint8(0)), Src: pfx("::/0")}, Drop())}, Pass(), "walks past IPv6 extension headers"},
		{"ipv6-dstopts", []Rule{r("a", 1, Match{Proto: new(uint8(60)), Src: pfx("fd77::1/128")}, Drop())}, Pass(), "walks past IPv6 extension headers"},
		{"icmp-v6", []Rule{r("a", 1, Match{Proto: new(uint8(1)), Src: pfx("fd00::/8")}, Drop())}, Pass(), "proto icmp with IPv6 prefixes"},
		{"icmpv6-v4", []Rule{r("a", 1, Match{Proto: new(uint8(58)), Dst: pfx("10.0.0.0/8")}, Drop())}, Pass(), "proto icmpv6 with IPv4 prefixes"},
		{"unknown-iface", []Rule{r("a", 1, Match{Iface: "wlan0"}, Drop())}, Pass(), `rule 1 "a": iface: unknown interface "wlan0": no such interface`},
		{"unknown-redirect", []Rule{r("a", 1, Match{}, Redirect("wlan0"))}, Pass(), `rule 1 "a": action redirect:wlan0: unknown interface "wlan0"`},
		{"unknown-default", nil, Redirect("wlan0"), `rules: default: action redirect:wlan0: unknown interface "wlan0"`},
		{"xsk-queue", []Rule{r("a", 1, Match{}, XSK(64))}, Pass(), "action xsk:64: queue outside 0..63"},
		{"bad-verb", []Rule{r("a", 1, Match{}, Action{Verb: 9})}, Pass(), "action action(9): unknown"},
		{"no-name", []Rule{r("", 1, Match{}, Drop())}, Pass(), "rule 1: no name"},
		{"duplicate-name", []Rule{r("a", 1, Match{}, Drop()), r("a", 2, Match{}, Drop())}, Pass(), `rule 2 "a": name also used by rule 1`},
		{"duplicate-id", []Rule{{Name: "a", ID: 7, Action: Drop()}, {Name: "b", ID: 7, Priority: 1, Action: Drop()}}, Pass(), `rule 2 "b": id 7 is also rule 1 "a"'s`},
		{"id-range", []Rule{{Name: "a", ID: 65536, Action: Drop()}}, Pass(), `rule 1 "a": id 65536 outside 1..65535`},
		{"rank-and-region", []Rule{r("a", 1, Match{Rank: &RankRange{1, 2}, Region: new(uint32(3))}, Drop())}, Pass(),
			"rank 1-2 and region 3: both match the Lovelock destination field; set one"},
		{"rank-lo-hi", []Rule{r("a", 1, Match{Rank: &RankRange{9, 3}}, Drop())}, Pass(), "rank range 9-3 is empty: lo > hi"},
		{"unknown-type", []Rule{r("a", 1, Match{Type: new(wire.Type(0x7f))}, Drop())}, Pass(), "lovelock type type(0x7f) is not a known type"},
		{"overlap-same-priority", []Rule{
			r("web", 5, Match{Proto: tcp, Dport: new(uint16(443))}, Drop()),
			r("net", 5, Match{Dst: pfx("10.1.0.0/16")}, XSK(1)),
		}, Pass(), `rules: rules 1 "web" and 2 "net" both have priority 5 and both match dst 10.1.0.0/16, proto tcp, dport 443: give one a different priority or make their matches disjoint`},
		{"overlap-same-action", []Rule{r("a", 5, Match{Tenant: new(uint32(1))}, Drop()), r("b", 5, Match{Type: new(wire.TypePing)}, Drop())}, Pass(),
			`rules 1 "a" and 2 "b" both have priority 5 and both match proto udp, dport 61440, type ping, tenant 1`},
		{"overlap-identical", []Rule{r("a", 5, Match{Iface: "eth1"}, Drop()), r("b", 5, Match{Iface: "eth1"}, Pass())}, Pass(),
			`rules 1 "a" and 2 "b" both have priority 5 and both match ifindex 11`},
		{"overlap-match-all", []Rule{r("a", 5, Match{}, Drop()), r("b", 5, Match{Src: pfx("::/0")}, Pass())}, Pass(),
			`rules 1 "a" and 2 "b" both have priority 5 and both match IPv6`},
		{"overlap-rank-ranges", []Rule{
			r("a", 5, Match{Rank: &RankRange{0, 100}}, Drop()),
			r("b", 5, Match{Rank: &RankRange{100, 200}}, Drop()),
		}, Pass(), `rules 1 "a" and 2 "b" both have priority 5 and both match proto udp, dport 61440, rank 100`},
		{"overlap-prefixes", []Rule{
			r("a", 5, Match{Src: pfx("10.0.0.0/8"), Proto: tcp}, Drop()),
			r("b", 5, Match{Src: pfx("10.9.0.0/16"), Dst: pfx("10.1.0.0/16")}, Drop()),
		}, Pass(), `both match src 10.9.0.0/16, dst 10.1.0.0/16, proto tcp`},
		{"many-errors", func() []Rule {
			var rs []Rule
			for i := range 20 {
				rs = append(rs, r(fmt.Sprint("r", i), uint32(i), Match{Dport: new(uint16(1))}, Drop()))
			}
			return rs
		}(), Pass(), "rules: and 10 more problems"},
	} {
		s := &Set{Default: c.def, Rules: c.rules}
		err := Validate(s, resolveAll, 0)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v\nwant it to contain %q", c.name, err, c.want)
		}
		if _, cerr := Compile(s, resolveAll, 0); cerr == nil || cerr.Error() != err.Error() {
			t.Errorf("%s: Compile err = %v, Validate err = %v", c.name, cerr, err)
		}
		if _, cerr := NewClassifier(s, resolveAll, 0); cerr == nil {
			t.Errorf("%s: NewClassifier accepted the set", c.name)
		}
	}
}

// TestValidateAccepts covers sets that look close to the errors above but
// are fine.
func TestValidateAccepts(t *testing.T) {
	pfx := netip.MustParsePrefix
	tcp := new(uint8(6))
	for name, rules := range map[string][]Rule{
		"disjoint-ports": {
			{Name: "a", Priority: 5, Match: Match{Proto: tcp, Dport: new(uint16(80))}, Action: Drop()},
			{Name: "b", Priority: 5, Match: Match{Proto: tcp, Dport: new(uint16(443))}, Action: Drop()},
		},
		"disjoint-families": {
			{Name: "a", Priority: 5, Match: Match{Src: pfx("0.0.0.0/0")}, Action: Drop()},
			{Name: "b", Priority: 5, Match: Match{Dst: pfx("::/0")}, Action: Drop()},
		},
		"disjoint-protos": {
			{Name: "a", Priority: 5, Match: Match{Proto: tcp}, Action: Drop()},
			{Name: "b", Priority: 5, Match: Match{Tenant: new(uint32(0))}, Action: Drop()},
		},
		"adjacent-ranks": {
			{Name: "a", Priority: 5, Match: Match{Rank: &RankRange{0, 99}}, Action: Drop()},
			{Name: "b", Priority: 5, Match: Match{Rank: &RankRange{100, 200}}, Action: Drop()},
		},
		"rank-vs-region": {
			{Name: "a", Priority: 5, Match: Match{Rank: &RankRange{0, 99}}, Action: Drop()},
			{Name: "b", Priority: 5, Match: Match{Region: new(uint32(100))}, Action: Drop()},
		},
		"different-ifaces": {
			{Name: "a", Priority: 5, Match: Match{Iface: "eth0"}, Action: Drop()},
			{Name: "b", Priority: 5, Match: Match{Iface: "eth1"}, Action: Drop()},
		},
		"overlap-other-priority": {
			{Name: "a", Priority: 5, Match: Match{}, Action: Drop()},
			{Name: "b", Priority: 6, Match: Match{}, Action: Pass()},
		},
		"lovelock-port-explicit": {
			{Name: "a", Priority: 5, Match: Match{Proto: new(uint8(17)), Dport: new(uint16(wire.DefaultPort)), Tenant: new(uint32(1))}, Action: Drop()},
		},
		"proto-0-with-family": {{Name: "a", Match: Match{Proto: new(uint8(0)), Src: pfx("0.0.0.0/0")}, Action: Drop()}},
	} {
		if err := Validate(&Set{Rules: rules}, resolveAll, 0); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestNoResolver(t *testing.T) {
	s := &Set{Rules: []Rule{{Name: "a", Match: Match{Iface: "eth0"}, Action: Drop()}}}
	if err := Validate(s, nil, 0); err == nil || !strings.Contains(err.Error(), `interface "eth0": no resolver`) {
		t.Errorf("err = %v", err)
	}
}

// TestCompile checks a small set's compiled form entry by entry.
func TestCompile(t *testing.T) {
	s := &Set{Default: Redirect("eth2"), Rules: []Rule{
		{Name: "web", Priority: 10, Match: Match{Dst: netip.MustParsePrefix("10.1.0.0/16"), Proto: new(uint8(6)), Dport: new(uint16(443))}, Action: XSK(2)},
		{Name: "ranks", ID: 9, Priority: 20, Match: Match{Iface: "eth1", Type: new(wire.TypeBundle), Rank: &RankRange{5, 9}}, Action: Drop()},
		{Name: "v6", Priority: 5, Match: Match{Src: netip.MustParsePrefix("fd00:1:2::/48")}, Action: Redirect("eth3")},
		{Name: "shadowed", Priority: 1, Match: Match{Src: netip.MustParsePrefix("fd00:1:2::/48")}, Action: Drop()},
	}}
	rs, err := Compile(s, resolveAll, 4791)
	if err != nil {
		t.Fatal(err)
	}
	llFields := bpf.FieldIfindex | bpf.FieldProto | bpf.FieldLLType | bpf.FieldDport | bpf.FieldLovelock
	wantShapes := []bpf.Shape{
		{Fields: llFields, RankLen: 31, MaxPrio: 20}, // ranks 6-7 and 8-9
		{Fields: llFields, RankLen: 32, MaxPrio: 20}, // rank 5
		{Fields: bpf.FieldFamily | bpf.FieldProto | bpf.FieldDport, DstLen: 16, MaxPrio: 10},
		{Fields: bpf.FieldFamily, SrcLen: 48, MaxPrio: 5},
	}
	if !reflect.DeepEqual(rs.Shapes, wantShapes) {
		t.Errorf("shapes\n%+v\nwant\n%+v", rs.Shapes, wantShapes)
	}
	if rs.DefaultAction != bpf.ActionRedirect || rs.DefaultArg != 12 {
		t.Errorf("default %v %d", rs.DefaultAction, rs.DefaultArg)
	}
	llKey := func(rank uint32) bpf.FlowKey {
		return bpf.FlowKey{Ifindex: 11, Proto: 17, LlType: uint8(wire.TypeBundle), Dport: 4791, Rank: rank}
	}
	web := bpf.FlowKey{Family: 4, Proto: 6, Dport: 443}
	copy(web.Dst[:], []byte{10, 1})
	v6 := bpf.FlowKey{Family: 6}
	copy(v6.Src[:], []byte{0xfd, 0, 0, 1, 0, 2})
	ranks := bpf.RuleVal{Prio: 20, Id: 9, Action: uint16(bpf.ActionDrop)}
	want := []bpf.Entry{
		{Key: bpf.RuleKey{Shape: 0, Flow: llKey(6)}, Val: ranks},
		{Key: bpf.RuleKey{Shape: 0, Flow: llKey(8)}, Val: ranks},
		{Key: bpf.RuleKey{Shape: 1, Flow: llKey(5)}, Val: ranks},
		{Key: bpf.RuleKey{Shape: 2, Flow: web}, Val: bpf.RuleVal{Prio: 10, Id: 1, Action: uint16(bpf.ActionXSK), Arg: 2}},
		{Key: bpf.RuleKey{Shape: 3, Flow: v6}, Val: bpf.RuleVal{Prio: 5, Id: 2, Action: uint16(bpf.ActionRedirect), Arg: 13}},
	}
	if !reflect.DeepEqual(rs.Entries, want) {
		t.Errorf("entries\n%+v\nwant\n%+v", rs.Entries, want)
	}
	// Deterministic: the same set compiles the same, whatever map order did.
	for range 5 {
		again, err := Compile(s, resolveAll, 4791)
		if err != nil || !reflect.DeepEqual(again, rs) {
			t.Fatalf("second compile differs: %v", err)
		}
	}
}

func TestTooManyShapes(t *testing.T) {
	var rules []Rule
	for i := range 40 {
		// Every source prefix length is its own shape.
		p, _ := netip.MustParseAddr("10.0.0.0").Prefix(i%33 + 0)
		if i >= 33 {
			p, _ = netip.MustParseAddr("fd00::").Prefix(40 + i)
		}
		rules = append(rules, Rule{Name: fmt.Sprint("r", i), Priority: uint32(i), Match: Match{Src: p}, Action: Drop()})
	}
	err := Validate(&Set{Rules: rules}, nil, 0)
	for _, want := range []string{
		"rules: the set needs 40 mask shapes, the data plane holds 32",
		"family src/24", `1 rules, e.g. "r24"`,
		"to reduce them: use fewer distinct src prefix lengths (in use: [1 2 3",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v\nwant it to contain %q", err, want)
		}
	}
	// Rank ranges: the message names the rules that split into blocks.
	// 1-1, 1-3, 1-7, ... split into blocks of every length: 32 shapes, and
	// a rule without a rank makes the 33rd.
	rules = []Rule{{Name: "tenant", Match: Match{Tenant: new(uint32(99))}, Action: Drop()}}
	for i := range 32 {
		rules = append(rules, Rule{Name: fmt.Sprint("r", i), Priority: uint32(i + 1),
			Match: Match{Tenant: new(uint32(i)), Rank: &RankRange{1, uint32(1<<(i+1) - 1)}}, Action: Drop()})
	}
	err = Validate(&Set{Rules: rules}, nil, 0)
	for _, want := range []string{
		"align rank ranges to powers of two: a range splits into aligned blocks, each block length a shape (in use: [1 2 3",
		`"r1" rank 1-3 needs 2, "r2" rank 1-7 needs 3`,
		"proto dport tenant rank/31                   31 rules",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v\nwant it to contain %q", err, want)
		}
	}
}

// TestCompiledLookup runs generated packets through a Go model of the C
// lookup (rules.h: shapes in order, mask, look up, stop early) over the
// compiled set, and through the linear reference classifier. It needs no
// privileges, so it checks Compile where the BPF tests are skipped.
func TestCompiledLookup(t *testing.T) {
	g := newGen(7, wire.DefaultPort)
	n := 0
	for set := range 20 {
		s := g.ruleSet(t, fakeIfaces, 30+set*20)
		rs, err := Compile(s, fakeIfaces, 0)
		if err != nil {
			t.Fatal(err)
		}
		cl, err := NewClassifier(s, fakeIfaces, 0)
		if err != nil {
			t.Fatal(err)
		}
		for range 2000 {
			frame, iface := g.packet(t, s)
			idx, _ := fakeIfaces(iface)
			want := cl.Classify(frame, uint32(idx))
			fr, err := wire.ParseFrame(frame, wire.DefaultPort)
			key := flowKey(fr.Flow, uint32(idx))
			malformed := wire.StatusOf(err).Malformed() && !fr.BadLovelock
			if malformed {
				key = bpf.FlowKey{}
			}
			if fr.BadLovelock {
				key.Pad = shapeLovelock // as steer() marks it
			}
			id, action, arg := cLookup(rs, key, malformed)
			if id != want.RuleID || action != want.Action || arg != want.Arg {
				text, _ := Format(s)
				t.Fatalf("set %d: model of C: rule %d %v %d; reference: %+v\nframe % x\n%s", set, id, action, arg, want, frame, text)
			}
			n++
		}
	}
	t.Logf("%d packets, zero disagreements", n)
}

// shapeLovelock is SHAPE_LOVELOCK of include/rules.h, copied from the C.
const shapeLovelock = 0x80

// flowKey lays a flow out as struct flow_key.
func flowKey(f wire.Flow, ifindex uint32) bpf.FlowKey {
	k := bpf.FlowKey{Ifindex: ifindex, Family: f.Family, Proto: f.Proto, LlType: uint8(f.Type),
		Sport: f.Sport, Dport: f.Dport, Tenant: f.Tenant, Rank: f.Rank}
	if f.Src.IsValid() {
		copy(k.Src[:], f.Src.AsSlice())
		copy(k.Dst[:], f.Dst.AsSlice())
	}
	return k
}

// cLookup is classify() of rules.h in Go, written from the C, not from
// Compile's helpers: shapes in order, the flow key ANDed with each shape's
// mask as the data plane receives it (bpf.Shape.Mask), pad byte included,
// one lookup per shape, and the early stop.
func cLookup(rs *bpf.Ruleset, f bpf.FlowKey, malformed bool) (uint32, bpf.Action, uint32) {
	id, action, arg := uint32(0), rs.DefaultAction, rs.DefaultArg
	if malformed {
		return id, action, arg
	}
	entries := map[bpf.RuleKey]bpf.RuleVal{}
	for _, e := range rs.Entries {
		entries[e.Key] = e.Val
	}
	var best *bpf.RuleVal
	for i, sh := range rs.Shapes {
		if best != nil && sh.MaxPrio <= best.Prio {
			break
		}
		m := sh.Mask()
		k := bpf.RuleKey{Shape: uint32(i), Flow: bpf.FlowKey{
			Ifindex: f.Ifindex & m.Ifindex, Family: f.Family & m.Family, Proto: f.Proto & m.Proto,
			LlType: f.LlType & m.LlType, Pad: f.Pad & m.Pad,
			Sport: f.Sport & m.Sport, Dport: f.Dport & m.Dport, Tenant: f.Tenant & m.Tenant, Rank: f.Rank & m.Rank,
		}}
		for j := range k.Flow.Src {
			k.Flow.Src[j] = f.Src[j] & m.Src[j]
			k.Flow.Dst[j] = f.Dst[j] & m.Dst[j]
		}
		if v, ok := entries[k]; ok && (best == nil || v.Prio > best.Prio) {
			best = &v
		}
	}
	if best != nil {
		id, action, arg = best.Id, bpf.Action(best.Action), best.Arg
	}
	return id, action, arg
}
