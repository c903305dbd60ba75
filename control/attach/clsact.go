package attach

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Kernels before 6.6 have no tcx links; there TC hooks are a direct-action
// BPF filter on the interface's clsact qdisc. A filter outlives the process
// like a pinned link does, but it cannot be pinned, so an empty directory
// links/clsact/<hook>@<iface> records it (bpffs holds no plain files).
const (
	clsactDir      = "clsact"
	clsactPriority = 1
	clsactName     = "lovelock_steer"
)

func (n *Node) clsactMarker(iface string, hook Hook) string {
	return filepath.Join(n.dir, "links", clsactDir, string(hook)+"@"+pinEscaper.Replace(iface))
}

func clsactFilter(ifindex int, hook Hook) *netlink.BpfFilter {
	parent := uint32(netlink.HANDLE_MIN_INGRESS)
	if hook == HookTCEgress {
		parent = netlink.HANDLE_MIN_EGRESS
	}
	return &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: ifindex, Parent: parent, Handle: netlink.MakeHandle(0, 1),
			Protocol: unix.ETH_P_ALL, Priority: clsactPriority,
		},
		Name:         clsactName,
		DirectAction: true,
	}
}

// attachClsact attaches prog as a clsact filter and records it.
func (n *Node) attachClsact(a Attachment, ifindex int, prog *ebpf.Program) error {
	marker := n.clsactMarker(a.Iface, a.Hook)
	qdisc := &netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT,
	}}
	if err := netlink.QdiscAdd(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("interface %s: add clsact qdisc: %w", a.Iface, err)
	}
	f := clsactFilter(ifindex, a.Hook)
	f.Fd = prog.FD()
	if err := netlink.FilterReplace(f); err != nil {
		return fmt.Errorf("interface %s: attach %s (clsact): %w", a.Iface, a.Hook, err)
	}
	if err := os.MkdirAll(marker, 0o700); err != nil {
		netlink.FilterDel(f)
		return fmt.Errorf("interface %s %s: record clsact filter: %w", a.Iface, a.Hook, err)
	}
	return nil
}

// detachClsact deletes the filter and its marker. When the interface is
// gone, so is its filter (with its qdisc): only the marker is left to remove.
func (n *Node) detachClsact(iface string, hook Hook) error {
	l, err := netlink.LinkByName(iface)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
	case err != nil:
		return fmt.Errorf("interface %s: %w", iface, err)
	default:
		if err := netlink.FilterDel(clsactFilter(l.Attrs().Index, hook)); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("interface %s %s: delete clsact filter: %w", iface, hook, err)
		}
	}
	if err := os.Remove(n.clsactMarker(iface, hook)); err != nil {
		return fmt.Errorf("interface %s %s: %w", iface, hook, err)
	}
	return nil
}
