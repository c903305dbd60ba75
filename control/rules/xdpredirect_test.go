package rules

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/lovelock-dpu/lovelock/control/netdev"
	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// TestXDPRedirectTargets: a redirect from a native XDP hook to a device
// that cannot transmit XDP frames (a bridge, a macvlan, a veth whose peer
// runs no XDP program) is refused with a message that
// names the rule and the device and says what to do; to a veth whose peer
// runs an XDP program it is accepted, and so is a redirect to a bridge
// from a TC hook. The devices are real, in a namespace of the test's, and
// the kernel says what each can do (netdev family, Linux 6.3+). A kernel
// before 6.3 cannot say: there every set is accepted, with one warning that
// names the targets it could not check (make image-bpf-test-older runs this
// on Debian's 6.1).
func TestXDPRedirectTargets(t *testing.T) {
	checked := testenv.KernelAtLeast(t, 6, 3)
	ns := testenv.NewNetNS(t)
	// xin runs the classifier in native XDP, tcin in a TC hook (only the
	// names matter here: CheckXDPRedirects is told where it runs).
	testenv.VethPair(t, testenv.VethEnd{NS: ns, Name: "xin"}, testenv.VethEnd{NS: ns, Name: "xin-peer"})
	testenv.VethPair(t, testenv.VethEnd{NS: ns, Name: "tcin"}, testenv.VethEnd{NS: ns, Name: "tcin-peer"})
	// vout's peer runs an XDP program, vbare's does not.
	testenv.VethPair(t, testenv.VethEnd{NS: ns, Name: "vout"}, testenv.VethEnd{NS: ns, Name: "vout-peer"})
	testenv.VethPair(t, testenv.VethEnd{NS: ns, Name: "vbare"}, testenv.VethEnd{NS: ns, Name: "vbare-peer"})
	testenv.XDPPassOn(t, ns, "vout-peer")
	// A bridge and a macvlan (VLAN and dummy devices cannot transmit XDP
	// frames either, but the kernel CI runs on has neither driver: no case
	// here, since CI takes a skipped case for a failure).
	testenv.InNetNS(t, ns, func() error {
		xin, err := netlink.LinkByName("xin")
		if err != nil {
			return err
		}
		for _, l := range []netlink.Link{
			&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}},
			&netlink.Macvlan{LinkAttrs: netlink.LinkAttrs{Name: "mv0", ParentIndex: xin.Attrs().Index}, Mode: netlink.MACVLAN_MODE_BRIDGE},
		} {
			if err := netlink.LinkAdd(l); err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		return nil
	})

	xdp := XDPHooks{Ifaces: []string{"xin", "other0"}}
	for _, tc := range []struct {
		name   string
		rules  string
		hooks  XDPHooks
		errs   []string // each must be in the error; none: accepted
		warned []string // each must be in the warnings
		// unchecked are the targets a kernel before 6.3 cannot check,
		// each named in its one warning; none: no warning there.
		unchecked []string
	}{
		{name: "xdp to a bridge", hooks: xdp, rules: `rules:
  - {name: ok, priority: 2, match: {iface: xin, proto: udp, dport: 7000}, action: "redirect:vout"}
  - {name: out, priority: 1, match: {iface: xin, proto: udp}, action: "redirect:br0"}
`, errs: []string{`rules: rule 2 "out": redirect to br0 from the native XDP hook on xin: br0 (bridge) cannot transmit XDP frames`,
			"drop every packet", "run the classifier on xin in a TC hook (tc-ingress) or in generic XDP"}, unchecked: []string{"vout", "br0"}},
		{name: "xdp to a macvlan", hooks: xdp, rules: `rules:
  - {name: out, priority: 1, match: {iface: xin}, action: "redirect:mv0"}
`, errs: []string{`rule 1 "out": redirect to mv0 from the native XDP hook on xin: mv0 (macvlan) cannot transmit XDP frames`}, unchecked: []string{"mv0"}},
		{name: "xdp to a veth whose peer runs no XDP program", hooks: xdp, rules: `rules:
  - {name: out, priority: 1, match: {iface: xin}, action: "redirect:vbare"}
`, errs: []string{`rule 1 "out": redirect to vbare from the native XDP hook on xin: vbare (veth) cannot transmit XDP frames`,
			"attach one to vbare's peer (xdp_pass"}, unchecked: []string{"vbare"}},
		{name: "xdp to a veth whose peer runs one", hooks: xdp, rules: `rules:
  - {name: out, priority: 1, match: {iface: xin}, action: "redirect:vout"}
`, unchecked: []string{"vout"}},
		{name: "tc to a bridge", hooks: xdp, rules: `rules:
  - {name: out, priority: 1, match: {iface: tcin}, action: "redirect:br0"}
`},
		{name: "no iface, a native XDP hook on the node", hooks: xdp, rules: `rules:
  - {name: out, priority: 1, match: {proto: udp}, action: "redirect:br0"}
`, errs: []string{`rule 1 "out": redirect to br0 from the native XDP hooks on other0, xin (a rule without iface runs on every hooked interface)`,
			"give the rule the iface of a TC hook"}, unchecked: []string{"br0"}},
		{name: "no iface, TC hooks only", rules: `rules:
  - {name: out, priority: 1, match: {proto: udp}, action: "redirect:br0"}
`},
		{name: "the default", hooks: xdp, rules: `default: "redirect:br0"
`, errs: []string{`rules: default: redirect to br0 from the native XDP hooks on other0, xin`}, unchecked: []string{"br0"}},
		{name: "hooks unknown: a warning", hooks: XDPHooks{Unknown: true}, rules: `rules:
  - {name: out, priority: 1, match: {iface: tcin}, action: "redirect:br0"}
  - {name: ok, priority: 2, match: {iface: tcin}, action: "redirect:vout"}
`, warned: []string{`rules: rule 1 "out": redirect to br0: br0 (bridge) cannot transmit XDP frames`, "lovelockd refuses the rule if it runs in a native XDP hook"},
			unchecked: []string{"br0", "vout"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, err := Parse([]byte(tc.rules))
			if err != nil {
				t.Fatal(err)
			}
			var warnings []string
			testenv.InNetNS(t, ns, func() error {
				if err := Validate(set, LinkResolver, 0); err != nil {
					return err
				}
				warnings, err = CheckXDPRedirects(set, LinkResolver, tc.hooks)
				return nil
			})
			if !checked {
				// Applied, with the warning lovelockd logs and returns.
				if err != nil {
					t.Fatalf("refused before 6.3: %v", err)
				}
				if len(tc.unchecked) == 0 {
					if len(warnings) != 0 {
						t.Errorf("warnings %q, want none", warnings)
					}
					return
				}
				if len(warnings) != 1 || !strings.Contains(warnings[0], "rules: could not check that ") ||
					!strings.Contains(warnings[0], netdev.ErrNoFamily.Error()) {
					t.Fatalf("warnings %q, want one that could not check, for the missing netdev family", warnings)
				}
				for _, target := range tc.unchecked {
					if !strings.Contains(warnings[0], target) {
						t.Errorf("warning lacks %s: %q", target, warnings[0])
					}
				}
				return
			}
			switch {
			case len(tc.errs) == 0 && err != nil:
				t.Errorf("refused: %v", err)
			case len(tc.errs) > 0 && err == nil:
				t.Errorf("accepted, want an error with %q", tc.errs)
			}
			for _, want := range tc.errs {
				if err != nil && !strings.Contains(err.Error(), want) {
					t.Errorf("error lacks %q:\n%v", want, err)
				}
			}
			if len(warnings) != len(tc.warned) && len(tc.warned) == 0 {
				t.Errorf("warnings %q, want none", warnings)
			}
			for _, want := range tc.warned {
				if !slices.ContainsFunc(warnings, func(w string) bool { return strings.Contains(w, want) }) {
					t.Errorf("warnings lack %q: %q", want, warnings)
				}
			}
		})
	}
}

// fakeDevices answers for ifindexes 1.. with feats[ifindex-1].
type fakeDevices struct {
	feats []netdev.XDPFeatures
	err   error
	asked int
}

func (f *fakeDevices) xdpFeatures(ifindex int) (netdev.XDPFeatures, error) {
	f.asked++
	if f.err != nil {
		return 0, f.err
	}
	return f.feats[ifindex-1], nil
}

func (f *fakeDevices) kind(int) string { return "" }

// TestXDPRedirectUnchecked: where the kernel cannot say what a device can do
// (no netdev family before Linux 6.3), nothing is refused and a warning
// names each target once; each target is asked about once.
func TestXDPRedirectUnchecked(t *testing.T) {
	set, err := Parse([]byte(`rules:
  - {name: a, priority: 1, match: {iface: p0, proto: udp}, action: "redirect:br0"}
  - {name: b, priority: 1, match: {iface: p0, proto: tcp}, action: "redirect:br0"}
  - {name: c, priority: 1, match: {iface: p0, proto: icmp}, action: "redirect:p1"}
`))
	if err != nil {
		t.Fatal(err)
	}
	resolve := func(name string) (int, error) { return map[string]int{"p0": 1, "br0": 2, "p1": 3}[name], nil }
	devs := &fakeDevices{err: netdev.ErrNoFamily}
	warnings, err := checkXDPRedirects(set, resolve, XDPHooks{Ifaces: []string{"p0"}}, devs)
	if err != nil {
		t.Fatalf("refused: %v", err)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "could not check that br0, p1 can transmit XDP frames") ||
		!strings.Contains(warnings[0], netdev.ErrNoFamily.Error()) {
		t.Errorf("warnings %q, want one naming br0 and p1 and the missing family", warnings)
	}
	if devs.asked != 2 {
		t.Errorf("asked the kernel %d times, want once per target (2)", devs.asked)
	}
	// Where the hooks are unknown, every redirect that cannot is a
	// warning, as many as an error would list.
	var many strings.Builder
	many.WriteString("rules:\n")
	for i := range maxErrors + 5 {
		fmt.Fprintf(&many, "  - {name: r%d, priority: %d, action: \"redirect:br0\"}\n", i, i)
	}
	manySet, err := Parse([]byte(many.String()))
	if err != nil {
		t.Fatal(err)
	}
	devs = &fakeDevices{feats: []netdev.XDPFeatures{0, 0}}
	warnings, err = checkXDPRedirects(manySet, resolve, XDPHooks{Unknown: true}, devs)
	if err != nil || len(warnings) != maxErrors+1 || warnings[maxErrors] != "rules: and 5 more redirects to devices that cannot transmit XDP frames" {
		t.Errorf("hooks unknown: err %v, warnings %q; want %d and 5 more", err, warnings, maxErrors)
	}

	// The same set where the kernel answers: br0 cannot, p1 can.
	devs = &fakeDevices{feats: []netdev.XDPFeatures{0, 0, netdev.XDPBasic | netdev.XDPNdoXmit}}
	warnings, err = checkXDPRedirects(set, resolve, XDPHooks{Ifaces: []string{"p0"}}, devs)
	if err == nil || len(warnings) != 0 || !strings.Contains(err.Error(), `rule 1 "a": redirect to br0`) ||
		!strings.Contains(err.Error(), `rule 2 "b": redirect to br0`) || strings.Contains(err.Error(), `"c"`) {
		t.Errorf("err %v, warnings %q; want rules a and b refused", err, warnings)
	}
}
