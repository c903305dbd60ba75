package memservice

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/appliance/service"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem/fmap"
)

// HostName is the far-memory host agent's service name.
const HostName = "memhost"

// DefaultHostSocket is where programs on a host reach the host agent.
const DefaultHostSocket = "/run/lovelock/farmem.sock"

// HostConfig is the far_memory_host section: the node is a host, and
// lovelockd runs its far-memory host agent, which serves the transparent
// mappings (fmap.Map) of every program on the node. The faults of a
// program's mapping are served here, in another process than the program,
// so they never wait on the program's own Go scheduler (docs/farmem-mapping.md).
type HostConfig struct {
	farmem.Config
	// Agent is the far-memory agent of the node's DPU (its far_memory
	// listen address), or a memory node directly.
	Agent netip.AddrPort `json:"agent"`
	// Tenant goes into every request of the node's mappings.
	Tenant uint32 `json:"tenant,omitempty"`
	// Socket is the unix socket programs map through (mode 0600: root's
	// programs only). Default DefaultHostSocket.
	Socket string `json:"socket,omitempty"`
}

// Validate checks the section.
func (c *HostConfig) Validate() error {
	if !c.Agent.IsValid() || c.Agent.Port() == 0 {
		return fmt.Errorf("config: far_memory_host: agent %q: want the DPU's far-memory agent address, e.g. 10.77.0.10:61440", c.Agent)
	}
	if err := c.Config.Validate(); err != nil {
		return fmt.Errorf("config: far_memory_host: %w", err)
	}
	return nil
}

func (c *HostConfig) socket() string {
	if c.Socket == "" {
		return DefaultHostSocket
	}
	return c.Socket
}

// HostService runs a host's far-memory host agent.
type HostService struct {
	cfg    HostConfig
	log    *slog.Logger
	client atomic.Pointer[farmem.Client]
	maps   atomic.Int64
}

// NewHost returns the host agent of cfg (validated by the caller).
func NewHost(cfg HostConfig, log *slog.Logger) *HostService {
	return &HostService{cfg: cfg, log: log.With("service", HostName)}
}

// Name implements service.Service.
func (s *HostService) Name() string { return HostName }

// Interfaces implements service.Service.
func (s *HostService) Interfaces() []string { return nil }

// Plan implements service.Service.
func (s *HostService) Plan() (service.Needs, error) { return service.Needs{}, s.cfg.Validate() }

// Run implements service.Service: a far-memory client towards the agent,
// and the mapping socket, until ctx ends; every mapping's dirty chunks are
// written back before it returns.
func (s *HostService) Run(ctx context.Context, b *service.Binding) error {
	cl, err := farmem.NewClient(farmem.ClientOptions{Config: s.cfg.Config, Tenant: s.cfg.Tenant, Server: s.cfg.Agent, Logger: s.log})
	if err != nil {
		return err
	}
	defer cl.Close()
	ln, err := listenUnix(s.cfg.socket())
	if err != nil {
		return err
	}
	s.client.Store(cl)
	defer s.client.Store(nil)
	s.log.Info("far-memory host agent", "socket", s.cfg.socket(), "agent", s.cfg.Agent, "tenant", s.cfg.Tenant)
	open := func(ctx context.Context, ref fmap.RegionRef) (fmap.Backend, error) {
		if ref.ID == 0 || ref.ID > math.MaxUint32 {
			return nil, fmt.Errorf("region %d: not a far-memory region ID (see 'lovelock mem regions')", ref.ID)
		}
		r, err := cl.Open(ctx, uint32(ref.ID), !ref.ReadOnly)
		if err != nil {
			return nil, err
		}
		s.maps.Add(1)
		return &countedRegion{Region: r, open: &s.maps}, nil
	}
	// Programs' connections wait in the listener's backlog until Serve
	// accepts them.
	b.Ready()
	return (&fmap.Agent{Logger: s.log}).Serve(ctx, ln, open)
}

// countedRegion counts a mapping's region while it is open.
type countedRegion struct {
	*farmem.Region
	open *atomic.Int64
}

func (r *countedRegion) Close() error {
	r.open.Add(-1)
	return r.Region.Close()
}

// ReadAt marks the errors no retry can fix with fmap.ErrLost, so that the
// mapping poisons the chunk at once instead of retrying for its fetch
// timeout: the region is gone, or never was this tenant's.
func (r *countedRegion) ReadAt(p []byte, off int64) (int, error) {
	n, err := r.Region.ReadAt(p, off)
	if farmem.Lost(err) {
		err = fmt.Errorf("%w (%w)", err, fmap.ErrLost)
	}
	return n, err
}

// WriteAt marks them too: a write-back that can never land (the region is
// gone, or another writer got it after this one's lease lapsed) poisons its
// chunk instead of staying dirty in the program's buffer for good.
func (r *countedRegion) WriteAt(p []byte, off int64) (int, error) {
	n, err := r.Region.WriteAt(p, off)
	if farmem.Lost(err) {
		err = fmt.Errorf("%w (%w)", err, fmap.ErrLost)
	}
	return n, err
}

// listenUnix listens on path, mode 0600, replacing a socket nobody answers
// on and refusing one a live process serves.
func listenUnix(path string) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("far-memory host socket: %w", err)
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return nil, fmt.Errorf("far-memory host socket %s: another host agent serves it; stop it or set far_memory_host.socket", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("far-memory host socket: remove stale %s: %w", path, err)
	}
	old := unix.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("far-memory host socket: %w", err)
	}
	return ln, nil
}

// Stats implements service.Service: api.MemHostStats.
func (s *HostService) Stats() any {
	st, ok := s.stats()
	if !ok {
		return nil
	}
	return st
}

func (s *HostService) stats() (api.MemHostStats, bool) {
	cl := s.client.Load()
	if cl == nil {
		return api.MemHostStats{}, false
	}
	return api.MemHostStats{Agent: s.cfg.Agent.String(), Socket: s.cfg.socket(), Mappings: s.maps.Load(), Client: cl.Stats()}, true
}

var _ service.Service = (*HostService)(nil)
