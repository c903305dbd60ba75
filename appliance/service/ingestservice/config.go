package ingestservice

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strings"

	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/agent"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/kserve"
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
//	  host_peer: 10.77.12.1           # ... from here only (default: host_listen's link)
//	  host_socket: /run/lovelock/     # naming a handle socket here (default: lovelockd's run directory)
//	  grpc: 10.77.0.12:8001           # KServe v2 front end (optional)
//	  transport: xdp                  # or udp (default)
//	  interfaces: [p0]                # AF_XDP sockets (transport xdp)
//	  models: [{name: checksum}, {name: mlp}]
//	  tenants: [{id: 1, models: [mlp], pool: a}]
//	  pools: {a: [0]}
type Config struct {
	Listen     netip.AddrPort `json:"listen"`
	HostListen netip.AddrPort `json:"host_listen"`
	// HostPeer is the address (or prefix) the GPU host's agent sends
	// from, its ingest_host listen address: control datagrams from
	// elsewhere are ignored, counted (host_refused) and logged once per
	// source. Default: the network of the interface that holds
	// host_listen's address, the host link (10.77.12.0/24 for dpu2 on the
	// testbed).
	HostPeer string `json:"host_peer,omitempty"`
	// HostSocket is the handle socket a registration may name, the one
	// the agent dials for the host's buffers (ingest_host socket): a
	// path, or a directory ending in / for any socket directly in it.
	// Default: the directory of lovelockd's API socket (/run/lovelock/),
	// where the GPU host agent's socket is on the testbed and in the docs.
	HostSocket string           `json:"host_socket,omitempty"`
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
	// GRPCMaxMessage is the largest gRPC request accepted; default: the
	// largest input a model takes (its max_input; 8 MiB, the GPU host's
	// default slot_input, for a model without one) plus 1 MiB. Raise it
	// with the host's slot_input.
	GRPCMaxMessage farmem.Size `json:"grpc_max_message,omitempty"`
	// GRPCMaxStreams bounds the calls in progress on one gRPC connection
	// (default 16), GRPCMaxConnections the connections served at once
	// (default 16; more wait to be accepted).
	GRPCMaxStreams     int `json:"grpc_max_streams,omitempty"`
	GRPCMaxConnections int `json:"grpc_max_connections,omitempty"`
	// GRPCMemoryBudget bounds the memory gRPC ModelInfer calls hold at
	// once while their messages are decoded and converted (up to
	// kserve.DecodeExpansion times a message's size) and then handed on;
	// a call that finds too little waits briefly, then fails
	// RESOURCE_EXHAUSTED for the client to retry. Default: 4 times what
	// the largest message may take (about 1.1 GiB for 9 MiB messages); at
	// least once that.
	GRPCMemoryBudget farmem.Size `json:"grpc_memory_budget,omitempty"`
}

// defaultSlotInput is the GPU host's default slot_input
// (hostagent.Config.SlotInput), which the DPU cannot know before the host
// registers.
const defaultSlotInput = 8 << 20

// kserveOptions are the gRPC front end's options: its message limit is
// the largest input a model may take plus kserve.MsgOverhead unless
// grpc_max_message says otherwise.
func (c *Config) kserveOptions(version string) kserve.Options {
	largest := 0
	for _, m := range c.Models {
		in := int(m.MaxInput)
		if in <= 0 || in > defaultSlotInput {
			in = defaultSlotInput
		}
		largest = max(largest, in)
	}
	return kserve.Options{Version: version, MaxRecvMsgSize: int(c.GRPCMaxMessage), MaxInput: largest,
		MaxConcurrentStreams: uint32(c.GRPCMaxStreams), MaxConnections: c.GRPCMaxConnections, MemoryBudget: int64(min(c.GRPCMemoryBudget, math.MaxInt64))}
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
	case c.Listen.Addr().IsUnspecified():
		// Clients take results only from the address they sent to, and a
		// socket bound to every address may answer from another one.
		return fmt.Errorf("config: ingest: listen %v is every address: name the one clients send inputs to, e.g. 10.77.0.12:61440 (results leave from it, and clients take them from it alone)", c.Listen)
	case !c.HostListen.IsValid() || c.HostListen.Port() == 0:
		return fmt.Errorf("config: ingest: host_listen %q: want the address and port the GPU host's agent registers with, e.g. 10.77.12.2:61441", c.HostListen)
	case c.HostListen == c.Listen:
		return errors.New("config: ingest: host_listen equals listen: give the host's control channel an address or port of its own")
	case c.HostPeer != "" && !c.hostPeer().IsValid():
		return fmt.Errorf("config: ingest: host_peer %q: want the GPU host's address (its ingest_host listen address, e.g. 10.77.12.1) or its link's prefix (e.g. 10.77.12.0/24)", c.HostPeer)
	case c.Transport != "" && c.Transport != "udp" && c.Transport != "xdp":
		return fmt.Errorf("config: ingest: transport %q: want udp or xdp", c.Transport)
	case c.XDP() && len(c.Interfaces) == 0:
		return errors.New("config: ingest: transport xdp needs interfaces (the DPU's uplink, e.g. [p0])")
	case c.GRPCMaxStreams < 0 || c.GRPCMaxConnections < 0 || c.GRPCMaxStreams > math.MaxUint32:
		return fmt.Errorf("config: ingest: grpc_max_streams %d, grpc_max_connections %d: want 0 (the default, 16 each) or more",
			c.GRPCMaxStreams, c.GRPCMaxConnections)
	case len(c.Models) == 0:
		return fmt.Errorf("config: ingest: no models: list at least one (built in: %v)", model.BuiltinNames())
	}
	if err := c.kserveOptions("").Validate(); err != nil {
		return fmt.Errorf("config: ingest: grpc_memory_budget %v: %w (grpc_max_message sets the message limit)", c.GRPCMemoryBudget, err)
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
		QueueLimit: c.QueueLimit, BufferBytes: int(c.Buffer), HostTimeout: c.HostTimeout.D(),
		HostPeer: c.hostPeer(), HostSocket: c.HostSocket}
	for _, m := range c.Models {
		cfg.Models = append(cfg.Models, agent.ModelConfig{Name: m.Name, Compute: m.Compute, MemGB: m.MemGB, Profile: m.Profile, Duration: m.Duration.D(), MaxInput: int(m.MaxInput)})
	}
	for _, t := range c.Tenants {
		cfg.Tenants = append(cfg.Tenants, agent.TenantConfig{ID: t.ID, Models: t.Models, Pool: t.Pool})
	}
	return cfg
}

// hostPeer parses host_peer: an address is a prefix of its own; the
// zero Prefix when unset or malformed.
func (c *Config) hostPeer() netip.Prefix {
	if strings.Contains(c.HostPeer, "/") {
		p, err := netip.ParsePrefix(c.HostPeer)
		if err != nil || p.Addr().Is4In6() {
			return netip.Prefix{} // sources are compared unmapped
		}
		return p
	}
	a, err := netip.ParseAddr(c.HostPeer)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen())
}

// hostDefaults fills in what the agent hears from the GPU host when the
// section does not say: registrations from host_listen's link (the
// network of the interface in addrs that holds its address), naming a
// socket in runDir, lovelockd's run directory.
func (c *Config) hostDefaults(cfg *agent.Config, runDir string, addrs func() ([]net.Addr, error)) error {
	if cfg.HostSocket == "" {
		cfg.HostSocket = strings.TrimSuffix(runDir, "/") + "/"
	}
	if cfg.HostPeer.IsValid() {
		return nil
	}
	listen := c.HostListen.Addr().Unmap()
	if listen.IsUnspecified() {
		return fmt.Errorf("config: ingest: host_listen %v is every address, so the GPU host's link is unknown: set host_peer to the host's address (its ingest_host listen address) or its link's prefix", c.HostListen)
	}
	as, err := addrs()
	if err != nil {
		return fmt.Errorf("ingest: find host_listen's link for the default host_peer: %w (or set host_peer)", err)
	}
	for _, a := range as {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok || ip.Unmap() != listen {
			continue
		}
		ones, bits := n.Mask.Size()
		if listen.Is4() && bits == 128 {
			ones -= 96
		}
		p := netip.PrefixFrom(listen, ones).Masked()
		if !p.IsValid() || p.Bits() == listen.BitLen() {
			return fmt.Errorf("config: ingest: host_listen %v has no network of its own (/%d on its interface), so the GPU host's link is unknown: set host_peer to the host's address (its ingest_host listen address)", listen, ones)
		}
		cfg.HostPeer = p
		return nil
	}
	return fmt.Errorf("config: ingest: host_listen %v is on no interface of this node, so the GPU host's link is unknown: set host_peer to the host's address (its ingest_host listen address) or its link's prefix", listen)
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
//	  models: [checksum, mlp, mymodel]
//	  worker_socket: /run/lovelock/ingest-workers.sock
//	  external_models: [{name: mymodel, row_bytes: 256, out_bytes_per_row: 64}]
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
	// ExternalModels are models a user's own process serves (the Python
	// hand-off, dataplane/ingest/python): listed in Models like built-in
	// ones, they need WorkerSocket, where their workers attach.
	ExternalModels []ExternalModelConfig `json:"external_models,omitempty"`
	WorkerSocket   string                `json:"worker_socket,omitempty"`
	// RunTimeout bounds one run of an external model (default 30s);
	// WorkerWait is how long a request waits for a worker to attach when
	// none is (default 0: it fails at once).
	RunTimeout farmem.Duration `json:"run_timeout,omitempty"`
	WorkerWait farmem.Duration `json:"worker_wait,omitempty"`
}

// ExternalModelConfig is one external model: inputs are whole rows of
// RowBytes, and the output is either OutBytes whatever the input, or
// OutBytesPerRow per input row.
type ExternalModelConfig struct {
	Name           string `json:"name"`
	RowBytes       int    `json:"row_bytes"`
	OutBytes       int    `json:"out_bytes,omitempty"`
	OutBytesPerRow int    `json:"out_bytes_per_row,omitempty"`
}

// Model returns the external model e describes.
func (e ExternalModelConfig) Model() *model.Model {
	out := func(int) int { return e.OutBytes }
	if e.OutBytesPerRow > 0 {
		out = func(n int) int { return n / e.RowBytes * e.OutBytesPerRow }
	}
	return model.NewExternal(e.Name, e.RowBytes, out)
}

func (e ExternalModelConfig) validate() error {
	switch {
	case e.Name == "" || len(e.Name) > ingest.MaxModelName:
		return fmt.Errorf("name %q: want 1..%d bytes", e.Name, ingest.MaxModelName)
	case e.RowBytes < 1:
		return fmt.Errorf("%s: row_bytes %d: want the size of one input row in bytes (a float32 row of 64 values: 256)", e.Name, e.RowBytes)
	case e.OutBytes < 0 || e.OutBytesPerRow < 0:
		return fmt.Errorf("%s: negative output size", e.Name)
	case (e.OutBytes > 0) == (e.OutBytesPerRow > 0):
		return fmt.Errorf("%s: give exactly one of out_bytes (the output's size whatever the input) and out_bytes_per_row", e.Name)
	}
	if _, err := model.Builtin(e.Name); err == nil {
		return fmt.Errorf("%s: the name of a built-in model: give your model another", e.Name)
	}
	return nil
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
	external := map[string]bool{}
	for i, e := range c.ExternalModels {
		if err := e.validate(); err != nil {
			return fmt.Errorf("config: ingest_host: external_models[%d]: %w", i, err)
		}
		if external[e.Name] {
			return fmt.Errorf("config: ingest_host: external model %s defined twice", e.Name)
		}
		external[e.Name] = true
	}
	switch {
	case len(c.ExternalModels) > 0 && c.WorkerSocket == "":
		return errors.New("config: ingest_host: external_models need worker_socket: the unix socket their workers attach to, e.g. /run/lovelock/ingest-workers.sock")
	case len(c.ExternalModels) == 0 && c.WorkerSocket != "":
		return errors.New("config: ingest_host: worker_socket without external_models: define the models workers serve, or drop it")
	case c.WorkerSocket != "" && c.WorkerSocket == c.Socket:
		return fmt.Errorf("config: ingest_host: worker_socket %s is also socket (the DPU's handle socket): give each its own path", c.WorkerSocket)
	case c.RunTimeout < 0 || c.WorkerWait < 0:
		return errors.New("config: ingest_host: run_timeout and worker_wait must not be negative")
	}
	listed := map[string]bool{}
	for _, m := range c.Models {
		if listed[m] {
			return fmt.Errorf("config: ingest_host: model %s listed twice", m)
		}
		listed[m] = true
		if external[m] {
			continue
		}
		if _, err := model.Builtin(m); err != nil {
			return fmt.Errorf("config: ingest_host: model %q is neither built in (%v) nor in external_models", m, model.BuiltinNames())
		}
	}
	for _, e := range c.ExternalModels {
		if !listed[e.Name] {
			return fmt.Errorf("config: ingest_host: external model %s is not in models: list it there to serve it", e.Name)
		}
	}
	return nil
}

// models returns the models the host runs, built-in and external.
func (c *HostConfig) models() []*model.Model {
	var out []*model.Model
	for _, name := range c.Models {
		if m, err := model.Builtin(name); err == nil {
			out = append(out, m)
			continue
		}
		for _, e := range c.ExternalModels {
			if e.Name == name {
				out = append(out, e.Model())
			}
		}
	}
	return out
}

func (c *HostConfig) device() string {
	if c.Device == "" {
		return "shm"
	}
	return c.Device
}
