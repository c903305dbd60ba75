package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// TestRulesBeforeAttach: when an interface is re-created (a new ifindex),
// and when lovelockd restores a data plane, the rule set compiled for the
// interface goes live before the classifier is attached to it. Before,
// relink and reconcile attached first, and for about a swap's time the
// new interface's packets met rules compiled for the old ifindex (their
// iface rules missed) or, on a fresh data plane, no rules at all.
func TestRulesBeforeAttach(t *testing.T) {
	const set = "rules: [{name: in, priority: 1, match: {iface: x0, proto: udp, dport: 7000}, action: drop}]\n"
	xdp := attach.Attachment{Iface: "x0", Hook: attach.HookXDP}
	veth := func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "x0"}, PeerName: "x1"})
	}
	cfg, _ := tempConfig(t)
	cfg.Metrics = ""
	ns := testenv.NewNetNS(t)
	testenv.InNetNS(t, ns, func() error {
		if err := veth(); err != nil {
			return err
		}
		d, err := New(cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			return err
		}
		defer d.Close()
		if _, err := d.Attach(xdp); err != nil {
			return err
		}
		parsed, err := rules.Parse([]byte(set))
		if err != nil {
			return err
		}
		if _, err := d.ApplyRules(*parsed); err != nil {
			return err
		}
		// Each swap notes whether the classifier already ran on x0, and
		// for which ifindex the set was compiled.
		var swaps []string
		d.swap = func(rs *bpf.Ruleset) error {
			_, err := d.node.Check(xdp)
			idx, _ := resolveIface("x0")
			swaps = append(swaps, fmt.Sprintf("attached %v, x0 ifindex %d", err == nil, idx))
			return d.node.Steer.Apply(rs)
		}

		// x0 goes (the rules fail: they name it) and comes back.
		old, _ := resolveIface("x0")
		if err := netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "x0"}}); err != nil {
			return err
		}
		d.mu.Lock()
		d.retryRules()
		d.mu.Unlock()
		if err := veth(); err != nil {
			return err
		}
		now, _ := resolveIface("x0")
		if now == old {
			return errors.New("x0 came back with its old ifindex: the test shows nothing")
		}
		swaps = nil
		d.relink([]string{"x0"})
		if _, err := d.node.Check(xdp); err != nil {
			return fmt.Errorf("relink did not attach x0 again: %w", err)
		}
		if want := fmt.Sprintf("attached false, x0 ifindex %d", now); len(swaps) != 1 || swaps[0] != want {
			t.Errorf("relink: swaps %q, want one: %q", swaps, want)
		}
		d.mu.Lock()
		_, failed := d.failures["rules"]
		d.mu.Unlock()
		if failed {
			t.Error("relink: the rules still fail")
		}

		// A restore onto a data plane whose link runs on no live
		// interface: x0 re-created again, then reconcile.
		if err := netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "x0"}}); err != nil {
			return err
		}
		if err := veth(); err != nil {
			return err
		}
		swaps = nil
		d.reconcile(cloneSet(d.live))
		if _, err := d.node.Check(xdp); err != nil {
			return fmt.Errorf("reconcile did not attach x0 again: %w", err)
		}
		now, _ = resolveIface("x0")
		if want := fmt.Sprintf("attached false, x0 ifindex %d", now); len(swaps) != 1 || swaps[0] != want {
			t.Errorf("reconcile: swaps %q, want one: %q", swaps, want)
		}
		return nil
	})
}
