package ingestservice

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/agent"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/sched"
)

// Config is the ingest section of lovelockd's configuration: the node (a
// DPU in front of a GPU host, dpu2 on the testbed) runs the ingest agent.
//
//	ingest:
//	  listen: 10.77.0.12:61440        # clients send inputs here (the uplink)
//	  host_listen: 10.77.12.2:61441   # the GPU host's agent registers here
//	  grpc: 10.77.0.12:8001           # KServe v2 front end (optional)
//	  transport: xdp                  # or udp (default)
//	  interfaces: [p0]                # AF_XDP sockets (transport xdp)
//	  models: [{name: checksum}, {name: mlp}]
//	  tenants: [{id: 1, models: [mlp], pool: a}]
//	  pools: {a: [0]}
type Config struct {
	Listen     netip.AddrPort   `json:"listen"`
	HostListen netip.AddrPort   `json:"host_listen"`
	GRPC       string           `json:"grpc,omitempty"`
	Transport  string           `json:"transport,omitempty"`
	Interfaces []string         `json:"interfaces,omitempty"`
	Models     []ModelConfig    `json:"models"`
	Tenants    []TenantConfig   `json:"tenants,omitempty"`
	Pools      map[string][]int `json:"pools,omitempty"`
	// Policy is the MIG placement policy: lovelock (default), firstfit,
	// bestfit or naive.
	Policy   string          `json:"policy,omitempty"`
	Reconfig farmem.Duration `json:"reconfig,omitempty"`
	// PlanNodes bounds the scheduler's exact planning of requests that
	// wait together (default 2000 search nodes, about 0.2 ms; -1: off).
	PlanNodes   int             `json:"plan_nodes,omitempty"`
	QueueLimit  int             `json:"queue_limit,omitempty"`
	Buffer      farmem.Size     `json:"buffer,omitempty"`
	HostTimeout farmem.Duration `json:"host_timeout,omitempty"`
	// GRPCMaxMessage is the largest gRPC request accepted (default 64MiB).
	GRPCMaxMessage farmem.Size `json:"grpc_max_message,omitempty"`
}

// ModelConfig is one model the agent serves.
type ModelConfig struct {
	Name     string          `json:"name"`
	Compute  int             `json:"compute,omitempty"`
	MemGB    int             `json:"mem_gb,omitempty"`
	Profile  string          `json:"profile,omitempty"`
	Duration farmem.Duration `json:"duration,omitempty"`
	MaxInput farmem.Size     `json:"max_input,omitempty"`
}

// TenantConfig grants a tenant models and a pool.
type TenantConfig struct {
	ID     uint32   `json:"id"`
	Models []string `json:"models"`
	Pool   string   `json:"pool,omitempty"`
}

// XDP reports whether the agent takes inputs through AF_XDP.
func (c *Config) XDP() bool { return c.Transport == "xdp" }

// Validate checks the section.
func (c *Config) Validate() error {
	switch {
	case !c.Listen.IsValid() || c.Listen.Port() == 0:
		return fmt.Errorf("config: ingest: listen %q: want the address and port clients send inputs to, e.g. 10.77.0.12:61440", c.Listen)
	case !c.HostListen.IsValid() || c.HostListen.Port() == 0:
		return fmt.Errorf("config: ingest: host_listen %q: want the address and port the GPU host's agent registers with, e.g. 10.77.12.2:61441", c.HostListen)
	case c.HostListen == c.Listen:
		return errors.New("config: ingest: host_listen equals listen: give the host's control channel an address or port of its own")
	case c.Transport != "" && c.Transport != "udp" && c.Transport != "xdp":
		return fmt.Errorf("config: ingest: transport %q: want udp or xdp", c.Transport)
	case c.XDP() && len(c.Interfaces) == 0:
		return errors.New("config: ingest: transport xdp needs interfaces (the DPU's uplink, e.g. [p0])")
	case len(c.Models) == 0:
		return fmt.Errorf("config: ingest: no models: list at least one (built in: %v)", model.BuiltinNames())
	}
	if c.Policy != "" {
		if _, err := sched.ParsePolicy(c.Policy); err != nil {
			return fmt.Errorf("config: ingest: %w", err)
		}
	}
	if err := c.agentConfig().Validate(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return nil
}

// agentConfig is the agent's configuration but for its transports and
// importer.
func (c *Config) agentConfig() agent.Config {
	pol := sched.Lovelock
	if c.Policy != "" {
		pol, _ = sched.ParsePolicy(c.Policy)
	}
	cfg := agent.Config{Pools: c.Pools, Policy: pol, Reconfig: c.Reconfig.D(), PlanNodes: c.PlanNodes,
		QueueLimit: c.QueueLimit, BufferBytes: int(c.Buffer), HostTimeout: c.HostTimeout.D()}
	for _, m := range c.Models {
		cfg.Models = append(cfg.Models, agent.ModelConfig{Name: m.Name, Compute: m.Compute, MemGB: m.MemGB, Profile: m.Profile, Duration: m.Duration.D(), MaxInput: int(m.MaxInput)})
	}
	for _, t := range c.Tenants {
		cfg.Tenants = append(cfg.Tenants, agent.TenantConfig{ID: t.ID, Models: t.Models, Pool: t.Pool})
	}
	return cfg
}

// HostConfig is the ingest_host section: the node is a GPU host (gpu0 on
// the testbed) whose GPUs take inputs from its DPU.
//
//	ingest_host:
//	  listen: 10.77.12.1:61441
//	  dpu: 10.77.12.2:61441
//	  device: shm                      # or cuda
//	  gpus: [{card: H100-80GB}]        # shm: the GPUs to stand in for
//	  socket: /run/lovelock/ingest.sock
//	  models: [checksum, mlp]
type HostConfig struct {
	Listen netip.AddrPort `json:"listen"`
	DPU    netip.AddrPort `json:"dpu"`
	// Device is shm (shared memory standing in for GPUs: the testbed and
	// CI) or cuda (the machine's NVIDIA GPUs through the driver API).
	Device string `json:"device,omitempty"`
	// GPUs: with shm, the GPUs to stand in for (their MIG card); with
	// cuda, optional overrides of the card of each GPU by index.
	GPUs       []GPUConfig `json:"gpus,omitempty"`
	Socket     string      `json:"socket"`
	Models     []string    `json:"models"`
	SlotInput  farmem.Size `json:"slot_input,omitempty"`
	SlotOutput farmem.Size `json:"slot_output,omitempty"`
	// Heartbeat is how often the host agent registers with its DPU.
	Heartbeat farmem.Duration `json:"heartbeat,omitempty"`
}

// GPUConfig is one GPU of the host.
type GPUConfig struct {
	Card string `json:"card"`
}

// Validate checks the section.
func (c *HostConfig) Validate() error {
	switch {
	case !c.Listen.IsValid() || c.Listen.Port() == 0:
		return fmt.Errorf("config: ingest_host: listen %q: want the host's address and port towards its DPU, e.g. 10.77.12.1:61441", c.Listen)
	case !c.DPU.IsValid() || c.DPU.Port() == 0:
		return fmt.Errorf("config: ingest_host: dpu %q: want the DPU ingest agent's host_listen address, e.g. 10.77.12.2:61441", c.DPU)
	case c.Device != "" && c.Device != "shm" && c.Device != "cuda":
		return fmt.Errorf("config: ingest_host: device %q: want shm or cuda", c.Device)
	case c.device() == "shm" && len(c.GPUs) == 0:
		return errors.New("config: ingest_host: device shm needs gpus: the GPUs it stands in for, e.g. [{card: H100-80GB}]")
	case c.Socket == "":
		return errors.New("config: ingest_host: socket is empty: name the unix socket the DPU fetches buffer handles from, e.g. /run/lovelock/ingest.sock")
	case len(c.Models) == 0:
		return fmt.Errorf("config: ingest_host: no models: list the models this host runs (built in: %v)", model.BuiltinNames())
	}
	for i, g := range c.GPUs {
		if g.Card == "" && c.device() == "cuda" {
			continue
		}
		if _, err := mig.CardByName(g.Card); err != nil {
			return fmt.Errorf("config: ingest_host: gpus[%d]: %w", i, err)
		}
	}
	for _, m := range c.Models {
		if _, err := model.Builtin(m); err != nil {
			return fmt.Errorf("config: ingest_host: %w", err)
		}
	}
	return nil
}

func (c *HostConfig) device() string {
	if c.Device == "" {
		return "shm"
	}
	return c.Device
}
