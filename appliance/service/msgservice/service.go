// Package msgservice is the messaging service (Buddy) in lovelockd: the
// routing agent of dataplane/messaging on the service frame
// (appliance/service), with its config section, its reserved steering
// rules for AF_XDP, its stats and metrics.
package msgservice

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/lovelock-dpu/lovelock/appliance/service"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
)

// Name is the service's name in lovelockd.
const Name = "messaging"

// Drain is how long a stopping agent may take to hand on what it
// acknowledged (messaging.AgentOptions.Drain), so that a restart of
// lovelockd under traffic loses no message. It stays well within
// systemd's stop timeout.
const Drain = 3 * time.Second

// Service runs a node's messaging routing agent.
type Service struct {
	cfg Config
	log *slog.Logger

	agent   atomic.Pointer[messaging.Agent] // the running agent, if any
	binding atomic.Pointer[service.Binding] // what it runs on
}

// New returns the messaging service of cfg (validated by the caller).
func New(cfg Config, log *slog.Logger) *Service {
	return &Service{cfg: cfg, log: log.With("service", Name)}
}

// Name implements service.Service.
func (s *Service) Name() string { return Name }

// Interfaces implements service.Service.
func (s *Service) Interfaces() []string {
	if !s.cfg.XDP() {
		return nil
	}
	return s.cfg.Interfaces
}

// Plan implements service.Service: it loads the cluster file and, with
// transport xdp, asks for one AF_XDP worker group per agent worker on the
// node's agent address and the rules that steer each worker's endpoint to
// its queue.
func (s *Service) Plan() (service.Needs, error) {
	cluster, err := s.cluster()
	if err != nil || !s.cfg.XDP() {
		return service.Needs{}, err
	}
	n, err := Needs(cluster, s.cfg.Node, s.cfg.Interfaces)
	if err == nil {
		n.XDP.MultiBuffer = s.cfg.MultiBufferOn()
	}
	return n, err
}

// Needs is what an agent of node in cluster needs on AF_XDP on ifaces; the
// benches ask for the same as lovelockd.
func Needs(cluster messaging.Config, node string, ifaces []string) (service.Needs, error) {
	n, err := cluster.NodeIndex(node)
	if err != nil {
		return service.Needs{}, err
	}
	if !cluster.Mode.HasAgent() {
		return service.Needs{}, fmt.Errorf("messaging: mode %q has no agent", cluster.Mode)
	}
	agent := cluster.Nodes[n].Agent
	return service.Needs{
		XDP: &service.XDPNeeds{Interfaces: ifaces, Addr: agent, Workers: cluster.Workers, Kernel: udp.Options{
			ReadBuffer: cluster.SocketBuffer, WriteBuffer: cluster.SocketBuffer, Steer: messaging.KernelSteer(),
		}},
		// Clients' bundles of transfer_size above the MTU arrive in IP
		// fragments, which XDP passes to the stack and the agent reads
		// on its kernel socket; Rules, on the Lovelock type, miss them.
		Rules: append(Rules(agent, cluster.Tenant, cluster.WorkerEndpoints(n), ifaces),
			service.FragmentRules([]netip.Addr{agent.Addr()}, nil)...),
	}, nil
}

func (s *Service) cluster() (messaging.Config, error) {
	cluster, err := messaging.LoadConfig(s.cfg.Cluster)
	if err != nil {
		return messaging.Config{}, err
	}
	return cluster, cluster.Validate()
}

// Run implements service.Service: it runs the agent on b's transports (or
// kernel sockets of its own without them) and drains it on stop.
func (s *Service) Run(ctx context.Context, b *service.Binding) error {
	cluster, err := s.cluster()
	if err != nil {
		return err
	}
	opts := messaging.AgentOptions{Logger: s.log, Drain: Drain, Transports: b.Transports()}
	a, err := messaging.NewAgent(cluster, s.cfg.Node, opts)
	if err != nil {
		return err
	}
	if len(b.Groups) > 0 {
		if mp := b.Groups[0].MaxPayload(); cluster.TransferSize > mp {
			s.log.Warn("transfer_size exceeds what one frame on the agent's interfaces carries: clients' bundles arrive as IP fragments, "+
				"which XDP passes to the stack, and reach the agent through its kernel socket, not AF_XDP", "transfer_size", cluster.TransferSize, "max", mp)
		}
	}
	// Running before the stats show: whoever sees the agent's counters
	// sees it running.
	b.Ready()
	s.binding.Store(b)
	s.agent.Store(a)
	defer s.agent.Store(nil)
	s.log.Info("messaging agent", "node", s.cfg.Node, "addr", a.Addr(), "mode", cluster.Mode, "workers", cluster.Workers,
		"transfer_size", a.TransferSize(), "transport", s.cfg.transport(), "binding", b.String())
	return a.Run(ctx)
}

// Stats implements service.Service.
func (s *Service) Stats() any {
	st, ok := s.AgentStats()
	if !ok {
		return nil
	}
	return st
}

// AgentStats returns the running agent's counters with its transports'
// paths; false while no agent runs.
func (s *Service) AgentStats() (messaging.Stats, bool) {
	a := s.agent.Load()
	if a == nil {
		return messaging.Stats{}, false
	}
	st := a.Stats()
	if b := s.binding.Load(); b != nil {
		st.Transport = b.Paths()
		st.TransportDegraded = b.Reasons()
	}
	return st, true
}

var _ service.Service = (*Service)(nil)
