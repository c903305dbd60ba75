// Package config is lovelockd's configuration file: where the data plane is
// pinned, which interfaces it is attached to at first start, where the state
// and the API live. YAML or JSON; every field has a default.
package config

import (
	"errors"
	"fmt"
	"os"

	"sigs.k8s.io/yaml"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/attach"
)

// DefaultPath is where lovelockd looks for its configuration.
const DefaultPath = "/etc/lovelock/lovelockd.yaml"

// Config is lovelockd's configuration.
type Config struct {
	// PinDir is the bpffs directory of the data plane's pins.
	PinDir string `json:"pin_dir,omitempty"`
	// Port is the Lovelock UDP port.
	Port uint16 `json:"port,omitempty"`
	// State is the file where lovelockd records the desired state
	// (attachments and rules) it reconciles at start.
	State string `json:"state,omitempty"`
	// Socket is the API's unix socket.
	Socket string `json:"socket,omitempty"`
	// Metrics is the address of the Prometheus endpoint ("" disables it).
	Metrics string `json:"metrics,omitempty"`
	// Interfaces to attach at start, on top of those in the state file.
	Interfaces []attach.Attachment `json:"interfaces,omitempty"`
	// Rules is a rule file applied when the state file holds no rules.
	Rules string `json:"rules,omitempty"`
	// Messaging runs the messaging service's routing agent (Buddy) when
	// set: docs/messaging.md describes its cluster file.
	Messaging *Messaging `json:"messaging,omitempty"`
}

// Messaging says which routing agent lovelockd runs.
type Messaging struct {
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
}

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

// XDP reports whether m runs the agent over AF_XDP.
func (m *Messaging) XDP() bool { return m != nil && m.Transport == TransportXDP }

// validate checks the messaging section.
func (m *Messaging) validate() error {
	if m.Cluster == "" || m.Node == "" {
		return errors.New("config: messaging needs both cluster (a file) and node (a name in it)")
	}
	switch m.Transport {
	case "", TransportUDP:
		if len(m.Interfaces) > 0 {
			return fmt.Errorf("config: messaging: interfaces %v apply to transport xdp only (transport is %q)", m.Interfaces, m.transport())
		}
	case TransportXDP:
		if len(m.Interfaces) == 0 {
			return errors.New("config: messaging: transport xdp needs interfaces: the ones the agent receives on (e.g. [pf0hpf, p0])")
		}
		seen := map[string]bool{}
		for _, i := range m.Interfaces {
			if i == "" {
				return errors.New("config: messaging: interfaces: empty name")
			}
			if seen[i] {
				return fmt.Errorf("config: messaging: interfaces: %s listed twice", i)
			}
			seen[i] = true
		}
	default:
		return fmt.Errorf("config: messaging: transport %q: want udp or xdp", m.Transport)
	}
	return nil
}

func (m *Messaging) transport() string {
	if m.Transport == "" {
		return TransportUDP
	}
	return m.Transport
}

// Defaults returns the configuration used when no file exists.
func Defaults() Config {
	return Config{
		PinDir:  attach.DefaultDir,
		Port:    61440,
		State:   "/var/lib/lovelock/state.json",
		Socket:  api.DefaultSocket,
		Metrics: "127.0.0.1:9477",
	}
}

// Load reads the configuration at path over the defaults. A missing file at
// the default path is not an error; a missing file named explicitly is.
func Load(path string, explicit bool) (Config, error) {
	cfg := Defaults()
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && !explicit {
		return cfg, nil
	}
	if err != nil {
		return cfg, fmt.Errorf("config: %w", err)
	}
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, cfg.Validate()
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.PinDir == "" || c.State == "" || c.Socket == "" {
		return errors.New("config: pin_dir, state and socket must not be empty")
	}
	if c.Port == 0 {
		return errors.New("config: port must be 1-65535")
	}
	if m := c.Messaging; m != nil {
		if err := m.validate(); err != nil {
			return err
		}
	}
	for i, a := range c.Interfaces {
		if a.Iface == "" {
			return fmt.Errorf("config: interfaces[%d]: iface is empty", i)
		}
		if err := a.Validate(); err != nil {
			return fmt.Errorf("config: interfaces[%d]: %w", i, err)
		}
	}
	return nil
}
