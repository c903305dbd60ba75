// Package ingestservice is accelerator ingest (Conspirator) in lovelockd,
// on the service frame (appliance/service): the DPU's ingest agent
// (Service, section ingest), with its KServe v2 gRPC front end and its
// reserved steering rules for AF_XDP, and the GPU host's agent
// (HostService, section ingest_host). The protocol and both agents live
// in dataplane/ingest.
package ingestservice

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/lovelock-dpu/lovelock/appliance/service"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/buildinfo"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/agent"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/kserve"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// Name is the DPU ingest agent's service name.
const Name = "ingest"

// socketBuffer is the kernel socket buffer of the agent's sockets: a
// client sends a multi-MiB input as a burst of datagrams, and the socket
// must hold it while the agent copies.
const socketBuffer = 16 << 20

// Service runs a DPU's ingest agent.
type Service struct {
	cfg  Config
	port uint16
	// runDir is lovelockd's run directory (its API socket's), where a
	// registration's handle socket may be unless host_socket says
	// otherwise.
	runDir string
	log    *slog.Logger
	agent  atomic.Pointer[agent.Agent]
	mux    *http.ServeMux
}

// New returns the ingest service of cfg (validated by the caller); port is
// lovelockd's Lovelock port, apiSocket its API socket ("": the default).
func New(cfg Config, port uint16, apiSocket string, log *slog.Logger) *Service {
	if apiSocket == "" {
		apiSocket = api.DefaultSocket
	}
	// A relative --socket would make host_socket's default relative,
	// which the agent refuses: the directory is the one lovelockd runs in.
	if abs, err := filepath.Abs(apiSocket); err == nil {
		apiSocket = abs
	}
	s := &Service{cfg: cfg, port: port, runDir: filepath.Dir(apiSocket), log: log.With("service", Name)}
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("GET /models", s.models)
	return s
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

// Plan implements service.Service: with transport xdp, one AF_XDP worker
// on the uplink and a rule that steers inputs to the agent's address to
// it; with udp, rules that pass inputs and the host's control traffic to
// the kernel above any operator rule.
func (s *Service) Plan() (service.Needs, error) {
	if err := s.cfg.Validate(); err != nil {
		return service.Needs{}, err
	}
	// Inputs from a client that does not size its datagrams to the MTU
	// (lovelock infer --mtu 0) arrive in IP fragments, which Rules, on
	// the Lovelock type or the port, miss.
	frags := service.FragmentRules([]netip.Addr{s.cfg.Listen.Addr(), s.cfg.HostListen.Addr()}, nil)
	n := service.Needs{Rules: append(Rules(s.cfg, s.port), frags...)}
	if s.cfg.XDP() {
		if s.cfg.Listen.Port() != s.port {
			return service.Needs{}, fmt.Errorf("config: ingest: transport xdp needs listen on the Lovelock port %d (steering reads the header there), not %d", s.port, s.cfg.Listen.Port())
		}
		n.XDP = &service.XDPNeeds{Interfaces: s.cfg.Interfaces, Addr: s.cfg.Listen, Workers: 1,
			Kernel: udp.Options{ReadBuffer: socketBuffer, WriteBuffer: socketBuffer}}
	}
	return n, nil
}

// Rules returns the rules the ingest agent reserves: inputs to its listen
// address go to its AF_XDP socket (transport xdp) or to the kernel, and
// the GPU host's control datagrams to host_listen pass to the kernel.
func Rules(cfg Config, port uint16) []rules.Rule {
	var out []rules.Rule
	in, ctrl := wire.TypeIngestInput, wire.TypeIngestCtrl
	act := rules.Pass()
	if cfg.XDP() {
		act = rules.XSK(0)
	}
	if cfg.Listen.Port() == port {
		if cfg.XDP() {
			for _, iface := range cfg.Interfaces {
				out = append(out, rules.Rule{Name: api.OwnedRulePrefix + "ingest/input/" + iface, Priority: api.OwnedPriority,
					Match: rules.Match{Iface: iface, Dst: prefixOf(cfg.Listen.Addr()), Type: &in}, Action: act})
			}
		} else {
			out = append(out, rules.Rule{Name: api.OwnedRulePrefix + "ingest/input", Priority: api.OwnedPriority,
				Match: rules.Match{Dst: prefixOf(cfg.Listen.Addr()), Type: &in}, Action: act})
		}
	} else {
		udpProto, p := uint8(17), cfg.Listen.Port()
		out = append(out, rules.Rule{Name: api.OwnedRulePrefix + "ingest/input", Priority: api.OwnedPriority,
			Match: rules.Match{Dst: prefixOf(cfg.Listen.Addr()), Proto: &udpProto, Dport: &p}, Action: rules.Pass()})
	}
	if cfg.HostListen.Port() == port {
		out = append(out, rules.Rule{Name: api.OwnedRulePrefix + "ingest/host", Priority: api.OwnedPriority,
			Match: rules.Match{Dst: prefixOf(cfg.HostListen.Addr()), Type: &ctrl}, Action: rules.Pass()})
	} else {
		udpProto, p := uint8(17), cfg.HostListen.Port()
		out = append(out, rules.Rule{Name: api.OwnedRulePrefix + "ingest/host", Priority: api.OwnedPriority,
			Match: rules.Match{Dst: prefixOf(cfg.HostListen.Addr()), Proto: &udpProto, Dport: &p}, Action: rules.Pass()})
	}
	return out
}

func prefixOf(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen())
}

// Run implements service.Service: the agent on b's AF_XDP group (or a
// kernel socket of its own), its control socket towards the host, and the
// gRPC front end when configured.
func (s *Service) Run(ctx context.Context, b *service.Binding) error {
	var clients transport.Transport
	if trs := b.Transports(); len(trs) > 0 {
		clients = trs[0]
	} else {
		c, err := udp.Listen(s.cfg.Listen, udp.Options{ReadBuffer: socketBuffer, WriteBuffer: socketBuffer})
		if err != nil {
			return fmt.Errorf("ingest: listen for clients on %v: %w", s.cfg.Listen, err)
		}
		defer c.Close()
		clients = c
	}
	host, err := udp.Listen(s.cfg.HostListen, udp.Options{ReadBuffer: 1 << 20, WriteBuffer: 1 << 20})
	if err != nil {
		return fmt.Errorf("ingest: listen for the GPU host on %v: %w", s.cfg.HostListen, err)
	}
	defer host.Close()
	cfg := s.cfg.agentConfig()
	if err := s.cfg.hostDefaults(&cfg, s.runDir, net.InterfaceAddrs); err != nil {
		return err
	}
	imp := newImporter()
	defer imp.Close()
	cfg.Clients, cfg.Host, cfg.Importer, cfg.Logger = clients, host, imp, s.log
	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	var grpcLn net.Listener
	if s.cfg.GRPC != "" {
		if grpcLn, err = net.Listen("tcp", s.cfg.GRPC); err != nil {
			return fmt.Errorf("ingest: gRPC listen on %s: %w", s.cfg.GRPC, err)
		}
	}
	s.agent.Store(a)
	defer s.agent.Store(nil)
	s.log.Info("ingest agent", "listen", s.cfg.Listen, "host_listen", s.cfg.HostListen, "host_peer", cfg.HostPeer, "host_socket", cfg.HostSocket, "grpc", s.cfg.GRPC, "transport", s.transport(), "models", len(cfg.Models))
	b.Ready()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var grpcErr error
	if grpcLn != nil {
		opts := s.cfg.kserveOptions(buildinfo.Version)
		srv := kserve.NewGRPCServer(a, a, opts)
		grpcLn = opts.Listener(grpcLn)
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := srv.Serve(grpcLn); err != nil && ctx.Err() == nil {
				grpcErr = fmt.Errorf("ingest: gRPC front end: %w", err)
				cancel()
			}
		}()
		go func() { defer wg.Done(); <-ctx.Done(); srv.Stop() }()
	}
	err = a.Run(ctx)
	cancel()
	wg.Wait()
	if err == nil && grpcErr != nil {
		err = grpcErr
	}
	return err
}

func (s *Service) transport() string {
	if s.cfg.XDP() {
		return "xdp"
	}
	return "udp"
}

// Stats implements service.Service: agent.Stats.
func (s *Service) Stats() any {
	if a := s.agent.Load(); a != nil {
		return a.Stats()
	}
	return nil
}

// ServeHTTP serves the service's calls under /v1/services/ingest/.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

func (s *Service) models(w http.ResponseWriter, r *http.Request) {
	a := s.agent.Load()
	if a == nil {
		api.Reply(w, nil, errors.New("the ingest agent is not running (see lovelock services)"))
		return
	}
	api.Reply(w, a.Models(), nil)
}

var _ service.Service = (*Service)(nil)
