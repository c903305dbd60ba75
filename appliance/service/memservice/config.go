package memservice

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
)

// ServerConfig is the memory_server section of lovelockd's configuration:
// the node is a memory node (mem0 in the testbed) and serves regions.
type ServerConfig struct {
	// Config holds the protocol knobs every far-memory party shares.
	farmem.Config
	// Addr is where the server receives: an address of the node and a
	// port (lovelockd's Lovelock port, so that steering sees its headers).
	Addr netip.AddrPort `json:"addr"`
	// StateDir holds the regions' backing files and metadata.
	StateDir string `json:"state_dir"`
	// Capacity is the most bytes of regions the server holds, a number
	// of bytes or with a unit: "8GiB", "512MiB".
	Capacity farmem.Size `json:"capacity"`
	// PreloadDir is the directory that creates arriving over the network
	// (hosts, through their DPU) may preload files from; empty, they may
	// not preload. lovelockd's API (lovelock mem create --preload) may
	// preload any file of the node.
	PreloadDir string `json:"preload_dir,omitempty"`
	// IDBase is the first region ID this server hands out; memory nodes
	// of one cluster take disjoint ranges (0: 1).
	IDBase uint32 `json:"id_base,omitempty"`
	// MaxRegions is the most regions the server holds, however small
	// (0: farmem.DefaultMaxRegions, 1024): each keeps a file open.
	MaxRegions int `json:"max_regions,omitempty"`
}

// Validate checks the section.
func (c *ServerConfig) Validate() error {
	switch {
	case !c.Addr.IsValid() || c.Addr.Port() == 0:
		return fmt.Errorf("config: memory_server: addr %q: want the address and port the server receives on, e.g. 10.77.0.20:61440", c.Addr)
	case c.StateDir == "":
		return errors.New("config: memory_server: state_dir is empty: name a directory for the regions' backing files, e.g. /var/lib/lovelock/mem")
	case c.Capacity == 0:
		return errors.New("config: memory_server: capacity is 0: give the most bytes of regions it may hold, e.g. 8GiB")
	}
	if err := c.Config.Validate(); err != nil {
		return fmt.Errorf("config: memory_server: %w", err)
	}
	if err := farmem.CheckMaxRegions(c.MaxRegions); err != nil {
		return fmt.Errorf("config: memory_server: %w", err)
	}
	return nil
}

// options turns the section into the server's options.
func (c *ServerConfig) options() farmem.ServerOptions {
	return farmem.ServerOptions{Config: c.Config, StateDir: c.StateDir, Capacity: uint64(c.Capacity), IDBase: c.IDBase, Addr: c.Addr,
		PreloadDir: c.PreloadDir, MaxRegions: c.MaxRegions}
}

// AgentConfig is the far_memory section: the node (a DPU) runs the
// far-memory agent between its host's processes and the memory nodes.
type AgentConfig struct {
	farmem.AgentConfig
}

// Validate checks the section.
func (c *AgentConfig) Validate() error {
	if !c.Listen.IsValid() || c.Listen.Port() == 0 {
		return fmt.Errorf("config: far_memory: listen %q: want the address and port host processes send to, e.g. 10.77.0.10:61440", c.Listen)
	}
	if err := c.AgentConfig.Validate(); err != nil {
		return fmt.Errorf("config: far_memory: %w", err)
	}
	return nil
}
