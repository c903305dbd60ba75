package rules

import (
	"errors"
	"testing"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// fixtureSets are the rule sets the fixture table refers to, as rule files.
var fixtureSets = map[string]string{
	"main": `
default: pass
rules:
  - {name: drop-telnet, priority: 500, match: {proto: tcp, dport: 23}, action: drop}
  - {name: web-host,    priority: 200, match: {dst: 10.1.2.3/32, proto: tcp, dport: 443}, action: drop}
  - {name: web,         priority: 100, match: {dst: 10.1.0.0/16, proto: tcp, dport: 443}, action: "xsk:2"}
  - {name: v6-net,      priority: 50,  match: {src: "fd00:1::/32"}, action: redirect:ext}
  - {name: ingest-lo,   priority: 300, match: {type: ingest-input, rank: 0-15}, action: "xsk:3"}
  - {name: ingest-hi,   priority: 300, match: {type: ingest-input, rank: 16-31}, action: "xsk:4"}
  - {name: tenant0,     priority: 250, match: {tenant: 0}, action: drop}
  - {name: region,      priority: 260, match: {region: 4096, tenant: 9}, action: redirect:v3}
  - {name: from-v0,     priority: 10,  match: {iface: v0}, action: drop}
  - {name: icmp,        priority: 20,  match: {proto: icmp, src: 0.0.0.0/0}, action: drop}
  - {name: any-v4,      priority: 5,   match: {src: 0.0.0.0/0}, action: pass}
  - {name: dns,         priority: 400, match: {iface: v2, proto: udp, sport: 53}, action: redirect:v1}
`,
	"drop-default": `
default: drop
rules:
  - {name: ssh, priority: 1, match: {proto: tcp, dport: 22, dst: 10.0.0.0/8}, action: pass}
  - {name: ll,  priority: 2, match: {proto: udp, dport: 61440}, action: "xsk:0"}
`,
	// A forwarding DPU: UDP to the Lovelock port that is not Lovelock (a
	// DNS reply to a host whose ephemeral port is 61440) must take the
	// address rules, not the drop default.
	"forward": `
default: drop
rules:
  - {name: to-hosts, priority: 10, match: {dst: 10.1.0.0/16, proto: udp}, action: redirect:v1}
  - {name: tenant0,  priority: 20, match: {tenant: 0}, action: pass}
  - {name: rank0,    priority: 30, match: {type: ping, rank: 0-3}, action: pass}
`,
	"redirect-default": `
default: redirect:v1
rules:
  - {name: v6-only, priority: 7, match: {dst: "::/0"}, action: pass}
`,
}

type fixture struct {
	name  string
	set   string // key of fixtureSets
	iface string // ingress interface; "" is lo
	frame func(testing.TB) []byte
	rule  string // the rule that must match, or "default"
	act   string // the action, as Action.String writes it
	st    wire.Status
}

func fixtures() []fixture {
	b := func(p pkt) func(testing.TB) []byte { return p.build }
	raw := func(p pkt, mutate func([]byte) []byte) func(testing.TB) []byte {
		return func(tb testing.TB) []byte { return mutate(p.build(tb)) }
	}
	vlan := func(p pkt) pkt { p.vlan = true; return p }
	frag := func(p pkt, k fragKind) pkt { p.frag = k; return p }
	ext := func(p pkt, e ...uint8) pkt { p.ext = e; return p }
	ll := lovelock
	const (
		ok  = wire.StatusOK
		not = wire.StatusNotLovelock
	)
	return []fixture{
		{"tcp-23", "main", "", b(tcp("10.9.0.1", "10.1.2.3", 5000, 23)), "drop-telnet", "drop", not},
		{"tcp-23-vlan", "main", "", b(vlan(tcp("10.9.0.1", "10.1.2.3", 5000, 23))), "drop-telnet", "drop", not},
		{"tcp-23-v6", "main", "", b(tcp("fd00:1::1", "fd00:2::1", 5000, 23)), "drop-telnet", "drop", not},
		{"web-host-beats-web", "main", "", b(tcp("10.9.0.1", "10.1.2.3", 5000, 443)), "web-host", "drop", not},
		{"web", "main", "", b(tcp("10.9.0.1", "10.1.9.9", 5000, 443)), "web", "xsk:2", not},
		{"web-wrong-proto", "main", "", b(udp("10.9.0.1", "10.1.9.9", 5000, 443)), "any-v4", "pass", not},
		{"web-outside-prefix", "main", "", b(tcp("10.9.0.1", "10.2.0.1", 5000, 443)), "any-v4", "pass", not},
		{"v6-net", "main", "", b(udp("fd00:1:ff::5", "fd00:2::1", 1, 2)), "v6-net", "redirect:ext", not},
		{"v6-outside", "main", "", b(udp("fd00:2::5", "fd00:1::1", 1, 2)), "default", "pass", not},
		{"v6-ext-headers", "main", "", b(ext(udp("fd00:1::5", "fd00:2::1", 1, 2), 0, 60, 44)), "v6-net", "redirect:ext", not},
		{"ingest-lo", "main", "", b(ll("10.9.0.1", "10.1.0.1", wire.TypeIngestInput, 3, 7)), "ingest-lo", "xsk:3", ok},
		{"ingest-lo-edge", "main", "", b(ll("10.9.0.1", "10.1.0.1", wire.TypeIngestInput, 3, 15)), "ingest-lo", "xsk:3", ok},
		{"ingest-hi", "main", "", b(ll("10.9.0.1", "10.1.0.1", wire.TypeIngestInput, 3, 16)), "ingest-hi", "xsk:4", ok},
		{"ingest-out-of-range", "main", "", b(ll("10.9.0.1", "10.1.0.1", wire.TypeIngestInput, 3, 40)), "any-v4", "pass", ok},
		{"ingest-v6", "main", "", b(ll("fd00:3::1", "fd00:3::2", wire.TypeIngestInput, 3, 31)), "ingest-hi", "xsk:4", ok},
		{"other-type", "main", "", b(ll("fd00:3::1", "fd00:3::2", wire.TypePing, 3, 7)), "default", "pass", ok},
		{"tenant0", "main", "", b(ll("fd00:3::1", "fd00:3::2", wire.TypePing, 0, 7)), "tenant0", "drop", ok},
		{"ingest-beats-tenant0", "main", "", b(ll("10.9.0.1", "10.1.0.1", wire.TypeIngestInput, 0, 7)), "ingest-lo", "xsk:3", ok},
		{"tenant0-not-for-plain-udp", "main", "", b(udp("fd00:3::1", "fd00:3::2", 1, 2)), "default", "pass", not},
		{"tenant0-not-for-tcp-to-ll-port", "main", "", b(tcp("fd00:3::1", "fd00:3::2", 1, wire.DefaultPort)), "default", "pass", not},
		{"region", "main", "", b(ll("fd00:3::1", "fd00:3::2", wire.TypeBundle, 9, 4096)), "region", "redirect:v3", ok},
		{"region-other-tenant", "main", "", b(ll("fd00:3::1", "fd00:3::2", wire.TypeBundle, 8, 4096)), "default", "pass", ok},
		{"iface-v0", "main", "v0", b(pkt{}), "from-v0", "drop", not},
		{"iface-lo", "main", "lo", b(pkt{}), "default", "pass", not},
		{"iface-v1", "main", "v1", b(pkt{}), "default", "pass", not},
		{"dns-on-v2", "main", "v2", b(udp("10.9.0.1", "10.1.0.1", 53, 3000)), "dns", "redirect:v1", not},
		{"dns-on-v3", "main", "v3", b(udp("10.9.0.1", "10.1.0.1", 53, 3000)), "any-v4", "pass", not},
		{"icmp", "main", "", b(pkt{src: addr("10.9.0.1"), dst: addr("10.1.0.1"), proto: 1}), "icmp", "drop", not},
		{"icmpv6", "main", "", b(pkt{src: addr("fd00:5::1"), dst: addr("fd00:5::2"), proto: 58}), "default", "pass", not},
		// Fragments are classified on L3 alone: no ports, no Lovelock fields.
		{"fragment-tcp-23", "main", "", b(frag(tcp("10.9.0.1", "10.1.2.3", 5000, 23), firstFrag)), "any-v4", "pass", not},
		{"fragment-later", "main", "", b(frag(tcp("10.9.0.1", "10.1.2.3", 5000, 23), laterFrag)), "any-v4", "pass", not},
		{"fragment-v6", "main", "", b(frag(tcp("fd00:1::1", "fd00:2::1", 5000, 23), firstFrag)), "v6-net", "redirect:ext", not},
		{"fragment-lovelock", "main", "", b(frag(ll("fd00:3::1", "fd00:3::2", wire.TypePing, 0, 7), firstFrag)), "default", "pass", not},
		// Malformed packets get the default action, whatever matches them.
		{"malformed-on-v0", "main", "v0", raw(tcp("10.9.0.1", "10.1.2.3", 5000, 23), func(f []byte) []byte { f[14] = 0x44; return f }),
			"default", "pass", wire.StatusBadHeader},
		{"truncated-lovelock", "main", "", raw(ll("10.9.0.1", "10.1.0.1", wire.TypeIngestInput, 3, 7), func(f []byte) []byte { return f[:len(f)-1] }),
			"default", "pass", wire.StatusTruncated},
		// But a bad Lovelock header alone leaves the L3/L4 rules to
		// apply (any-v4), and no Lovelock rule (tenant0 would drop it).
		{"bad-version", "main", "", raw(ll("10.9.0.1", "10.1.0.1", wire.TypeIngestInput, 3, 7), func(f []byte) []byte { f[42] = 9; return f }),
			"any-v4", "pass", wire.StatusBadVersion},
		{"unknown-type", "main", "", raw(ll("10.9.0.1", "10.1.0.1", wire.TypeIngestInput, 0, 7), func(f []byte) []byte { f[43] = 0x7f; return f }),
			"any-v4", "pass", wire.StatusUnknownType},
		{"ethernet-padding", "main", "", raw(ll("10.9.0.1", "10.1.0.1", wire.TypeIngestInput, 3, 20), func(f []byte) []byte { return append(f, 0, 0, 0, 0) }),
			"ingest-hi", "xsk:4", ok},

		{"drop-default/ssh", "drop-default", "", b(tcp("192.168.0.1", "10.3.0.1", 5000, 22)), "ssh", "pass", not},
		{"drop-default/ssh-outside", "drop-default", "", b(tcp("192.168.0.1", "11.3.0.1", 5000, 22)), "default", "drop", not},
		{"drop-default/lovelock", "drop-default", "", b(ll("10.9.0.1", "10.1.0.1", wire.TypePong, 3, 7)), "ll", "xsk:0", ok},
		{"drop-default/malformed", "drop-default", "", raw(ll("10.9.0.1", "10.1.0.1", wire.TypePong, 3, 7), func(f []byte) []byte { return f[:40] }),
			"default", "drop", wire.StatusTruncated},
		{"drop-default/arp", "drop-default", "", b(pkt{}), "default", "drop", not},
		// UDP to the Lovelock port whose Lovelock header fails its checks
		// takes the rules on its addresses and protocol, never one on
		// Lovelock fields (its key holds zeros there: tenant 0, rank 0).
		{"forward/dns-reply-to-ll-port", "forward", "", b(udp("10.9.0.53", "10.1.0.7", 53, wire.DefaultPort)),
			"to-hosts", "redirect:v1", wire.StatusTruncated},
		{"forward/bad-version-tenant0", "forward", "", raw(ll("10.9.0.1", "10.1.0.1", wire.TypePing, 0, 0), func(f []byte) []byte { f[42] = 9; return f }),
			"to-hosts", "redirect:v1", wire.StatusBadVersion},
		{"forward/bad-length-tenant0", "forward", "", raw(ll("10.9.0.1", "10.1.0.1", wire.TypePing, 0, 0), func(f []byte) []byte { f[65]++; return f }),
			"to-hosts", "redirect:v1", wire.StatusBadLength},
		{"forward/not-lovelock-no-rule", "forward", "", b(udp("10.9.0.53", "10.2.0.7", 53, wire.DefaultPort)),
			"default", "drop", wire.StatusTruncated},
		{"forward/valid-rank0", "forward", "", b(ll("10.9.0.1", "10.1.0.1", wire.TypePing, 0, 0)), "rank0", "pass", ok},
		{"forward/valid-tenant0", "forward", "", b(ll("10.9.0.1", "10.1.0.1", wire.TypePong, 0, 9)), "tenant0", "pass", ok},
		{"forward/ip-truncated", "forward", "", raw(ll("10.9.0.1", "10.1.0.1", wire.TypePing, 0, 0), func(f []byte) []byte { return f[:len(f)-1] }),
			"default", "drop", wire.StatusTruncated},
		{"redirect-default/v4", "redirect-default", "", b(udp("10.9.0.1", "10.1.0.1", 1, 2)), "default", "redirect:v1", not},
		{"redirect-default/v6", "redirect-default", "", b(udp("fd00::1", "fd00::2", 1, 2)), "v6-only", "pass", not},
	}
}

// parsedFixtureSets parses fixtureSets.
func parsedFixtureSets(tb testing.TB) map[string]*Set {
	out := map[string]*Set{}
	for name, text := range fixtureSets {
		s, err := Parse([]byte(text))
		if err != nil {
			tb.Fatalf("set %s: %v", name, err)
		}
		out[name] = s
	}
	return out
}

var errNoIface = errors.New("no such interface")

// fakeIfaces resolves the harness's interface names without a namespace,
// for the Go-only tests.
func fakeIfaces(name string) (int, error) {
	for i, n := range harnessIfaces {
		if n == name {
			return i + 1, nil
		}
	}
	if name == "ext" {
		return 4242, nil
	}
	return 0, errNoIface
}

// checkFixture compares a verdict with the fixture's expectation.
func checkFixture(t *testing.T, c fixture, v Verdict, names map[uint32]string, resolve Resolver) {
	t.Helper()
	if got := names[v.RuleID]; got != c.rule {
		t.Errorf("%s: rule %q, want %q", c.name, got, c.rule)
	}
	want, err := ParseAction(c.act)
	if err != nil {
		t.Fatal(err)
	}
	var arg uint32
	switch want.Verb {
	case bpf.ActionRedirect:
		idx, _ := resolve(want.Iface)
		arg = uint32(idx)
	case bpf.ActionXSK:
		arg = want.Queue
	}
	if v.Action != want.Verb || v.Arg != arg {
		t.Errorf("%s: action %v arg %d, want %v arg %d", c.name, v.Action, v.Arg, want.Verb, arg)
	}
	if v.Status != c.st {
		t.Errorf("%s: status %v, want %v", c.name, v.Status, c.st)
	}
}

// TestFixturesGo runs the fixture table through the Go classifier; it needs
// no privileges. TestFixturesBPF runs the same table through both.
func TestFixturesGo(t *testing.T) {
	sets := parsedFixtureSets(t)
	for _, c := range fixtures() {
		s := sets[c.set]
		cl, err := NewClassifier(s, fakeIfaces, 0)
		if err != nil {
			t.Fatalf("%s: %v", c.set, err)
		}
		names := ruleNames(t, s)
		iface := c.iface
		if iface == "" {
			iface = "lo"
		}
		idx, _ := fakeIfaces(iface)
		checkFixture(t, c, cl.Classify(c.frame(t), uint32(idx)), names, fakeIfaces)
	}
}

// TestFixturesBPF runs the fixture table through the steering program
// (BPF_PROG_TEST_RUN, in a namespace with real interfaces) and the Go
// classifier: both must give the fixture's verdict, the XDP return code must
// fit the action, exactly the expected rule's counter must rise, and the
// data plane's verdict counters must add up.
func TestFixturesBPF(t *testing.T) {
	h := newHarness(t, 0)
	sets := parsedFixtureSets(t)
	var (
		a   *applied
		cur string
	)
	compared := 0
	for _, c := range fixtures() {
		if c.set != cur {
			// Counters carry over from set to set; apply reads them afresh.
			var err error
			if a, err = h.apply(sets[c.set]); err != nil {
				t.Fatalf("%s: %v", c.set, err)
			}
			cur = c.set
		}
		iface := c.iface
		if iface == "" {
			iface = "lo"
		}
		frame := c.frame(t)
		var v Verdict
		var d string
		if err := h.inNS(func() error {
			var err error
			v, d, err = a.run(frame, uint32(h.ifaces[iface]))
			return err
		}); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if d != "" {
			t.Errorf("%s: BPF and Go disagree: %s\nframe % x", c.name, d, frame)
		}
		checkFixture(t, c, v, a.names, h.resolve)
		if err := a.checkStats(); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		compared++
	}
	t.Logf("%d fixtures compared", compared)
}

func ruleNames(tb testing.TB, s *Set) map[uint32]string {
	ids, err := IDs(s)
	if err != nil {
		tb.Fatal(err)
	}
	names := map[uint32]string{0: "default"}
	for i, id := range ids {
		names[id] = s.Rules[i].Name
	}
	return names
}
