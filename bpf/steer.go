package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Stat indexes the steering program's per-CPU counters (enum steer_stat).
// The values come from the object's BTF through bpf2go (steerSteerStat), so
// they cannot drift from the C enum.
type Stat uint32

// Counters kept by the steering program.
const (
	StatRX        = Stat(steerSteerStatSTAT_RX)        // every packet seen
	StatLovelock  = Stat(steerSteerStatSTAT_LOVELOCK)  // valid Lovelock packets
	StatMalformed = Stat(steerSteerStatSTAT_MALFORMED) // malformed headers (the default action, unless only the Lovelock header is bad)
	StatNoRule    = Stat(steerSteerStatSTAT_NO_RULE)   // classified packets no rule matched (default action): well-formed ones and bad Lovelock headers
	StatPass      = Stat(steerSteerStatSTAT_PASS)      // verdicts as carried out: to the kernel
	StatDrop      = Stat(steerSteerStatSTAT_DROP)      // dropped
	StatRedirect  = Stat(steerSteerStatSTAT_REDIRECT)  // redirected to another interface
	StatXSK       = Stat(steerSteerStatSTAT_XSK)       // sent to an AF_XDP socket
	StatXSKOnTC   = Stat(steerSteerStatSTAT_XSK_TC)    // xsk verdicts on a TC hook, passed instead
	StatXSKMiss   = Stat(steerSteerStatSTAT_XSK_MISS)  // xsk verdicts with no socket on the arrival queue (none registered, or its socket gone), or multi-buffer, passed instead
	NumStats      = Stat(steerSteerStatSTAT_MAX)       // how many counters there are (the stats map's size, checked at load)
)

// statNames names every counter; the [...] length and the check below make
// a counter added in C without a name here a compile error.
var statNames = [...]string{"rx", "lovelock", "malformed", "no_rule", "pass", "drop", "redirect", "xsk", "xsk_on_tc", "xsk_miss"}

var _ [len(statNames) - int(NumStats)]struct{} // statNames has no name too many
var _ [int(NumStats) - len(statNames)]struct{} // nor one too few

// String names the counter as metrics and the CLI show it.
func (s Stat) String() string {
	if s < NumStats {
		return statNames[s]
	}
	return fmt.Sprintf("stat(%d)", uint32(s))
}

// Counter is a packet and byte count, summed over CPUs. In JSON (the API's
// /v1/stats) its keys are lower case like every other key.
type Counter struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// Pin names under a steering pin directory. Their layout is documented in
// docs/ARCHITECTURE.md; renaming one breaks adoption of a running data plane.
const (
	PinProgXDP       = "xdp_steer"
	PinProgTCIngress = "tc_ingress"
	PinProgTCEgress  = "tc_egress"
	PinProgXDPPass   = "xdp_pass"
	PinStats         = "steer_stats"
	PinIfaceStats    = "iface_stats"
	PinRuleStats     = "rule_stats"
	PinRulesets      = "rulesets"
	PinXSKs          = "xsks"
	PinXSKSlots      = "xsk_slots"
	PinShapesets     = "shapesets"
	PinActiveSet     = "active_set"
)

// Options configure the steering program before it is loaded.
type Options struct {
	// Port is the Lovelock UDP port; 0 means the wire default (61440).
	Port uint16
}

// Steer holds the steering programs and maps, loaded fresh or opened from
// pins. The caller must Close it; programs stay loaded after Close only while
// a pin or an attached link still refers to them.
type Steer struct {
	XDP       *ebpf.Program // classifier for XDP hooks
	TCIngress *ebpf.Program // classifier for TC ingress (clsact/tcx)
	TCEgress  *ebpf.Program // classifier for TC egress
	XDPPass   *ebpf.Program // pass-through for peers of veth redirect targets

	stats      *ebpf.Map
	ifaceStats *ebpf.Map
	ruleStats  *ebpf.Map
	rulesets   *ebpf.Map
	shapesets  *ebpf.Map
	activeSet  *ebpf.Map
	xsks       *ebpf.Map
	xskSlots   *ebpf.Map

	inner *ebpf.MapSpec // template of a rule table

	// drainFault, when set, makes waitReaders fail with its error before
	// it waits: tests make the wait after a flip fail with it.
	drainFault func() error
}

func (s *Steer) pins() []struct {
	name string
	obj  interface{ Pin(string) error }
} {
	return []struct {
		name string
		obj  interface{ Pin(string) error }
	}{
		{PinProgXDP, s.XDP}, {PinProgTCIngress, s.TCIngress}, {PinProgTCEgress, s.TCEgress},
		{PinProgXDPPass, s.XDPPass}, {PinStats, s.stats}, {PinIfaceStats, s.ifaceStats}, {PinRuleStats, s.ruleStats},
		{PinRulesets, s.rulesets}, {PinShapesets, s.shapesets}, {PinActiveSet, s.activeSet}, {PinXSKs, s.xsks}, {PinXSKSlots, s.xskSlots},
	}
}

// Load loads the steering programs and maps into the kernel, with no rule
// set installed (every packet passes). A map size that differs from this
// package's constants fails before anything is loaded (see checkSpec); a
// program the kernel refuses returns a *LoadError, which unwraps to the
// *ebpf.VerifierError.
func Load(opts Options) (*Steer, error) {
	spec, err := loadSteer()
	if err != nil {
		return nil, fmt.Errorf("steer: read object: %w", err)
	}
	return load(spec, opts)
}

// load is Load on a given collection spec (tests hand it broken ones).
func load(spec *ebpf.CollectionSpec, opts Options) (*Steer, error) {
	if err := checkSpec(spec); err != nil {
		return nil, err
	}
	if opts.Port != 0 {
		if err := spec.Variables[steerVarLlPort].Set(opts.Port); err != nil {
			return nil, fmt.Errorf("steer: set ll_port: %w", err)
		}
	}
	var objs steerObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return nil, &LoadError{Object: "steer", Err: err}
	}
	return &Steer{
		XDP: objs.XdpSteer, TCIngress: objs.TcIngress, TCEgress: objs.TcEgress, XDPPass: objs.XdpPass,
		stats: objs.SteerStats, ifaceStats: objs.IfaceStats, ruleStats: objs.RuleStats, rulesets: objs.Rulesets, shapesets: objs.Shapesets, activeSet: objs.ActiveSet, xsks: objs.Xsks, xskSlots: objs.XskSlots,
		inner: spec.Maps[steerMapRulesets].InnerMap,
	}, nil
}

// ErrStale reports pinned programs built from other sources than this
// binary's: adopting them would mix two versions of the data plane.
var ErrStale = errors.New("pinned programs differ from this build")

// OpenPinned opens a steering data plane pinned in dir by Pin. It refuses
// (ErrStale) programs whose instructions differ from this build's, so a
// daemon never adopts a data plane it does not understand.
func OpenPinned(dir string) (*Steer, error) {
	// The kernel's tag hashes the instructions as loaded (calls and
	// callbacks linked, map references blanked); load this build's programs
	// once to learn their tags.
	fresh, err := Load(Options{})
	if err != nil {
		return nil, err
	}
	defer fresh.Close()

	s := &Steer{inner: fresh.inner}
	progs := []struct {
		pin   string
		fresh *ebpf.Program
		dst   **ebpf.Program
	}{
		{PinProgXDP, fresh.XDP, &s.XDP}, {PinProgTCIngress, fresh.TCIngress, &s.TCIngress},
		{PinProgTCEgress, fresh.TCEgress, &s.TCEgress}, {PinProgXDPPass, fresh.XDPPass, &s.XDPPass},
	}
	for _, p := range progs {
		prog, err := ebpf.LoadPinnedProgram(filepath.Join(dir, p.pin), nil)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("steer: open pinned program %s: %w", p.pin, err)
		}
		*p.dst = prog
		if err := sameTag(prog, p.fresh); err != nil {
			s.Close()
			return nil, fmt.Errorf("steer: program %s in %s: %w", p.pin, dir, err)
		}
	}
	maps := []struct {
		pin string
		dst **ebpf.Map
	}{{PinStats, &s.stats}, {PinIfaceStats, &s.ifaceStats}, {PinRuleStats, &s.ruleStats}, {PinRulesets, &s.rulesets}, {PinShapesets, &s.shapesets}, {PinActiveSet, &s.activeSet}, {PinXSKs, &s.xsks}, {PinXSKSlots, &s.xskSlots}}
	for _, m := range maps {
		mp, err := ebpf.LoadPinnedMap(filepath.Join(dir, m.pin), nil)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("steer: open pinned map %s: %w", m.pin, err)
		}
		*m.dst = mp
	}
	return s, nil
}

// sameTag compares two loaded programs' tags (hashes of their instructions).
func sameTag(pinned, fresh *ebpf.Program) error {
	a, err := pinned.Info()
	if err != nil {
		return fmt.Errorf("read program info: %w", err)
	}
	b, err := fresh.Info()
	if err != nil {
		return fmt.Errorf("read program info: %w", err)
	}
	if a.Tag != b.Tag {
		return fmt.Errorf("tag %s, this build has %s: %w", a.Tag, b.Tag, ErrStale)
	}
	return nil
}

// Pin pins every program and map into dir, on a bpffs, creating it.
func (s *Steer) Pin(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("steer: pin dir: %w", err)
	}
	for _, p := range s.pins() {
		if err := p.obj.Pin(filepath.Join(dir, p.name)); err != nil {
			return fmt.Errorf("steer: pin %s: %w", p.name, err)
		}
	}
	return nil
}

// AttachXDP attaches the classifier to the interface ifindex with a BPF link.
// flags selects the mode (link.XDPDriverMode for native, link.XDPGenericMode).
// The program stays attached while the link is open or pinned.
func (s *Steer) AttachXDP(ifindex int, flags link.XDPAttachFlags) (link.Link, error) {
	l, err := link.AttachXDP(link.XDPOptions{Program: s.XDP, Interface: ifindex, Flags: flags})
	if err != nil {
		return nil, fmt.Errorf("steer: attach xdp to ifindex %d: %w", ifindex, err)
	}
	return l, nil
}

// Stats reads the data plane's counters, indexed by Stat.
func (s *Steer) Stats() ([]Counter, error) {
	out := make([]Counter, NumStats)
	for i := range out {
		c, err := sumPerCPU(s.stats, uint32(i))
		if err != nil {
			return nil, fmt.Errorf("steer: read %s: %w", Stat(i), err)
		}
		out[i] = c
	}
	return out, nil
}

// Per-interface counters (map iface_stats): the counters Stats reads, kept
// again per interface the steering hook ran on (XDP and TC ingress: the
// arrival interface; TC egress: the interface the packet leaves by).
const (
	// IfaceSlots is how many interfaces have counters of their own,
	// IFACE_SLOTS in bpf/steer.c (the map's size, checked at load).
	IfaceSlots = int(steerIfaceLimitsIFACE_SLOTS)
	// IfaceOther is the slot that every ifindex from IfaceOther up shares:
	// ifindexes 1..IfaceOther-1 have a slot each, larger ones are counted
	// together under IfaceOther, so no packet goes uncounted.
	IfaceOther = uint32(steerIfaceLimitsIFACE_OTHER)
)

// IfaceStats reads the per-interface counters, summed over CPUs: slot
// (ifindex, or IfaceOther for every ifindex from IfaceOther up) to counters
// indexed by Stat. Slots that counted no packet are left out. Every packet
// is counted under exactly one slot, so the sum over slots of each counter
// is Stats' (on a data plane loaded with the per-interface map; after an
// upgrade from a build without it, the sum counts from the upgrade on).
func (s *Steer) IfaceStats() (map[uint32][]Counter, error) {
	if s.ifaceStats == nil {
		return nil, fmt.Errorf("steer: read per-interface counters: no map %s", PinIfaceStats)
	}
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("steer: %w", err)
	}
	// One batch of every slot: a lookup per slot would be IfaceSlots
	// syscalls per scrape.
	n := int(s.ifaceStats.MaxEntries())
	keys := make([]uint32, n)
	vals := make([]steerIfaceCounters, n*ncpu)
	var cursor ebpf.MapBatchCursor
	got, err := s.ifaceStats.BatchLookup(&cursor, keys, vals, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil, fmt.Errorf("steer: read per-interface counters: %w", err)
	}
	out := make(map[uint32][]Counter)
	for i := 0; i < got; i++ {
		var sum []Counter
		for _, v := range vals[i*ncpu : (i+1)*ncpu] {
			if v.C[StatRX].Packets == 0 {
				continue // every packet counts under rx
			}
			if sum == nil {
				sum = make([]Counter, NumStats)
			}
			for j := range sum {
				sum[j].Packets += v.C[j].Packets
				sum[j].Bytes += v.C[j].Bytes
			}
		}
		if sum != nil {
			out[keys[i]] = sum
		}
	}
	return out, nil
}

// RuleCounter reads the counters of rule id (0: packets no rule matched).
func (s *Steer) RuleCounter(id uint32) (Counter, error) {
	c, err := sumPerCPU(s.ruleStats, id)
	if err != nil {
		return Counter{}, fmt.Errorf("steer: read counters of rule %d: %w", id, err)
	}
	return c, nil
}

// ResetRuleCounter zeroes the counters of rule id, before the ID is given to
// a new rule.
func (s *Steer) ResetRuleCounter(id uint32) error {
	n, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("steer: %w", err)
	}
	if err := s.ruleStats.Update(id, make([]steerCounter, n), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("steer: reset counters of rule %d: %w", id, err)
	}
	return nil
}

// MaxXSKSockets is how many AF_XDP sockets the data plane can hold.
const MaxXSKSockets = 256

type xskKey = steerXskKey

// SetXSK registers the AF_XDP socket fd, bound to queue of the interface
// ifindex, for rules with action xsk:<queue> on that interface. It replaces
// a socket registered for the same interface and queue.
func (s *Steer) SetXSK(ifindex int, queue uint32, fd int) error {
	return s.setXSK(ifindex, queue, fd, false)
}

// SetXSKMultiBuffer is SetXSK for a socket bound with XDP_USE_SG
// (xsk.SocketConfig.MultiBuffer): the steering program hands it
// multi-buffer frames too (frames longer than the driver's first XDP
// buffer, such as jumbo frames on veth), which it passes to the stack for
// other sockets, where the kernel would drop them.
func (s *Steer) SetXSKMultiBuffer(ifindex int, queue uint32, fd int) error {
	return s.setXSK(ifindex, queue, fd, true)
}

// xskSlotSG marks a slot whose socket takes multi-buffer frames
// (XSK_SLOT_SG in steer.c).
const xskSlotSG = 1 << 31

func (s *Steer) setXSK(ifindex int, queue uint32, fd int, multiBuffer bool) error {
	key := xskKey{Ifindex: uint32(ifindex), Queue: queue}
	slot, err := s.xskSlot(key)
	if err != nil {
		return err
	}
	val := slot
	if multiBuffer {
		val |= xskSlotSG
	}
	// Socket first, then the slot: a packet never finds a slot without one.
	if err := s.xsks.Update(slot, uint32(fd), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("steer: register AF_XDP socket for ifindex %d queue %d: %w", ifindex, queue, err)
	}
	if err := s.xskSlots.Update(&key, val, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("steer: register AF_XDP socket for ifindex %d queue %d: %w", ifindex, queue, err)
	}
	return nil
}

// xskSlot returns the slot registered for key, or a free one.
func (s *Steer) xskSlot(key xskKey) (uint32, error) {
	used := make(map[uint32]bool)
	var k xskKey
	var slot uint32
	it := s.xskSlots.Iterate()
	for it.Next(&k, &slot) {
		slot &^= xskSlotSG
		if k == key {
			return slot, nil
		}
		used[slot] = true
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("steer: list AF_XDP sockets: %w", err)
	}
	for i := uint32(0); i < MaxXSKSockets; i++ {
		if !used[i] {
			return i, nil
		}
	}
	return 0, fmt.Errorf("steer: all %d AF_XDP socket slots are in use", MaxXSKSockets)
}

// ClearXSK unregisters the AF_XDP socket of queue on interface ifindex.
func (s *Steer) ClearXSK(ifindex int, queue uint32) error {
	key := xskKey{Ifindex: uint32(ifindex), Queue: queue}
	var slot uint32
	if err := s.xskSlots.Lookup(&key, &slot); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		return fmt.Errorf("steer: unregister AF_XDP socket: %w", err)
	}
	slot &^= xskSlotSG
	// Slot first, then the socket: a packet never finds a slot without one.
	if err := s.xskSlots.Delete(&key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("steer: unregister AF_XDP socket: %w", err)
	}
	if err := s.xsks.Delete(slot); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("steer: unregister AF_XDP socket: %w", err)
	}
	return nil
}

// Close releases this process's handles.
func (s *Steer) Close() error {
	var errs []error
	for _, c := range []interface{ Close() error }{s.XDP, s.TCIngress, s.TCEgress, s.XDPPass, s.stats, s.ifaceStats, s.ruleStats, s.rulesets, s.shapesets, s.activeSet, s.xsks, s.xskSlots} {
		switch v := c.(type) {
		case *ebpf.Program:
			if v != nil {
				errs = append(errs, v.Close())
			}
		case *ebpf.Map:
			if v != nil {
				errs = append(errs, v.Close())
			}
		}
	}
	return errors.Join(errs...)
}

func sumPerCPU(m *ebpf.Map, key uint32) (Counter, error) {
	var perCPU []steerCounter
	if err := m.Lookup(key, &perCPU); err != nil {
		return Counter{}, err
	}
	var c Counter
	for _, v := range perCPU {
		c.Packets += v.Packets
		c.Bytes += v.Bytes
	}
	return c, nil
}

// ReadPinnedStats reads the counters of a steering data plane pinned in dir,
// for a process that did not load it.
func ReadPinnedStats(dir string) ([]Counter, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, PinStats), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("steer: open pinned map %s: %w", PinStats, err)
	}
	defer m.Close()
	s := &Steer{stats: m}
	return s.Stats()
}

// Port returns the Lovelock UDP port the loaded classifier was built with
// (Options.Port), read back from the kernel: the constant lives in the
// program's read-only data map, which a pinned program keeps. The port does
// not change the program's instructions, so OpenPinned's tag check cannot
// see it; callers that adopt pins compare it with the port they want.
func (s *Steer) Port() (uint16, error) {
	spec, err := loadSteer()
	if err != nil {
		return 0, fmt.Errorf("steer: read object: %w", err)
	}
	v := spec.Variables[steerVarLlPort]
	ms := spec.Maps[v.SectionName]
	if ms == nil {
		return 0, fmt.Errorf("steer: no map for section %s of %s", v.SectionName, steerVarLlPort)
	}
	info, err := s.XDP.Info()
	if err != nil {
		return 0, fmt.Errorf("steer: program info: %w", err)
	}
	ids, ok := info.MapIDs()
	if !ok {
		return 0, fmt.Errorf("steer: the kernel does not say which maps the program uses: %w", ebpf.ErrNotSupported)
	}
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue
		}
		mi, err := m.Info()
		if err != nil || mi.Type != ebpf.Array || mi.ValueSize != ms.ValueSize || !strings.HasSuffix(mi.Name, strings.TrimPrefix(v.SectionName, ".")) {
			m.Close()
			continue
		}
		val := make([]byte, mi.ValueSize)
		err = m.Lookup(uint32(0), &val)
		m.Close()
		if err != nil {
			return 0, fmt.Errorf("steer: read %s: %w", v.SectionName, err)
		}
		return binary.NativeEndian.Uint16(val[v.Offset:]), nil
	}
	return 0, fmt.Errorf("steer: the program has no %s map", v.SectionName)
}
