package memservice

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync/atomic"

	"github.com/lovelock-dpu/lovelock/appliance/service"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// AgentName is the far-memory agent's service name.
const AgentName = "farmem"

// AgentService runs a DPU's far-memory agent on kernel UDP sockets: one
// on its listen address for the host's processes, one towards the memory
// nodes. (AF_XDP sockets would need a second local address on the Lovelock
// port for the memory nodes' replies, beside the messaging agent's, and
// bench-mem found them no faster at equal datagram sizes: docs/farmem.md.)
type AgentService struct {
	cfg   AgentConfig
	port  uint16
	log   *slog.Logger
	agent atomic.Pointer[farmem.Agent]
}

// NewAgent returns the far-memory agent of cfg (validated by the caller);
// port is lovelockd's Lovelock port.
func NewAgent(cfg AgentConfig, port uint16, log *slog.Logger) *AgentService {
	return &AgentService{cfg: cfg, port: port, log: log.With("service", AgentName)}
}

// Name implements service.Service.
func (s *AgentService) Name() string { return AgentName }

// Interfaces implements service.Service.
func (s *AgentService) Interfaces() []string { return nil }

// Plan implements service.Service: rules that pass the agent's traffic to
// the kernel whatever the operator's set says.
func (s *AgentService) Plan() (service.Needs, error) {
	if err := s.cfg.Validate(); err != nil {
		return service.Needs{}, err
	}
	return service.Needs{Rules: append(AgentRules(s.cfg.AgentConfig, s.port), AgentFragmentRules(s.cfg.AgentConfig)...)}, nil
}

// AgentFragmentRules returns the rules that pass the IP fragments of the
// agent's datagrams: requests to its listen address and the memory nodes'
// replies. Datagrams of up to max_datagram (8972 bytes by default) are
// fragmented on a 1500-byte MTU, and AgentRules, on the Lovelock type or
// the source port, miss fragments, which carry neither.
func AgentFragmentRules(cfg farmem.AgentConfig) []rules.Rule {
	var from []netip.Addr
	for _, srv := range cfg.Servers {
		from = append(from, srv.Addr.Addr())
	}
	return service.FragmentRules([]netip.Addr{cfg.Listen.Addr()}, from)
}

// AgentRules returns the rules the agent reserves: the host processes'
// requests to its listen address (when that is on the Lovelock port, where
// steering reads the type) and the memory nodes' datagrams from their
// addresses pass to the kernel, above any operator rule (a default of drop
// would otherwise starve far memory without a word). Plan adds
// AgentFragmentRules.
func AgentRules(cfg farmem.AgentConfig, port uint16) []rules.Rule {
	var out []rules.Rule
	// The host rules and the server rules overlap (a memory node on the
	// Lovelock port sending to the listen address): one priority above
	// the other, as the rule compiler wants, both pass.
	rule := func(name string, prio uint32, m rules.Match) {
		out = append(out, rules.Rule{Name: api.OwnedRulePrefix + "mem/" + name, Priority: prio, Match: m, Action: rules.Pass()})
	}
	host := prefixOf(cfg.Listen.Addr())
	if cfg.Listen.Port() == port {
		for _, typ := range []wire.Type{wire.TypeMemRead, wire.TypeMemWrite} {
			typ := typ
			rule("host/"+typ.String(), api.OwnedPriority, rules.Match{Dst: host, Type: &typ})
		}
	} else {
		udp, p := uint8(17), cfg.Listen.Port()
		rule("host", api.OwnedPriority, rules.Match{Dst: host, Proto: &udp, Dport: &p})
	}
	for i, srv := range cfg.Servers {
		udp, p := uint8(17), srv.Addr.Port()
		rule(fmt.Sprintf("server%d", i), api.OwnedPriority+1, rules.Match{Src: prefixOf(srv.Addr.Addr()), Proto: &udp, Sport: &p})
	}
	return out
}

func prefixOf(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen())
}

// Run implements service.Service.
func (s *AgentService) Run(ctx context.Context, b *service.Binding) error {
	a, err := farmem.NewAgent(s.cfg.AgentConfig, farmem.AgentOptions{Logger: s.log})
	if err != nil {
		return err
	}
	s.agent.Store(a)
	defer s.agent.Store(nil)
	s.log.Info("far-memory agent", "listen", a.Addr(), "servers", len(s.cfg.Servers), "chunk_size", s.cfg.WithDefaults().ChunkSize)
	b.Ready()
	return a.Run(ctx)
}

// Stats implements service.Service: farmem.AgentStats.
func (s *AgentService) Stats() any {
	if a := s.agent.Load(); a != nil {
		return a.Stats()
	}
	return nil
}

var _ service.Service = (*AgentService)(nil)
