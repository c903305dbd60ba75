// Package testenv holds the helpers that privileged tests share: the root
// check that skips (or, under LOVELOCK_REQUIRE_PRIV=1, fails), throwaway
// network namespaces, and bpffs. Everything it creates is removed through
// tb.Cleanup.
package testenv

import (
	"errors"
	"os"
	"testing"

	"github.com/vishvananda/netlink"
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
