package attach

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// An upgrade replaces pinned programs of another build (or another
// Lovelock port) under traffic, as tubular does:
//
//  1. load this build's programs and maps and pin them into <dir>_tmp_<pid>;
//  2. fill the new maps (Options.Upgrade: the operator's rule set), and copy
//     the counters over where their layout is unchanged;
//  3. pin every link of <dir>/links a second time into the new directory
//     (the same kernel links, now with two pins each) and record clsact
//     filters there;
//  4. swap the two directories with one renameat2(RENAME_EXCHANGE): the
//     commit point;
//  5. swap each link's program with Link.Update (BPF_LINK_UPDATE: one
//     pointer exchange in the kernel, no packet sees no program) and each
//     clsact filter in place, same handle and priority;
//  6. remove the old set, now at the temporary name.
//
// A crash before 4 leaves <dir> as it was, every link running the old
// programs; the next Open removes the temporary directory, and with it only
// second pins. A crash after 4 leaves <dir> complete with the new programs
// and maps while some links may still run the old programs: Open (rollForward)
// updates every link whose program is not the pinned one, whichever build
// opens it, and removes the leftover directory. So <dir> is always one
// complete set, and its programs are the ones its links end up running.

// crashAfterCommit, set by tests, makes upgrade stop right after its
// commit point as if the process died there.
var crashAfterCommit func() bool

var errCrashed = errors.New("upgrade: stopped after the commit point (test)")

// Build identifies the programs of a pin directory.
type Build struct {
	// Tag is the kernel's tag of the XDP classifier (a hash of its
	// instructions).
	Tag string `json:"tag"`
	// Port is the Lovelock port it was loaded for (0: unknown).
	Port uint16 `json:"port"`
}

func (b Build) String() string { return fmt.Sprintf("tag %s port %d", b.Tag, b.Port) }

// UpgradeReport says what an upgrade (or a roll-forward of links that a
// crashed upgrade left on the old programs) did.
type UpgradeReport struct {
	// From and To are the replaced programs and this build's; both are
	// zero for a roll-forward.
	From, To Build
	// Reason is why the pins were replaced ("programs differ", "port").
	Reason string
	// Swapped are the attachments whose program was swapped in place.
	Swapped []Attachment
	// Failed are attachments that could not be swapped, with why; they
	// keep running the old programs until the next Open or Reattach.
	Failed []string
	// CountersCarried is true when the verdict and per-rule counters were
	// copied from the old maps; false when their layout changed and the
	// new ones start from zero. The per-interface counters are carried
	// when the old pins have them with the same layout (IfaceCountersCarried),
	// else they count from the upgrade on.
	CountersCarried bool
	// IfaceCountersCarried is true when the per-interface counters were
	// copied too; false for pins of a build without them.
	IfaceCountersCarried bool
}

// upgrade replaces the pins of n.dir with this build's programs loaded for
// port; see the comment at the top of this file. Callers hold the lock.
func (n *Node) upgrade(port uint16, fill func(*bpf.Steer) error, reason string) (err error) {
	rep := &UpgradeReport{Reason: reason}
	rep.From = pinnedBuild(n.dir)

	s, err := bpf.Load(bpf.Options{Port: port})
	if err != nil {
		return err
	}
	tmp := fmt.Sprintf("%s_tmp_%d", n.dir, os.Getpid())
	committed := false
	defer func() {
		if !committed {
			s.Close()
			os.RemoveAll(tmp)
		}
	}()
	if err := s.Pin(tmp); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(tmp, "links", clsactDir), 0o700); err != nil {
		return fmt.Errorf("upgrade: pin dir: %w", err)
	}
	rep.To = Build{Tag: progTag(s.XDP), Port: portOf(s)}
	if fill != nil {
		if err := fill(s); err != nil {
			return fmt.Errorf("upgrade: fill the new maps: %w", err)
		}
	}
	counters, err := carryCounters(n.dir, tmp)
	if err != nil {
		return fmt.Errorf("upgrade: carry the counters: %w", err)
	}
	rep.CountersCarried = counters != nil
	rep.IfaceCountersCarried = counters != nil && counters.iface
	if counters != nil {
		defer counters.close()
	}
	if err := copyLinkPins(n.dir, tmp); err != nil {
		return fmt.Errorf("upgrade: %w", err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, n.dir, unix.RENAME_EXCHANGE); err != nil {
		return fmt.Errorf("upgrade: swap %s and %s (renameat2 RENAME_EXCHANGE on bpffs needs Linux 5.13): %w", tmp, n.dir, err)
	}
	committed = true
	if crashAfterCommit != nil && crashAfterCommit() {
		// A test's stand-in for a crash: stop with the handles closed and
		// nothing else undone.
		s.Close()
		return errCrashed
	}
	n.Steer, n.Loaded = s, true
	n.rollForward(rep)
	if counters != nil {
		if err := counters.finish(); err != nil {
			rep.Failed = append(rep.Failed, fmt.Sprintf("counters counted by the old programs during the swap: %v", err))
		}
	}
	// tmp now holds the old set: its pins are the old programs and maps
	// and second pins of links that run the new programs.
	if err := os.RemoveAll(tmp); err != nil {
		rep.Failed = append(rep.Failed, fmt.Sprintf("remove the old pins in %s: %v", tmp, err))
	}
	n.Upgraded = rep
	return nil
}

// rollForward swaps the program of every attachment pinned in n.dir that
// does not run n.Steer's program for its hook, and records what it did in
// rep. A defunct link (its interface gone) is left to Reattach.
func (n *Node) rollForward(rep *UpgradeReport) {
	atts, err := n.Attachments()
	if err != nil {
		rep.Failed = append(rep.Failed, err.Error())
		return
	}
	for _, a := range atts {
		prog := n.prog(a.Hook)
		if prog == nil {
			continue
		}
		swapped, err := n.swapProgram(a, prog)
		if err != nil {
			rep.Failed = append(rep.Failed, err.Error())
		} else if swapped {
			rep.Swapped = append(rep.Swapped, a)
		}
	}
}

// prog is the program that runs at hook.
func (n *Node) prog(hook Hook) *ebpf.Program {
	switch hook {
	case HookXDP:
		return n.Steer.XDP
	case HookTCIngress:
		return n.Steer.TCIngress
	case HookTCEgress:
		return n.Steer.TCEgress
	}
	return nil
}

// swapProgram makes a's link (or clsact filter) run prog, unless it does.
func (n *Node) swapProgram(a Attachment, prog *ebpf.Program) (bool, error) {
	want, err := progID(prog)
	if err != nil {
		return false, err
	}
	if a.Mode == ModeClsact {
		nl, err := netlink.LinkByName(a.Iface)
		if err != nil {
			return false, nil // defunct: Reattach's business
		}
		f := clsactFilter(nl.Attrs().Index, a.Hook)
		filters, err := netlink.FilterList(nl, f.Parent)
		if err != nil {
			return false, fmt.Errorf("interface %s %s (clsact): list filters: %w", a.Iface, a.Hook, err)
		}
		for _, g := range filters {
			b, ok := g.(*netlink.BpfFilter)
			if !ok || b.Attrs().Priority != clsactPriority || b.Attrs().Handle != f.Handle {
				continue
			}
			if ebpf.ProgramID(b.Id) == want {
				return false, nil
			}
			// Replacing the filter with the same parent, handle and
			// priority swaps its program in place: no moment without one.
			f.Fd = prog.FD()
			if err := netlink.FilterReplace(f); err != nil {
				return false, fmt.Errorf("interface %s %s (clsact): replace filter: %w", a.Iface, a.Hook, err)
			}
			return true, nil
		}
		return false, nil
	}
	l, err := link.LoadPinnedLink(n.linkPin(a.Iface, a.Hook), nil)
	if err != nil {
		return false, fmt.Errorf("interface %s %s: open pinned link: %w", a.Iface, a.Hook, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return false, fmt.Errorf("interface %s %s: link info: %w", a.Iface, a.Hook, err)
	}
	if info.Program == want {
		return false, nil
	}
	if err := l.Update(prog); err != nil {
		if errors.Is(err, unix.ENOLINK) {
			return false, nil // defunct: Reattach's business
		}
		return false, fmt.Errorf("interface %s %s: swap program: %w", a.Iface, a.Hook, err)
	}
	return true, nil
}

// copyLinkPins pins every link pinned under from/links a second time under
// to/links, and copies the clsact markers.
func copyLinkPins(from, to string) error {
	atts, err := listLinks(from)
	if err != nil {
		return err
	}
	for _, a := range atts {
		name := string(a.Hook) + "@" + pinEscaper.Replace(a.Iface)
		if a.Mode == ModeClsact {
			if err := os.MkdirAll(filepath.Join(to, "links", clsactDir, name), 0o700); err != nil {
				return fmt.Errorf("interface %s %s: record clsact filter: %w", a.Iface, a.Hook, err)
			}
			continue
		}
		if err := pinAgain(filepath.Join(from, "links", name), filepath.Join(to, "links", name)); err != nil {
			return fmt.Errorf("interface %s %s: %w", a.Iface, a.Hook, err)
		}
	}
	return nil
}

// pinAgain pins the link pinned at from at to as well. (Pin on a link
// loaded from a pin moves that pin; a link opened by ID has none.)
func pinAgain(from, to string) error {
	l, err := link.LoadPinnedLink(from, nil)
	if err != nil {
		return fmt.Errorf("open pinned link: %w", err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return fmt.Errorf("link info: %w", err)
	}
	byID, err := link.NewFromID(info.ID)
	if err != nil {
		return fmt.Errorf("open link %d: %w", info.ID, err)
	}
	defer byID.Close()
	if err := byID.Pin(to); err != nil {
		return fmt.Errorf("pin link: %w", err)
	}
	return nil
}

// counter is one CPU's slot of the counter maps (struct counter in C).
type counter struct{ Packets, Bytes uint64 }

// ifaceCounters is one CPU's slot of the per-interface counters (struct
// iface_counters in C): the verdict counters again.
type ifaceCounters [bpf.NumStats]counter

// counterCopy carries the counters from the old maps to the new ones: all
// of them before the swap (the new programs then start from the old
// counts), and after it what the old programs counted in between, added to
// the few slots that changed. Each addition is a read and a write of one
// slot, so a packet the new program counts in that slot in the
// microseconds between them is lost to the counter (not to the data
// plane).
type counterCopy struct {
	maps  []mapCopy
	iface bool // the per-interface counters are among maps
}

// mapCopy is the carry of one counter map.
type mapCopy interface {
	finish() error
	close()
}

// carryCounters copies the counters pinned in from to those pinned in to.
// The verdict and per-rule counters are copied when both have the same
// layout in both; nil when they did not (every map then starts from zero).
// The per-interface counters are copied too when the old pins have them
// with the same layout; pins of a build without them (or with another
// number of slots) leave the new ones starting from zero, so after such an
// upgrade they count from the upgrade on.
func carryCounters(from, to string) (*counterCopy, error) {
	c := &counterCopy{}
	ok := false
	defer func() {
		if !ok {
			c.close()
		}
	}()
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, err
	}
	for _, name := range []string{bpf.PinStats, bpf.PinRuleStats} {
		m, err := carryMap[counter](from, to, name, ncpu)
		if err != nil || m == nil {
			return nil, err
		}
		c.maps = append(c.maps, m)
	}
	m, err := carryMap[ifaceCounters](from, to, bpf.PinIfaceStats, ncpu)
	if err != nil {
		return nil, err
	}
	if m != nil {
		c.maps, c.iface = append(c.maps, m), true
	}
	ok = true
	return c, nil
}

// finish adds what the old programs counted since the copy, once no link
// runs them, and releases the maps.
func (c *counterCopy) finish() error {
	defer c.close()
	var errs []error
	for _, m := range c.maps {
		errs = append(errs, m.finish())
	}
	return errors.Join(errs...)
}

func (c *counterCopy) close() {
	for _, m := range c.maps {
		m.close()
	}
}

// perCPUCopy carries one per-CPU array whose values are T, a struct of
// uint64 counters.
type perCPUCopy[T comparable] struct {
	name     string
	src, dst *ebpf.Map
	snap     []T
	ncpu     int
}

// carryMap copies map name pinned in from to the one pinned in to; nil
// when from has no such map or it has another layout.
func carryMap[T comparable](from, to, name string, ncpu int) (*perCPUCopy[T], error) {
	src, err := ebpf.LoadPinnedMap(filepath.Join(from, name), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, nil // an older layout without it
	}
	dst, err := ebpf.LoadPinnedMap(filepath.Join(to, name), nil)
	if err != nil {
		src.Close()
		return nil, fmt.Errorf("open new map %s: %w", name, err)
	}
	c := &perCPUCopy[T]{name: name, src: src, dst: dst, ncpu: ncpu}
	if !sameLayout[T](src, dst) {
		c.close()
		return nil, nil
	}
	vals, err := readPerCPU[T](src, ncpu)
	if err != nil {
		c.close()
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	keys := make([]uint32, src.MaxEntries())
	for k := range keys {
		keys[k] = uint32(k)
	}
	if _, err := dst.BatchUpdate(keys, vals, nil); err != nil {
		c.close()
		return nil, fmt.Errorf("write %s: %w", name, err)
	}
	c.snap = vals
	return c, nil
}

func (c *perCPUCopy[T]) finish() error {
	now, err := readPerCPU[T](c.src, c.ncpu)
	if err != nil {
		return fmt.Errorf("read %s: %w", c.name, err)
	}
	for k := uint32(0); k < c.src.MaxEntries(); k++ {
		was, is := c.snap[int(k)*c.ncpu:int(k+1)*c.ncpu], now[int(k)*c.ncpu:int(k+1)*c.ncpu]
		if slices.Equal(was, is) {
			continue
		}
		var v []T
		if err := c.dst.Lookup(k, &v); err != nil {
			return fmt.Errorf("read %s[%d]: %w", c.name, k, err)
		}
		for cpu := range v {
			addSince(&v[cpu], &was[cpu], &is[cpu])
		}
		if err := c.dst.Update(k, v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("write %s[%d]: %w", c.name, k, err)
		}
	}
	return nil
}

func (c *perCPUCopy[T]) close() {
	c.src.Close()
	c.dst.Close()
}

// addSince adds is - was to dst, word by word: T is a struct of uint64
// counters (sameLayout held its size to the map's values).
func addSince[T any](dst, was, is *T) {
	n := int(unsafe.Sizeof(*dst) / 8)
	d := unsafe.Slice((*uint64)(unsafe.Pointer(dst)), n)
	w := unsafe.Slice((*uint64)(unsafe.Pointer(was)), n)
	i := unsafe.Slice((*uint64)(unsafe.Pointer(is)), n)
	for j := range d {
		d[j] += i[j] - w[j]
	}
}

// readPerCPU reads a per-CPU array in batches (65536 rules one by one take
// seconds): key k's CPUs at [k*ncpu, (k+1)*ncpu).
func readPerCPU[T any](m *ebpf.Map, ncpu int) ([]T, error) {
	const chunk = 4096
	out := make([]T, 0, int(m.MaxEntries())*ncpu)
	keys := make([]uint32, chunk)
	vals := make([]T, chunk*ncpu)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		done := errors.Is(err, ebpf.ErrKeyNotExist)
		if err != nil && !done {
			return nil, err
		}
		out = append(out, vals[:n*ncpu]...)
		if done {
			if len(out) != int(m.MaxEntries())*ncpu {
				return nil, fmt.Errorf("read %d of %d slots", len(out)/ncpu, m.MaxEntries())
			}
			return out, nil
		}
	}
}

// sameLayout: a and b are per-CPU arrays of the same size, keyed by u32,
// whose values are T.
func sameLayout[T any](a, b *ebpf.Map) bool {
	var v T
	return a.Type() == ebpf.PerCPUArray && a.Type() == b.Type() && a.KeySize() == b.KeySize() && a.KeySize() == 4 &&
		a.ValueSize() == b.ValueSize() && int(a.ValueSize()) == binary.Size(v) && a.MaxEntries() == b.MaxEntries()
}

// pinnedBuild describes the programs pinned in dir, as far as it can.
func pinnedBuild(dir string) Build {
	prog, err := ebpf.LoadPinnedProgram(filepath.Join(dir, bpf.PinProgXDP), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return Build{Tag: "unknown"}
	}
	defer prog.Close()
	// Port reads the constant where this build keeps it; an older build
	// may keep it elsewhere, so it is a best guess.
	return Build{Tag: progTag(prog), Port: portOf(&bpf.Steer{XDP: prog})}
}

func portOf(s *bpf.Steer) uint16 {
	p, err := s.Port()
	if err != nil {
		return 0
	}
	return p
}

func progTag(p *ebpf.Program) string {
	info, err := p.Info()
	if err != nil {
		return "unknown"
	}
	return info.Tag
}

func progID(p *ebpf.Program) (ebpf.ProgramID, error) {
	info, err := p.Info()
	if err != nil {
		return 0, fmt.Errorf("program info: %w", err)
	}
	id, ok := info.ID()
	if !ok {
		return 0, fmt.Errorf("program info: no ID: %w", ebpf.ErrNotSupported)
	}
	return id, nil
}

// wantPort is the port a node configured with port runs.
func wantPort(port uint16) uint16 {
	if port == 0 {
		return wire.DefaultPort
	}
	return port
}
