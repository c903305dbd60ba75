package msgservice

import (
	"errors"
	"fmt"
)

// Config is the messaging section of lovelockd's configuration: which
// routing agent lovelockd runs.
type Config struct {
	// Cluster is the messaging cluster file (YAML or JSON): mode, nodes,
	// ranks and knobs, the same on every node.
	Cluster string `json:"cluster"`
	// Node is this node's name in the cluster file.
	Node string `json:"node"`
	// Transport is what the agent's workers receive and send on:
	// TransportUDP (the default) or TransportXDP.
	Transport string `json:"transport,omitempty"`
	// Interfaces are the interfaces the agent receives on with transport
	// xdp (on a DPU: pf0hpf from its host, p0 from the fabric). Each
	// worker w gets an AF_XDP socket on queue w of each, so each needs at
	// least workers queues. lovelockd attaches XDP to them if nothing
	// else did.
	Interfaces []string `json:"interfaces,omitempty"`
	// MultiBuffer binds the AF_XDP sockets with XDP_USE_SG (transport
	// xdp): bundles up to the MTU less 28 on the AF_XDP path, as on
	// kernel UDP. Unset means on. Where the kernel or driver refuses
	// it, the agent runs on single-buffer sockets (bundles of one XDP
	// buffer, 3478 bytes on veth) and the service reports itself
	// degraded. false asks for single-buffer sockets.
	MultiBuffer *bool `json:"multi_buffer,omitempty"`
}

// MultiBufferOn reports whether the AF_XDP sockets are to be bound with
// XDP_USE_SG: unless multi_buffer is false.
func (c *Config) MultiBufferOn() bool { return c == nil || c.MultiBuffer == nil || *c.MultiBuffer }

// Messaging transports.
const (
	// TransportUDP: kernel UDP sockets, a SO_REUSEPORT group steered by
	// the destination endpoint.
	TransportUDP = "udp"
	// TransportXDP: per worker, an AF_XDP socket on its queue of each
	// interface, fed by steering rules lovelockd installs, and the kernel
	// UDP socket beside them for what XDP passes to the stack
	// (docs/messaging.md).
	TransportXDP = "xdp"
)

// XDP reports whether c runs the agent over AF_XDP.
func (c *Config) XDP() bool { return c != nil && c.Transport == TransportXDP }

// Validate checks the messaging section.
func (c *Config) Validate() error {
	if c.Cluster == "" || c.Node == "" {
		return errors.New("config: messaging needs both cluster (a file) and node (a name in it)")
	}
	switch c.Transport {
	case "", TransportUDP:
		if len(c.Interfaces) > 0 {
			return fmt.Errorf("config: messaging: interfaces %v apply to transport xdp only (transport is %q)", c.Interfaces, c.transport())
		}
		if c.MultiBuffer != nil {
			return fmt.Errorf("config: messaging: multi_buffer applies to transport xdp only (transport is %q)", c.transport())
		}
	case TransportXDP:
		if len(c.Interfaces) == 0 {
			return errors.New("config: messaging: transport xdp needs interfaces: the ones the agent receives on (e.g. [pf0hpf, p0])")
		}
		seen := map[string]bool{}
		for _, i := range c.Interfaces {
			if i == "" {
				return errors.New("config: messaging: interfaces: empty name")
			}
			if seen[i] {
				return fmt.Errorf("config: messaging: interfaces: %s listed twice", i)
			}
			seen[i] = true
		}
	default:
		return fmt.Errorf("config: messaging: transport %q: want udp or xdp", c.Transport)
	}
	return nil
}

func (c *Config) transport() string {
	if c.Transport == "" {
		return TransportUDP
	}
	return c.Transport
}
