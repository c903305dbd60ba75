package memservice

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

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
	Capacity Size `json:"capacity"`
	// IDBase is the first region ID this server hands out; memory nodes
	// of one cluster take disjoint ranges (0: 1).
	IDBase uint32 `json:"id_base,omitempty"`
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
	return nil
}

// options turns the section into the server's options.
func (c *ServerConfig) options() farmem.ServerOptions {
	return farmem.ServerOptions{Config: c.Config, StateDir: c.StateDir, Capacity: uint64(c.Capacity), IDBase: c.IDBase, Addr: c.Addr}
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

// Size is a byte count that reads "8GiB", "512MiB", "64KiB" or a plain
// number of bytes.
type Size uint64

// UnmarshalJSON implements json.Unmarshaler (YAML goes through JSON).
func (s *Size) UnmarshalJSON(b []byte) error {
	v, err := ParseSize(strings.Trim(string(b), `"`))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// MarshalJSON implements json.Marshaler.
func (s Size) MarshalJSON() ([]byte, error) { return []byte(strconv.Quote(s.String())), nil }

// String formats s with the largest binary unit that divides it.
func (s Size) String() string {
	for _, u := range sizeUnits {
		if s >= u.n && s%u.n == 0 {
			return strconv.FormatUint(uint64(s/u.n), 10) + u.name
		}
	}
	return strconv.FormatUint(uint64(s), 10)
}

var sizeUnits = []struct {
	name string
	n    Size
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}

// ParseSize reads a Size.
func ParseSize(v string) (Size, error) {
	num, mult := v, Size(1)
	for _, u := range sizeUnits {
		if n, ok := strings.CutSuffix(v, u.name); ok {
			num, mult = n, u.n
			break
		}
	}
	n, err := strconv.ParseUint(strings.TrimSpace(num), 10, 64)
	if err != nil || Size(n) > ^Size(0)/mult {
		return 0, fmt.Errorf("size %q: want a number of bytes, or one with KiB, MiB, GiB or TiB", v)
	}
	return Size(n) * mult, nil
}
