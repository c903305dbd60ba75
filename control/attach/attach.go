// Package attach owns the steering data plane's pinned state on a node: it
// loads the steering programs (or adopts the ones already pinned) and
// attaches them to interfaces through BPF links pinned beside them, so the
// data plane keeps forwarding while no control process runs.
//
// Pin layout under Dir (docs/ARCHITECTURE.md, version 1):
//
//	xdp_steer, tc_ingress, tc_egress, xdp_pass   programs
//	steer_stats, iface_stats, rule_stats, rulesets, xsks   maps
//	links/<hook>@<iface>                          one pinned link per attachment
//
// The directory is built under a temporary name and renamed into place, so
// it is either complete or absent; an upgrade (upgrade.go) swaps a new
// directory with the old one in one rename and then each link's program. Writers hold an exclusive flock on the
// directory's lock file (LockDir) while they change it.
package attach

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/bpf"
)

// DefaultDir is where lovelockd keeps its pins.
const DefaultDir = "/sys/fs/bpf/lovelock"

// ErrNoBPFFS reports that a pin directory is not on a bpffs mount.
var ErrNoBPFFS = errors.New("not on a bpffs mount (mount one with: mount -t bpf bpf /sys/fs/bpf)")

// ErrPortMismatch reports pins loaded for another Lovelock port than the
// one asked for.
var ErrPortMismatch = errors.New("pinned programs use another Lovelock port")

// ErrNotAttached reports a detach of something that is not attached.
var ErrNotAttached = errors.New("not attached")

// Hook is where on an interface the classifier runs.
type Hook string

// Hooks.
const (
	HookXDP       Hook = "xdp"        // XDP, before the kernel allocates an skb
	HookTCIngress Hook = "tc-ingress" // TC ingress (tcx), for skb-only paths
	HookTCEgress  Hook = "tc-egress"  // TC egress (tcx): host-originated packets
)

// ParseHook checks a hook name.
func ParseHook(s string) (Hook, error) {
	switch h := Hook(s); h {
	case HookXDP, HookTCIngress, HookTCEgress:
		return h, nil
	}
	return "", fmt.Errorf("hook %q: want %s, %s or %s", s, HookXDP, HookTCIngress, HookTCEgress)
}

// Mode selects how a hook is attached.
type Mode string

// Attach modes. XDP hooks take native or generic; TC hooks take tcx or
// clsact, and without a mode use tcx where the kernel has it (6.6 and
// newer) and a clsact filter elsewhere.
const (
	ModeNative  Mode = "native"  // XDP in the driver; what production uses
	ModeGeneric Mode = "generic" // XDP on the skb path; for drivers without XDP
	ModeTCX     Mode = "tcx"     // TC through a tcx link (kernel 6.6+)
	ModeClsact  Mode = "clsact"  // TC through a direct-action filter on a clsact qdisc
)

// ParseMode checks an XDP mode name; "" means native.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case "":
		return ModeNative, nil
	case ModeNative, ModeGeneric:
		return m, nil
	}
	return "", fmt.Errorf("xdp mode %q: want %q or %q", s, ModeNative, ModeGeneric)
}

// parseTCMode checks a TC mode name; "" means tcx where the kernel has it.
func parseTCMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case "", ModeTCX, ModeClsact:
		return m, nil
	}
	return "", fmt.Errorf("tc mode %q: want %q or %q", s, ModeTCX, ModeClsact)
}

// Attachment is one interface hook running the classifier.
type Attachment struct {
	Iface string `json:"iface"`
	Hook  Hook   `json:"hook"`
	// Mode is the XDP mode asked for (XDP only).
	Mode Mode `json:"mode,omitempty"`
}

// Validate checks the hook and the mode that goes with it.
func (a Attachment) Validate() error {
	if a.Iface == "" {
		return errors.New("attachment: no interface")
	}
	hook, err := ParseHook(string(a.Hook))
	if err != nil {
		return err
	}
	if hook == HookXDP {
		_, err = ParseMode(string(a.Mode))
	} else {
		_, err = parseTCMode(string(a.Mode))
	}
	if err != nil {
		return fmt.Errorf("interface %s %s: %w", a.Iface, a.Hook, err)
	}
	return nil
}

// Options configure Open.
type Options struct {
	// Dir is the pin directory; its parent must be on a bpffs.
	Dir string
	// Port is the Lovelock UDP port used when programs are loaded fresh.
	Port uint16
	// Upgrade makes Open replace pinned programs of another build or
	// another port under traffic (upgrade.go) instead of refusing them
	// with bpf.ErrStale or ErrPortMismatch.
	Upgrade bool
	// Fill, when Open upgrades, is called with the new programs and maps
	// before any link runs them, to install the rule set; if it fails,
	// nothing pinned changes.
	Fill func(*bpf.Steer) error
}

// Node is a node's steering data plane, opened for changes: it holds the
// writer lock until Close.
type Node struct {
	// Steer holds the programs and maps; its rule set can be swapped.
	Steer *bpf.Steer
	// Loaded is true when Open loaded programs, false when it adopted pins.
	Loaded bool
	// Upgraded says what Open swapped: the pins it replaced (an upgrade),
	// or links an interrupted upgrade left on the old programs; nil when
	// it swapped nothing.
	Upgraded *UpgradeReport

	dir  string
	lock *os.File
}

// Open adopts the data plane pinned in opts.Dir, or loads one and pins it
// there. Adopted programs must match this build (bpf.ErrStale otherwise)
// and port (ErrPortMismatch); with opts.Upgrade, Open replaces them instead
// under traffic. Nothing pinned is changed when Open fails.
func Open(opts Options) (*Node, error) {
	dir := filepath.Clean(opts.Dir)
	parent := filepath.Dir(dir)
	if err := checkBPFFS(parent); err != nil {
		return nil, fmt.Errorf("pin dir %s: %w", dir, err)
	}
	lock, err := lockPins(LockDir, dir)
	if err != nil {
		return nil, err
	}
	n := &Node{dir: dir, lock: lock}
	if err := n.open(opts); err != nil {
		lock.Close()
		return nil, err
	}
	return n, nil
}

func (n *Node) open(opts Options) error {
	port := opts.Port
	// Leftovers of a load that crashed before its rename, or of an upgrade
	// (the old set, after the swap; second link pins, before it).
	stale, _ := filepath.Glob(n.dir + "_tmp_*")
	for _, d := range stale {
		os.RemoveAll(d)
	}
	if _, err := os.Stat(n.dir); err == nil {
		s, err := n.adopt(port)
		if err != nil {
			if !opts.Upgrade || !(errors.Is(err, bpf.ErrStale) || errors.Is(err, ErrPortMismatch)) {
				return err
			}
			reason := "the pinned programs differ from this build's"
			if errors.Is(err, ErrPortMismatch) {
				reason = "the pinned programs use another Lovelock port"
			}
			return n.upgrade(port, opts.Fill, reason)
		}
		n.Steer = s
		// An upgrade that crashed after its commit point leaves links on
		// the old programs: swap them now.
		rep := &UpgradeReport{Reason: "links left on other programs (an upgrade was interrupted)"}
		n.rollForward(rep)
		if len(rep.Swapped) > 0 || len(rep.Failed) > 0 {
			n.Upgraded = rep
		}
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("pin dir %s: %w", n.dir, err)
	}

	s, err := bpf.Load(bpf.Options{Port: port})
	if err != nil {
		return err
	}
	// bpffs refuses dots in names.
	tmp := fmt.Sprintf("%s_tmp_%d", n.dir, os.Getpid())
	if err := s.Pin(tmp); err != nil {
		s.Close()
		os.RemoveAll(tmp)
		return err
	}
	if err := os.Mkdir(filepath.Join(tmp, "links"), 0o700); err != nil {
		s.Close()
		os.RemoveAll(tmp)
		return fmt.Errorf("pin dir: %w", err)
	}
	if err := os.Rename(tmp, n.dir); err != nil {
		s.Close()
		os.RemoveAll(tmp)
		return fmt.Errorf("pin dir: move into place: %w", err)
	}
	n.Steer, n.Loaded = s, true
	return nil
}

// adopt opens the pins of n.dir when they are this build's, loaded for port.
func (n *Node) adopt(port uint16) (*bpf.Steer, error) {
	s, err := bpf.OpenPinned(n.dir)
	if err != nil {
		if errors.Is(err, bpf.ErrStale) {
			return nil, fmt.Errorf("%w; the data plane was left as it is: start the lovelockd that pinned it, "+
				"upgrade it (lovelockd does at start), or detach everything ('lovelock iface detach --all') and remove %s", err, n.dir)
		}
		return nil, err
	}
	// The port is a load-time constant, invisible to the tag check:
	// adopting programs built for another port would run rules on the
	// Lovelock header against the wrong traffic.
	want := wantPort(port)
	have, err := s.Port()
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("pinned programs in %s: %w", n.dir, err)
	}
	if have != want {
		s.Close()
		return nil, fmt.Errorf("%w: the programs pinned in %s were loaded for Lovelock port %d, this node is configured for %d; "+
			"the data plane was left as it is: configure port %d, or upgrade it to port %d (lovelockd does at start)",
			ErrPortMismatch, n.dir, have, want, have, want)
	}
	return s, nil
}

// Dir is the pin directory.
func (n *Node) Dir() string { return n.dir }

// Close releases the handles and the lock; the data plane stays as it is.
func (n *Node) Close() error {
	err := n.Steer.Close()
	return errors.Join(err, n.lock.Close())
}

// Attach attaches the classifier at a's hook on a's interface, unless it
// already runs there (then it reports adopted); see Reattach.
func (n *Node) Attach(a Attachment) (adopted bool, err error) {
	out, err := n.Reattach(a)
	return out == Adopted, err
}

// Reattach attaches the classifier at a's hook on a's interface. An
// attachment already pinned there is adopted only when it runs on the live
// interface of that name (Check); one that does not (its interface was
// deleted or re-created) has its pin removed and is attached again
// (Replaced). A link is pinned before its handle closes; if pinning fails,
// closing detaches it again.
func (n *Node) Reattach(a Attachment) (Outcome, error) {
	replaced := false
	if _, err := n.Check(a); err == nil {
		// Adopting is right only when the link is what was asked for: a
		// mode asked for explicitly must be the one the link has.
		if a.Hook == HookXDP && a.Mode != "" {
			if have := xdpMode(a.Iface); have != "" && have != a.Mode {
				return "", fmt.Errorf("interface %s: xdp is already attached in %s mode, not %s: detach it first "+
					"('lovelock iface detach %s --hook xdp') to attach it in %s mode", a.Iface, have, a.Mode, a.Iface, a.Mode)
			}
		}
		return Adopted, nil
	} else if errors.Is(err, ErrDefunct) {
		if _, lerr := netlink.LinkByName(a.Iface); lerr != nil {
			// Nothing to attach to: keep the pin, which says what was
			// asked for, until the interface is back.
			return "", err
		}
		if err := n.removeDefunct(a); err != nil {
			return "", err
		}
		replaced = true
	} else if !errors.Is(err, ErrNotAttached) {
		return "", err
	}
	if err := n.attachNew(a); err != nil {
		return "", err
	}
	if replaced {
		return Replaced, nil
	}
	return Attached, nil
}

func (n *Node) attachNew(a Attachment) error {
	pin := n.linkPin(a.Iface, a.Hook)
	nl, err := netlink.LinkByName(a.Iface)
	if err != nil {
		return fmt.Errorf("interface %s: %w", a.Iface, err)
	}
	ifindex := nl.Attrs().Index

	var l link.Link
	switch a.Hook {
	case HookXDP:
		mode, err := ParseMode(string(a.Mode))
		if err != nil {
			return err
		}
		flags := link.XDPDriverMode
		if mode == ModeGeneric {
			flags = link.XDPGenericMode
		}
		l, err = link.AttachXDP(link.XDPOptions{Program: n.Steer.XDP, Interface: ifindex, Flags: flags})
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("interface %s: attach xdp (%s): %w: %s", a.Iface, mode, err, xdpBusy(a.Iface, ifindex))
		}
		if err != nil {
			return fmt.Errorf("interface %s: attach xdp (%s): %w", a.Iface, mode, err)
		}
	case HookTCIngress, HookTCEgress:
		mode, err := parseTCMode(string(a.Mode))
		if err != nil {
			return err
		}
		prog, at := n.Steer.TCIngress, ebpf.AttachTCXIngress
		if a.Hook == HookTCEgress {
			prog, at = n.Steer.TCEgress, ebpf.AttachTCXEgress
		}
		if mode != ModeClsact {
			l, err = link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: at})
			if errors.Is(err, ebpf.ErrNotSupported) && mode == "" {
				return n.attachClsact(a, ifindex, prog)
			}
			if err != nil {
				return fmt.Errorf("interface %s: attach %s (tcx): %w", a.Iface, a.Hook, err)
			}
		} else {
			return n.attachClsact(a, ifindex, prog)
		}
	default:
		_, err := ParseHook(string(a.Hook))
		return err
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		return fmt.Errorf("interface %s %s: pin link: %w", a.Iface, a.Hook, err)
	}
	return nil
}

// xdpBusy says what holds iface's XDP hook when attaching there is refused
// with EBUSY, and how to free it. A program attached through netlink goes
// with 'ip link set IFACE xdp off'; one a BPF link holds does not (the
// kernel refuses that detach with EBUSY too), so the link is named: it goes
// when its last pin and file descriptor do.
func xdpBusy(iface string, ifindex int) string {
	netlinkHeld := fmt.Sprintf("another XDP program, not attached through a BPF link, runs there (see 'ip link show %s'; 'ip link set %s xdp off' removes it)", iface, iface)
	nl, err := netlink.LinkByIndex(ifindex)
	if err != nil || nl.Attrs().Xdp == nil || nl.Attrs().Xdp.ProgId == 0 {
		return netlinkHeld
	}
	prog := nl.Attrs().Xdp.ProgId
	id, err := xdpLink(ifindex, prog)
	switch {
	case err != nil:
		return fmt.Sprintf("another XDP program (id %d) runs there (see 'ip link show %s'): if a BPF link holds it ('bpftool link'), remove the link's pin or stop the process "+
			"that holds it; if not, 'ip link set %s xdp off' removes it (listing the links failed: %v)", prog, iface, iface, err)
	case id == 0:
		return netlinkHeld
	}
	name := ""
	if p, err := ebpf.NewProgramFromID(ebpf.ProgramID(prog)); err == nil {
		if info, err := p.Info(); err == nil && info.Name != "" {
			name = fmt.Sprintf(" %q", info.Name)
		}
		p.Close()
	}
	return fmt.Sprintf("BPF link %d holds XDP there, with program %d%s, and lovelockd's pin directory does not pin it: "+
		"'ip link set %s xdp off' cannot remove a link; remove the link's pin in bpffs or stop the process that holds it "+
		"('bpftool -f link show id %d' lists both)", id, prog, name, iface, id)
}

// xdpLink returns the ID of the XDP link that attaches program prog to
// ifindex, 0 if none does. Link IDs are system-wide and ifindexes per
// network namespace: the program the interface runs tells this
// namespace's link from another's on the same ifindex.
func xdpLink(ifindex int, prog uint32) (link.ID, error) {
	var it link.Iterator
	defer it.Close()
	for it.Next() {
		info, err := it.Link.Info()
		if err != nil {
			continue // gone meanwhile, or not ours to read
		}
		if x := info.XDP(); x != nil && x.Ifindex == uint32(ifindex) && uint32(info.Program) == prog {
			return info.ID, nil
		}
	}
	return 0, it.Err()
}

// Detach removes the pinned link of iface's hook, which detaches it (or,
// for a clsact attachment, deletes its filter).
func (n *Node) Detach(iface string, hook Hook) error {
	if _, err := os.Stat(n.clsactMarker(iface, hook)); err == nil {
		return n.detachClsact(iface, hook)
	}
	return detachPin(n.linkPin(iface, hook), iface, hook)
}

func detachPin(pin, iface string, hook Hook) error {
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("interface %s %s: %w", iface, hook, ErrNotAttached)
	}
	if err != nil {
		return fmt.Errorf("interface %s %s: open pinned link: %w", iface, hook, err)
	}
	defer l.Close()
	if err := l.Unpin(); err != nil {
		return fmt.Errorf("interface %s %s: unpin link: %w", iface, hook, err)
	}
	return nil
}

// Attachments lists what is attached, from the pinned links.
func (n *Node) Attachments() ([]Attachment, error) {
	return listLinks(n.dir)
}

// ListAttachments lists the attachments pinned in dir without taking the
// writer lock (for readers such as the CLI).
func ListAttachments(dir string) ([]Attachment, error) {
	return listLinks(dir)
}

func listLinks(dir string) ([]Attachment, error) {
	entries, err := os.ReadDir(filepath.Join(dir, "links"))
	if err != nil {
		return nil, fmt.Errorf("pinned links: %w", err)
	}
	var out []Attachment
	for _, e := range entries {
		hook, esc, ok := strings.Cut(e.Name(), "@")
		if !ok {
			continue
		}
		out = append(out, Attachment{Iface: pinUnescaper.Replace(esc), Hook: Hook(hook)})
	}
	clsact, _ := os.ReadDir(filepath.Join(dir, "links", clsactDir))
	for _, e := range clsact {
		if hook, esc, ok := strings.Cut(e.Name(), "@"); ok {
			out = append(out, Attachment{Iface: pinUnescaper.Replace(esc), Hook: Hook(hook), Mode: ModeClsact})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Iface != out[j].Iface {
			return out[i].Iface < out[j].Iface
		}
		return out[i].Hook < out[j].Hook
	})
	return out, nil
}

// NativeXDP reports whether a runs the classifier in native (driver-mode)
// XDP, where a redirect needs a target that can transmit XDP frames: an XDP
// hook in native mode, or of no mode (which attaches native, and adopts a
// link of any mode) unless the kernel reports a generic program on a's
// interface in the calling thread's network namespace.
func (a Attachment) NativeXDP() bool {
	if a.Hook != HookXDP {
		return false
	}
	switch a.Mode {
	case ModeNative:
		return true
	case "":
		return xdpMode(a.Iface) != ModeGeneric
	}
	return false
}

// xdpMode is the mode of the XDP program attached to iface, as the kernel
// reports it, or "" when it cannot tell.
func xdpMode(iface string) Mode {
	l, err := netlink.LinkByName(iface)
	if err != nil || l.Attrs().Xdp == nil {
		return ""
	}
	switch l.Attrs().Xdp.AttachMode {
	case nl.XDP_ATTACHED_DRV:
		return ModeNative
	case nl.XDP_ATTACHED_SKB:
		return ModeGeneric
	case nl.XDP_ATTACHED_HW:
		return "offload"
	}
	return ""
}

func (n *Node) linkPin(iface string, hook Hook) string {
	return filepath.Join(n.dir, "links", string(hook)+"@"+pinEscaper.Replace(iface))
}

// bpffs refuses dots in names, which interface names (eth0.100) may hold.
var (
	pinEscaper   = strings.NewReplacer("%", "%25", ".", "%2E")
	pinUnescaper = strings.NewReplacer("%2E", ".", "%25", "%")
)

// LockDir holds the writer locks of pin directories, one file per pin
// directory (bpffs holds no regular files, and a pin directory may not exist
// yet when it is locked: it is created by a rename).
const LockDir = "/run/lovelock/locks"

// lockPath is the lock file of pin directory dir in lockDir.
func lockPath(lockDir, dir string) string {
	esc := strings.NewReplacer("%", "%25", "/", "%2F").Replace(filepath.Clean(dir))
	return filepath.Join(lockDir, "pins"+esc+".lock")
}

// lockPins takes the writer lock of pin directory dir: an exclusive flock
// on its lock file, which then holds the holder's pid. Only writers of the
// same pin directory exclude each other; nodes with other pin directories
// under the same bpffs do not. When another process holds the lock, the
// error names it.
func lockPins(lockDir, dir string) (*os.File, error) {
	if err := os.MkdirAll(lockDir, 0o700); err != nil {
		return nil, fmt.Errorf("lock pin dir %s: %w", dir, err)
	}
	path := lockPath(lockDir, dir)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock pin dir %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock pin dir %s: another lovelockd (or lovelock command) is changing the data plane: %s holds %s",
				dir, holder(path), path)
		}
		return nil, fmt.Errorf("lock pin dir %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// holder names the process whose pid a lock file holds: "pid 123
// (lovelockd)", or "a process" when the file says nothing usable.
func holder(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "a process"
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return "a process"
	}
	if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil {
		return fmt.Sprintf("pid %d (%s)", pid, strings.TrimSpace(string(comm)))
	}
	return fmt.Sprintf("pid %d", pid)
}

// checkBPFFS checks that dir is on a bpffs mount. A dir that does not exist
// yet is fine when its nearest existing ancestor is on one: loading pins
// creates the missing directories (bpf.Steer.Pin's MkdirAll).
func checkBPFFS(dir string) error {
	var st unix.Statfs_t
	at := dir
	for {
		err := unix.Statfs(at, &st)
		if err == nil {
			break
		}
		up := filepath.Dir(at)
		if !errors.Is(err, unix.ENOENT) || up == at {
			return fmt.Errorf("%s: %w", at, err)
		}
		at = up
	}
	if st.Type != unix.BPF_FS_MAGIC {
		if at != dir {
			return fmt.Errorf("%s does not exist, and %s, its nearest existing parent, is %w", dir, at, ErrNoBPFFS)
		}
		return ErrNoBPFFS
	}
	return nil
}
