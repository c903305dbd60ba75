package testbed

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	llnetns "github.com/lovelock-dpu/lovelock/control/netns"
)

// Report is what Status found of a testbed, compared with its Spec. (The
// type cannot share the function's name, hence Report.)
type Report struct {
	// Prefix is the Spec's prefix.
	Prefix string `json:"prefix"`
	// Complete is true when every node, link, address, route and neighbour
	// entry of the Spec is in place, every interface is administratively up,
	// forwarding (IPv4 and IPv6) is as planned, and the far end of every DPU
	// port runs an XDP program (xdp_pass, so redirected frames arrive).
	Complete bool `json:"complete"`
	// Nodes lists the Spec's nodes in order.
	Nodes []NodeStatus `json:"nodes"`
	// Links lists the Spec's veth pairs in order.
	Links []LinkStatus `json:"links"`
	// Problems says, one line each, what keeps the testbed from complete.
	Problems []string `json:"problems,omitempty"`
}

// NodeStatus is one node as found.
type NodeStatus struct {
	// Name is the node's name, Namespace its network namespace name.
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	// Role and Description come from the Spec.
	Role        Role   `json:"role"`
	Description string `json:"description"`
	// Present is true when the namespace exists.
	Present bool `json:"present"`
	// Forwarding is the node's net.ipv4.ip_forward, Forwarding6 its
	// net.ipv6.conf.all.forwarding.
	Forwarding  bool `json:"forwarding"`
	Forwarding6 bool `json:"forwarding6"`
	// Interfaces lists every interface in the namespace, in index order.
	Interfaces []InterfaceStatus `json:"interfaces,omitempty"`
}

// InterfaceStatus is one interface inside a node.
type InterfaceStatus struct {
	// Name is the interface name; Kind the link type (veth, bridge, device).
	Name string `json:"name"`
	Kind string `json:"kind"`
	// MAC is the hardware address.
	MAC string `json:"mac"`
	// Up is the administrative state; OperState the kernel's RFC 2863 state
	// (up once the veth peer is up too).
	Up        bool   `json:"up"`
	OperState string `json:"oper_state"`
	// Master is the bridge this interface is a port of, if any.
	Master string `json:"master,omitempty"`
	// Peer is the planned other end ("node/iface") of a veth, if planned.
	Peer string `json:"peer,omitempty"`
	// Addresses are the addresses in CIDR form, IPv6 link-local left out.
	Addresses []string `json:"addresses,omitempty"`
	// XDP is true when an XDP program is attached.
	XDP bool `json:"xdp,omitempty"`
}

// LinkStatus is one planned veth pair.
type LinkStatus struct {
	// A and B are the ends, "node/iface".
	A string `json:"a"`
	B string `json:"b"`
	// Present is true when both ends exist and are each other's peer.
	Present bool `json:"present"`
	// Up is true when both ends report operstate up.
	Up bool `json:"up"`
}

// Status inspects the testbed of spec without changing anything. A missing
// or partial testbed is not an error: it shows as Complete false with the
// gaps in Problems. Errors are reserved for an invalid Spec and for failing
// to read state that exists. It needs root.
func Status(spec Spec) (Report, error) {
	plans, err := spec.plan()
	if err != nil {
		return Report{}, err
	}
	st := Report{Prefix: spec.Prefix}
	problem := func(format string, args ...any) { st.Problems = append(st.Problems, fmt.Sprintf(format, args...)) }

	// links[node][iface] as found, for pairing the ends afterwards.
	found := map[string]map[string]netlink.Link{}
	for _, p := range plans {
		ns := NodeStatus{Name: p.spec.Name, Namespace: p.ns, Role: p.spec.Role, Description: p.spec.Description}
		links, err := inspectNode(p, &ns, problem)
		if err != nil {
			return Report{}, fmt.Errorf("testbed: node %s: %w", p.spec.Name, err)
		}
		found[p.spec.Name] = links
		st.Nodes = append(st.Nodes, ns)
	}
	for _, l := range spec.Links {
		la, lb := found[l.A.Node][l.A.Iface], found[l.B.Node][l.B.Iface]
		ls := LinkStatus{A: l.A.String(), B: l.B.String(), Present: vethPaired(la, lb)}
		ls.Up = ls.Present && la.Attrs().OperState == netlink.OperUp && lb.Attrs().OperState == netlink.OperUp
		if !ls.Present && la != nil && lb != nil {
			problem("link %s: ends exist but are not one veth pair", l)
		}
		st.Links = append(st.Links, ls)
	}
	// Without a program on the far end, veth drops what XDP redirects into
	// a DPU port, counted nowhere (xdppass.go).
	peers, ports := dpuPortPeers(spec)
	for i, p := range peers {
		if l := found[p.Node][p.Iface]; l != nil && !xdpAttached(l) {
			problem("%s (far end of DPU port %s): no XDP program, so frames redirected out of %s are dropped; `lovelock testbed up` attaches xdp_pass again",
				p, ports[i], ports[i])
		}
	}
	st.Complete = len(st.Problems) == 0
	return st, nil
}

// inspectNode fills ns and reports gaps against the plan.
func inspectNode(p *nodePlan, ns *NodeStatus, problem func(string, ...any)) (map[string]netlink.Link, error) {
	h, ok, err := openNamespace(nsPath(p.ns))
	if err != nil {
		return nil, err
	}
	if !ok {
		problem("node %s: namespace %s missing", p.spec.Name, p.ns)
		return nil, nil
	}
	defer h.Close()
	ns.Present = true
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	defer nl.Close()

	err = llnetns.Do(h, func() error {
		v, err := readSysctl("net/ipv4/ip_forward")
		if err != nil {
			return err
		}
		ns.Forwarding = v == "1"
		v, err = readSysctl("net/ipv6/conf/all/forwarding")
		ns.Forwarding6 = v == "1"
		return err
	})
	if err != nil {
		return nil, err
	}
	if ns.Forwarding != p.spec.Forwarding {
		problem("node %s: ip_forward is %v, want %v", p.spec.Name, ns.Forwarding, p.spec.Forwarding)
	}
	if ns.Forwarding6 != p.spec.Forwarding {
		problem("node %s: IPv6 forwarding (net.ipv6.conf.all.forwarding) is %v, want %v", p.spec.Name, ns.Forwarding6, p.spec.Forwarding)
	}

	var links []netlink.Link
	if err := retryDump(func() (err error) { links, err = nl.LinkList(); return err }); err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	byName := map[string]netlink.Link{}
	byIndex := map[int]string{}
	for _, l := range links {
		byName[l.Attrs().Name] = l
		byIndex[l.Attrs().Index] = l.Attrs().Name
	}
	addrsOf := map[string][]netip.Prefix{}
	for _, l := range links {
		a := l.Attrs()
		addrs, err := listAddrs(nl, l)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", a.Name, err)
		}
		addrsOf[a.Name] = addrs
		is := InterfaceStatus{
			Name: a.Name, Kind: l.Type(), MAC: a.HardwareAddr.String(),
			Up: a.Flags&net.FlagUp != 0, OperState: a.OperState.String(),
			Master: byIndex[a.MasterIndex], XDP: xdpAttached(l),
		}
		if ifc := p.iface(a.Name); ifc != nil && ifc.kind == "veth" {
			is.Peer = ifc.peer.String()
		}
		for _, ad := range addrs {
			is.Addresses = append(is.Addresses, ad.String())
		}
		ns.Interfaces = append(ns.Interfaces, is)
		if a.Name == "lo" && !is.Up {
			problem("node %s: lo is down", p.spec.Name)
		}
	}

	for _, ifc := range p.ifaces {
		l := byName[ifc.name]
		where := p.spec.Name + "/" + ifc.name
		if l == nil {
			problem("%s: missing", where)
			continue
		}
		a := l.Attrs()
		if l.Type() != ifc.kind {
			problem("%s: is a %s, want %s", where, l.Type(), ifc.kind)
		}
		if a.Flags&net.FlagUp == 0 {
			problem("%s: down", where)
		}
		if a.HardwareAddr.String() != ifc.mac.String() {
			problem("%s: MAC %s, want %s", where, a.HardwareAddr, ifc.mac)
		}
		if byIndex[a.MasterIndex] != ifc.master {
			problem("%s: master %q, want %q", where, byIndex[a.MasterIndex], ifc.master)
		}
		for _, want := range ifc.addrs {
			if !slices.Contains(addrsOf[ifc.name], want) {
				problem("%s: address %v missing", where, want)
			}
		}
	}

	if len(p.routes) > 0 {
		var routes []netlink.Route
		err := retryDump(func() (err error) {
			routes, err = nl.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("list routes: %w", err)
		}
		for _, want := range p.routes {
			if !slices.ContainsFunc(routes, func(r netlink.Route) bool {
				dst, ok := ipNetToPrefix(r.Dst)
				gw, _ := netip.AddrFromSlice(r.Gw)
				return ok && dst == want.dst && gw.Unmap() == want.via && byIndex[r.LinkIndex] == want.dev
			}) {
				problem("node %s: route %v via %v dev %s missing", p.spec.Name, want.dst, want.via, want.dev)
			}
		}
	}

	if len(p.neighs) > 0 {
		var neighs []netlink.Neigh
		if err := retryDump(func() (err error) { neighs, err = nl.NeighList(0, netlink.FAMILY_ALL); return err }); err != nil {
			return nil, fmt.Errorf("list neighbours: %w", err)
		}
		for _, want := range p.neighs {
			if !slices.ContainsFunc(neighs, func(n netlink.Neigh) bool {
				ip, _ := netip.AddrFromSlice(n.IP)
				return ip.Unmap() == want.ip && byIndex[n.LinkIndex] == want.dev &&
					n.State&netlink.NUD_PERMANENT != 0 && n.HardwareAddr.String() == want.mac.String()
			}) {
				problem("node %s: permanent neighbour %v lladdr %s dev %s missing", p.spec.Name, want.ip, want.mac, want.dev)
			}
		}
	}
	return byName, nil
}

// Summary returns a one-line account: complete, or the first few problems.
func (s Report) Summary() string {
	if s.Complete {
		return fmt.Sprintf("testbed %s: complete (%d nodes, %d links)", s.Prefix, len(s.Nodes), len(s.Links))
	}
	present := 0
	for _, n := range s.Nodes {
		if n.Present {
			present++
		}
	}
	if present == 0 {
		return fmt.Sprintf("testbed %s: absent", s.Prefix)
	}
	first := s.Problems
	if len(first) > 3 {
		first = first[:3]
	}
	more := ""
	if n := len(s.Problems) - len(first); n > 0 {
		more = fmt.Sprintf(" (and %d more)", n)
	}
	return fmt.Sprintf("testbed %s: incomplete, %d of %d nodes present: %s%s",
		s.Prefix, present, len(s.Nodes), strings.Join(first, "; "), more)
}

func xdpAttached(l netlink.Link) bool {
	x := l.Attrs().Xdp
	return x != nil && x.Attached
}
