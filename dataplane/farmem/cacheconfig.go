package farmem

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Prefetcher chooses which cache entries the DPU agent's dynamic cache
// loads ahead of a region's reads.
type Prefetcher uint8

// The prefetchers. PrefetchAdjacent is the zero value, SODA's choice.
const (
	// PrefetchAdjacent loads the entry after the one a read touched
	// (SODA §IV-C).
	PrefetchAdjacent Prefetcher = iota
	// PrefetchStride looks for a majority delta among the region's recent
	// reads in the agent's history (Leap's trend detector) and loads the
	// entries that delta leads to; without a majority it loads nothing.
	PrefetchStride
	// PrefetchHints loads only what the application names (Region.Hint).
	PrefetchHints
	// PrefetchOff keeps the region out of the dynamic cache.
	PrefetchOff
	numPrefetchers
)

var prefetcherNames = [...]string{"adjacent", "stride", "hints", "off"}

// String names p as the config does.
func (p Prefetcher) String() string {
	if p < numPrefetchers {
		return prefetcherNames[p]
	}
	return fmt.Sprintf("prefetcher(%d)", uint8(p))
}

// MarshalText implements encoding.TextMarshaler.
func (p Prefetcher) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler: adjacent, stride,
// hints or off.
func (p *Prefetcher) UnmarshalText(b []byte) error {
	v, err := ParsePrefetcher(string(b))
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// UnmarshalJSON takes a name, or false for off: lovelockd's YAML config is
// read as YAML 1.1, where an unquoted off is the boolean false.
func (p *Prefetcher) UnmarshalJSON(b []byte) error {
	if string(b) == "false" {
		*p = PrefetchOff
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("prefetcher %s: want adjacent, stride, hints or off", b)
	}
	return p.UnmarshalText([]byte(s))
}

// ParsePrefetcher reads a prefetcher's name.
func ParsePrefetcher(s string) (Prefetcher, error) {
	for i, n := range prefetcherNames {
		if n == s {
			return Prefetcher(i), nil
		}
	}
	return 0, fmt.Errorf("prefetcher %q: want adjacent, stride, hints or off", s)
}

// Range is a byte range of a region.
type Range struct {
	Offset uint64 `json:"offset"`
	Size   uint64 `json:"size"`
}

// CacheRegion is the cache policy of one region in the agent's config.
type CacheRegion struct {
	Region uint32 `json:"region"`
	// Prefetcher overrides CacheConfig.Prefetcher for the region.
	Prefetcher *Prefetcher `json:"prefetcher,omitempty"`
	// Static ranges are loaded into the static cache when the agent
	// starts (a range of size 0 means the whole region).
	Static []Range `json:"static,omitempty"`
}

// CacheConfig configures the DPU agent's caches (docs/farmem.md, "DPU
// caches"). The zero value has no dynamic cache and a static cache of
// DefaultStaticSize.
type CacheConfig struct {
	// Size is the dynamic cache's arena in bytes; 0 turns the dynamic
	// cache off.
	Size Size `json:"size,omitempty"`
	// EntrySize is the unit the dynamic cache loads and evicts: larger
	// than a chunk, so that one fetch serves several reads (SODA: 1 MiB).
	// A multiple of ChunkSize.
	EntrySize Size `json:"entry_size,omitempty"`
	// StaticSize bounds the bytes the static cache holds.
	StaticSize Size `json:"static_size,omitempty"`
	// History is how many recent read requests the agent remembers for
	// the stride detector.
	History int `json:"history,omitempty"`
	// Prefetcher is the regions' default prefetcher.
	Prefetcher Prefetcher `json:"prefetcher,omitempty"`
	// Depth is how many entries a prefetcher loads ahead of one read.
	Depth int `json:"depth,omitempty"`
	// Regions set a prefetcher and static ranges per region.
	Regions []CacheRegion `json:"regions,omitempty"`
	// BNet and BIntra, bytes per second: the fabric's bandwidth and the
	// host↔DPU bandwidth of SODA's eq. 3. Zero measures them: BIntra by
	// a copy loop at start, BNet as the fastest entry fill seen.
	BNet   Size `json:"b_net,omitempty"`
	BIntra Size `json:"b_intra,omitempty"`
	// Window is how many dynamic-cache reads one hit-rate measurement
	// covers; Probe how many reads pass with the cache switched off
	// before it is tried again for a window.
	Window int `json:"window,omitempty"`
	Probe  int `json:"probe,omitempty"`
	// Queue bounds the entry fills waiting to be issued; prefetches
	// beyond it are dropped (counted).
	Queue int `json:"queue,omitempty"`
	// FillInflight bounds the bytes of entry fills on the fabric at once
	// (whole chunks, at least one): an entry's reads all at once are a
	// burst of datagrams (720 for 1 MiB at MTU 1500) that overruns
	// receive rings, and the drops come back as retransmissions.
	FillInflight Size `json:"fill_inflight,omitempty"`
}

// Cache defaults.
const (
	DefaultEntrySize    = 1 << 20 // SODA's cache entry
	DefaultStaticSize   = 64 << 20
	DefaultHistory      = 128
	DefaultDepth        = 2
	DefaultCacheWindow  = 1024
	DefaultProbeEvery   = 8 // windows
	DefaultFillQueue    = 64
	DefaultFillInflight = 256 << 10
)

// WithDefaults returns c with every zero knob at its default.
func (c CacheConfig) WithDefaults() CacheConfig {
	if c.EntrySize == 0 {
		c.EntrySize = DefaultEntrySize
	}
	if c.StaticSize == 0 {
		c.StaticSize = DefaultStaticSize
	}
	if c.History == 0 {
		c.History = DefaultHistory
	}
	if c.Depth == 0 {
		c.Depth = DefaultDepth
	}
	if c.Window == 0 {
		c.Window = DefaultCacheWindow
	}
	if c.Probe == 0 {
		c.Probe = DefaultProbeEvery * c.Window
	}
	if c.Queue == 0 {
		c.Queue = DefaultFillQueue
	}
	if c.FillInflight == 0 {
		c.FillInflight = DefaultFillInflight
	}
	return c
}

// Validate checks c (after defaults) against the protocol's chunk size.
func (c CacheConfig) Validate(chunk int) error {
	c = c.WithDefaults()
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("farmem: cache config: "+format, a...)) }
	if chunk > 0 && (c.EntrySize < Size(chunk) || c.EntrySize%Size(chunk) != 0 || c.EntrySize > 1<<30) {
		bad("entry_size %v: want a multiple of chunk_size %d, at most 1GiB", c.EntrySize, chunk)
	}
	if c.Size != 0 && c.Size < c.EntrySize {
		bad("size %v: want 0 (no dynamic cache) or at least one entry (%v)", c.Size, c.EntrySize)
	}
	if c.History < 2 || c.History > 1<<16 {
		bad("history %d: want 2 to 65536", c.History)
	}
	if c.Depth < 1 || c.Depth > 64 {
		bad("depth %d: want 1 to 64", c.Depth)
	}
	if c.Window < 1 || c.Probe < 1 || c.Queue < 1 {
		bad("window %d, probe %d, queue %d: want each at least 1", c.Window, c.Probe, c.Queue)
	}
	if c.Prefetcher >= numPrefetchers {
		bad("prefetcher %v", c.Prefetcher)
	}
	seen := map[uint32]bool{}
	for _, r := range c.Regions {
		if seen[r.Region] {
			bad("region %d listed twice", r.Region)
		}
		seen[r.Region] = true
		if r.Prefetcher != nil && *r.Prefetcher >= numPrefetchers {
			bad("region %d: prefetcher %v", r.Region, *r.Prefetcher)
		}
	}
	return errors.Join(errs...)
}
