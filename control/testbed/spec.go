// Package testbed builds, inspects and tears down the Lovelock network
// testbed: one Linux network namespace per node (hosts, a GPU host, DPUs, a
// memory node, a client) joined by veth pairs, with a bridge namespace as the
// top-of-rack switch (docs/testbed.md draws it).
//
// The package owns everything whose name starts with a Spec's prefix: the
// `ip netns`-compatible bind mounts /run/netns/<prefix><node>, every interface,
// address, route and permanent neighbour entry inside those namespaces, and
// any veth in the root namespace whose alias marks it as created for that
// prefix. It also makes sure /sys/fs/bpf is a mounted bpffs, since later work
// pins BPF objects there from inside the nodes. Nothing else in the repository
// creates or removes testbed namespaces.
//
// Everything is built with netlink from Go; no `ip` command is run. Up
// converges whatever it finds (nothing, a complete testbed, or the debris of
// a crash) to the Spec, and Down removes everything with the prefix, so both
// are safe to repeat.
package testbed

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"strings"

	llnetns "github.com/lovelock-dpu/lovelock/control/netns"
)

// DefaultPrefix is the namespace-name prefix of the testbed that people use
// by hand (`lovelock testbed up`). Tests must pick their own, unique prefix.
const DefaultPrefix = "ll-"

// NetnsDir is where `ip netns` keeps its named namespaces; the testbed keeps
// its own there so that `ip netns list` and `ip netns exec` see them.
const NetnsDir = "/run/netns"

// BPFFSPath is the bpffs mount point that Up makes sure exists.
const BPFFSPath = "/sys/fs/bpf"

// aliasMarker starts the IFLA_IFALIAS of every interface the package creates
// (and of each node's lo), followed by the prefix, a space and "node/iface",
// so that Down can recognise its own interfaces wherever they end up,
// including the root namespace. The space tells the prefix from the node:
// neither may contain one, while both may contain '-'.
const aliasMarker = "lovelock-testbed:"

// ErrUnknownNode is wrapped by lookups of a node that the Spec does not have.
var ErrUnknownNode = errors.New("unknown node")

// Role says what a node stands for.
type Role string

// The roles of the default testbed's nodes.
const (
	// RoleHost is a server whose NIC is a DPU; its processes use the DPU's
	// services through host-side client libraries.
	RoleHost Role = "host"
	// RoleGPU is a GPU host behind a DPU, the target of accelerator ingest.
	RoleGPU Role = "gpu"
	// RoleDPU is a Lovelock node: pf0hpf faces its host, p0 is its uplink.
	RoleDPU Role = "dpu"
	// RoleMemory is a memory node that serves far-memory regions.
	RoleMemory Role = "memory"
	// RoleClient is a machine outside the cluster: inference inputs, load.
	RoleClient Role = "client"
	// RoleSwitch is the fabric: a namespace holding a Linux bridge.
	RoleSwitch Role = "switch"
)

// Spec describes a testbed: which namespaces exist, how they are wired and
// addressed. Build one with DefaultSpec and change Prefix; the other fields
// are exported so that tests and tools can read the plan.
type Spec struct {
	// Prefix starts every namespace name (Prefix+node). It must be non-empty.
	// Down removes the namespaces that are this testbed's: Prefix+node for
	// the Spec's nodes, and any other Prefix+name whose interfaces are
	// marked as Prefix's, but not those of a testbed whose prefix merely
	// starts with Prefix (ll-x- beside ll-).
	Prefix string
	// Nodes are the namespaces, in a stable order.
	Nodes []NodeSpec
	// Links are the veth pairs between nodes.
	Links []LinkSpec
}

// NodeSpec is one node (one network namespace).
type NodeSpec struct {
	// Name is the node's name, e.g. "host0"; the namespace is Prefix+Name.
	Name string
	// Role says what the node stands for.
	Role Role
	// Description is a one-line explanation for people (status, --help).
	Description string
	// MainIface names the interface whose addresses are the node's main
	// addresses (NodeAddr); empty for a node without addresses.
	MainIface string
	// Forwarding turns on IPv4 and IPv6 forwarding in the node.
	Forwarding bool
	// Bridges are Linux bridges created inside the node.
	Bridges []string
	// Routes are installed in the node's main table. The outgoing interface
	// is the one whose subnet holds the gateway.
	Routes []Route
}

// Route is a static route through a directly connected gateway.
type Route struct {
	// Dst is the destination prefix; 0.0.0.0/0 or ::/0 for the default.
	Dst netip.Prefix
	// Via is the gateway, an address in one of the node's subnets.
	Via netip.Addr
}

// LinkSpec is one veth pair.
type LinkSpec struct {
	// A and B are the two ends.
	A, B Endpoint
}

// Endpoint is one end of a veth pair.
type Endpoint struct {
	// Node is the node holding this end.
	Node string
	// Iface is the interface name inside that node (at most 15 bytes).
	Iface string
	// Master, if set, names a bridge of the same node to enslave this end to.
	Master string
	// Addrs are the end's addresses with their subnet lengths.
	Addrs []netip.Prefix
}

// String returns "node/iface".
func (e Endpoint) String() string { return e.Node + "/" + e.Iface }

// String returns "a ⇄ b".
func (l LinkSpec) String() string { return l.A.String() + " ⇄ " + l.B.String() }

// DefaultSpec returns the testbed of DESIGN §3 with DefaultPrefix:
//
//	host0 eth0 ⇄ dpu0 pf0hpf, host1 eth0 ⇄ dpu1 pf0hpf, gpu0 eth0 ⇄ dpu2 pf0hpf;
//	dpu0..2 p0, mem0 eth0 and client eth0 ⇄ ports of bridge br0 in fabric.
//
// The fabric subnet is 10.77.0.0/24 (fd77::/64), host link N is
// 10.77.N.0/24 (fd77:N::/64) for N = 10, 11, 12. Hosts route everything via
// their DPU; DPUs forward and reach the other host subnets via the owning
// DPU's p0; mem0 and client reach host subnets the same way.
func DefaultSpec() Spec {
	p := netip.MustParsePrefix
	type pair struct {
		host, dpu string
		role      Role
		desc      string
		net       int // third octet of the host link, and the DPU's fabric host number
	}
	pairs := []pair{
		{"host0", "dpu0", RoleHost, "server behind dpu0 (host processes: messaging and far-memory clients)", 10},
		{"host1", "dpu1", RoleHost, "server behind dpu1 (host processes: messaging and far-memory clients)", 11},
		{"gpu0", "dpu2", RoleGPU, "GPU host behind dpu2 (accelerator ingest writes into its GPU memory)", 12},
	}
	fabric := []struct {
		node, iface string
		role        Role
		desc        string
		host        int
	}{
		{"dpu0", "p0", RoleDPU, "", 10},
		{"dpu1", "p0", RoleDPU, "", 11},
		{"dpu2", "p0", RoleDPU, "", 12},
		{"mem0", "eth0", RoleMemory, "memory node on the fabric (far-memory server)", 20},
		{"client", "eth0", RoleClient, "outside client on the fabric (inference inputs, load generators)", 30},
	}

	s := Spec{Prefix: DefaultPrefix}
	// Routes to every host subnet through the DPU that owns it, for fabric
	// nodes; a DPU skips its own subnet, which is directly connected.
	hostRoutes := func(skip string) []Route {
		var rs []Route
		for _, pr := range pairs {
			if pr.dpu == skip {
				continue
			}
			rs = append(rs,
				Route{Dst: p(fmt.Sprintf("10.77.%d.0/24", pr.net)), Via: netip.MustParseAddr(fmt.Sprintf("10.77.0.%d", pr.net))},
				Route{Dst: p(fmt.Sprintf("fd77:%d::/64", pr.net)), Via: netip.MustParseAddr(fmt.Sprintf("fd77::%d", pr.net))},
			)
		}
		return rs
	}
	for _, pr := range pairs {
		s.Nodes = append(s.Nodes, NodeSpec{
			Name: pr.host, Role: pr.role, Description: pr.desc, MainIface: "eth0",
			Routes: []Route{
				{Dst: p("0.0.0.0/0"), Via: netip.MustParseAddr(fmt.Sprintf("10.77.%d.2", pr.net))},
				{Dst: p("::/0"), Via: netip.MustParseAddr(fmt.Sprintf("fd77:%d::2", pr.net))},
			},
		})
	}
	for _, pr := range pairs {
		s.Nodes = append(s.Nodes, NodeSpec{
			Name: pr.dpu, Role: RoleDPU, MainIface: "p0", Forwarding: true,
			Description: fmt.Sprintf("DPU of %s: pf0hpf faces %s, p0 is the uplink to the fabric", pr.host, pr.host),
			Routes:      hostRoutes(pr.dpu),
		})
	}
	for _, f := range fabric[len(pairs):] {
		s.Nodes = append(s.Nodes, NodeSpec{
			Name: f.node, Role: f.role, Description: f.desc, MainIface: f.iface,
			Routes: hostRoutes(""),
		})
	}
	s.Nodes = append(s.Nodes, NodeSpec{
		Name: "fabric", Role: RoleSwitch, Bridges: []string{"br0"},
		Description: "top-of-rack switch: bridge br0 joins every p0/eth0 uplink (ports named <node>-<iface>)",
	})

	for _, pr := range pairs {
		s.Links = append(s.Links, LinkSpec{
			A: Endpoint{Node: pr.host, Iface: "eth0", Addrs: []netip.Prefix{
				p(fmt.Sprintf("10.77.%d.1/24", pr.net)), p(fmt.Sprintf("fd77:%d::1/64", pr.net))}},
			B: Endpoint{Node: pr.dpu, Iface: "pf0hpf", Addrs: []netip.Prefix{
				p(fmt.Sprintf("10.77.%d.2/24", pr.net)), p(fmt.Sprintf("fd77:%d::2/64", pr.net))}},
		})
	}
	for _, f := range fabric {
		s.Links = append(s.Links, LinkSpec{
			A: Endpoint{Node: f.node, Iface: f.iface, Addrs: []netip.Prefix{
				p(fmt.Sprintf("10.77.0.%d/24", f.host)), p(fmt.Sprintf("fd77::%d/64", f.host))}},
			B: Endpoint{Node: "fabric", Iface: f.node + "-" + f.iface, Master: "br0"},
		})
	}
	return s
}

// Namespace returns the network namespace name of node: Prefix+node.
func (s Spec) Namespace(node string) string { return s.Prefix + node }

// NodeNames returns the node names in Spec order.
func (s Spec) NodeNames() []string {
	names := make([]string, len(s.Nodes))
	for i, n := range s.Nodes {
		names[i] = n.Name
	}
	return names
}

// Node returns the node called name, or an error wrapping ErrUnknownNode that
// lists the valid names.
func (s Spec) Node(name string) (NodeSpec, error) {
	for _, n := range s.Nodes {
		if n.Name == name {
			return n, nil
		}
	}
	return NodeSpec{}, fmt.Errorf("testbed: %w %q (nodes: %s)", ErrUnknownNode, name, strings.Join(s.NodeNames(), ", "))
}

// NodeAddr returns the node's main IPv4 address: the first IPv4 address of
// its MainIface (p0 for a DPU, eth0 for the others).
func (s Spec) NodeAddr(node string) (netip.Addr, error) { return s.nodeAddr(node, true) }

// NodeAddr6 is NodeAddr for IPv6.
func (s Spec) NodeAddr6(node string) (netip.Addr, error) { return s.nodeAddr(node, false) }

func (s Spec) nodeAddr(node string, v4 bool) (netip.Addr, error) {
	n, err := s.Node(node)
	if err != nil {
		return netip.Addr{}, err
	}
	for _, e := range s.endpoints() {
		if e.Node != node || e.Iface != n.MainIface {
			continue
		}
		for _, a := range e.Addrs {
			if a.Addr().Is4() == v4 {
				return a.Addr(), nil
			}
		}
	}
	fam := "IPv6"
	if v4 {
		fam = "IPv4"
	}
	return netip.Addr{}, fmt.Errorf("testbed: node %s has no %s address on its main interface %q", node, fam, n.MainIface)
}

// Run runs fn on a locked OS thread inside node's network namespace. The
// mount namespace is kept, so /sys/fs/bpf stays visible. Sockets opened by fn
// belong to the node and may be used from any goroutine afterwards;
// goroutines started by fn run in the root namespace.
func (s Spec) Run(node string, fn func() error) error {
	if _, err := s.Node(node); err != nil {
		return err
	}
	if err := llnetns.DoNamed(s.Namespace(node), fn); err != nil {
		return fmt.Errorf("testbed node %s: %w", node, err)
	}
	return nil
}

// MAC returns the deterministic, locally administered unicast MAC address of
// interface iface on node: 02 followed by five bytes of an FNV-1a hash of
// "node/iface". It does not depend on the prefix: testbeds never share a
// segment, and fixed addresses keep captures comparable between runs.
func MAC(node, iface string) net.HardwareAddr {
	h := fnv.New64a()
	h.Write([]byte(node + "/" + iface))
	sum := h.Sum(nil)
	return net.HardwareAddr{0x02, sum[0], sum[1], sum[2], sum[3], sum[4]}
}

func (s Spec) endpoints() []Endpoint {
	es := make([]Endpoint, 0, 2*len(s.Links))
	for _, l := range s.Links {
		es = append(es, l.A, l.B)
	}
	return es
}

// Validate checks that the Spec is consistent: a usable prefix, unique names
// that fit the kernel's limits, links between known nodes, bridges that
// exist, gateways inside a subnet of the node, and unique MAC addresses.
func (s Spec) Validate() error {
	_, err := s.plan()
	return err
}

func alias(prefix, node, iface string) string {
	return aliasMarker + prefix + " " + node + "/" + iface
}

// aliasOwner returns the prefix and node that an alias made by alias names;
// ok is false for any other alias.
func aliasOwner(a string) (prefix, node string, ok bool) {
	rest, ok := strings.CutPrefix(a, aliasMarker)
	if !ok {
		return "", "", false
	}
	prefix, rest, ok = strings.Cut(rest, " ")
	if !ok {
		return "", "", false
	}
	node, _, ok = strings.Cut(rest, "/")
	return prefix, node, ok
}

// ownsAlias reports whether alias a marks an interface of this testbed: its
// prefix is exactly s.Prefix, or, in the older format without the space
// (lovelock-testbed:<prefix><node>/<iface>), it names one of the Spec's
// nodes after s.Prefix, which is as far as that format can be told apart.
func (s Spec) ownsAlias(a string) bool {
	if prefix, _, ok := aliasOwner(a); ok {
		return prefix == s.Prefix
	}
	rest, ok := strings.CutPrefix(a, aliasMarker+s.Prefix)
	if !ok || strings.Contains(rest, " ") {
		return false
	}
	node, _, ok := strings.Cut(rest, "/")
	return ok && s.hasNode(node)
}

func (s Spec) hasNode(name string) bool {
	for _, n := range s.Nodes {
		if n.Name == name {
			return true
		}
	}
	return false
}

// ifacePlan is one interface as Up builds it and Status expects it.
type ifacePlan struct {
	name   string
	kind   string // "veth" or "bridge"
	mac    net.HardwareAddr
	alias  string
	master string
	addrs  []netip.Prefix
	peer   Endpoint // veth only
}

type routePlan struct {
	dst netip.Prefix
	via netip.Addr
	dev string
}

type neighPlan struct {
	dev string
	ip  netip.Addr
	mac net.HardwareAddr
}

type nodePlan struct {
	spec    NodeSpec
	ns      string
	loAlias string      // the mark on lo
	ifaces  []ifacePlan // bridges first, then veth ends in link order
	routes  []routePlan
	neighs  []neighPlan
}

func (p *nodePlan) iface(name string) *ifacePlan {
	for i := range p.ifaces {
		if p.ifaces[i].name == name {
			return &p.ifaces[i]
		}
	}
	return nil
}

func validName(s string, extra string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(extra, r)) {
			return false
		}
	}
	return true
}

// validPrefix reports whether prefix may name namespaces: non-empty, and
// only characters that are safe in a file name and a shell word.
func validPrefix(prefix string) error {
	if !validName(prefix, "-_.") || strings.HasPrefix(prefix, ".") {
		return fmt.Errorf("testbed: invalid prefix %q: want a non-empty name of letters, digits, '-', '_' or '.'", prefix)
	}
	return nil
}

// plan validates the Spec and derives what each node must contain, including
// the permanent neighbour entries: every addressed end on a segment (a plain
// veth pair, or all ends whose peers are ports of one bridge) gets the
// addresses and MACs of every other addressed end on that segment.
func (s Spec) plan() ([]*nodePlan, error) {
	if err := validPrefix(s.Prefix); err != nil {
		return nil, err
	}
	byName := map[string]*nodePlan{}
	var plans []*nodePlan
	for _, n := range s.Nodes {
		if !validName(n.Name, "-_") {
			return nil, fmt.Errorf("testbed: invalid node name %q", n.Name)
		}
		if byName[n.Name] != nil {
			return nil, fmt.Errorf("testbed: node %s defined twice", n.Name)
		}
		p := &nodePlan{spec: n, ns: s.Namespace(n.Name), loAlias: alias(s.Prefix, n.Name, "lo")}
		for _, b := range n.Bridges {
			p.ifaces = append(p.ifaces, ifacePlan{name: b, kind: "bridge", mac: MAC(n.Name, b), alias: alias(s.Prefix, n.Name, b)})
		}
		byName[n.Name] = p
		plans = append(plans, p)
	}

	macs := map[string]string{}
	addIface := func(e, peer Endpoint) error {
		p := byName[e.Node]
		if p == nil {
			return fmt.Errorf("testbed: link end %s: %w %q", e, ErrUnknownNode, e.Node)
		}
		if len(e.Iface) > 15 || !validName(e.Iface, "-_.") {
			return fmt.Errorf("testbed: link end %s: invalid interface name (at most 15 bytes)", e)
		}
		if e.Iface == "lo" || p.iface(e.Iface) != nil {
			return fmt.Errorf("testbed: link end %s: interface defined twice", e)
		}
		if e.Master != "" {
			if b := p.iface(e.Master); b == nil || b.kind != "bridge" {
				return fmt.Errorf("testbed: link end %s: master %q is not a bridge of node %s", e, e.Master, e.Node)
			}
			if len(e.Addrs) > 0 {
				return fmt.Errorf("testbed: link end %s: a bridge port has no addresses", e)
			}
		}
		for _, a := range e.Addrs {
			if !a.IsValid() || a.Addr().Zone() != "" {
				return fmt.Errorf("testbed: link end %s: invalid address %v", e, a)
			}
		}
		p.ifaces = append(p.ifaces, ifacePlan{
			name: e.Iface, kind: "veth", mac: MAC(e.Node, e.Iface),
			alias: alias(s.Prefix, e.Node, e.Iface), master: e.Master, addrs: e.Addrs, peer: peer,
		})
		return nil
	}
	for _, l := range s.Links {
		if l.A.Master != "" && l.B.Master != "" {
			return nil, fmt.Errorf("testbed: link %s: bridge-to-bridge links are not supported", l)
		}
		if err := addIface(l.A, l.B); err != nil {
			return nil, err
		}
		if err := addIface(l.B, l.A); err != nil {
			return nil, err
		}
	}
	for _, p := range plans {
		for _, ifc := range p.ifaces {
			key := ifc.mac.String()
			if other, ok := macs[key]; ok {
				return nil, fmt.Errorf("testbed: %s/%s and %s share MAC %s; rename one", p.spec.Name, ifc.name, other, key)
			}
			macs[key] = p.spec.Name + "/" + ifc.name
		}
	}

	// Segments: a bridge's ports form one, each plain veth pair another.
	segments := map[string][]Endpoint{}
	var order []string
	for i, l := range s.Links {
		key := fmt.Sprintf("link %d", i)
		switch {
		case l.A.Master != "":
			key = "bridge " + l.A.Node + "/" + l.A.Master
		case l.B.Master != "":
			key = "bridge " + l.B.Node + "/" + l.B.Master
		}
		if _, ok := segments[key]; !ok {
			order = append(order, key)
		}
		for _, e := range []Endpoint{l.A, l.B} {
			if e.Master == "" && len(e.Addrs) > 0 {
				segments[key] = append(segments[key], e)
			}
		}
	}
	for _, key := range order {
		members := segments[key]
		for _, m := range members {
			p := byName[m.Node]
			for _, o := range members {
				if o.Node == m.Node && o.Iface == m.Iface {
					continue
				}
				for _, a := range o.Addrs {
					p.neighs = append(p.neighs, neighPlan{dev: m.Iface, ip: a.Addr(), mac: MAC(o.Node, o.Iface)})
				}
			}
		}
	}

	for _, p := range plans {
		n := p.spec
		if n.MainIface != "" {
			if ifc := p.iface(n.MainIface); ifc == nil || len(ifc.addrs) == 0 {
				return nil, fmt.Errorf("testbed: node %s: main interface %q missing or without addresses", n.Name, n.MainIface)
			}
		}
		for _, r := range n.Routes {
			if !r.Dst.IsValid() || !r.Via.IsValid() || r.Dst.Addr().Is4() != r.Via.Is4() {
				return nil, fmt.Errorf("testbed: node %s: invalid route %v via %v", n.Name, r.Dst, r.Via)
			}
			dev := ""
			for _, ifc := range p.ifaces {
				for _, a := range ifc.addrs {
					if a.Masked().Contains(r.Via) {
						dev = ifc.name
					}
				}
			}
			if dev == "" {
				return nil, fmt.Errorf("testbed: node %s: route %v: gateway %v is in none of the node's subnets", n.Name, r.Dst, r.Via)
			}
			p.routes = append(p.routes, routePlan{dst: r.Dst.Masked(), via: r.Via, dev: dev})
		}
	}
	return plans, nil
}
