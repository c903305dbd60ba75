package messaging

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging/bundle"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// Mode says where the routing agents run, the three scenarios of the Buddy
// paper as Lovelock builds them.
type Mode string

// The modes.
const (
	// ModeNone runs no agent: each client aggregates per destination
	// client and sends its bundles straight to the client that owns the
	// rank. (The paper's "None" co-runs a routing agent on the
	// application's cores; run ModeHost with the agent pinned to those
	// cores to reproduce it exactly.)
	ModeNone Mode = "none"
	// ModeHost runs one agent per node on the host, on cores of its own:
	// the paper's "x86" offloading.
	ModeHost Mode = "host"
	// ModeDPU runs one agent per node on the node's DPU: the paper's "Dpu"
	// offloading, and Lovelock's default.
	ModeDPU Mode = "dpu"
)

// HasAgent reports whether clients of this mode attach to a node agent.
func (m Mode) HasAgent() bool { return m == ModeHost || m == ModeDPU }

// ParseMode parses "none", "host" or "dpu".
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeNone, ModeHost, ModeDPU:
		return m, nil
	}
	return "", fmt.Errorf("messaging: mode %q: want none, host or dpu", s)
}

// Duration is a time.Duration that reads and writes as text ("2ms", "250µs"
// or "250us") in config files.
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String formats d like time.Duration.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with time.ParseDuration.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// RankRange is an inclusive range of application ranks.
type RankRange struct {
	Lo, Hi uint32
}

// Ranks is a set of application ranks as ranges, written "0-3,8,10-11".
type Ranks []RankRange

// Range returns the ranks lo..hi.
func Range(lo, hi uint32) Ranks { return Ranks{{lo, hi}} }

// ParseRanks parses a comma-separated list of ranks and inclusive ranges.
func ParseRanks(s string) (Ranks, error) {
	var r Ranks
	if strings.TrimSpace(s) == "" {
		return r, nil
	}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.ParseUint(strings.TrimSpace(lo), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("ranks %q: %q is not a rank", s, lo)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(strings.TrimSpace(hi), 10, 32); err != nil {
				return nil, fmt.Errorf("ranks %q: %q is not a rank", s, hi)
			}
		}
		if a > b {
			return nil, fmt.Errorf("ranks %q: range %d-%d is empty", s, a, b)
		}
		r = append(r, RankRange{uint32(a), uint32(b)})
	}
	return r, nil
}

// String formats r as ParseRanks reads it.
func (r Ranks) String() string {
	parts := make([]string, len(r))
	for i, x := range r {
		if x.Lo == x.Hi {
			parts[i] = strconv.FormatUint(uint64(x.Lo), 10)
		} else {
			parts[i] = fmt.Sprintf("%d-%d", x.Lo, x.Hi)
		}
	}
	return strings.Join(parts, ",")
}

// Count returns the number of ranks in r, counting overlaps twice.
func (r Ranks) Count() uint64 {
	var n uint64
	for _, x := range r {
		n += uint64(x.Hi-x.Lo) + 1
	}
	return n
}

// Contains reports whether rank is in r.
func (r Ranks) Contains(rank uint32) bool {
	for _, x := range r {
		if x.Lo <= rank && rank <= x.Hi {
			return true
		}
	}
	return false
}

// All returns every rank of r in order of the ranges.
func (r Ranks) All() []uint32 {
	var out []uint32
	for _, x := range r {
		for v := uint64(x.Lo); v <= uint64(x.Hi); v++ {
			out = append(out, uint32(v))
		}
	}
	return out
}

// MarshalText implements encoding.TextMarshaler.
func (r Ranks) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseRanks.
func (r *Ranks) UnmarshalText(b []byte) error {
	v, err := ParseRanks(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// Node is one cluster node: its agent (in the modes that have one) and the
// client processes on its host.
type Node struct {
	// Name identifies the node; unique.
	Name string `json:"name"`
	// Agent is the UDP address of the node's routing agent: its DPU's
	// address in ModeDPU, a host address in ModeHost, unused in ModeNone.
	Agent netip.AddrPort `json:"agent,omitzero"`
	// Clients are the application processes on the node's host.
	Clients []ClientSpec `json:"clients,omitempty"`
}

// ClientSpec is one application process: where it receives, and the ranks
// it serves.
type ClientSpec struct {
	// Name identifies the client within its node; unique there.
	Name string `json:"name"`
	// Addr is the client's UDP address; agents (and in ModeNone other
	// clients) send its bundles there.
	Addr netip.AddrPort `json:"addr"`
	// Ranks are the application ranks the client receives for.
	Ranks Ranks `json:"ranks,omitempty"`
}

// Config is the messaging service's configuration: the cluster (mode, nodes,
// their clients and ranks) and the knobs. Every node and client of a cluster
// uses the same Config; the next-hop tables are computed from it at start.
type Config struct {
	// Mode says whether and where agents run (default ModeDPU).
	Mode Mode `json:"mode,omitempty"`
	// Tenant goes into every datagram's header; receivers drop other
	// tenants' datagrams.
	Tenant uint32 `json:"tenant,omitempty"`
	// Nodes is the cluster, in a fixed order: a node's index is part of
	// its endpoints.
	Nodes []Node `json:"nodes,omitempty"`

	// TransferSize is the largest bundle datagram (UDP payload: Lovelock
	// header, preamble and records) in bytes. Each agent and client
	// lowers it to its transport's MaxPayload (1472 bytes on a 1500-byte
	// MTU path without IP fragmentation).
	TransferSize int `json:"transfer_size,omitempty"`
	// BuffersPerDest is the number of send buffers per destination (next
	// hop) per worker or sender shard, and equally the receive window, in
	// bundles, a receiver grants each link (at most 64).
	BuffersPerDest int `json:"buffers_per_dest,omitempty"`
	// Workers is the number of agent workers, each with its own socket or
	// AF_XDP queue and its own send buffers.
	Workers int `json:"workers,omitempty"`
	// FlushTimeout is how long a send buffer may hold messages before it is
	// sent although not full.
	FlushTimeout Duration `json:"flush_timeout,omitempty"`
	// IdleTimeout: an agent worker that has received nothing, or a client
	// shard that has been given nothing to send, for this long sends all
	// its buffers.
	IdleTimeout Duration `json:"idle_timeout,omitempty"`
	// RetransmitTimeout is how long a sender waits for the acknowledgement
	// of a bundle before it sends it again (doubling per try, up to 64
	// times the timeout).
	RetransmitTimeout Duration `json:"retransmit_timeout,omitempty"`
	// PeerTimeout: a link whose peer has not answered for this long while
	// bundles wait for it is declared dead; its buffered messages are
	// dropped (and counted) so that one dead peer cannot stall the rest.
	PeerTimeout Duration `json:"peer_timeout,omitempty"`
	// MaxMessageSize is the largest application message; larger sends are
	// refused and larger arrivals dropped.
	MaxMessageSize int `json:"max_message_size,omitempty"`
	// SenderShards is the number of independent send paths of a client,
	// so that concurrent senders do not contend; 0 means GOMAXPROCS, at
	// most 64.
	SenderShards int `json:"sender_shards,omitempty"`
	// SocketBuffer is the kernel UDP socket buffer size asked for.
	SocketBuffer int `json:"socket_buffer,omitempty"`
}

// Defaults of the knobs, after the Buddy paper where it gives one.
const (
	// DefaultTransferSize: the paper's transfer size gains plateau at 16
	// to 32 KiB.
	DefaultTransferSize = 16 << 10
	// DefaultBuffersPerDest: the paper's runtime buffer count gains
	// plateau at 8.
	DefaultBuffersPerDest = 8
	// DefaultMaxWorkers caps the default worker count: the paper's agent
	// scales to 7-8 threads on an 8-core BlueField-3.
	DefaultMaxWorkers = 8
	// DefaultFlushTimeout bounds the latency a lone message sees per hop.
	DefaultFlushTimeout = Duration(time.Millisecond)
	// DefaultIdleTimeout flushes well before FlushTimeout once traffic
	// stops (the Go runtime rounds sleeps below 1ms up when it is idle).
	DefaultIdleTimeout = Duration(250 * time.Microsecond)
	// DefaultRetransmitTimeout is far above any RTT on a rack, so it fires
	// on loss only.
	DefaultRetransmitTimeout = Duration(10 * time.Millisecond)
	// DefaultPeerTimeout tolerates restarts of a peer's daemon.
	DefaultPeerTimeout = Duration(10 * time.Second)
	// DefaultMaxMessageSize bounds the reassembly memory per link.
	DefaultMaxMessageSize = 1 << 20
	// DefaultSocketBuffer is 4 MiB, room for every window of 32 links of
	// 16 KiB bundles.
	DefaultSocketBuffer = 4 << 20
)

// Limits that Validate enforces.
const (
	MinTransferSize = 128
	MaxTransferSize = 65507 // the largest UDP payload over IPv4
	MaxBuffers      = 64    // the credit's selective-acknowledgement bitmap
	MaxMessageLimit = 64 << 20
	MaxRanks        = 1 << 24 // bounds the next-hop tables
)

// Defaults returns the configuration with every knob at its default, mode
// ModeDPU, and no nodes.
func Defaults() Config {
	return Config{
		Mode:              ModeDPU,
		TransferSize:      DefaultTransferSize,
		BuffersPerDest:    DefaultBuffersPerDest,
		Workers:           min(runtime.NumCPU(), DefaultMaxWorkers),
		FlushTimeout:      DefaultFlushTimeout,
		IdleTimeout:       DefaultIdleTimeout,
		RetransmitTimeout: DefaultRetransmitTimeout,
		PeerTimeout:       DefaultPeerTimeout,
		MaxMessageSize:    DefaultMaxMessageSize,
		SocketBuffer:      DefaultSocketBuffer,
	}
}

// WithDefaults returns c with every zero knob (and an empty mode) set to its
// default.
func (c Config) WithDefaults() Config {
	d := Defaults()
	if c.Mode == "" {
		c.Mode = d.Mode
	}
	for _, f := range []struct{ v, def *int }{
		{&c.TransferSize, &d.TransferSize}, {&c.BuffersPerDest, &d.BuffersPerDest}, {&c.Workers, &d.Workers},
		{&c.MaxMessageSize, &d.MaxMessageSize}, {&c.SocketBuffer, &d.SocketBuffer},
	} {
		if *f.v == 0 {
			*f.v = *f.def
		}
	}
	for _, f := range []struct{ v, def *Duration }{
		{&c.FlushTimeout, &d.FlushTimeout}, {&c.IdleTimeout, &d.IdleTimeout},
		{&c.RetransmitTimeout, &d.RetransmitTimeout}, {&c.PeerTimeout, &d.PeerTimeout},
	} {
		if *f.v == 0 {
			*f.v = *f.def
		}
	}
	return c
}

// ParseConfig reads a YAML or JSON configuration over the defaults and
// validates it. Unknown fields are errors.
func ParseConfig(data []byte) (Config, error) {
	c := Defaults()
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return Config{}, fmt.Errorf("messaging: config: %w", err)
	}
	return c, c.Validate()
}

// LoadConfig reads and validates the configuration file at path.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("messaging: %w", err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Validate checks the knobs and the cluster: the mode, every knob's range,
// unique node and client names, valid and distinct addresses, an agent
// address for every node when the mode has agents, and ranks that no two
// clients share. Errors name the field as the config file spells it.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("messaging: "+format, args...)) }
	if _, err := ParseMode(string(c.Mode)); err != nil {
		errs = append(errs, err)
	}
	intRange := func(name string, v, lo, hi int) {
		if v < lo || v > hi {
			bad("%s %d outside %d..%d", name, v, lo, hi)
		}
	}
	intRange("transfer_size", c.TransferSize, MinTransferSize, MaxTransferSize)
	intRange("buffers_per_dest", c.BuffersPerDest, 1, MaxBuffers)
	intRange("workers", c.Workers, 1, MaxWorkers)
	intRange("max_message_size", c.MaxMessageSize, 1, MaxMessageLimit)
	intRange("sender_shards", c.SenderShards, 0, MaxShards)
	intRange("socket_buffer", c.SocketBuffer, 64<<10, 1<<30)
	durRange := func(name string, v Duration, lo, hi time.Duration) {
		if v.D() < lo || v.D() > hi {
			bad("%s %v outside %v..%v", name, v, lo, hi)
		}
	}
	durRange("flush_timeout", c.FlushTimeout, time.Microsecond, time.Minute)
	durRange("idle_timeout", c.IdleTimeout, time.Microsecond, time.Minute)
	durRange("retransmit_timeout", c.RetransmitTimeout, 100*time.Microsecond, time.Minute)
	durRange("peer_timeout", c.PeerTimeout, time.Millisecond, time.Hour)
	if c.PeerTimeout.D() < 4*c.RetransmitTimeout.D() {
		bad("peer_timeout %v must be at least 4 retransmit_timeouts (%v)", c.PeerTimeout, 4*c.RetransmitTimeout.D())
	}
	errs = append(errs, c.validateCluster()...)
	return errors.Join(errs...)
}

func (c Config) validateCluster() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("messaging: "+format, args...)) }
	if len(c.Nodes) == 0 {
		bad("nodes: none configured")
	}
	if len(c.Nodes) > MaxNodes {
		bad("nodes: %d, at most %d", len(c.Nodes), MaxNodes)
	}
	names := map[string]bool{}
	addrs := map[netip.AddrPort]string{}
	addr := func(where string, a netip.AddrPort) {
		switch {
		case !a.IsValid() || a.Addr().IsUnspecified():
			bad("%s: address %q is not a usable ip:port", where, a)
		case a.Port() == 0:
			bad("%s: address %v needs a port (Lovelock's is %d)", where, a, wire.DefaultPort)
		default:
			a = netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
			if other, dup := addrs[a]; dup {
				bad("%s: address %v is also %s's", where, a, other)
			}
			addrs[a] = where
		}
	}
	var ranges []struct {
		r     RankRange
		owner string
	}
	var total uint64
	for i, n := range c.Nodes {
		where := fmt.Sprintf("nodes[%d]", i)
		if n.Name == "" {
			bad("%s: name is empty", where)
		} else {
			where = fmt.Sprintf("node %q", n.Name)
			if names[n.Name] {
				bad("%s: name used twice", where)
			}
			names[n.Name] = true
		}
		if c.Mode.HasAgent() {
			addr(where+" agent", n.Agent)
		}
		if len(n.Clients) > MaxClientsPerNode {
			bad("%s: %d clients, at most %d", where, len(n.Clients), MaxClientsPerNode)
		}
		cnames := map[string]bool{}
		for j, cl := range n.Clients {
			cw := fmt.Sprintf("%s clients[%d]", where, j)
			if cl.Name == "" {
				bad("%s: name is empty", cw)
			} else {
				cw = fmt.Sprintf("%s client %q", where, cl.Name)
				if cnames[cl.Name] {
					bad("%s: name used twice", cw)
				}
				cnames[cl.Name] = true
			}
			addr(cw, cl.Addr)
			for _, r := range cl.Ranks {
				if r.Lo > r.Hi {
					bad("%s: rank range %d-%d is empty", cw, r.Lo, r.Hi)
					continue
				}
				if r.Hi == bundle.ContinuationRank {
					bad("%s: rank %d is reserved (continuation records)", cw, bundle.ContinuationRank)
					continue
				}
				total += uint64(r.Hi-r.Lo) + 1
				ranges = append(ranges, struct {
					r     RankRange
					owner string
				}{r, cw})
			}
		}
	}
	if total > MaxRanks {
		bad("%d ranks in the cluster, at most %d", total, MaxRanks)
	}
	slices.SortFunc(ranges, func(a, b struct {
		r     RankRange
		owner string
	}) int {
		return int(int64(a.r.Lo) - int64(b.r.Lo))
	})
	for i := 1; i < len(ranges); i++ {
		if ranges[i].r.Lo <= ranges[i-1].r.Hi {
			bad("rank %d belongs to both %s and %s", ranges[i].r.Lo, ranges[i-1].owner, ranges[i].owner)
		}
	}
	return errs
}

// NodeIndex returns the index of the node named name.
func (c Config) NodeIndex(name string) (int, error) {
	for i, n := range c.Nodes {
		if n.Name == name {
			return i, nil
		}
	}
	return -1, fmt.Errorf("messaging: no node %q: %w", name, ErrUnknownNode)
}

// ClientIndex returns the indices of node and client by name.
func (c Config) ClientIndex(node, client string) (n, cl int, err error) {
	n, err = c.NodeIndex(node)
	if err != nil {
		return -1, -1, err
	}
	for i, s := range c.Nodes[n].Clients {
		if s.Name == client {
			return n, i, nil
		}
	}
	return -1, -1, fmt.Errorf("messaging: node %q has no client %q: %w", node, client, ErrUnknownNode)
}

// WorkerEndpoints returns the endpoints of node n's agent workers: the
// destination values ("rank" in steering rules) that XDP must steer to AF_XDP
// queue 0, 1, … of the agent, one rule each, for types bundle and credit.
func (c Config) WorkerEndpoints(n int) []Endpoint {
	eps := make([]Endpoint, c.Workers)
	for w := range eps {
		eps[w] = AgentEndpoint(n, w)
	}
	return eps
}
