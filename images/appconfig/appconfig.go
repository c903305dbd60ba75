// Package appconfig owns the appliance configuration of the Lovelock image:
// the JSON file /etc/lovelock/appliance.json that the image's /init reads to
// know which modules to load, which interfaces to bring up with which
// addresses, and how to start lovelockd. It is validated at image build time
// so that a broken file never reaches a card.
package appconfig

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
)

// Path is where the image keeps its appliance configuration.
const Path = "/etc/lovelock/appliance.json"

// XDP attach modes of an interface.
const (
	XDPNative  = "native"
	XDPGeneric = "generic"
)

// Config is the appliance configuration.
type Config struct {
	// Hostname of the node; empty keeps the kernel's default.
	Hostname string `json:"hostname,omitempty"`
	// Modules lists kernel modules to load at boot (with their
	// dependencies); empty loads every module the image carries.
	Modules []string `json:"modules,omitempty"`
	// Interfaces to bring up, in order.
	Interfaces []Interface `json:"interfaces"`
	// Lovelockd says how to start the daemon.
	Lovelockd Lovelockd `json:"lovelockd"`
}

// Interface is a network interface to bring up.
type Interface struct {
	// Name of the interface. When no interface has this name, /init
	// renames the one whose phys_port_name it is (mlx5 representors report
	// p0, pf0hpf, pf0vf0 there, as NVIDIA's udev rule names them).
	Name string `json:"name"`
	// Addresses in CIDR form (10.0.2.15/24); none leaves it unnumbered.
	Addresses []string `json:"addresses,omitempty"`
	// Gateway adds a default route through this address.
	Gateway string `json:"gateway,omitempty"`
	// MTU, 0 for the driver's default.
	MTU int `json:"mtu,omitempty"`
	// XDP attaches lovelockd's XDP classifier: "native" (in the driver;
	// uplink ports) or "generic" (skb path; host-PF/VF representors).
	// Empty attaches none.
	XDP string `json:"xdp,omitempty"`
	// TCEgress attaches the TC egress classifier (host-originated
	// packets).
	TCEgress bool `json:"tc_egress,omitempty"`
	// Optional interfaces may be missing (a port without a cable, a VF
	// not created yet); /init waits for required ones only.
	Optional bool `json:"optional,omitempty"`
}

// Lovelockd says how to start the daemon. Its own settings (pin directory,
// API socket, metrics, state file) live in its configuration file,
// /etc/lovelock/lovelockd.yaml when the image carries one.
type Lovelockd struct {
	// Args are appended to the flags /init derives from the interfaces.
	Args []string `json:"args,omitempty"`
}

// Parse decodes and validates a configuration. Unknown fields are errors, so
// a typo does not silently change nothing.
func Parse(b []byte) (*Config, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var c Config
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("appliance config: %w", err)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Load reads and validates the configuration file at path.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("appliance config: %w", err)
	}
	c, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Validate checks every field that /init or lovelockd would reject later.
func (c *Config) Validate() error {
	seen := make(map[string]bool)
	for i, ifc := range c.Interfaces {
		if ifc.Name == "" || len(ifc.Name) > 15 {
			return fmt.Errorf("appliance config: interface %d: name %q: want 1-15 characters", i, ifc.Name)
		}
		if seen[ifc.Name] {
			return fmt.Errorf("appliance config: interface %s listed twice", ifc.Name)
		}
		seen[ifc.Name] = true
		for _, a := range ifc.Addresses {
			if _, err := netip.ParsePrefix(a); err != nil {
				return fmt.Errorf("appliance config: interface %s: address %q: %w", ifc.Name, a, err)
			}
		}
		if ifc.Gateway != "" {
			if _, err := netip.ParseAddr(ifc.Gateway); err != nil {
				return fmt.Errorf("appliance config: interface %s: gateway: %w", ifc.Name, err)
			}
		}
		if ifc.MTU < 0 || ifc.MTU > 65535 {
			return fmt.Errorf("appliance config: interface %s: mtu %d out of range", ifc.Name, ifc.MTU)
		}
		switch ifc.XDP {
		case "", XDPNative, XDPGeneric:
		default:
			return fmt.Errorf("appliance config: interface %s: xdp %q: want %q, %q or nothing", ifc.Name, ifc.XDP, XDPNative, XDPGeneric)
		}
	}
	return nil
}

// Steered returns the interfaces lovelockd attaches XDP to.
func (c *Config) Steered() []Interface {
	var out []Interface
	for _, ifc := range c.Interfaces {
		if ifc.XDP != "" {
			out = append(out, ifc)
		}
	}
	return out
}

// LovelockdArgs returns lovelockd's command line arguments (without the
// program name): --xdp, --xdp-generic and --tc-egress per interface, then
// Lovelockd.Args.
func (c *Config) LovelockdArgs() []string {
	var args []string
	for _, ifc := range c.Interfaces {
		switch ifc.XDP {
		case XDPNative:
			args = append(args, "--xdp", ifc.Name)
		case XDPGeneric:
			args = append(args, "--xdp-generic", ifc.Name)
		}
		if ifc.TCEgress {
			args = append(args, "--tc-egress", ifc.Name)
		}
	}
	return append(args, c.Lovelockd.Args...)
}
