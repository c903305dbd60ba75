// Package netns runs Go code inside a Linux network namespace.
//
// It owns the one subtle rule of namespaces in Go: a namespace belongs to an OS
// thread, not to a goroutine, so code must run on a locked thread whose
// namespace is switched and switched back. If switching back fails the thread
// stays locked, and Go discards it when the goroutine exits instead of handing
// a thread in the wrong namespace to other goroutines.
package netns

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Do runs fn with the calling goroutine's thread inside the network namespace
// ns. Goroutines started by fn do not inherit the namespace.
func Do(ns netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns: get current namespace: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns: enter namespace: %w", err)
	}
	fnErr := fn()
	if err := netns.Set(orig); err != nil {
		// Leave the thread locked: it dies with this goroutine.
		return fmt.Errorf("netns: restore namespace: %w (fn: %v)", err, fnErr)
	}
	runtime.UnlockOSThread()
	return fnErr
}

// DoNamed is Do for a namespace named as by `ip netns` (a bind mount under
// /run/netns).
func DoNamed(name string, fn func() error) error {
	ns, err := netns.GetFromName(name)
	if err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	defer ns.Close()
	return Do(ns, fn)
}

// DoSysfs runs fn on a thread inside the network namespace ns that sees
// that namespace's own sysfs on /sys, as `ip netns exec` does: a network
// device's sysfs directory (/sys/class/net/DEV) shows only through a sysfs
// mounted from its namespace. The thread enters a private mount namespace
// first, so the mount is never seen outside it; it never returns to the Go
// scheduler (its goroutine ends locked, so the runtime ends the thread),
// and the mount namespace goes with it. fn runs on that thread alone:
// goroutines it starts see neither namespace.
func DoSysfs(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("netns: unshare the mount namespace: %w", err)
			}
			if err := unix.Mount("", "/", "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
				return fmt.Errorf("netns: make mounts private: %w", err)
			}
			if err := netns.Set(ns); err != nil {
				return fmt.Errorf("netns: enter namespace: %w", err)
			}
			if err := unix.Mount("sysfs", "/sys", "sysfs", unix.MS_NOSUID|unix.MS_NOEXEC|unix.MS_NODEV, ""); err != nil {
				return fmt.Errorf("netns: mount the namespace's sysfs on /sys: %w", err)
			}
			return fn()
		}()
	}()
	return <-errc
}
