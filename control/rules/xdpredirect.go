package rules

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/netdev"
)

// XDPHooks says where the classifier runs in native (driver-mode) XDP. A
// redirect from there hands the frame to the target's driver (its
// ndo_xdp_xmit), and a device without one (a bridge, a VLAN device, a veth
// whose peer runs no XDP program) drops it after the data plane counted it
// as redirected. From TC and generic XDP hooks a redirect goes through the
// kernel's transmit path, which every device has.
type XDPHooks struct {
	// Ifaces are the interfaces with the classifier in a native XDP hook.
	Ifaces []string
	// Unknown says where the classifier runs is not known (the CLI could
	// not ask lovelockd): every redirect is checked as if it ran in a
	// native XDP hook, and what fails is a warning, not an error.
	Unknown bool
}

// CheckXDPRedirects checks that every interface s redirects to from a
// native XDP hook can transmit XDP frames, asking the kernel's netdev
// generic-netlink family (Linux 6.3+) for the device's XDP features in the
// calling thread's network namespace. A rule runs where its iface is hooked;
// one without an iface, and the default, on every hooked interface. The
// error names each rule whose target cannot and says what to do instead.
// What cannot be checked (a kernel without the netdev family) is not
// refused but returned as a warning. resolve gives the ifindexes, as for
// Validate, which lovelockd and `lovelock rules apply --dry-run` run
// first; a target it cannot resolve is not checked.
func CheckXDPRedirects(s *Set, resolve Resolver, hooks XDPHooks) (warnings []string, err error) {
	return checkXDPRedirects(s, resolve, hooks, kernelDevices{})
}

// devices tells what the kernel says about a device: its XDP features and
// its kind ("bridge", "veth", ...; "" when unknown). Tests fake it.
type devices interface {
	xdpFeatures(ifindex int) (netdev.XDPFeatures, error)
	kind(ifindex int) string
}

type kernelDevices struct{}

func (kernelDevices) xdpFeatures(ifindex int) (netdev.XDPFeatures, error) {
	return netdev.DevXDPFeatures(ifindex)
}

func (kernelDevices) kind(ifindex int) string {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return ""
	}
	return l.Type()
}

func checkXDPRedirects(s *Set, resolve Resolver, hooks XDPHooks, devs devices) (warnings []string, err error) {
	native := slices.Clone(hooks.Ifaces)
	slices.Sort(native)
	native = slices.Compact(native)
	res := &resolver{fn: resolve, cache: map[string]uint32{}}
	type target struct {
		feat netdev.XDPFeatures
		err  error
	}
	targets := map[uint32]target{}
	var l errList
	// unchecked are the targets whose features the kernel did not give,
	// by the reason.
	unchecked := map[string][]string{}
	var reasons []string
	moreWarnings := 0
	// wrap names the rule (or the default) in an error.
	check := func(wrap func(error) error, iface string, a Action) {
		if a.Verb != bpf.ActionRedirect {
			return
		}
		from := native
		if iface != "" {
			from = nil
			if slices.Contains(native, iface) {
				from = []string{iface}
			}
		}
		if len(from) == 0 && !hooks.Unknown {
			return
		}
		idx, err := res.ifindex(a.Iface)
		if err != nil {
			// Validate says so; here there is nothing to check yet.
			return
		}
		t, ok := targets[idx]
		if !ok {
			t.feat, t.err = devs.xdpFeatures(int(idx))
			targets[idx] = t
		}
		if t.err != nil {
			reason := t.err.Error()
			if !slices.Contains(unchecked[reason], a.Iface) {
				if len(unchecked[reason]) == 0 {
					reasons = append(reasons, reason)
				}
				unchecked[reason] = append(unchecked[reason], a.Iface)
			}
			return
		}
		if t.feat&netdev.XDPNdoXmit != 0 {
			return
		}
		problem := redirectProblem(a.Iface, devs.kind(int(idx)), t.feat, iface, from)
		if hooks.Unknown {
			// As many as an error lists, the rest counted.
			if len(warnings) == maxErrors {
				moreWarnings++
				return
			}
			warnings = append(warnings, "rules: "+wrap(fmt.Errorf("%s (where the classifier runs is not known: "+
				"lovelockd refuses the rule if it runs in a native XDP hook)", problem)).Error())
			return
		}
		l.add(wrap(errors.New(problem)))
	}
	check(func(err error) error { return fmt.Errorf("default: %w", err) }, "", s.Default)
	for i, r := range s.Rules {
		check(func(err error) error { return ruleError(i, r.Name, err) }, r.Match.Iface, r.Action)
	}
	if moreWarnings > 0 {
		warnings = append(warnings, fmt.Sprintf("rules: and %d more redirects to devices that cannot transmit XDP frames", moreWarnings))
	}
	for _, reason := range reasons {
		warnings = append(warnings, fmt.Sprintf("rules: could not check that %s can transmit XDP frames, which a redirect from a native XDP hook needs: %s; "+
			"a bridge, a VLAN device or a veth whose peer runs no XDP program cannot, and the kernel drops what is redirected there after Lovelock counted it",
			strings.Join(unchecked[reason], ", "), reason))
	}
	return warnings, l.err()
}

// redirectProblem says why a redirect to target, a device of kind that
// has XDP features feat, from the native XDP hooks on from fails, and what
// to do. iface is the rule's match iface ("" for none).
func redirectProblem(target, kind string, feat netdev.XDPFeatures, iface string, from []string) string {
	var b strings.Builder
	b.WriteString("redirect to " + target)
	switch {
	case len(from) == 0:
	case iface != "":
		fmt.Fprintf(&b, " from the native XDP hook on %s", iface)
	default:
		fmt.Fprintf(&b, " from the native XDP hooks on %s (a rule without iface runs on every hooked interface)", strings.Join(from, ", "))
	}
	desc := target
	if kind != "" {
		desc += " (" + kind + ")"
	}
	fmt.Fprintf(&b, ": %s cannot transmit XDP frames (XDP features: %v; no ndo-xmit), so the kernel would drop every packet redirected there after Lovelock counted it as redirected", desc, feat)
	if kind == "veth" {
		fmt.Fprintf(&b, "; a veth takes XDP frames only while its peer runs an XDP program in native mode (or has GRO on): attach one to %s's peer (xdp_pass, as `lovelock testbed up` does) and apply again, or", target)
	} else {
		b.WriteString("; redirect to a device that can (a physical port, or a veth whose peer runs an XDP program), or")
	}
	switch {
	case iface != "":
		fmt.Fprintf(&b, " run the classifier on %s in a TC hook (tc-ingress) or in generic XDP instead, where a redirect to %s works", iface, target)
	default:
		fmt.Fprintf(&b, " give the rule the iface of a TC hook (tc-ingress) or a generic XDP hook, where a redirect to %s works", target)
	}
	return b.String()
}
