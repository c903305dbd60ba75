// Package testenv holds the helpers that privileged tests share: the root
// check that skips (or, under LOVELOCK_REQUIRE_PRIV=1, fails), throwaway
// network namespaces, and bpffs; and a few pieces several packages' tests
// need alike (a UDP frame for the steering programs, a read that may
// fault). Everything it creates is removed through tb.Cleanup.
package testenv

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	llnetns "github.com/lovelock-dpu/lovelock/control/netns"
)

// RequirePrivEnv names the variable that turns a privilege skip into a failure.
// CI sets it so that a suite cannot pass by skipping its real tests.
const RequirePrivEnv = "LOVELOCK_REQUIRE_PRIV"

// RequirePriv skips tb unless the process runs as root with a mounted bpffs
// reachable; when LOVELOCK_REQUIRE_PRIV=1 it fails instead of skipping.
func RequirePriv(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv(RequirePrivEnv) == "1" {
		tb.Fatalf("test needs root, and %s=1 forbids skipping it", RequirePrivEnv)
	}
	tb.Skip("test needs root (run as root, or set " + RequirePrivEnv + "=1 to make this a failure)")
}

// NewNetNS creates an anonymous network namespace that lives until the test
// ends. The loopback device inside it is up.
func NewNetNS(tb testing.TB) netns.NsHandle {
	tb.Helper()
	RequirePriv(tb)
	var ns netns.NsHandle
	// netns.New switches the calling thread; do it on a locked thread and
	// switch back, so the test goroutine is untouched.
	orig, err := netns.Get()
	if err != nil {
		tb.Fatalf("get netns: %v", err)
	}
	defer orig.Close()
	err = llnetns.Do(orig, func() error {
		var err error
		ns, err = netns.New()
		if err != nil {
			return err
		}
		return setLoopbackUp()
	})
	if err != nil {
		tb.Fatalf("new netns: %v", err)
	}
	tb.Cleanup(func() { ns.Close() })
	return ns
}

// InNetNS runs fn inside ns and fails tb on error.
func InNetNS(tb testing.TB, ns netns.NsHandle, fn func() error) {
	tb.Helper()
	if err := llnetns.Do(ns, fn); err != nil {
		tb.Fatal(err)
	}
}

// BPFFS returns a fresh, empty bpffs mount point that is unmounted when the
// test ends.
func BPFFS(tb testing.TB) string {
	tb.Helper()
	RequirePriv(tb)
	dir := tb.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, ""); err != nil {
		tb.Fatalf("mount bpffs on %s: %v", dir, err)
	}
	tb.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			tb.Errorf("unmount bpffs %s: %v", dir, err)
		}
	})
	return dir
}

func setLoopbackUp() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	return netlink.LinkSetUp(lo)
}

// VethEnd is one end of a veth pair: its namespace, name, address (a
// prefix such as "10.77.0.1/24", or "" for none), MTU (0: the default)
// and queue count (0: one).
type VethEnd struct {
	NS     netns.NsHandle
	Name   string
	Addr   string
	MTU    int
	Queues int
}

// VethPair creates a veth pair from a to b, each end in its namespace
// with IPv6 off (no router solicitations in the way), its address and
// up, and returns their ifindexes. The pair goes with its namespaces.
func VethPair(tb testing.TB, a, b VethEnd) (aIndex, bIndex int) {
	tb.Helper()
	RequirePriv(tb)
	queues := func(e VethEnd) int { return max(e.Queues, 1) }
	InNetNS(tb, a.NS, func() error {
		v := &netlink.Veth{
			LinkAttrs: netlink.LinkAttrs{Name: a.Name, MTU: a.MTU, NumTxQueues: queues(a), NumRxQueues: queues(a)},
			PeerName:  b.Name, PeerNumTxQueues: uint32(queues(b)), PeerNumRxQueues: uint32(queues(b)),
			PeerNamespace: netlink.NsFd(int(b.NS)),
		}
		if b.MTU != 0 {
			v.PeerMTU = uint32(b.MTU)
		}
		if err := netlink.LinkAdd(v); err != nil {
			return fmt.Errorf("add veth %s/%s: %w", a.Name, b.Name, err)
		}
		var err error
		aIndex, err = setUp(a)
		return err
	})
	InNetNS(tb, b.NS, func() error {
		var err error
		bIndex, err = setUp(b)
		return err
	})
	return aIndex, bIndex
}

// setUp turns IPv6 off on e, gives it its address and brings it up.
func setUp(e VethEnd) (int, error) {
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+e.Name+"/disable_ipv6", []byte("1"), 0); err != nil {
		return 0, fmt.Errorf("%s: disable IPv6: %w", e.Name, err)
	}
	l, err := netlink.LinkByName(e.Name)
	if err != nil {
		return 0, fmt.Errorf("veth end %s: %w", e.Name, err)
	}
	if e.Addr != "" {
		a, err := netlink.ParseAddr(e.Addr)
		if err != nil {
			return 0, fmt.Errorf("%s: address %q: %w", e.Name, e.Addr, err)
		}
		if err := netlink.AddrAdd(l, a); err != nil {
			return 0, fmt.Errorf("%s: add %s: %w", e.Name, e.Addr, err)
		}
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return 0, fmt.Errorf("%s: up: %w", e.Name, err)
	}
	return l.Attrs().Index, nil
}

// XDPPassOn attaches a program that passes every frame to iface in ns, in
// native (driver) mode, for as long as the interface lives: a veth takes
// frames an XDP program redirects to its peer only while it runs one (its
// peer then reports ndo-xmit among its XDP features).
func XDPPassOn(tb testing.TB, ns netns.NsHandle, iface string) {
	tb.Helper()
	xdpPassOn(tb, ns, iface, nl.XDP_FLAGS_DRV_MODE)
}

// XDPPassGenericOn is XDPPassOn in generic (skb) mode.
func XDPPassGenericOn(tb testing.TB, ns netns.NsHandle, iface string) {
	tb.Helper()
	xdpPassOn(tb, ns, iface, nl.XDP_FLAGS_SKB_MODE)
}

func xdpPassOn(tb testing.TB, ns netns.NsHandle, iface string, flags int) {
	tb.Helper()
	RequirePriv(tb)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */), asm.Return()}})
	if err != nil {
		tb.Fatalf("load an XDP_PASS program: %v", err)
	}
	// The attachment holds the program; it goes with the interface.
	defer prog.Close()
	InNetNS(tb, ns, func() error {
		l, err := netlink.LinkByName(iface)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetXdpFdWithFlags(l, prog.FD(), flags); err != nil {
			return fmt.Errorf("%s: attach an XDP_PASS program: %w", iface, err)
		}
		return nil
	})
}

// KernelAtLeast says whether the running kernel is major.minor or newer,
// for tests that assert what each kernel does (a fallback before a
// feature's version) rather than skip where the feature is missing. The
// release is uname's ("6.1.0-56-cloud-amd64").
func KernelAtLeast(tb testing.TB, major, minor int) bool {
	tb.Helper()
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		tb.Fatalf("uname: %v", err)
	}
	release := unix.ByteSliceToString(uts.Release[:])
	gotMajor, gotMinor, ok := parseRelease(release)
	if !ok {
		tb.Fatalf("kernel release %q: want major.minor first", release)
	}
	return gotMajor > major || gotMajor == major && gotMinor >= minor
}

// parseRelease reads major and minor from a kernel release.
func parseRelease(release string) (major, minor int, ok bool) {
	n, err := fmt.Sscanf(release, "%d.%d", &major, &minor)
	return major, minor, err == nil && n == 2
}
