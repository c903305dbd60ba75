package service

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// Program is Steering over a bare steering program with no operator rules:
// the reserved rules of every service bound to it, and a default of pass.
// Benches and tests that run services without lovelockd use it; lovelockd
// has its own Steering, which keeps the operator's rules beside them.
type Program struct {
	Steer *bpf.Steer
	// LovelockPort is the port the program parses Lovelock headers on
	// (bpf.Options.Port; 0 for wire.DefaultPort).
	LovelockPort uint16
	// Attached lists the interfaces the caller attached the program to in
	// XDP.
	Attached []string

	mu       sync.Mutex
	reserved map[string][]rules.Rule
}

// Port implements Steering.
func (p *Program) Port() uint16 {
	if p.LovelockPort == 0 {
		return wire.DefaultPort
	}
	return p.LovelockPort
}

// XDPAttached implements Steering.
func (p *Program) XDPAttached(iface string) (bool, error) {
	return slices.Contains(p.Attached, iface), nil
}

// SetXSK implements Steering.
func (p *Program) SetXSK(ifindex int, queue uint32, fd int) error {
	return p.Steer.SetXSK(ifindex, queue, fd)
}

// SetXSKMultiBuffer implements Steering.
func (p *Program) SetXSKMultiBuffer(ifindex int, queue uint32, fd int) error {
	return p.Steer.SetXSKMultiBuffer(ifindex, queue, fd)
}

// ClearXSK implements Steering.
func (p *Program) ClearXSK(ifindex int, queue uint32) error {
	return p.Steer.ClearXSK(ifindex, queue)
}

// Reserve implements Steering: the rule set becomes every service's
// reserved rules, in service name order, over a default of pass. A set
// that went live without its old readers waited out (bpf.ErrNotDrained)
// is reserved, with a warning.
func (p *Program) Reserve(service string, rs []rules.Rule) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	next := map[string][]rules.Rule{}
	for k, v := range p.reserved {
		next[k] = v
	}
	if rs == nil {
		delete(next, service)
	} else {
		next[service] = rs
	}
	set := rules.Set{Default: rules.Pass(), Rules: Merge(next)}
	for i := range set.Rules {
		set.Rules[i].ID = uint32(i + 1)
	}
	compiled, err := rules.Compile(&set, rules.LinkResolver, p.Port())
	if err != nil {
		return nil, err
	}
	var warnings []string
	if err := p.Steer.Apply(compiled); err != nil {
		if !errors.Is(err, bpf.ErrNotDrained) {
			return nil, err
		}
		warnings = append(warnings, fmt.Sprintf("rules applied, but: %v", err))
	}
	p.reserved = next
	return warnings, nil
}

// Merge returns the reserved rules of every service, in service name
// order, so that a rule set is the same whichever service bound first. A
// rule two services reserve alike (FragmentRules for an address both use)
// is kept once.
func Merge(reserved map[string][]rules.Rule) []rules.Rule {
	names := make([]string, 0, len(reserved))
	for n := range reserved {
		names = append(names, n)
	}
	slices.Sort(names)
	var out []rules.Rule
	for _, n := range names {
		out = append(out, reserved[n]...)
	}
	return dedupe(out)
}

// LoadProgram loads a steering program of its own (not pinned) and attaches
// it in native XDP to each of ifaces, in the network namespace of the
// calling thread; stop detaches and unloads it. It is for benches and tests
// that run services without lovelockd.
func LoadProgram(ifaces []string) (p *Program, stop func(), err error) {
	s, err := bpf.Load(bpf.Options{})
	if err != nil {
		return nil, nil, err
	}
	var links []link.Link
	stop = func() {
		for _, l := range links {
			_ = l.Close()
		}
		_ = s.Close()
	}
	for _, name := range ifaces {
		l, err := netlink.LinkByName(name)
		if err != nil {
			stop()
			return nil, nil, fmt.Errorf("interface %s: %w", name, err)
		}
		xl, err := s.AttachXDP(l.Attrs().Index, link.XDPDriverMode)
		if err != nil {
			stop()
			return nil, nil, fmt.Errorf("attach XDP to %s: %w", name, err)
		}
		links = append(links, xl)
	}
	return &Program{Steer: s, Attached: slices.Clone(ifaces)}, stop, nil
}
