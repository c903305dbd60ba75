package testbed

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/vishvananda/netlink"
)

// Down removes every trace of the testbed with spec.Prefix, and nothing of
// another testbed whose prefix starts with it (ll-x- beside ll-), so it works
// after a crash, a half-built Up, or a change of Spec. A /run/netns entry is
// this testbed's when it is named Prefix+node for a node of the Spec, or
// when it is named Prefix+something and an interface inside (lo included)
// carries this prefix's alias. For each it deletes the interfaces inside (so
// that veth peers vanish at once, not when the kernel gets round to freeing
// the namespace), unmounts the name and removes the file; then it deletes
// veths in the caller's namespace whose alias marks them as this prefix's.
// Down keeps going past failures and returns them all. A process still
// running inside a node keeps that (now empty, nameless) namespace alive
// until it exits.
func Down(ctx context.Context, spec Spec) error {
	if err := validPrefix(spec.Prefix); err != nil {
		return err
	}
	unlock, err := lockHost()
	if err != nil {
		return err
	}
	defer unlock()
	names, err := namespacesWithPrefix(spec.Prefix)
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("testbed down: %w", err)
		}
		mine, err := spec.ownsNamespace(name)
		if err != nil {
			errs = append(errs, fmt.Errorf("testbed: namespace %s: %w", name, err))
			continue
		}
		if !mine {
			continue
		}
		if err := destroyNamespace(name); err != nil {
			errs = append(errs, fmt.Errorf("testbed: namespace %s: %w", name, err))
		}
	}
	if err := removeRootStrays(spec); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func destroyNamespace(name string) error {
	path := nsPath(name)
	ns, ok, err := openNamespace(path)
	if err != nil {
		return err
	}
	if ok {
		err := func() error {
			defer ns.Close()
			h, err := netlink.NewHandleAt(ns)
			if err != nil {
				return fmt.Errorf("netlink: %w", err)
			}
			defer h.Close()
			var links []netlink.Link
			if err := retryDump(func() (err error) { links, err = h.LinkList(); return err }); err != nil {
				return fmt.Errorf("list links: %w", err)
			}
			for _, l := range links {
				// "device" is lo, or a real NIC someone moved in: the kernel
				// hands real NICs back to the root namespace on its own.
				if l.Type() == "device" {
					continue
				}
				if err := h.LinkDel(l); err != nil && !isNotFound(err) {
					return fmt.Errorf("delete %s: %w", l.Attrs().Name, err)
				}
			}
			return nil
		}()
		if err != nil {
			return err
		}
	}
	return removeNamespaceFile(path)
}

// ownsNamespace reports whether the namespace called name, which starts
// with the prefix, is this testbed's: named after one of the Spec's nodes,
// or holding an interface marked as this prefix's. Anything else (ll-x-host0
// when the prefix is ll-) is left alone, and so is an empty namespace or a
// dead name file of a node the Spec does not know: nothing says whose it is.
func (s Spec) ownsNamespace(name string) (bool, error) {
	if s.hasNode(strings.TrimPrefix(name, s.Prefix)) {
		return true, nil
	}
	ns, ok, err := openNamespace(nsPath(name))
	if err != nil || !ok {
		return false, err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return false, fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	var links []netlink.Link
	if err := retryDump(func() (err error) { links, err = h.LinkList(); return err }); err != nil {
		return false, fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		if s.ownsAlias(l.Attrs().Alias) {
			return true, nil
		}
	}
	return false, nil
}

// removeRootStrays deletes links in the caller's namespace that carry this
// prefix's alias marker. The builder never puts a veth there, but a future
// or older builder, or a person moving interfaces by hand, might.
func removeRootStrays(spec Spec) error {
	h, err := netlink.NewHandle()
	if err != nil {
		return fmt.Errorf("testbed: root namespace netlink: %w", err)
	}
	defer h.Close()
	var links []netlink.Link
	if err := retryDump(func() (err error) { links, err = h.LinkList(); return err }); err != nil {
		return fmt.Errorf("testbed: root namespace: list links: %w", err)
	}
	var errs []error
	for _, l := range links {
		if !spec.ownsAlias(l.Attrs().Alias) {
			continue
		}
		if err := h.LinkDel(l); err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("testbed: root namespace: delete stray %s (%s): %w", l.Attrs().Name, l.Attrs().Alias, err))
		}
	}
	return errors.Join(errs...)
}
