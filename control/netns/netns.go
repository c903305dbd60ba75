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
