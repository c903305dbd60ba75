package testbed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	llnetns "github.com/lovelock-dpu/lovelock/control/netns"
)

// readyTimeout bounds how long Up waits for every veth to report carrier
// (the kernel's linkwatch applies operstate asynchronously, and a bridge
// port forwards only once its operstate is up).
const readyTimeout = 10 * time.Second

// liveNode is an open node: its namespace and a netlink socket inside it.
type liveNode struct {
	plan *nodePlan
	ns   netns.NsHandle
	h    *netlink.Handle
}

func (n *liveNode) close() {
	if n.h != nil {
		n.h.Close()
	}
	n.ns.Close()
}

// Up builds the testbed described by spec, or converges an existing or
// half-built one to it: missing namespaces, links, addresses, routes and
// neighbour entries are added, wrong ones replaced; nothing that is already
// right is touched, so a second Up is harmless. It also makes sure
// /sys/fs/bpf is a mounted bpffs. Up returns once every veth has carrier, or
// an error naming the node or link that failed. It needs root.
func Up(ctx context.Context, spec Spec) error {
	plans, err := spec.plan()
	if err != nil {
		return err
	}
	unlock, err := lockHost()
	if err != nil {
		return err
	}
	defer unlock()
	if err := ensureNetnsDirShared(); err != nil {
		return err
	}
	if err := ensureBPFFS(); err != nil {
		return err
	}

	nodes := map[string]*liveNode{}
	defer func() {
		for _, n := range nodes {
			n.close()
		}
	}()
	for _, p := range plans {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("testbed up: %w", err)
		}
		ns, err := ensureNamespace(nsPath(p.ns), p.loAlias)
		if err != nil {
			return fmt.Errorf("testbed: node %s: %w", p.spec.Name, err)
		}
		n := &liveNode{plan: p, ns: ns}
		nodes[p.spec.Name] = n
		if n.h, err = netlink.NewHandleAt(ns); err != nil {
			return fmt.Errorf("testbed: node %s: netlink: %w", p.spec.Name, err)
		}
		if err := configureNode(n); err != nil {
			return fmt.Errorf("testbed: node %s: %w", p.spec.Name, err)
		}
	}
	for _, l := range spec.Links {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("testbed up: %w", err)
		}
		if err := ensureVeth(spec.Prefix, nodes[l.A.Node], nodes[l.B.Node], l); err != nil {
			return fmt.Errorf("testbed: link %s: %w", l, err)
		}
	}
	for _, p := range plans {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("testbed up: %w", err)
		}
		if err := configureInterfaces(nodes[p.spec.Name]); err != nil {
			return fmt.Errorf("testbed: node %s: %w", p.spec.Name, err)
		}
	}
	for _, p := range plans {
		if err := configureRoutesAndNeighbours(nodes[p.spec.Name]); err != nil {
			return fmt.Errorf("testbed: node %s: %w", p.spec.Name, err)
		}
	}
	if err := ensurePeerPass(spec); err != nil {
		return err
	}
	return waitReady(ctx, plans, nodes)
}

// configureNode sets the node's sysctls, brings lo up and creates its
// bridges. The IPv6 defaults are set before any veth exists so that new
// interfaces never run DAD or accept router advertisements.
func configureNode(n *liveNode) error {
	fwd := "0"
	if n.plan.spec.Forwarding {
		fwd = "1"
	}
	err := llnetns.Do(n.ns, func() error {
		for _, conf := range []string{"all", "default"} {
			for key, val := range map[string]string{"accept_dad": "0", "dad_transmits": "0", "accept_ra": "0", "router_solicitations": "0"} {
				if err := writeSysctl("net/ipv6/conf/"+conf+"/"+key, val); err != nil {
					return err
				}
			}
		}
		if err := writeSysctl("net/ipv4/ip_forward", fwd); err != nil {
			return err
		}
		if err := writeSysctl("net/ipv6/conf/all/forwarding", fwd); err != nil {
			return err
		}
		return setLoopbackUp(n.plan.loAlias)
	})
	if err != nil {
		return err
	}
	for _, ifc := range n.plan.ifaces {
		if ifc.kind != "bridge" {
			continue
		}
		if err := ensureBridge(n, ifc); err != nil {
			return fmt.Errorf("bridge %s: %w", ifc.name, err)
		}
	}
	return nil
}

func ensureBridge(n *liveNode, ifc ifacePlan) error {
	link, err := lookupLink(n.h, ifc.name)
	if err != nil {
		return err
	}
	if link != nil && link.Type() != "bridge" {
		if err := n.h.LinkDel(link); err != nil {
			return fmt.Errorf("delete non-bridge %s: %w", ifc.name, err)
		}
		link = nil
	}
	if link == nil {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = ifc.name
		attrs.HardwareAddr = ifc.mac
		attrs.Alias = ifc.alias
		if err := n.h.LinkAdd(&netlink.Bridge{LinkAttrs: attrs}); err != nil {
			return fmt.Errorf("create: %w", err)
		}
		if link, err = n.h.LinkByName(ifc.name); err != nil {
			return err
		}
	}
	return ensureLinkBasics(n.h, link, ifc)
}

// ensureLinkBasics sets MAC, alias and admin state up where they differ.
func ensureLinkBasics(h *netlink.Handle, link netlink.Link, ifc ifacePlan) error {
	a := link.Attrs()
	if a.HardwareAddr.String() != ifc.mac.String() {
		if err := h.LinkSetHardwareAddr(link, ifc.mac); err != nil {
			return fmt.Errorf("set MAC %s: %w", ifc.mac, err)
		}
	}
	if a.Alias != ifc.alias {
		if err := h.LinkSetAlias(link, ifc.alias); err != nil {
			return fmt.Errorf("set alias: %w", err)
		}
	}
	if a.Flags&net.FlagUp == 0 {
		if err := h.LinkSetUp(link); err != nil {
			return fmt.Errorf("set up: %w", err)
		}
	}
	return nil
}

// vethPaired reports whether la (in one namespace) and lb (in another) are
// the two ends of one veth pair: each one's IFLA_LINK is the other's index.
func vethPaired(la, lb netlink.Link) bool {
	if la == nil || lb == nil || la.Type() != "veth" || lb.Type() != "veth" {
		return false
	}
	return la.Attrs().ParentIndex == lb.Attrs().Index && lb.Attrs().ParentIndex == la.Attrs().Index
}

// ensureVeth makes sure l exists as one veth pair. The pair is created with
// each end directly in its node (IFLA_NET_NS_FD for the peer), so no end
// ever passes through the root namespace, where a crash could strand it.
func ensureVeth(prefix string, a, b *liveNode, l LinkSpec) error {
	la, err := lookupLink(a.h, l.A.Iface)
	if err != nil {
		return fmt.Errorf("%s: %w", l.A, err)
	}
	lb, err := lookupLink(b.h, l.B.Iface)
	if err != nil {
		return fmt.Errorf("%s: %w", l.B, err)
	}
	if vethPaired(la, lb) {
		return nil
	}
	// Anything else under these names is debris: remove it. Deleting one
	// veth end removes its peer too, hence the tolerance of "not found".
	for _, x := range []struct {
		h    *netlink.Handle
		link netlink.Link
		e    Endpoint
	}{{a.h, la, l.A}, {b.h, lb, l.B}} {
		if x.link == nil {
			continue
		}
		if err := x.h.LinkDel(x.link); err != nil && !isNotFound(err) {
			return fmt.Errorf("%s: delete stale interface: %w", x.e, err)
		}
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = l.A.Iface
	attrs.HardwareAddr = MAC(l.A.Node, l.A.Iface)
	attrs.Alias = alias(prefix, l.A.Node, l.A.Iface)
	veth := netlink.NewVeth(attrs)
	veth.PeerName = l.B.Iface
	veth.PeerHardwareAddr = MAC(l.B.Node, l.B.Iface)
	veth.PeerNamespace = netlink.NsFd(int(b.ns))
	if err := a.h.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth: %w", err)
	}
	return nil
}

// lookupLink returns the named link, or nil if there is none.
func lookupLink(h *netlink.Handle, name string) (netlink.Link, error) {
	link, err := h.LinkByName(name)
	if isNotFound(err) {
		return nil, nil
	}
	return link, err
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT)
}

// configureInterfaces converges each veth end of the node: per-interface
// IPv6 knobs, MAC, alias, bridge master, exactly the planned addresses
// (link-local ones aside), and admin state up.
func configureInterfaces(n *liveNode) error {
	err := llnetns.Do(n.ns, func() error {
		for _, ifc := range n.plan.ifaces {
			for key, val := range map[string]string{"accept_dad": "0", "accept_ra": "0"} {
				if err := writeSysctl("net/ipv6/conf/"+ifc.name+"/"+key, val); err != nil {
					return fmt.Errorf("%s: %w", ifc.name, err)
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, ifc := range n.plan.ifaces {
		if ifc.kind != "veth" {
			continue
		}
		if err := configureVethEnd(n, ifc); err != nil {
			return fmt.Errorf("%s: %w", ifc.name, err)
		}
	}
	return nil
}

func configureVethEnd(n *liveNode, ifc ifacePlan) error {
	link, err := n.h.LinkByName(ifc.name)
	if err != nil {
		return err
	}
	if ifc.master != "" {
		br, err := n.h.LinkByName(ifc.master)
		if err != nil {
			return fmt.Errorf("master %s: %w", ifc.master, err)
		}
		if link.Attrs().MasterIndex != br.Attrs().Index {
			if err := n.h.LinkSetMaster(link, br); err != nil {
				return fmt.Errorf("enslave to %s: %w", ifc.master, err)
			}
		}
	}
	have, err := listAddrs(n.h, link)
	if err != nil {
		return err
	}
	for _, a := range have {
		if !slices.Contains(ifc.addrs, a) {
			if err := n.h.AddrDel(link, toNetlinkAddr(a)); err != nil {
				return fmt.Errorf("remove stray address %v: %w", a, err)
			}
		}
	}
	for _, a := range ifc.addrs {
		if slices.Contains(have, a) {
			continue
		}
		if err := n.h.AddrReplace(link, toNetlinkAddr(a)); err != nil {
			return fmt.Errorf("add address %v: %w", a, err)
		}
	}
	return ensureLinkBasics(n.h, link, ifc)
}

func toNetlinkAddr(p netip.Prefix) *netlink.Addr {
	a := &netlink.Addr{IPNet: prefixToIPNet(p)}
	if p.Addr().Is6() {
		// Usable at once: no tentative phase, even if DAD were on.
		a.Flags = unix.IFA_F_NODAD
	}
	return a
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func ipNetToPrefix(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	a = a.Unmap()
	ones, bits := n.Mask.Size()
	if bits != a.BitLen() {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, ones), true
}

// listAddrs returns the link's addresses other than IPv6 link-local ones,
// which the kernel manages.
func listAddrs(h *netlink.Handle, link netlink.Link) ([]netip.Prefix, error) {
	var addrs []netlink.Addr
	err := retryDump(func() (err error) {
		addrs, err = h.AddrList(link, netlink.FAMILY_ALL)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	var out []netip.Prefix
	for _, a := range addrs {
		p, ok := ipNetToPrefix(a.IPNet)
		if !ok || p.Addr().IsLinkLocalUnicast() {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

// retryDump retries a netlink dump that the kernel interrupted because the
// table changed underneath it.
func retryDump(dump func() error) error {
	var err error
	for range 5 {
		if err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return err
		}
	}
	return err
}

func configureRoutesAndNeighbours(n *liveNode) error {
	for _, r := range n.plan.routes {
		link, err := n.h.LinkByName(r.dev)
		if err != nil {
			return fmt.Errorf("route %v via %v: %w", r.dst, r.via, err)
		}
		route := &netlink.Route{
			LinkIndex: link.Attrs().Index,
			Dst:       prefixToIPNet(r.dst),
			Gw:        net.IP(r.via.AsSlice()),
		}
		if err := n.h.RouteReplace(route); err != nil {
			return fmt.Errorf("route %v via %v dev %s: %w", r.dst, r.via, r.dev, err)
		}
	}
	for _, nb := range n.plan.neighs {
		link, err := n.h.LinkByName(nb.dev)
		if err != nil {
			return fmt.Errorf("neighbour %v: %w", nb.ip, err)
		}
		fam := netlink.FAMILY_V4
		if nb.ip.Is6() {
			fam = netlink.FAMILY_V6
		}
		err = n.h.NeighSet(&netlink.Neigh{
			LinkIndex:    link.Attrs().Index,
			Family:       fam,
			State:        netlink.NUD_PERMANENT,
			IP:           net.IP(nb.ip.AsSlice()),
			HardwareAddr: nb.mac,
		})
		if err != nil {
			return fmt.Errorf("neighbour %v lladdr %s dev %s: %w", nb.ip, nb.mac, nb.dev, err)
		}
	}
	return nil
}

// waitReady polls until every veth end reports operstate up.
func waitReady(ctx context.Context, plans []*nodePlan, nodes map[string]*liveNode) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		pending := ""
		for _, p := range plans {
			for _, ifc := range p.ifaces {
				if ifc.kind != "veth" {
					continue
				}
				link, err := nodes[p.spec.Name].h.LinkByName(ifc.name)
				if err != nil {
					return fmt.Errorf("testbed: node %s: %s: %w", p.spec.Name, ifc.name, err)
				}
				if link.Attrs().OperState != netlink.OperUp && pending == "" {
					pending = p.spec.Name + "/" + ifc.name
				}
			}
		}
		if pending == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("testbed: %s has no carrier: %w", pending, ctx.Err())
		case <-tick.C:
		}
	}
}

// SetMTU sets the MTU of every interface of the testbed but loopback (the
// bridge follows its ports): 9000 lets jumbo datagrams cross it unfragmented.
func SetMTU(spec Spec, mtu int) error {
	for pass := 0; pass < 2; pass++ { // bridges follow their ports
		for _, node := range spec.NodeNames() {
			err := spec.Run(node, func() error {
				links, err := netlink.LinkList()
				if err != nil {
					return err
				}
				for _, l := range links {
					if l.Attrs().Flags&net.FlagLoopback != 0 || l.Attrs().MTU == mtu {
						continue
					}
					if err := netlink.LinkSetMTU(l, mtu); err != nil {
						return fmt.Errorf("testbed: %s %s mtu %d: %w", node, l.Attrs().Name, mtu, err)
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}
