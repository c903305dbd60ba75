package daemon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/xdp"
)

// agentRestartDelay spaces restarts of a failing messaging agent.
const agentRestartDelay = time.Second

// agentDrain is how long a stopping agent may take to hand on what it
// acknowledged (messaging.AgentOptions.Drain), so that a restart of
// lovelockd under traffic loses no message. It stays well within
// systemd's stop timeout.
const agentDrain = 3 * time.Second

// superviseAgent runs the messaging routing agent of cfg.Messaging until ctx
// ends, starting it again when it fails. A cluster file that does not load
// is retried too: an operator may be fixing it.
func (d *Daemon) superviseAgent(ctx context.Context) {
	for ctx.Err() == nil {
		err := d.runAgent(ctx)
		if ctx.Err() != nil {
			return
		}
		d.agentErr.Store(&err)
		d.log.Error("messaging agent stopped; restarting", "err", err, "in", agentRestartDelay)
		select {
		case <-ctx.Done():
			return
		case <-time.After(agentRestartDelay):
		}
	}
}

func (d *Daemon) runAgent(ctx context.Context) error {
	m := d.cfg.Messaging
	cfg, err := messaging.LoadConfig(m.Cluster)
	if err != nil {
		return err
	}
	opts := messaging.AgentOptions{Logger: d.log.With("service", "messaging"), Drain: agentDrain}
	if m.XDP() {
		groups, stop, err := d.openXDP(cfg)
		if err != nil {
			return err
		}
		defer stop()
		for _, g := range groups {
			opts.Transports = append(opts.Transports, g)
		}
	}
	a, err := messaging.NewAgent(cfg, m.Node, opts)
	if err != nil {
		return err
	}
	d.agent.Store(a)
	defer d.agent.Store(nil)
	d.agentErr.Store(nil)
	d.log.Info("messaging agent", "node", m.Node, "addr", a.Addr(), "mode", cfg.Mode, "workers", cfg.Workers,
		"transfer_size", a.TransferSize(), "transport", m.Transport)
	err = a.Run(ctx)
	if err == nil && ctx.Err() == nil {
		err = errors.New("agent returned")
	}
	return err
}

// openXDP opens the agent's transports for transport xdp: per worker w, an
// AF_XDP socket on queue w of every configured interface and socket w of a
// kernel SO_REUSEPORT group on the agent's address (xdp.OpenGroups). It
// registers the AF_XDP sockets with the steering program and installs
// lovelockd's rules that send each worker's datagrams to its queue. stop
// undoes it all: rules removed, sockets unregistered and closed.
func (d *Daemon) openXDP(cfg messaging.Config) (groups []*xdp.Group, stop func(), err error) {
	m := d.cfg.Messaging
	n, err := cfg.NodeIndex(m.Node)
	if err != nil {
		return nil, nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	agent := cfg.Nodes[n].Agent
	switch {
	case !cfg.Mode.HasAgent():
		return nil, nil, fmt.Errorf("messaging: mode %q has no agent", cfg.Mode)
	case !agent.Addr().Unmap().Is4():
		return nil, nil, fmt.Errorf("messaging: transport xdp: agent address %v: AF_XDP carries IPv4 only", agent)
	case agent.Port() != d.cfg.Port:
		return nil, nil, fmt.Errorf("messaging: transport xdp: agent port %d: the steering program reads Lovelock headers on port %d only (lovelockd's port)",
			agent.Port(), d.cfg.Port)
	case cfg.Workers > bpf.MaxXSKQueues:
		return nil, nil, fmt.Errorf("messaging: transport xdp: %d workers, the steering program's xsk action reaches queues 0..%d",
			cfg.Workers, bpf.MaxXSKQueues-1)
	}
	groups, err = xdp.OpenGroups(xdp.GroupOptions{Interfaces: m.Interfaces, Addr: agent}, cfg.Workers, udp.Options{
		ReadBuffer: cfg.SocketBuffer, WriteBuffer: cfg.SocketBuffer, Steer: messaging.KernelSteer(),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("messaging: transport xdp on %v: %w", m.Interfaces, err)
	}
	type slot struct {
		ifindex int
		queue   uint32
	}
	var registered []slot
	stop = func() {
		d.groups.Store(nil)
		if _, err := d.setOwned(nil); err != nil {
			d.log.Error("messaging: remove lovelockd's steering rules", "err", err)
		}
		d.mu.Lock()
		for _, s := range registered {
			if err := d.node.Steer.ClearXSK(s.ifindex, s.queue); err != nil {
				d.log.Error("messaging: unregister AF_XDP socket", "ifindex", s.ifindex, "queue", s.queue, "err", err)
			}
		}
		d.mu.Unlock()
		for _, g := range groups {
			_ = g.Close()
		}
	}
	d.mu.Lock()
	for _, g := range groups {
		for _, t := range g.Transports() {
			if err = d.node.Steer.SetXSK(t.Ifindex(), t.Queue(), t.FD()); err != nil {
				break
			}
			registered = append(registered, slot{t.Ifindex(), t.Queue()})
		}
	}
	d.mu.Unlock()
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("messaging: %w", err)
	}
	d.groups.Store(&groups)
	d.checkXDPAttached(m.Interfaces)
	owned := api.MessagingRules(agent, cfg.Tenant, cfg.WorkerEndpoints(n), m.Interfaces)
	warnings, err := d.setOwned(owned)
	if err != nil {
		// The kernel sockets still carry everything, only slower.
		d.log.Error("messaging: lovelockd's steering rules do not compile with the operator's; the agent runs on its kernel sockets alone", "err", err)
	}
	for _, w := range warnings {
		d.log.Warn("rules", "warning", w)
	}
	if mp := groups[0].MaxPayload(); cfg.TransferSize > mp {
		d.log.Warn("messaging: transfer_size exceeds what one frame on the agent's interfaces carries: clients' bundles arrive as IP fragments, "+
			"which XDP passes to the stack, and reach the agent through its kernel socket, not AF_XDP", "transfer_size", cfg.TransferSize, "max", mp)
	}
	t := groups[0].Transports()[0]
	d.log.Info("messaging: AF_XDP", "interfaces", m.Interfaces, "workers", cfg.Workers, "mode", t.Mode(),
		"max_payload", groups[0].MaxPayload(), "rules", len(owned))
	return groups, stop, nil
}

// checkXDPAttached warns about agent interfaces without the steering program
// in XDP: their AF_XDP sockets get nothing, the kernel sockets all.
func (d *Daemon) checkXDPAttached(ifaces []string) {
	d.mu.Lock()
	att, err := d.node.Attachments()
	d.mu.Unlock()
	if err != nil {
		return
	}
	for _, i := range ifaces {
		if !slices.ContainsFunc(att, func(a attach.Attachment) bool { return a.Iface == i && a.Hook == attach.HookXDP }) {
			d.log.Warn("messaging: no XDP attachment on an agent interface: its traffic reaches the agent through the kernel socket only",
				"iface", i, "fix", "lovelock iface attach "+i)
		}
	}
}

// MsgStats implements api.Service.
func (d *Daemon) MsgStats() (messaging.Stats, error) {
	a := d.agent.Load()
	if a == nil {
		if d.cfg.Messaging == nil {
			return messaging.Stats{}, &api.NotFoundError{Err: errors.New("this node runs no messaging agent (see 'messaging' in lovelockd's config)")}
		}
		if p := d.agentErr.Load(); p != nil && *p != nil {
			return messaging.Stats{}, fmt.Errorf("the messaging agent is not running: %w", *p)
		}
		return messaging.Stats{}, errors.New("the messaging agent is not running (see lovelockd's log)")
	}
	st := a.Stats()
	st.Transport = d.transportStats()
	return st, nil
}

// transportStats returns what the agent's AF_XDP transports carried, per
// worker and path; nil with transport udp.
func (d *Daemon) transportStats() []messaging.PathStats {
	p := d.groups.Load()
	if p == nil {
		return nil
	}
	var out []messaging.PathStats
	for w, g := range *p {
		st := g.Stats()
		for _, s := range st.Sockets {
			out = append(out, messaging.PathStats{
				Worker: w, Path: "xsk", Interface: s.Interface, Queue: int(s.Queue), Mode: s.Mode.String(),
				RX: s.Transport.RXPackets, TX: s.Transport.TXPackets,
				Dropped: s.Socket.RXDropped + s.Socket.RXRingFull,
			})
		}
		out = append(out, messaging.PathStats{Worker: w, Path: "kernel", RX: st.KernelRX, TX: st.KernelTX + st.KernelFallback, TXFallback: st.KernelFallback})
	}
	return out
}

var _ transport.Transport = (*xdp.Group)(nil)
