package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/sched"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
)

// Config sets up a DPU ingest agent.
type Config struct {
	// Clients is where clients' inputs arrive and results leave (AF_XDP
	// on the DPU's uplink, or kernel UDP).
	Clients transport.Transport
	// Host is the control socket towards the GPU host's agent.
	Host transport.Transport
	// HostPeer is where the GPU host's agent sends from: control
	// datagrams from outside it are dropped unread and counted
	// (Stats.HostRefused), so no other peer that reaches Host can
	// register a host in its place or redirect its doorbells. An address
	// is a /32 (/128) prefix. Required.
	HostPeer netip.Prefix
	// HostSocket is the handle socket a registration may name, the one
	// the agent dials to fetch the host's buffers: an absolute path, or
	// a directory ending in "/" for any socket directly in it (writable
	// only by trusted users). A registration naming another is refused
	// and counted. Required.
	HostSocket string
	// Importer maps the buffers the host registers (devmem.ShmImporter
	// on the testbed).
	Importer devmem.Importer
	// Models are the models the agent accepts requests for.
	Models []ModelConfig
	// Tenants are granted models and a GPU pool. Empty: every tenant may
	// use every model on every GPU (one pool), which suits a single
	// trusted site and nothing else.
	Tenants []TenantConfig
	// Pools partition the host's GPUs by index; a tenant's requests land
	// only on its pool's GPUs. Empty: one pool, "default", of all GPUs.
	Pools map[string][]int
	// Policy places requests on MIG slices (default sched.Lovelock).
	Policy sched.Policy
	// Reconfig is the cost of creating a MIG instance on idle slices.
	Reconfig time.Duration
	// PlanNodes is the search budget of the scheduler's windowed planner
	// (sched.Window.Nodes) when requests wait together: it runs under the
	// agent's lock on the request path, so the default, 2000 nodes, caps
	// a plan near 0.2 ms (docs/scheduling.md: about 2 % from the optimum
	// on its window class, against 0.1 % at the offline default).
	// Negative turns the planner off.
	PlanNodes int
	// QueueLimit is the most requests waiting for a slice per pool
	// (default 1024); beyond it a request is refused as overloaded.
	QueueLimit int
	// BufferBytes is the DPU memory for inputs being received or waiting
	// for a slice (default 256 MiB); beyond it new requests are refused
	// as overloaded.
	BufferBytes int
	// ReassemblyTimeout drops a request whose fragments stopped coming
	// (default 1 s); the client's retransmission starts it again.
	ReassemblyTimeout time.Duration
	// DoorbellTimeout is how long the agent waits for a completion before
	// ringing again (default 250 ms), DoorbellRetries how often it rings
	// before it gives up on the host (default 8).
	DoorbellTimeout time.Duration
	DoorbellRetries int
	// HostTimeout is how long without a registration heartbeat before the
	// host counts as gone (default 2 s).
	HostTimeout time.Duration
	// ResultTTL is how long a result is kept to answer a retransmitted
	// request (default 3 s).
	ResultTTL time.Duration
	// ResultBytes bounds the memory of kept results (default 64 MiB).
	ResultBytes int
	Logger      *slog.Logger
}

// ModelConfig is one model the agent serves.
type ModelConfig struct {
	Name string
	// Compute and MemGB say which MIG profile its requests need: the
	// smallest with that many compute slices and that much memory
	// (default 1 slice).
	Compute int
	MemGB   int
	// Profile names an exact profile instead (e.g. "1g.10gb").
	Profile string
	// Duration is the expected run time of one request, the scheduler's
	// estimate until it has measured some (default 1 ms).
	Duration time.Duration
	// MaxInput is the largest input accepted (default: the host's slot
	// input size).
	MaxInput int
}

// TenantConfig grants a tenant models and a pool.
type TenantConfig struct {
	ID     uint32
	Models []string
	Pool   string // default "default"
}

// DefaultPool is the pool of all GPUs when no pools are configured.
const DefaultPool = "default"

// Validate checks the settings (not the transports), as New will.
func (c Config) Validate() error { return c.defaults() }

func (c *Config) defaults() error {
	if err := c.hostChecks(); err != nil {
		return err
	}
	if len(c.Models) == 0 {
		return fmt.Errorf("ingest agent: no models: configure at least one (built in: %v)", model.BuiltinNames())
	}
	seen := map[string]bool{}
	for i := range c.Models {
		m := &c.Models[i]
		if m.Name == "" || len(m.Name) > ingest.MaxModelName {
			return fmt.Errorf("ingest agent: model %d: name %q: want 1..%d bytes", i, m.Name, ingest.MaxModelName)
		}
		if seen[m.Name] {
			return fmt.Errorf("ingest agent: model %s configured twice", m.Name)
		}
		seen[m.Name] = true
		if m.Compute == 0 && m.Profile == "" {
			m.Compute = 1
		}
		if m.Duration == 0 {
			m.Duration = time.Millisecond
		}
		if m.Duration < 0 || m.MaxInput < 0 || m.Compute < 0 || m.MemGB < 0 {
			return fmt.Errorf("ingest agent: model %s: negative setting", m.Name)
		}
	}
	if len(c.Pools) == 0 {
		c.Pools = map[string][]int{DefaultPool: nil} // nil: every GPU
	}
	for i := range c.Tenants {
		t := &c.Tenants[i]
		if t.Pool == "" {
			t.Pool = DefaultPool
		}
		if _, ok := c.Pools[t.Pool]; !ok {
			return fmt.Errorf("ingest agent: tenant %d: no pool %q (pools: %v)", t.ID, t.Pool, poolNames(c.Pools))
		}
		for _, m := range t.Models {
			if !seen[m] {
				return fmt.Errorf("ingest agent: tenant %d: model %q is not configured", t.ID, m)
			}
		}
	}
	if c.Reconfig < 0 {
		// The scheduler would start work before it is placed; it refuses
		// it too, but only once a GPU host registers.
		return fmt.Errorf("ingest agent: reconfig %v is negative: use 0 (MIG instances ready at once) or the time creating one takes", c.Reconfig)
	}
	if len(c.Tenants) == 0 && len(c.Pools) > 1 {
		return errors.New("ingest agent: several pools but no tenants: grant each tenant a pool")
	}
	if c.PlanNodes == 0 {
		c.PlanNodes = 2000
	}
	if c.QueueLimit == 0 {
		c.QueueLimit = 1024
	}
	if c.BufferBytes == 0 {
		c.BufferBytes = 256 << 20
	}
	if c.ReassemblyTimeout == 0 {
		c.ReassemblyTimeout = time.Second
	}
	if c.DoorbellTimeout == 0 {
		c.DoorbellTimeout = 250 * time.Millisecond
	}
	if c.DoorbellRetries == 0 {
		c.DoorbellRetries = 8
	}
	if c.HostTimeout == 0 {
		c.HostTimeout = 2 * time.Second
	}
	if c.ResultTTL == 0 {
		c.ResultTTL = 3 * time.Second
	}
	if c.ResultBytes == 0 {
		c.ResultBytes = 64 << 20
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// hostChecks validates HostPeer and HostSocket where they are set; New
// requires them (lovelockd fills in defaults before).
func (c *Config) hostChecks() error {
	if c.HostSocket != "" {
		p := strings.TrimSuffix(c.HostSocket, "/")
		if p == "" {
			p = "/"
		}
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return fmt.Errorf("ingest agent: host_socket %q: want an absolute path without . or .. (the GPU host's ingest_host socket, e.g. /run/lovelock/ingest.sock), or its directory ending in /", c.HostSocket)
		}
	}
	if c.HostPeer.IsValid() && c.HostPeer != c.HostPeer.Masked() {
		return fmt.Errorf("ingest agent: host_peer %v has host bits set: want the GPU host's address (%v) or its network (%v)",
			c.HostPeer, c.HostPeer.Addr(), c.HostPeer.Masked())
	}
	return nil
}

// hostRequired refuses a config that does not say which GPU host the
// agent serves.
func (c *Config) hostRequired() error {
	switch {
	case !c.HostPeer.IsValid():
		return errors.New("ingest agent: no host_peer: name the GPU host's address (its ingest_host listen address) or its link's prefix, e.g. 10.77.12.1 or 10.77.12.0/24")
	case c.HostSocket == "":
		return errors.New("ingest agent: no host_socket: name the GPU host's handle socket (its ingest_host socket, e.g. /run/lovelock/ingest.sock) or its directory ending in /")
	}
	return nil
}

// socketAllowed reports whether a registration may make the agent dial
// the handle socket path.
func (c *Config) socketAllowed(path string) bool {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return false // .. or // would let a path leave the allowed directory
	}
	if dir, ok := strings.CutSuffix(c.HostSocket, "/"); ok {
		if dir == "" {
			dir = "/"
		}
		return filepath.Dir(path) == dir
	}
	return path == c.HostSocket
}

func poolNames(p map[string][]int) []string {
	var out []string
	for k := range p {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// tenantGrant returns the pool a tenant's request for mdl goes to, or the
// refusal.
func (c *Config) tenantGrant(tenant uint32, mdl string) (string, error) {
	if len(c.Tenants) == 0 {
		return DefaultPool, nil
	}
	for _, t := range c.Tenants {
		if t.ID != tenant {
			continue
		}
		if !slices.Contains(t.Models, mdl) {
			return "", ingest.Errorf(ingest.StatusNotGranted, "tenant %d is not granted model %s (granted: %v)", tenant, mdl, t.Models)
		}
		return t.Pool, nil
	}
	return "", ingest.Errorf(ingest.StatusNotGranted, "tenant %d has no grant on this DPU: ask its operator to add it to the ingest tenants", tenant)
}
