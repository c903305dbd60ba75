// Package attach owns the steering data plane's pinned state on a node: it
// loads the steering program (or adopts the one already pinned), and attaches
// it to interfaces through BPF links pinned beside it, so the data plane keeps
// forwarding while no control process is running.
//
// Pin layout under Dir (documented in docs/ARCHITECTURE.md):
//
//	xdp_steer          the XDP program
//	steer_stats        its per-CPU counters
//	links/xdp_<iface>  one pinned XDP link per attached interface
package attach

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/bpf"
)

// DefaultDir is where lovelockd keeps its pins.
const DefaultDir = "/sys/fs/bpf/lovelock"

// ErrNoBPFFS reports that a pin directory is not on a bpffs mount.
var ErrNoBPFFS = errors.New("not on a bpffs mount (mount one with: mount -t bpf bpf /sys/fs/bpf)")

// Mode selects how XDP is attached.
type Mode string

// XDP attach modes.
const (
	ModeNative  Mode = "native"  // in the driver; what production uses
	ModeGeneric Mode = "generic" // on the skb path; for drivers without XDP
)

func (m Mode) flags() (link.XDPAttachFlags, error) {
	switch m {
	case ModeNative, "":
		return link.XDPDriverMode, nil
	case ModeGeneric:
		return link.XDPGenericMode, nil
	}
	return 0, fmt.Errorf("xdp mode %q: want %q or %q", m, ModeNative, ModeGeneric)
}

// Config describes the desired data plane.
type Config struct {
	// Dir is the pin directory; it must be on a bpffs.
	Dir string
	// Port is the Lovelock UDP port (0: the wire default).
	Port uint16
	// Interfaces to attach to.
	Interfaces []string
	// Mode of XDP attachment.
	Mode Mode
}

// Result says what Ensure did for each interface.
type Result struct {
	// Loaded is true when a program was loaded, false when a pinned one was adopted.
	Loaded bool
	// Attached lists interfaces that got a new link.
	Attached []string
	// Adopted lists interfaces whose pinned link was kept as it was.
	Adopted []string
}

// Ensure brings the node to cfg: it adopts a pinned program or loads and pins
// one, then attaches it to every interface that has no pinned link yet. It
// never detaches anything, so it is safe to run at every daemon start.
func Ensure(cfg Config) (Result, error) {
	var res Result
	flags, err := cfg.Mode.flags()
	if err != nil {
		return res, err
	}
	if err := checkBPFFS(cfg.Dir); err != nil {
		return res, err
	}
	// Resolve every interface before touching kernel state, so a typo
	// changes nothing.
	ifindex := make([]int, len(cfg.Interfaces))
	for i, name := range cfg.Interfaces {
		nl, err := netlink.LinkByName(name)
		if err != nil {
			return res, fmt.Errorf("interface %s: %w", name, err)
		}
		ifindex[i] = nl.Attrs().Index
	}
	prog, loaded, err := programFor(cfg)
	if err != nil {
		return res, err
	}
	defer prog.Close()
	res.Loaded = loaded

	if err := os.MkdirAll(filepath.Join(cfg.Dir, "links"), 0o700); err != nil {
		return res, fmt.Errorf("pin dir: %w", err)
	}
	for i, name := range cfg.Interfaces {
		adopted, err := attachOne(cfg.Dir, prog, name, ifindex[i], flags)
		if err != nil {
			return res, err
		}
		if adopted {
			res.Adopted = append(res.Adopted, name)
		} else {
			res.Attached = append(res.Attached, name)
		}
	}
	return res, nil
}

// Detach removes the pinned link of iface, which detaches the program from it.
func Detach(dir, iface string) error {
	pin := linkPin(dir, iface)
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("interface %s: no pinned link at %s: %w", iface, pin, os.ErrNotExist)
	}
	if err != nil {
		return fmt.Errorf("interface %s: open link %s: %w", iface, pin, err)
	}
	defer l.Close()
	if err := l.Unpin(); err != nil {
		return fmt.Errorf("interface %s: unpin link: %w", iface, err)
	}
	return nil
}

func programFor(cfg Config) (*ebpf.Program, bool, error) {
	pin := filepath.Join(cfg.Dir, bpf.PinProgXDP)
	prog, err := ebpf.LoadPinnedProgram(pin, nil)
	if err == nil {
		return prog, false, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, false, fmt.Errorf("program %s: %w", pin, err)
	}
	s, err := bpf.Load(bpf.Options{Port: cfg.Port})
	if err != nil {
		return nil, false, err
	}
	defer s.Close()
	if err := s.Pin(cfg.Dir); err != nil {
		return nil, false, err
	}
	prog, err = ebpf.LoadPinnedProgram(pin, nil)
	if err != nil {
		return nil, false, fmt.Errorf("program %s: reopen after pinning: %w", pin, err)
	}
	return prog, true, nil
}

func attachOne(dir string, prog *ebpf.Program, name string, ifindex int, flags link.XDPAttachFlags) (adopted bool, err error) {
	pin := linkPin(dir, name)
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		l.Close()
		return true, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("interface %s: open pinned link %s: %w", name, pin, err)
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifindex, Flags: flags})
	if err != nil {
		return false, fmt.Errorf("interface %s: attach xdp: %w", name, err)
	}
	defer l.Close()
	// Pin first, or the link dies with this process; if pinning fails the
	// deferred Close detaches again and nothing half-done is left.
	if err := l.Pin(pin); err != nil {
		return false, fmt.Errorf("interface %s: pin link: %w", name, err)
	}
	return false, nil
}

func linkPin(dir, iface string) string {
	return filepath.Join(dir, "links", "xdp_"+iface)
}

func checkBPFFS(dir string) error {
	// The directory may not exist yet: check the nearest existing parent.
	for p := dir; ; p = filepath.Dir(p) {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if err == nil {
			if st.Type != unix.BPF_FS_MAGIC {
				return fmt.Errorf("pin dir %s: %w", dir, ErrNoBPFFS)
			}
			return nil
		}
		if !errors.Is(err, unix.ENOENT) || p == filepath.Dir(p) {
			return fmt.Errorf("pin dir %s: %w", dir, err)
		}
	}
}
