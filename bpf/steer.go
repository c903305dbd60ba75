package bpf

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Stat indexes the steering program's per-CPU counters (enum steer_stat).
type Stat uint32

// Counters kept by the steering program.
const (
	StatRX        Stat = 0 // every frame seen
	StatLovelock  Stat = 1 // valid Lovelock packets
	StatOther     Stat = 2 // well-formed non-Lovelock traffic
	StatMalformed Stat = 3 // truncated or invalid headers
	numStats           = 4
)

// String names the counter as metrics and the CLI show it.
func (s Stat) String() string {
	switch s {
	case StatRX:
		return "rx"
	case StatLovelock:
		return "lovelock"
	case StatOther:
		return "other"
	case StatMalformed:
		return "malformed"
	}
	return fmt.Sprintf("stat(%d)", uint32(s))
}

// Counter is a packet and byte count, summed over CPUs.
type Counter struct {
	Packets uint64
	Bytes   uint64
}

// Pin names under a steering pin directory. Their layout is documented in
// docs/ARCHITECTURE.md; changing a name is a breaking change for a running
// data plane.
const (
	PinStats   = "steer_stats"
	PinProgXDP = "xdp_steer"
)

// SteerOptions configure the steering program before it is loaded.
type SteerOptions struct {
	// Port is the Lovelock UDP port; 0 means the wire default (61440).
	Port uint16
}

// Steer is a loaded steering program and its maps.
type Steer struct {
	objs steerObjects
}

// LoadSteer loads the steering program into the kernel. The caller owns the
// result and must Close it; a program stays loaded after Close only while
// something (a pin or an attached link) still refers to it.
func LoadSteer(opts SteerOptions) (*Steer, error) {
	spec, err := loadSteer()
	if err != nil {
		return nil, err
	}
	if opts.Port != 0 {
		if err := spec.Variables[steerVarLlPort].Set(opts.Port); err != nil {
			return nil, fmt.Errorf("steer: set ll_port: %w", err)
		}
	}
	s := &Steer{}
	if err := spec.LoadAndAssign(&s.objs, nil); err != nil {
		return nil, fmt.Errorf("steer: load: %+v", err)
	}
	return s, nil
}

// Pin pins the program and its maps into dir, which must be on a bpffs.
func (s *Steer) Pin(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("steer: pin dir: %w", err)
	}
	if err := s.objs.SteerStats.Pin(filepath.Join(dir, PinStats)); err != nil {
		return fmt.Errorf("steer: pin map %s: %w", PinStats, err)
	}
	if err := s.objs.XdpSteer.Pin(filepath.Join(dir, PinProgXDP)); err != nil {
		return fmt.Errorf("steer: pin program %s: %w", PinProgXDP, err)
	}
	return nil
}

// AttachXDP attaches the program to the interface ifindex with a BPF link.
// flags selects the mode (link.XDPDriverMode for native, link.XDPGenericMode).
// The program stays attached while the link is open or pinned.
func (s *Steer) AttachXDP(ifindex int, flags link.XDPAttachFlags) (link.Link, error) {
	l, err := link.AttachXDP(link.XDPOptions{
		Program:   s.objs.XdpSteer,
		Interface: ifindex,
		Flags:     flags,
	})
	if err != nil {
		return nil, fmt.Errorf("steer: attach xdp to ifindex %d: %w", ifindex, err)
	}
	return l, nil
}

// Stats reads the program's counters.
func (s *Steer) Stats() ([]Counter, error) {
	return readStats(s.objs.SteerStats)
}

// Close releases this process's references to the program and maps.
func (s *Steer) Close() error {
	return s.objs.Close()
}

// ReadPinnedStats reads the counters of a steering program pinned in dir, for
// a process that did not load it (the CLI, a restarted daemon).
func ReadPinnedStats(dir string) ([]Counter, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, PinStats), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("steer: open pinned map %s: %w", PinStats, err)
	}
	defer m.Close()
	return readStats(m)
}

func readStats(m *ebpf.Map) ([]Counter, error) {
	out := make([]Counter, numStats)
	for i := range out {
		var perCPU []steerStatCounter
		if err := m.Lookup(uint32(i), &perCPU); err != nil {
			return nil, fmt.Errorf("steer: read %s: %w", Stat(i), err)
		}
		for _, c := range perCPU {
			out[i].Packets += c.Packets
			out[i].Bytes += c.Bytes
		}
	}
	return out, nil
}
