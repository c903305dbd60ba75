package service

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/xdp"
	"github.com/lovelock-dpu/lovelock/dataplane/xsk"
)

// openGroups opens the AF_XDP groups; tests replace it.
var openGroups = xdp.OpenGroups

// Steering is the node's steering program as a service binding sees it:
// lovelockd's data plane, with the operator's rules beside the services'
// (appliance/daemon), or a bare program in a bench (Program).
type Steering interface {
	// Port is the UDP port on which the program parses Lovelock headers.
	Port() uint16
	// XDPAttached reports whether the program runs in XDP on iface.
	XDPAttached(iface string) (bool, error)
	// SetXSK and ClearXSK register and unregister the AF_XDP socket fd
	// for queue of ifindex (the program's xsk action).
	SetXSK(ifindex int, queue uint32, fd int) error
	// SetXSKMultiBuffer is SetXSK for a socket bound with XDP_USE_SG,
	// which takes multi-buffer frames too.
	SetXSKMultiBuffer(ifindex int, queue uint32, fd int) error
	ClearXSK(ifindex int, queue uint32) error
	// Reserve makes rs the reserved rules of the named service and swaps
	// the rule set in; nil removes them. It returns warnings about
	// operator rules that the reserved ones shadow.
	Reserve(service string, rs []rules.Rule) (warnings []string, err error)
}

// Binding is what Bind gave a service: its AF_XDP transports, if it asked
// for them, and what did not go as asked.
type Binding struct {
	// Groups has one xdp.Group per worker (nil without XDPNeeds). The
	// service owns them while it runs: it may close them, and Close
	// closes them again.
	Groups []*xdp.Group
	// Degraded says, one line each, what Bind bound short of the needs
	// while the service still runs: e.g. reserved rules that did not
	// compile, so its traffic reaches it through the kernel sockets
	// only. Empty when everything is as asked. Reasons says what holds
	// now, after Recheck.
	Degraded []string

	name  string
	steer Steering
	log   *slog.Logger
	// onReady is the supervisor's: it reports the service running. Nil
	// for a binding without one (benches).
	onReady func()
	ready   sync.Once

	// steerMu serialises Recheck's calls on steer with Close, so that a
	// retried Reserve cannot follow the Close that removes the rules.
	// Nothing holding it waits for mu.
	steerMu    sync.Mutex
	closed     bool
	registered []xskSlot
	reserved   bool

	mu sync.Mutex
	// reasons are every way the binding may fall short, in the order
	// found; those active hold now.
	reasons []degradation
}

// degradation is one way a binding may fall short of its needs.
type degradation struct {
	why    string
	active bool
	// check finds out again whether the cause holds (holds) and, if so,
	// why (empty: as before); ok false when it cannot tell, which leaves
	// the reason as it is. Nil when only a new binding can fix it. It
	// runs with steerMu held.
	check func() (holds bool, why string, ok bool)
}

// Reasons returns what the binding falls short of its needs in now: the
// reasons Bind found, as the last Recheck left them.
func (b *Binding) Reasons() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, r := range b.reasons {
		if r.active {
			out = append(out, r.why)
		}
	}
	return out
}

// Recheck evaluates again every reason an operator can make hold or go,
// and reports whether Reasons changed. The steering program in XDP on
// each interface the binding receives on is checked both ways: detached,
// the service is degraded again. Reserved rules that did not compile
// with the operator's set are reserved again (the operator may have
// changed the set, or an interface appeared), and once they are that
// reason is gone for good. Multi-buffer sockets refused stay until a new
// binding.
func (b *Binding) Recheck() bool {
	b.steerMu.Lock()
	defer b.steerMu.Unlock()
	if b.closed {
		return false
	}
	b.mu.Lock()
	next := slices.Clone(b.reasons)
	b.mu.Unlock()
	changed := false
	for i := range next {
		r := &next[i]
		if r.check == nil {
			continue
		}
		holds, why, ok := r.check()
		if !ok {
			continue
		}
		if why == "" || !holds {
			why = r.why
		}
		if holds != r.active || why != r.why {
			changed = true
		}
		r.active, r.why = holds, why
	}
	b.mu.Lock()
	b.reasons = next
	b.mu.Unlock()
	return changed
}

// Ready says the service has opened everything it serves on (sockets,
// devices, listeners) and serves from now: only then does the supervisor
// report it running, and the node ready. A service calls it once its last
// setup step that can fail is done, before its serve loop; later calls do
// nothing.
func (b *Binding) Ready() {
	if b == nil {
		return
	}
	b.ready.Do(func() {
		if b.onReady != nil {
			b.onReady()
		}
	})
}

type xskSlot struct {
	ifindex int
	queue   uint32
}

// Transports returns the groups as transports, one per worker.
func (b *Binding) Transports() []transport.Transport {
	var out []transport.Transport
	for _, g := range b.Groups {
		out = append(out, g)
	}
	return out
}

// Bind opens what n asks for and registers it with the steering program:
// the groups' AF_XDP sockets in the program's socket map, then the
// reserved rules. It must run on a thread inside the interfaces' network
// namespace (the sockets are opened there). On error nothing stays bound.
// A reserved rule set that does not compile with the operator's leaves the
// service bound on its kernel sockets, reported in Binding.Degraded.
func Bind(st Steering, log *slog.Logger, name string, n Needs) (_ *Binding, err error) {
	b := &Binding{name: name, steer: st, log: log}
	defer func() {
		if err != nil {
			b.Close()
		}
	}()
	// Refused before anything is opened.
	if err := checkReserved(name, n.Rules); err != nil {
		return nil, err
	}
	if x := n.XDP; x != nil {
		if err := checkXDP(st, x); err != nil {
			return nil, fmt.Errorf("%s: transport xdp: %w", name, err)
		}
		b.Groups, err = openGroups(xdp.GroupOptions{Interfaces: x.Interfaces, Addr: x.Addr, MultiBuffer: x.MultiBuffer}, x.Workers, x.Kernel)
		if err != nil && x.MultiBuffer && errors.Is(err, xsk.ErrMultiBuffer) {
			// Single-buffer sockets carry the same traffic with bundles
			// of one XDP buffer; larger datagrams take the kernel path.
			// The service runs, short of what it asked for, and says so.
			sgErr := err
			b.Groups, err = openGroups(xdp.GroupOptions{Interfaces: x.Interfaces, Addr: x.Addr}, x.Workers, x.Kernel)
			if err == nil {
				b.degrade(fmt.Sprintf("multi-buffer AF_XDP refused (%v): single-buffer sockets, datagrams up to %d bytes on the AF_XDP path; "+
					"it stays so until the service binds again (restart lovelockd, e.g. systemctl restart lovelockd, once the kernel or driver takes XDP_USE_SG)",
					sgErr, b.Groups[0].MaxPayload()), true, nil)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%s: transport xdp on %v: %w", name, x.Interfaces, err)
		}
		for _, g := range b.Groups {
			for _, t := range g.Transports() {
				set := st.SetXSK
				if t.MultiBuffer() {
					set = st.SetXSKMultiBuffer
				}
				if err := set(t.Ifindex(), t.Queue(), t.FD()); err != nil {
					return nil, fmt.Errorf("%s: register AF_XDP socket on %s queue %d: %w", name, t.Interface(), t.Queue(), err)
				}
				b.registered = append(b.registered, xskSlot{t.Ifindex(), t.Queue()})
			}
		}
		// Checked now and at every Recheck: an operator may attach
		// the program later, or detach it.
		for _, iface := range x.Interfaces {
			check := func() (bool, string, bool) {
				ok, err := st.XDPAttached(iface)
				return !ok, "", err == nil
			}
			missing, _, known := check()
			b.degrade(fmt.Sprintf("no steering program in XDP on %s: its traffic reaches the service through the kernel socket only (fix: lovelock iface attach %s)", iface, iface),
				missing && known, check)
		}
	}
	if len(n.Rules) > 0 {
		warnings, err := st.Reserve(name, n.Rules)
		if err != nil {
			if n.XDP == nil {
				return nil, fmt.Errorf("%s: reserved steering rules: %w", name, err)
			}
			// The kernel sockets still carry everything, only slower.
			// Recheck tries again until they compile.
			b.degrade(reserveFailed(err), true, func() (bool, string, bool) {
				if b.reserved {
					return false, "", true
				}
				warnings, err := st.Reserve(name, n.Rules)
				if err != nil {
					return true, reserveFailed(err), true
				}
				b.reserved = true
				b.logWarnings(warnings)
				return false, "", true
			})
		} else {
			b.reserved = true
		}
		b.logWarnings(warnings)
	}
	return b, nil
}

// reserveFailed is the degraded reason for reserved rules that did not
// compile with the operator's set.
func reserveFailed(err error) string {
	return fmt.Sprintf("reserved steering rules do not compile with the operator's set, so traffic reaches the service through its kernel sockets only: %v "+
		"(retried every second: this goes once they compile, e.g. after the operator's rules change, see 'lovelock rule list', or an interface they name appears)", err)
}

func (b *Binding) logWarnings(warnings []string) {
	for _, w := range warnings {
		b.log.Warn("rules", "service", b.name, "warning", w)
	}
}

// checkXDP refuses needs the steering program cannot serve.
func checkXDP(st Steering, x *XDPNeeds) error {
	switch {
	case len(x.Interfaces) == 0:
		return errors.New("no interfaces to receive on")
	case !x.Addr.Addr().Unmap().Is4():
		return fmt.Errorf("address %v: AF_XDP carries IPv4 only", x.Addr)
	case x.Addr.Port() != st.Port():
		return fmt.Errorf("port %d: the steering program reads Lovelock headers on port %d only (lovelockd's port)", x.Addr.Port(), st.Port())
	case x.Workers < 1:
		return fmt.Errorf("%d workers", x.Workers)
	case x.Workers > bpf.MaxXSKQueues:
		return fmt.Errorf("%d workers, the steering program's xsk action reaches queues 0..%d", x.Workers, bpf.MaxXSKQueues-1)
	}
	return nil
}

// checkReserved makes sure a service's rules are in lovelockd's reserved
// names and band, where the operator's cannot collide with them.
func checkReserved(name string, rs []rules.Rule) error {
	for _, r := range rs {
		if !api.IsOwned(r.Name) || r.Priority < api.OwnedPriority {
			return fmt.Errorf("%s: reserved rule %q: want a name starting with %q and priority %d or more", name, r.Name, api.OwnedRulePrefix, api.OwnedPriority)
		}
	}
	return nil
}

// degrade records a way the binding may fall short of its needs: active
// if it does now (then Degraded says so), check to find out again (nil:
// only a new binding fixes it).
func (b *Binding) degrade(why string, active bool, check func() (bool, string, bool)) {
	b.reasons = append(b.reasons, degradation{why: why, active: active, check: check})
	if active {
		b.Degraded = append(b.Degraded, why)
		b.log.Error("service degraded", "service", b.name, "why", why)
	}
}

// Close undoes Bind: the reserved rules are removed, the sockets
// unregistered and closed. It is safe to call more than once.
func (b *Binding) Close() {
	b.steerMu.Lock()
	defer b.steerMu.Unlock()
	b.closed = true
	if b.reserved {
		if _, err := b.steer.Reserve(b.name, nil); err != nil {
			b.log.Error("remove reserved steering rules", "service", b.name, "err", err)
		}
		b.reserved = false
	}
	for _, s := range b.registered {
		if err := b.steer.ClearXSK(s.ifindex, s.queue); err != nil {
			b.log.Error("unregister AF_XDP socket", "service", b.name, "ifindex", s.ifindex, "queue", s.queue, "err", err)
		}
	}
	b.registered = nil
	for _, g := range b.Groups {
		_ = g.Close()
	}
}

// Paths returns what the groups carried, per worker and path.
func (b *Binding) Paths() []transport.PathStats {
	var out []transport.PathStats
	for w, g := range b.Groups {
		out = append(out, g.Paths(w)...)
	}
	return out
}

// String describes the binding for logs.
func (b *Binding) String() string {
	if len(b.Groups) == 0 {
		return "kernel sockets"
	}
	t := b.Groups[0].Transports()[0]
	var ifaces []string
	for _, t := range b.Groups[0].Transports() {
		ifaces = append(ifaces, t.Interface())
	}
	buffers := "single-buffer"
	if t.MultiBuffer() {
		buffers = "multi-buffer"
	}
	return fmt.Sprintf("AF_XDP on %s, %d workers, %s mode, %s, max payload %d", strings.Join(ifaces, ","), len(b.Groups), t.Mode(), buffers, b.Groups[0].MaxPayload())
}
