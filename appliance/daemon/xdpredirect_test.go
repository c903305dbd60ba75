package daemon

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/control/netdev"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// xdpRedirectNS is a namespace for the XDP redirect tests: xin for a native
// XDP hook, gen for a generic one, tcin for a TC one, vout a veth whose
// peer runs an XDP program, and, unless late, a bridge br0. It skips the
// test on a kernel that cannot say what a device can do.
func xdpRedirectNS(t *testing.T) netns.NsHandle {
	t.Helper()
	ns := testenv.NewNetNS(t)
	for _, name := range []string{"xin", "gen", "tcin", "vout"} {
		testenv.VethPair(t, testenv.VethEnd{NS: ns, Name: name}, testenv.VethEnd{NS: ns, Name: name + "-peer"})
	}
	testenv.XDPPassOn(t, ns, "vout-peer")
	var noFamily error
	testenv.InNetNS(t, ns, func() error {
		if _, err := netdev.DevXDPFeatures(1); errors.Is(err, netdev.ErrNoFamily) {
			noFamily = err
			return nil
		}
		return addBridge("br0")
	})
	if noFamily != nil {
		t.Skipf("the kernel cannot say: %v", noFamily)
	}
	return ns
}

func addBridge(name string) error {
	if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
		return err
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	return netlink.LinkSetUp(l)
}

// xdpRedirectDaemon starts lovelockd in ns with xdpRedirectHooks, closed
// when the test ends.
func xdpRedirectDaemon(t *testing.T, ns netns.NsHandle) *Daemon {
	t.Helper()
	cfg, _ := tempConfig(t)
	cfg.Metrics = ""
	cfg.Interfaces = xdpRedirectHooks
	var d *Daemon
	testenv.InNetNS(t, ns, func() error {
		var err error
		d, err = New(cfg, slog.New(slog.DiscardHandler))
		return err
	})
	t.Cleanup(func() { d.Close() })
	return d
}

var xdpRedirectHooks = []attach.Attachment{
	{Iface: "xin", Hook: attach.HookXDP, Mode: attach.ModeNative},
	{Iface: "gen", Hook: attach.HookXDP, Mode: attach.ModeGeneric},
	{Iface: "tcin", Hook: attach.HookTCIngress},
}

// TestXDPRedirectChecked: lovelockd refuses a rule set that redirects from a
// native XDP hook to a device that cannot transmit XDP frames (a bridge),
// where the kernel would drop every packet after the redirect counter
// counted it, and says why and what to do; the set it ran stays. A
// redirect to a veth whose peer runs an XDP program is accepted, and so
// is one to the bridge from a TC hook or generic XDP. An XDP attachment
// that would make the live rules redirect so is refused too.
func TestXDPRedirectChecked(t *testing.T) {
	ns := xdpRedirectNS(t)
	d := xdpRedirectDaemon(t, ns)
	if len(d.failures) != 0 {
		t.Fatalf("start: failures %v", d.failures)
	}
	for _, tc := range []struct {
		name  string
		rules string
		errs  []string // each must be in the error; none: applied
	}{
		{name: "xdp to a bridge", rules: `rules:
  - {name: out, priority: 1, match: {iface: xin, proto: udp}, action: "redirect:br0"}
`, errs: []string{`rule 1 "out": redirect to br0 from the native XDP hook on xin: br0 (bridge) cannot transmit XDP frames`,
			"run the classifier on xin in a TC hook"}},
		{name: "no iface, so xdp too, to a bridge", rules: `rules:
  - {name: out, priority: 1, match: {proto: udp}, action: "redirect:br0"}
`, errs: []string{`rule 1 "out": redirect to br0 from the native XDP hooks on xin (a rule without iface runs on every hooked interface)`}},
		{name: "the default from xdp to a bridge", rules: `default: "redirect:br0"
`, errs: []string{`default: redirect to br0 from the native XDP hooks on xin`}},
		{name: "xdp to a veth whose peer runs an XDP program", rules: `rules:
  - {name: out, priority: 1, match: {iface: xin, proto: udp}, action: "redirect:vout"}
`},
		{name: "tc to a bridge", rules: `rules:
  - {name: out, priority: 1, match: {iface: tcin, proto: udp}, action: "redirect:br0"}
`},
		{name: "generic xdp to a bridge", rules: `rules:
  - {name: out, priority: 1, match: {iface: gen, proto: udp}, action: "redirect:br0"}
`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, err := rules.Parse([]byte(tc.rules))
			if err != nil {
				t.Fatal(err)
			}
			before := d.live
			// The dry run (CheckRules) says what the apply then does.
			var checkErr error
			testenv.InNetNS(t, ns, func() error {
				_, checkErr = d.CheckRules(*set)
				_, err = d.ApplyRules(*set)
				return nil
			})
			if (checkErr == nil) != (err == nil) || checkErr != nil && checkErr.Error() != err.Error() {
				t.Errorf("CheckRules: %v; ApplyRules: %v", checkErr, err)
			}
			if len(tc.errs) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var bad *api.BadRequestError
			if !errors.As(err, &bad) {
				t.Fatalf("applied (err %v), want it refused as a bad request", err)
			}
			for _, want := range tc.errs {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error lacks %q:\n%v", want, err)
				}
			}
			if !equalSets(d.live, before) {
				t.Errorf("the live set changed to %+v", d.live)
			}
		})
	}

	// The live set redirects from tcin to br0: XDP in native mode on tcin
	// would make that a redirect the kernel drops.
	set, err := rules.Parse([]byte("rules:\n  - {name: out, priority: 1, match: {iface: tcin, proto: udp}, action: \"redirect:br0\"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	testenv.InNetNS(t, ns, func() error {
		if _, err := d.ApplyRules(*set); err != nil {
			return err
		}
		_, err = d.Attach(attach.Attachment{Iface: "tcin", Hook: attach.HookXDP, Mode: attach.ModeNative})
		return nil
	})
	var bad *api.BadRequestError
	if !errors.As(err, &bad) || !strings.Contains(err.Error(), `rule 1 "out": redirect to br0 from the native XDP hook on tcin: br0 (bridge) cannot transmit XDP frames`) {
		t.Errorf("native XDP on tcin under a rule redirecting from it to br0: err %v, want it refused naming the rule", err)
	}
	testenv.InNetNS(t, ns, func() error {
		_, err = d.Attach(attach.Attachment{Iface: "tcin", Hook: attach.HookXDP, Mode: attach.ModeGeneric})
		return nil
	})
	if err != nil {
		t.Errorf("generic XDP on tcin: %v", err)
	}
}

// equalSets compares two rule sets by their text form.
func equalSets(a, b rules.Set) bool {
	fa, erra := rules.Format(&a)
	fb, errb := rules.Format(&b)
	return erra == nil && errb == nil && string(fa) == string(fb)
}

// TestXDPRedirectLateInterface: a rule redirecting from a native XDP hook
// to an interface that is not there yet is pending; when a bridge of that
// name appears, the retry checks it and fails, and lovelockd's status
// reports why like any rule failure; when it is a veth whose peer runs an
// XDP program instead, the retry applies the set.
func TestXDPRedirectLateInterface(t *testing.T) {
	ns := xdpRedirectNS(t)
	cfg, dir := tempConfig(t)
	cfg.Metrics = ""
	cfg.Interfaces = xdpRedirectHooks
	cfg.Rules = filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(cfg.Rules, []byte(`rules:
  - {name: out, priority: 1, match: {iface: xin, proto: udp}, action: "redirect:late0"}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	testenv.InNetNS(t, ns, func() error {
		d, err := New(cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			return err
		}
		defer d.Close()
		rulesFailure := func(when string, want string) {
			t.Helper()
			d.mu.Lock()
			d.retryRules()
			d.mu.Unlock()
			st, err := d.Status()
			if err != nil {
				t.Fatal(err)
			}
			var cause string
			for _, f := range st.Failures {
				if f.What == "rules" {
					cause = f.Cause
				}
			}
			switch {
			case want == "" && (cause != "" || st.RulesPending):
				t.Errorf("%s: rules failed (%q), pending %v; want them live", when, cause, st.RulesPending)
			case want != "" && (!strings.Contains(cause, want) || !st.RulesPending || st.Health != api.HealthDegraded):
				t.Errorf("%s: health %s, rules pending %v, failure %q; want degraded, pending, failing with %q", when, st.Health, st.RulesPending, cause, want)
			}
		}
		rulesFailure("late0 not there", `unknown interface "late0"`)
		if err := addBridge("late0"); err != nil {
			return err
		}
		rulesFailure("late0 a bridge", `rule 1 "out": redirect to late0 from the native XDP hook on xin: late0 (bridge) cannot transmit XDP frames`)
		late, err := netlink.LinkByName("late0")
		if err != nil {
			return err
		}
		if err := netlink.LinkDel(late); err != nil {
			return err
		}
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "late0"}, PeerName: "late1"}); err != nil {
			return err
		}
		testenv.XDPPassOn(t, ns, "late1")
		rulesFailure("late0 a veth whose peer runs an XDP program", "")
		return nil
	})
}

// TestCheckXDPRedirect: lovelockd --check refuses a rule file that
// redirects from a native XDP hook of the config to a bridge, as New
// would, and passes one that redirects there from a TC hook.
func TestCheckXDPRedirect(t *testing.T) {
	ns := xdpRedirectNS(t)
	cfg, dir := tempConfig(t)
	cfg.Interfaces = xdpRedirectHooks
	cfg.Rules = filepath.Join(dir, "rules.yaml")
	for from, want := range map[string]string{
		"xin":  `rule 1 "out": redirect to br0 from the native XDP hook on xin: br0 (bridge) cannot transmit XDP frames`,
		"tcin": "",
	} {
		if err := os.WriteFile(cfg.Rules, []byte("rules:\n  - {name: out, priority: 1, match: {iface: "+from+"}, action: \"redirect:br0\"}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		var err error
		testenv.InNetNS(t, ns, func() error {
			_, err = Check(cfg)
			return nil
		})
		if (want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("redirect from %s: %v, want %q", from, err, want)
		}
	}
}

// TestXDPRedirectRechecked: a redirect to a veth passes while the veth's
// peer runs an XDP program; when the program goes after the rules were
// installed (the kernel then drops what they redirect there), lovelockd's
// status says so as the "redirects" failure, the set staying live, and the
// failure clears once the peer runs one again. Before, the status stayed
// ok while the redirect counter counted packets the kernel dropped.
func TestXDPRedirectRechecked(t *testing.T) {
	ns := xdpRedirectNS(t)
	d := xdpRedirectDaemon(t, ns)
	set, err := rules.Parse([]byte("rules: [{name: out, priority: 1, match: {iface: xin, proto: udp}, action: 'redirect:vout'}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	redirects := func() (api.Status, string) {
		t.Helper()
		var st api.Status
		testenv.InNetNS(t, ns, func() (err error) {
			st, err = d.Status()
			return err
		})
		for _, f := range st.Failures {
			if f.What == "redirects" {
				return st, f.Cause
			}
		}
		return st, ""
	}
	testenv.InNetNS(t, ns, func() error {
		_, err := d.ApplyRules(*set)
		return err
	})
	if st, cause := redirects(); cause != "" || st.Health != api.HealthOK {
		t.Fatalf("with vout-peer's program: health %s, redirects failure %q", st.Health, cause)
	}
	setPeerXDP := func(fd int) {
		testenv.InNetNS(t, ns, func() error {
			l, err := netlink.LinkByName("vout-peer")
			if err != nil {
				return err
			}
			return netlink.LinkSetXdpFd(l, fd)
		})
	}
	setPeerXDP(-1)
	st, cause := redirects()
	if st.Health != api.HealthDegraded || !strings.Contains(cause, `rule 1 "out": redirect to vout from the native XDP hook on xin: vout (veth) cannot transmit XDP frames`) {
		t.Errorf("vout-peer's program gone: health %s, redirects failure %q", st.Health, cause)
	}
	if st.Rules != 1 || st.RulesPending {
		t.Errorf("rules %d, pending %v; want the set live", st.Rules, st.RulesPending)
	}
	testenv.XDPPassOn(t, ns, "vout-peer")
	if st, cause := redirects(); cause != "" || st.Health != api.HealthOK {
		t.Errorf("vout-peer's program back: health %s, redirects failure %q", st.Health, cause)
	}
}
