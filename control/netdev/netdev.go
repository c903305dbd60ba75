// Package netdev asks the kernel's "netdev" generic-netlink family (Linux
// 6.3 and newer, include/uapi/linux/netdev.h) what a device can do with
// XDP: in particular whether it can transmit frames an XDP program
// redirects to it (ndo_xdp_xmit), which a redirect from a native XDP hook
// needs and a bridge, a VLAN device or a dummy does not have.
package netdev

import (
	"errors"
	"fmt"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The netdev family, from include/uapi/linux/netdev.h.
const (
	familyName    = "netdev"
	familyVersion = 1
	cmdDevGet     = 1 // NETDEV_CMD_DEV_GET
	attrIfindex   = 1 // NETDEV_A_DEV_IFINDEX, u32
	attrXDP       = 3 // NETDEV_A_DEV_XDP_FEATURES, u64 (enum netdev_xdp_act)
)

// XDPFeatures are a device's XDP features (enum netdev_xdp_act).
type XDPFeatures uint64

// XDP features, as the kernel numbers them.
const (
	XDPBasic       XDPFeatures = 1 << iota // XDP_ABORTED, XDP_DROP, XDP_PASS, XDP_TX
	XDPRedirect                            // XDP_REDIRECT from a program on the device
	XDPNdoXmit                             // transmits frames redirected to it (ndo_xdp_xmit)
	XDPXskZerocopy                         // AF_XDP zero-copy
	XDPHwOffload                           // programs offloaded to the NIC
	XDPRxSG                                // multi-buffer frames on receive
	XDPNdoXmitSG                           // multi-buffer frames redirected to it
)

var featureNames = []string{"basic", "redirect", "ndo-xmit", "xsk-zerocopy", "hw-offload", "rx-sg", "ndo-xmit-sg"}

// String lists the features by the names the kernel's netdev spec gives
// them ("basic,redirect,ndo-xmit"), or "none".
func (f XDPFeatures) String() string {
	var names []string
	for i, n := range featureNames {
		if f&(1<<i) != 0 {
			names = append(names, n)
		}
	}
	if rest := f &^ (1<<len(featureNames) - 1); rest != 0 {
		names = append(names, fmt.Sprintf("%#x", uint64(rest)))
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ",")
}

// ErrNoFamily reports a kernel without the netdev family (before 6.3):
// a device's XDP features cannot be asked for.
var ErrNoFamily = errors.New("the kernel has no netdev generic-netlink family (Linux 6.3 and newer have it)")

// DevXDPFeatures returns the XDP features of the device with ifindex in
// the calling thread's network namespace. It fails with ErrNoFamily on a
// kernel without the netdev family.
func DevXDPFeatures(ifindex int) (XDPFeatures, error) {
	fam, err := netlink.GenlFamilyGet(familyName)
	if errors.Is(err, unix.ENOENT) {
		return 0, ErrNoFamily
	}
	if err != nil {
		return 0, fmt.Errorf("netdev family: %w", err)
	}
	req := nl.NewNetlinkRequest(int(fam.ID), 0)
	req.AddData(genlHeader{cmdDevGet, familyVersion})
	req.AddData(nl.NewRtAttr(attrIfindex, nl.Uint32Attr(uint32(ifindex))))
	msgs, err := req.Execute(unix.NETLINK_GENERIC, 0)
	if err != nil {
		return 0, fmt.Errorf("netdev dev-get ifindex %d: %w", ifindex, err)
	}
	if len(msgs) != 1 || len(msgs[0]) < nl.SizeofGenlmsg {
		return 0, fmt.Errorf("netdev dev-get ifindex %d: %d replies, want 1", ifindex, len(msgs))
	}
	attrs, err := nl.ParseRouteAttr(msgs[0][nl.SizeofGenlmsg:])
	if err != nil {
		return 0, fmt.Errorf("netdev dev-get ifindex %d: %w", ifindex, err)
	}
	for _, a := range attrs {
		if a.Attr.Type == attrXDP && len(a.Value) == 8 {
			return XDPFeatures(nl.NativeEndian().Uint64(a.Value)), nil
		}
	}
	return 0, fmt.Errorf("netdev dev-get ifindex %d: no xdp-features in the reply", ifindex)
}

// genlHeader is struct genlmsghdr: the command, the family's version and a
// reserved u16 that must be 0. nl.Genlmsg is not used: its Serialize reads
// the reserved bytes from past its two-byte struct, and the netdev family,
// which validates strictly, refuses what it finds there.
type genlHeader [nl.SizeofGenlmsg]byte

func (h genlHeader) Len() int          { return len(h) }
func (h genlHeader) Serialize() []byte { return h[:] }
