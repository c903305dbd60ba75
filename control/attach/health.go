package attach

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
)

// A pinned link outlives its interface: when the interface is deleted (a
// driver reset, a representor re-created, a veth torn down) the kernel
// detaches the link from it but the link, and its pin, stay. The link then
// reports ifindex 0 and never runs again, not even on an interface of the
// same name created later. Adoption therefore checks every pin against the
// live kernel (Check) before it calls it attached.

// ErrDefunct reports a pinned attachment that no longer runs on the
// interface it names.
var ErrDefunct = errors.New("not running on the interface")

// Outcome is what Reattach did.
type Outcome string

// Outcomes of Reattach.
const (
	// Attached: nothing was pinned; the classifier is attached now.
	Attached Outcome = "attached"
	// Adopted: a pinned attachment runs on the live interface; nothing changed.
	Adopted Outcome = "adopted"
	// Replaced: a pinned attachment no longer ran on the live interface of
	// its name (the interface was deleted or re-created); its pin was
	// removed and the classifier attached again.
	Replaced Outcome = "replaced"
)

// LinkStatus is an attachment as the kernel runs it now.
type LinkStatus struct {
	Attachment
	// Ifindex is the interface the link runs on (0: none).
	Ifindex int `json:"ifindex"`
	// Live is true when the pinned link (or clsact filter) runs on the
	// live interface of its name.
	Live bool `json:"live"`
	// Problem says why it is not live.
	Problem string `json:"problem,omitempty"`
}

// Check reports whether the attachment pinned for a's interface and hook
// runs on the live interface of that name: the interface exists, the
// link's ifindex is that interface's, and for XDP the kernel reports the
// link's program on it. An error wrapping ErrDefunct says why not;
// ErrNotAttached when nothing is pinned.
func (n *Node) Check(a Attachment) (ifindex int, err error) {
	if _, err := os.Stat(n.clsactMarker(a.Iface, a.Hook)); err == nil {
		return checkClsact(a)
	}
	l, err := link.LoadPinnedLink(n.linkPin(a.Iface, a.Hook), nil)
	if errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("interface %s %s: %w", a.Iface, a.Hook, ErrNotAttached)
	}
	if err != nil {
		return 0, fmt.Errorf("interface %s %s: open pinned link: %w", a.Iface, a.Hook, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return 0, fmt.Errorf("interface %s %s: link info: %w", a.Iface, a.Hook, err)
	}
	var linkIdx int
	switch {
	case info.XDP() != nil:
		linkIdx = int(info.XDP().Ifindex)
	case info.TCX() != nil:
		linkIdx = int(info.TCX().Ifindex)
	default:
		return 0, fmt.Errorf("interface %s %s: pinned link of type %v: %w", a.Iface, a.Hook, info.Type, ErrDefunct)
	}
	nl, lerr := netlink.LinkByName(a.Iface)
	switch {
	case linkIdx == 0 && lerr != nil:
		return 0, fmt.Errorf("interface %s %s: the interface is gone (%v) and the link with it: %w", a.Iface, a.Hook, lerr, ErrDefunct)
	case linkIdx == 0:
		return 0, fmt.Errorf("interface %s %s: the link's interface was deleted; %s is a new interface (ifindex %d) that runs no program: %w",
			a.Iface, a.Hook, a.Iface, nl.Attrs().Index, ErrDefunct)
	case lerr != nil:
		return linkIdx, fmt.Errorf("interface %s %s: the link runs on ifindex %d, and no interface is named %s (renamed?): %w",
			a.Iface, a.Hook, linkIdx, a.Iface, ErrDefunct)
	case nl.Attrs().Index != linkIdx:
		return linkIdx, fmt.Errorf("interface %s %s: the link runs on ifindex %d, %s is ifindex %d: %w",
			a.Iface, a.Hook, linkIdx, a.Iface, nl.Attrs().Index, ErrDefunct)
	}
	if a.Hook == HookXDP {
		x := nl.Attrs().Xdp
		if x == nil || !x.Attached || x.ProgId != uint32(info.Program) {
			return linkIdx, fmt.Errorf("interface %s %s: the kernel reports no program of the link (id %d) on it: %w",
				a.Iface, a.Hook, info.Program, ErrDefunct)
		}
	}
	return linkIdx, nil
}

// checkClsact finds the classifier's filter on the live interface.
func checkClsact(a Attachment) (int, error) {
	nl, err := netlink.LinkByName(a.Iface)
	if err != nil {
		return 0, fmt.Errorf("interface %s %s (clsact): the interface is gone (%v) and the filter with it: %w", a.Iface, a.Hook, err, ErrDefunct)
	}
	f := clsactFilter(nl.Attrs().Index, a.Hook)
	filters, err := netlink.FilterList(nl, f.Parent)
	if err != nil {
		return 0, fmt.Errorf("interface %s %s (clsact): list filters: %w", a.Iface, a.Hook, err)
	}
	for _, g := range filters {
		if b, ok := g.(*netlink.BpfFilter); ok && b.Attrs().Priority == clsactPriority && b.Attrs().Handle == f.Handle {
			return nl.Attrs().Index, nil
		}
	}
	return 0, fmt.Errorf("interface %s %s (clsact): no classifier filter on ifindex %d (the interface was re-created, or the qdisc removed): %w",
		a.Iface, a.Hook, nl.Attrs().Index, ErrDefunct)
}

// Status lists every pinned attachment with whether it runs on the live
// interface of its name.
func (n *Node) Status() ([]LinkStatus, error) {
	atts, err := n.Attachments()
	if err != nil {
		return nil, err
	}
	out := make([]LinkStatus, 0, len(atts))
	for _, a := range atts {
		s := LinkStatus{Attachment: a}
		s.Ifindex, err = n.Check(a)
		if err != nil {
			s.Problem = err.Error()
		} else {
			s.Live = true
		}
		out = append(out, s)
	}
	return out, nil
}

// removeDefunct removes the pin (or clsact marker) of an attachment that
// Check found defunct. Removing a link's last reference detaches it from
// whatever it still runs on.
func (n *Node) removeDefunct(a Attachment) error {
	marker := n.clsactMarker(a.Iface, a.Hook)
	if _, err := os.Stat(marker); err == nil {
		if nl, err := netlink.LinkByName(a.Iface); err == nil {
			netlink.FilterDel(clsactFilter(nl.Attrs().Index, a.Hook))
		}
		return os.Remove(marker)
	}
	if err := os.Remove(n.linkPin(a.Iface, a.Hook)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("interface %s %s: remove defunct link pin: %w", a.Iface, a.Hook, err)
	}
	return nil
}
