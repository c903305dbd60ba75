package testbed

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	llnetns "github.com/lovelock-dpu/lovelock/control/netns"
)

// lockHost serialises Up and Down across processes with an exclusive flock
// on /run/netns itself, creating the directory first. A directory lock leaves
// no file behind, and `ip netns` never takes it, so users are not blocked.
func lockHost() (unlock func(), err error) {
	if err := os.MkdirAll(NetnsDir, 0o755); err != nil {
		return nil, fmt.Errorf("testbed: create %s: %w", NetnsDir, err)
	}
	fd, err := unix.Open(NetnsDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("testbed: open %s: %w", NetnsDir, err)
	}
	for {
		err = unix.Flock(fd, unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("testbed: lock %s: %w", NetnsDir, err)
	}
	// Closing the descriptor drops the lock.
	return func() { unix.Close(fd) }, nil
}

// ensureNetnsDirShared makes /run/netns a shared mount point, as `ip netns
// add` does, so that namespace mounts made later propagate into mount
// namespaces that already exist (a service's private /run, for one).
func ensureNetnsDirShared() error {
	bound := false
	for {
		err := unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if err == nil {
			return nil
		}
		// EINVAL: not a mount point yet. Bind it onto itself once, then retry.
		if !errors.Is(err, unix.EINVAL) || bound {
			return fmt.Errorf("testbed: make %s a shared mount: %w", NetnsDir, err)
		}
		if err := unix.Mount(NetnsDir, NetnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("testbed: bind-mount %s onto itself: %w", NetnsDir, err)
		}
		bound = true
	}
}

// ensureBPFFS mounts bpffs on /sys/fs/bpf unless one is there already. It
// works in the caller's mount namespace, which setns into a node keeps.
func ensureBPFFS() error {
	var st unix.Statfs_t
	if err := unix.Statfs(BPFFSPath, &st); err != nil {
		return fmt.Errorf("testbed: bpffs %s: %w", BPFFSPath, err)
	}
	if st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	// mode=0700 is what systemd uses: pins are root's business.
	if err := unix.Mount("bpf", BPFFSPath, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("testbed: mount bpffs on %s: %w", BPFFSPath, err)
	}
	return nil
}

// isNetns reports whether fd refers to a network namespace.
func isNetns(fd int) bool {
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil || st.Type != unix.NSFS_MAGIC {
		return false
	}
	typ, err := unix.IoctlRetInt(fd, unix.NS_GET_NSTYPE)
	return err == nil && typ == unix.CLONE_NEWNET
}

// openNamespace opens the named namespace at path. It returns (None, false,
// nil) when there is no usable namespace there: no file, or a file that is
// not (or no longer) a network namespace bind mount.
func openNamespace(path string) (netns.NsHandle, bool, error) {
	ns, err := netns.GetFromPath(path)
	if errors.Is(err, os.ErrNotExist) {
		return netns.None(), false, nil
	}
	if err != nil {
		return netns.None(), false, err
	}
	if !isNetns(int(ns)) {
		ns.Close()
		return netns.None(), false, nil
	}
	return ns, true, nil
}

// ensureNamespace returns a handle on the named namespace at path, creating
// it (or replacing a dead placeholder file left by a crash) if needed; a new
// namespace's lo gets loAlias, the mark Down knows it by.
func ensureNamespace(path, loAlias string) (netns.NsHandle, error) {
	for attempt := 0; ; attempt++ {
		ns, ok, err := openNamespace(path)
		if err != nil {
			return netns.None(), err
		}
		if ok {
			return ns, nil
		}
		if attempt > 0 {
			return netns.None(), fmt.Errorf("namespace %s vanished while being created", path)
		}
		// Whatever is there is not a namespace: an empty file from a crash
		// between create and mount, or a stale mount. Clear it.
		if err := removeNamespaceFile(path); err != nil {
			return netns.None(), err
		}
		if err := createNamespace(path, loAlias); err != nil {
			return netns.None(), err
		}
	}
}

// createNamespace creates a new network namespace and bind-mounts it at
// path, the way `ip netns add` does, without moving any long-lived thread.
func createNamespace(path, loAlias string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	f.Close()
	orig, err := netns.Get()
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("get current namespace: %w", err)
	}
	defer orig.Close()
	// Do puts the thread back into orig afterwards, so the unshare only
	// ever affects this locked thread for the duration of fn.
	err = llnetns.Do(orig, func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare: %w", err)
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mount onto %s: %w", path, err)
		}
		return setLoopbackUp(loAlias)
	})
	if err != nil {
		removeNamespaceFile(path)
		return err
	}
	return nil
}

// setLoopbackUp brings lo up and gives it alias, which marks the namespace
// as the testbed's even before any veth is in it.
func setLoopbackUp(alias string) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("lo: %w", err)
	}
	if lo.Attrs().Alias != alias {
		if err := netlink.LinkSetAlias(lo, alias); err != nil {
			return fmt.Errorf("lo alias: %w", err)
		}
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	return nil
}

// removeNamespaceFile unmounts and removes path; both steps tolerate that
// the mount or the file is already gone.
func removeNamespaceFile(path string) error {
	// MNT_DETACH: a process still inside keeps the namespace alive, but the
	// name is gone at once. EINVAL means it was not mounted.
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// namespacesWithPrefix lists the names in /run/netns that start with prefix.
func namespacesWithPrefix(prefix string) ([]string, error) {
	entries, err := os.ReadDir(NetnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("testbed: list %s: %w", NetnsDir, err)
	}
	var names []string
	for _, e := range entries {
		if len(e.Name()) >= len(prefix) && e.Name()[:len(prefix)] == prefix {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

func nsPath(name string) string { return filepath.Join(NetnsDir, name) }

// writeSysctl writes value to /proc/sys/<key>. Under /proc/sys/net the
// kernel picks the namespace of the thread that opens the file, so callers
// run it inside the node on a locked thread.
func writeSysctl(key, value string) error {
	if err := os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", key, value, err)
	}
	return nil
}

func readSysctl(key string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/proc/sys", key))
	if err != nil {
		return "", fmt.Errorf("sysctl %s: %w", key, err)
	}
	n := len(b)
	for n > 0 && (b[n-1] == '\n' || b[n-1] == ' ') {
		n--
	}
	return string(b[:n]), nil
}
