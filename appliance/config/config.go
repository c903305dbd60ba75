// Package config is lovelockd's configuration file: where the data plane is
// pinned, which interfaces it is attached to at first start, where the state
// and the API live. YAML or JSON; every field has a default.
package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"

	"sigs.k8s.io/yaml"

	"github.com/lovelock-dpu/lovelock/appliance/service/ingestservice"
	"github.com/lovelock-dpu/lovelock/appliance/service/memservice"
	"github.com/lovelock-dpu/lovelock/appliance/service/msgservice"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/control/rules"
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
	// Metrics is the address of the Prometheus endpoint ("" or off
	// disables it).
	Metrics string `json:"metrics,omitempty"`
	// Interfaces to attach at start, on top of those in the state file.
	Interfaces []attach.Attachment `json:"interfaces,omitempty"`
	// Rules is a rule file applied when the state file holds no rules.
	Rules string `json:"rules,omitempty"`
	// Messaging runs the messaging service's routing agent (Buddy) when
	// set: docs/messaging.md describes its cluster file.
	Messaging *Messaging `json:"messaging,omitempty"`
	// MemoryServer makes the node a far-memory memory node (SODA's
	// memory agent): docs/farmem.md.
	MemoryServer *memservice.ServerConfig `json:"memory_server,omitempty"`
	// FarMemory runs the far-memory agent of a DPU between its host's
	// processes and the memory nodes.
	FarMemory *memservice.AgentConfig `json:"far_memory,omitempty"`
	// FarMemoryHost runs a host's far-memory host agent, which serves the
	// transparent mappings of the host's programs (docs/farmem-mapping.md).
	FarMemoryHost *memservice.HostConfig `json:"far_memory_host,omitempty"`
	// Ingest runs a DPU's accelerator ingest agent (Conspirator) in front
	// of a GPU host: docs/ingest.md.
	Ingest *ingestservice.Config `json:"ingest,omitempty"`
	// IngestHost runs a GPU host's ingest agent, which registers its GPUs'
	// slot buffers with its DPU and launches the models.
	IngestHost *ingestservice.HostConfig `json:"ingest_host,omitempty"`
}

// Messaging is the messaging service's section (msgservice.Config).
type Messaging = msgservice.Config

// Messaging transports.
const (
	TransportUDP = msgservice.TransportUDP
	TransportXDP = msgservice.TransportXDP
)

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

// Load reads the configuration at path over the defaults and validates it.
// A missing file at the default path is not an error; a missing file named
// explicitly is.
func Load(path string, explicit bool) (Config, error) {
	cfg, err := Read(path, explicit)
	if err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

// Read is Load without the validation, for a caller that overrides fields
// first (lovelockd's flags) and validates the result.
func Read(path string, explicit bool) (Config, error) {
	cfg := Defaults()
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && !explicit {
		return cfg, nil
	}
	if err != nil {
		return cfg, fmt.Errorf("config: %w", err)
	}
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, rules.YAMLError(data, err))
	}
	cfg.Normalize()
	return cfg, nil
}

// Normalize spells settings one way; call it again after overriding
// fields (lovelockd's flags). metrics: off (or "false", which is how YAML
// 1.1 reads an unquoted off into a string field) means no endpoint.
func (c *Config) Normalize() {
	if c.Metrics == "off" || c.Metrics == "false" {
		c.Metrics = ""
	}
}

// validMetrics checks the metrics address ("" for none, as Normalize
// spells off): HOST:PORT with a numeric port, as net.Listen takes it. The
// host may be empty (every address) or a name.
func validMetrics(addr string) error {
	if addr == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) {
			err = errors.New(ae.Err)
		}
		return fmt.Errorf("config: metrics %q: want HOST:PORT, e.g. 127.0.0.1:9477, or off (%v)", addr, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("config: metrics %q: the port must be a number from 0 to 65535", addr)
	}
	return nil
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.PinDir == "" || c.State == "" || c.Socket == "" {
		return errors.New("config: pin_dir, state and socket must not be empty")
	}
	if c.Port == 0 {
		return errors.New("config: port must be 1-65535")
	}
	if err := validMetrics(c.Metrics); err != nil {
		return err
	}
	// The services' sections, each checked by its service.
	var sections []interface{ Validate() error }
	if c.Messaging != nil {
		sections = append(sections, c.Messaging)
	}
	if c.MemoryServer != nil {
		sections = append(sections, c.MemoryServer)
	}
	if c.FarMemory != nil {
		sections = append(sections, c.FarMemory)
	}
	if c.FarMemoryHost != nil {
		sections = append(sections, c.FarMemoryHost)
	}
	if c.Ingest != nil {
		sections = append(sections, c.Ingest)
	}
	if c.IngestHost != nil {
		sections = append(sections, c.IngestHost)
	}
	for _, s := range sections {
		if err := s.Validate(); err != nil {
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
