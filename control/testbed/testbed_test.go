package testbed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// testSpec returns the default testbed under a prefix no other test process
// uses: the pid keeps packages apart, tag keeps tests apart.
func testSpec(t *testing.T, tag string) Spec {
	t.Helper()
	s := DefaultSpec()
	s.Prefix = fmt.Sprintf("llt%d%s-", os.Getpid(), tag)
	return s
}

// downAtEnd removes the testbed when the test ends, whatever happened, and
// checks that nothing is left.
func downAtEnd(t *testing.T, spec Spec) {
	t.Cleanup(func() {
		if err := Down(context.Background(), spec); err != nil {
			t.Errorf("cleanup Down: %v", err)
		}
		requireGone(t, spec.Prefix)
	})
}

// requireGone fails t if any namespace or root-namespace link of prefix is
// left.
func requireGone(t *testing.T, prefix string) {
	t.Helper()
	names, err := namespacesWithPrefix(prefix)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) > 0 {
		t.Errorf("namespaces left in %s: %v", NetnsDir, names)
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		a := l.Attrs()
		if strings.HasPrefix(a.Name, prefix) || strings.HasPrefix(a.Alias, aliasMarker+prefix) {
			t.Errorf("link left in root namespace: %s (alias %q)", a.Name, a.Alias)
		}
	}
}

func requireComplete(t *testing.T, spec Spec) Report {
	t.Helper()
	st, err := Status(spec)
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if !st.Complete {
		t.Fatalf("testbed incomplete:\n%s", strings.Join(st.Problems, "\n"))
	}
	return st
}

func TestDefaultSpec(t *testing.T) {
	s := DefaultSpec()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if s.Prefix != "ll-" || s.Namespace("host0") != "ll-host0" || s.Namespace("fabric") != "ll-fabric" {
		t.Errorf("names: prefix %q, host0 in %q", s.Prefix, s.Namespace("host0"))
	}
	want := map[string]string{
		"host0": "10.77.10.1", "host1": "10.77.11.1", "gpu0": "10.77.12.1",
		"dpu0": "10.77.0.10", "dpu1": "10.77.0.11", "dpu2": "10.77.0.12",
		"mem0": "10.77.0.20", "client": "10.77.0.30",
	}
	for node, addr := range want {
		got, err := s.NodeAddr(node)
		if err != nil || got != netip.MustParseAddr(addr) {
			t.Errorf("NodeAddr(%s) = %v, %v; want %s", node, got, err, addr)
		}
		if got6, err := s.NodeAddr6(node); err != nil || !got6.Is6() {
			t.Errorf("NodeAddr6(%s) = %v, %v", node, got6, err)
		}
	}
	if _, err := s.NodeAddr("fabric"); err == nil {
		t.Error("NodeAddr(fabric) has no address, want an error")
	}
	_, err := s.Node("dpu9")
	if !errors.Is(err, ErrUnknownNode) || !strings.Contains(err.Error(), "host0, host1, gpu0, dpu0") {
		t.Errorf("Node(dpu9) error = %v; want ErrUnknownNode listing the nodes", err)
	}

	plans, err := s.plan()
	if err != nil {
		t.Fatal(err)
	}
	neighs := map[string]int{}
	for _, p := range plans {
		neighs[p.spec.Name] = len(p.neighs)
	}
	// dpu0: host0's two addresses on pf0hpf, four fabric peers' two on p0.
	if neighs["dpu0"] != 2+4*2 || neighs["host0"] != 2 || neighs["mem0"] != 4*2 || neighs["fabric"] != 0 {
		t.Errorf("permanent neighbours per node: %v", neighs)
	}
}

func TestMAC(t *testing.T) {
	m := MAC("dpu0", "p0")
	if m[0]&0x02 == 0 || m[0]&0x01 != 0 {
		t.Errorf("MAC %s is not locally administered unicast", m)
	}
	if m.String() != MAC("dpu0", "p0").String() || m.String() == MAC("dpu1", "p0").String() {
		t.Error("MAC is not a deterministic function of node and interface")
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Spec)
		want   string
	}{
		{"empty prefix", func(s *Spec) { s.Prefix = "" }, "invalid prefix"},
		{"slash in prefix", func(s *Spec) { s.Prefix = "../x" }, "invalid prefix"},
		{"long iface", func(s *Spec) { s.Links[0].A.Iface = "averyveryverylongname" }, "15 bytes"},
		{"unknown node", func(s *Spec) { s.Links[0].A.Node = "nope" }, "unknown node"},
		{"duplicate node", func(s *Spec) { s.Nodes = append(s.Nodes, s.Nodes[0]) }, "defined twice"},
		{"unreachable gateway", func(s *Spec) { s.Nodes[0].Routes[0].Via = netip.MustParseAddr("192.0.2.1") }, "none of the node's subnets"},
		{"missing bridge", func(s *Spec) { s.Links[len(s.Links)-1].B.Master = "br9" }, "not a bridge"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := DefaultSpec()
			tc.mutate(&s)
			err := s.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate() = %v; want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestLifecycle builds the testbed, checks that Up is idempotent and repairs
// damage, that every node reaches every other over UDP (IPv4 and IPv6), and
// that Down leaves nothing.
func TestLifecycle(t *testing.T) {
	testenv.RequirePriv(t)
	spec := testSpec(t, "a")
	downAtEnd(t, spec)
	ctx := t.Context()

	start := time.Now()
	if err := Up(ctx, spec); err != nil {
		t.Fatalf("Up: %v", err)
	}
	t.Logf("Up took %v", time.Since(start))
	start = time.Now()
	if err := Up(ctx, spec); err != nil {
		t.Fatalf("second Up: %v", err)
	}
	t.Logf("second Up took %v", time.Since(start))
	st := requireComplete(t, spec)
	if len(st.Nodes) != 9 || len(st.Links) != 8 {
		t.Errorf("status has %d nodes, %d links; want 9, 8", len(st.Nodes), len(st.Links))
	}
	for _, l := range st.Links {
		if !l.Present || !l.Up {
			t.Errorf("link %s ⇄ %s: present %v, up %v", l.A, l.B, l.Present, l.Up)
		}
	}

	t.Run("bpffs visible in nodes", func(t *testing.T) {
		err := spec.Run("dpu0", func() error {
			var fs unix.Statfs_t
			if err := unix.Statfs(BPFFSPath, &fs); err != nil {
				return err
			}
			if fs.Type != unix.BPF_FS_MAGIC {
				return fmt.Errorf("%s is not bpffs (magic %#x)", BPFFSPath, fs.Type)
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
	})

	t.Run("Up repairs damage", func(t *testing.T) {
		// A deleted uplink (its fabric port goes with it), a lost address,
		// a stray address, and a whole node gone.
		err := spec.Run("dpu1", func() error {
			l, err := netlink.LinkByName("p0")
			if err != nil {
				return err
			}
			return netlink.LinkDel(l)
		})
		if err != nil {
			t.Fatal(err)
		}
		err = spec.Run("host0", func() error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			if err := netlink.AddrDel(l, toNetlinkAddr(netip.MustParsePrefix("10.77.10.1/24"))); err != nil {
				return err
			}
			return netlink.AddrAdd(l, toNetlinkAddr(netip.MustParsePrefix("192.0.2.7/24")))
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := destroyNamespace(spec.Namespace("mem0")); err != nil {
			t.Fatal(err)
		}
		st, err := Status(spec)
		if err != nil {
			t.Fatal(err)
		}
		if st.Complete {
			t.Fatal("Status says complete after damage")
		}
		for _, want := range []string{"dpu1/p0: missing", "fabric/dpu1-p0: missing", "host0/eth0: address 10.77.10.1/24 missing", "namespace " + spec.Namespace("mem0") + " missing"} {
			if !slices.Contains(st.Problems, want) && !slices.ContainsFunc(st.Problems, func(p string) bool { return strings.Contains(p, want) }) {
				t.Errorf("problems lack %q:\n%s", want, strings.Join(st.Problems, "\n"))
			}
		}
		if err := Up(ctx, spec); err != nil {
			t.Fatalf("Up after damage: %v", err)
		}
		st = requireComplete(t, spec)
		for _, n := range st.Nodes {
			if n.Name != "host0" {
				continue
			}
			for _, ifc := range n.Interfaces {
				if ifc.Name == "eth0" && slices.Contains(ifc.Addresses, "192.0.2.7/24") {
					t.Error("Up left the stray address on host0/eth0")
				}
			}
		}
	})

	t.Run("Status sees a lost xdp_pass and IPv6 forwarding off", func(t *testing.T) {
		// The fabric's end of dpu0's uplink loses its xdp_pass; dpu1 stops
		// forwarding IPv6.
		err := spec.Run("fabric", func() error {
			l, err := netlink.LinkByName("dpu0-p0")
			if err != nil {
				return err
			}
			return netlink.LinkSetXdpFd(l, -1)
		})
		if err != nil {
			t.Fatal(err)
		}
		err = spec.Run("dpu1", func() error { return writeSysctl("net/ipv6/conf/all/forwarding", "0") })
		if err != nil {
			t.Fatal(err)
		}
		st, err := Status(spec)
		if err != nil {
			t.Fatal(err)
		}
		if st.Complete {
			t.Errorf("Status says complete without xdp_pass on fabric/dpu0-p0 and IPv6 forwarding in dpu1")
		}
		for _, want := range []string{
			"fabric/dpu0-p0 (far end of DPU port dpu0/p0): no XDP program",
			"`lovelock testbed up` attaches xdp_pass again",
			"node dpu1: IPv6 forwarding (net.ipv6.conf.all.forwarding) is false, want true",
		} {
			if !slices.ContainsFunc(st.Problems, func(p string) bool { return strings.Contains(p, want) }) {
				t.Errorf("problems lack %q:\n%s", want, strings.Join(st.Problems, "\n"))
			}
		}
		if err := Up(ctx, spec); err != nil {
			t.Fatalf("Up: %v", err)
		}
		requireComplete(t, spec)
	})

	t.Run("UDP between every pair", func(t *testing.T) {
		requireAllPairsUDP(t, spec, "udp4", spec.NodeAddr)
		requireAllPairsUDP(t, spec, "udp6", spec.NodeAddr6)
	})

	if err := Down(ctx, spec); err != nil {
		t.Fatalf("Down: %v", err)
	}
	requireGone(t, spec.Prefix)
	st, err := Status(spec)
	if err != nil {
		t.Fatal(err)
	}
	if st.Complete || !strings.Contains(st.Summary(), "absent") {
		t.Errorf("after Down: %s", st.Summary())
	}
	if err := Down(ctx, spec); err != nil {
		t.Errorf("second Down: %v", err)
	}
}

// requireAllPairsUDP sends one datagram from every node to every other node's
// main address, each from a socket opened inside the sender's namespace to a
// listener opened inside the receiver's, and fails unless all arrive.
func requireAllPairsUDP(t *testing.T, spec Spec, network string, addrOf func(string) (netip.Addr, error)) {
	t.Helper()
	const port = 7777
	var nodes []string
	for _, n := range spec.Nodes {
		if n.Role != RoleSwitch {
			nodes = append(nodes, n.Name)
		}
	}
	type datagram struct{ at, payload string }
	got := make(chan datagram, 4*len(nodes)*len(nodes))
	senders := map[string]*net.UDPConn{}
	for _, n := range nodes {
		var rx, tx *net.UDPConn
		err := spec.Run(n, func() (err error) {
			if rx, err = net.ListenUDP(network, &net.UDPAddr{Port: port}); err != nil {
				return err
			}
			tx, err = net.ListenUDP(network, nil)
			return err
		})
		if err != nil {
			t.Fatalf("%s sockets in %s: %v", network, n, err)
		}
		t.Cleanup(func() { rx.Close(); tx.Close() })
		senders[n] = tx
		go func() {
			buf := make([]byte, 256)
			for {
				k, _, err := rx.ReadFromUDP(buf)
				if err != nil {
					return
				}
				got <- datagram{at: n, payload: string(buf[:k])}
			}
		}()
	}

	pending := map[string]bool{}
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				pending[a+">"+b] = true
			}
		}
	}
	// Resend what is missing a few times: a bridge port may start forwarding
	// a moment after its carrier came up.
	deadline := time.Now().Add(5 * time.Second)
	for len(pending) > 0 && time.Now().Before(deadline) {
		for key := range pending {
			from, to, _ := strings.Cut(key, ">")
			dst, err := addrOf(to)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := senders[from].WriteToUDPAddrPort([]byte(key), netip.AddrPortFrom(dst, port)); err != nil {
				t.Logf("%s send %s: %v", network, key, err)
			}
		}
		timeout := time.After(200 * time.Millisecond)
	collect:
		for len(pending) > 0 {
			select {
			case d := <-got:
				_, to, _ := strings.Cut(d.payload, ">")
				if to != d.at {
					t.Errorf("%s datagram %q arrived at %s", network, d.payload, d.at)
				}
				delete(pending, d.payload)
			case <-timeout:
				break collect
			}
		}
	}
	if len(pending) > 0 {
		var missing []string
		for k := range pending {
			missing = append(missing, k)
		}
		slices.Sort(missing)
		t.Errorf("%s: %d of %d ordered pairs undelivered: %v", network, len(missing), len(nodes)*(len(nodes)-1), missing)
	}
}

// TestDownAfterCrash leaves the debris a crash could leave (some namespaces
// and a veth of a half-built testbed, a name file never mounted, a marked
// veth in the root namespace) and checks that Up converges it and Down
// removes all of it.
func TestDownAfterCrash(t *testing.T) {
	testenv.RequirePriv(t)
	spec := testSpec(t, "b")
	downAtEnd(t, spec)
	ctx := t.Context()

	halfBuild := func(t *testing.T) {
		t.Helper()
		if err := os.MkdirAll(NetnsDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"host0", "dpu0"} {
			ns, err := ensureNamespace(nsPath(spec.Namespace(n)), alias(spec.Prefix, n, "lo"))
			if err != nil {
				t.Fatal(err)
			}
			ns.Close()
		}
		// Created, never mounted: the file ip netns would also leave.
		if err := os.WriteFile(nsPath(spec.Namespace("gpu0")), nil, 0); err != nil {
			t.Fatal(err)
		}
		err := spec.Run("host0", func() error {
			attrs := netlink.NewLinkAttrs()
			attrs.Name = "eth0"
			attrs.Alias = alias(spec.Prefix, "host0", "eth0")
			v := netlink.NewVeth(attrs)
			v.PeerName = "pf0hpf"
			if err := netlink.LinkAdd(v); err != nil { // peer left beside it, not moved yet
				return err
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		attrs := netlink.NewLinkAttrs()
		attrs.Name = fmt.Sprintf("lls%d", os.Getpid())
		attrs.Alias = alias(spec.Prefix, "dpu1", "p0")
		v := netlink.NewVeth(attrs)
		v.PeerName = fmt.Sprintf("llq%d", os.Getpid())
		if err := netlink.LinkAdd(v); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if l, err := netlink.LinkByName(attrs.Name); err == nil {
				netlink.LinkDel(l)
			}
		})
	}

	t.Run("Up converges a half-built testbed", func(t *testing.T) {
		halfBuild(t)
		if err := Up(ctx, spec); err != nil {
			t.Fatalf("Up: %v", err)
		}
		requireComplete(t, spec)
		// Up does not own the root namespace; Down does clean it.
		if err := Down(ctx, spec); err != nil {
			t.Fatalf("Down: %v", err)
		}
		requireGone(t, spec.Prefix)
	})

	t.Run("Down removes a half-built testbed", func(t *testing.T) {
		halfBuild(t)
		if err := Down(ctx, spec); err != nil {
			t.Fatalf("Down: %v", err)
		}
		requireGone(t, spec.Prefix)
	})

	t.Run("Up honours a cancelled context", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if err := Up(cctx, spec); !errors.Is(err, context.Canceled) {
			t.Errorf("Up with cancelled context = %v; want context.Canceled", err)
		}
	})
}

// TestDownOnlyItsPrefix brings up two testbeds, one's prefix the other's
// plus "x-" (ll- and ll-x-), and downs the shorter: the longer one, its
// namespaces and its marked root-namespace veth survive complete, while a
// namespace of a node the Spec does not know but marked as the shorter
// prefix's goes. Before, Down removed every namespace starting with the
// prefix, so ll-x-host0 went with ll-host0.
func TestDownOnlyItsPrefix(t *testing.T) {
	testenv.RequirePriv(t)
	a := testSpec(t, "c")
	b := a
	b.Prefix = a.Prefix + "x-"
	downAtEnd(t, a)
	downAtEnd(t, b) // runs first: a's check for leftovers would see b's
	ctx := t.Context()
	for _, s := range []Spec{a, b} {
		if err := Up(ctx, s); err != nil {
			t.Fatalf("Up %s: %v", s.Prefix, err)
		}
	}
	// Debris of a node a's Spec no longer has, marked as a's.
	old := a.Namespace("old9")
	ns, err := ensureNamespace(nsPath(old), alias(a.Prefix, "old9", "lo"))
	if err != nil {
		t.Fatal(err)
	}
	ns.Close()
	// A veth of b's in the root namespace.
	attrs := netlink.NewLinkAttrs()
	attrs.Name = fmt.Sprintf("llr%d", os.Getpid())
	attrs.Alias = alias(b.Prefix, "dpu1", "p0")
	v := netlink.NewVeth(attrs)
	v.PeerName = fmt.Sprintf("llp%d", os.Getpid())
	if err := netlink.LinkAdd(v); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(attrs.Name); err == nil {
			netlink.LinkDel(l)
		}
	})

	if err := Down(ctx, a); err != nil {
		t.Fatalf("Down %s: %v", a.Prefix, err)
	}
	requireComplete(t, b)
	if _, err := netlink.LinkByName(attrs.Name); err != nil {
		t.Errorf("Down %s removed %s's root-namespace veth: %v", a.Prefix, b.Prefix, err)
	}
	names, err := namespacesWithPrefix(a.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if !strings.HasPrefix(name, b.Prefix) {
			t.Errorf("namespace %s left after Down %s", name, a.Prefix)
		}
	}
	if st, err := Status(a); err != nil || !strings.Contains(st.Summary(), "absent") {
		t.Errorf("after Down %s: %v %s", a.Prefix, err, st.Summary())
	}

	if err := Down(ctx, b); err != nil {
		t.Fatalf("Down %s: %v", b.Prefix, err)
	}
	requireGone(t, b.Prefix)
}
