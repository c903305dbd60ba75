package graph

import (
	"context"
	"errors"
	"fmt"

	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem/fmap"
)

// Upload copies a CSR image into a new far-memory region through c (to a
// DPU agent or a memory node): it allocates a writable region of the
// image's size, writes it chunk by chunk with the explicit API, syncs it to
// the memory node's disk and releases the writer lease, so that programs
// can map the region read-only. For files already on the memory node, a
// preload (lovelock mem create --preload) copies without the network.
func Upload(ctx context.Context, c *farmem.Client, img []byte) (uint32, error) {
	r, err := c.Alloc(ctx, uint64(len(img)))
	if err != nil {
		return 0, fmt.Errorf("graph: allocate a region of %d bytes: %w", len(img), err)
	}
	if err := CopyTo(r, img, farmem.DefaultChunkSize); err != nil {
		r.Close()
		return 0, err
	}
	if err := r.Sync(); err != nil {
		r.Close()
		return 0, fmt.Errorf("graph: sync region %d: %w", r.ID(), err)
	}
	if err := r.Close(); err != nil {
		return 0, fmt.Errorf("graph: close region %d: %w", r.ID(), err)
	}
	return r.ID(), nil
}

// MapRegion maps the far-memory region id, which holds a CSR file, through
// the host agent serving socket (lovelockd's far_memory_host.socket),
// read-only, and opens the graph over the mapping's bytes. opts sets the
// host buffer (fmap's default: a third of the region). Close the mapping
// when done with the graph.
func MapRegion(ctx context.Context, socket string, id uint64, opts fmap.Options) (*Graph, *fmap.Mapping, error) {
	m, err := fmap.Map(ctx, socket, fmap.RegionRef{ID: id, Name: "graph", ReadOnly: true}, opts)
	if err != nil {
		return nil, nil, fmt.Errorf("graph: map region %d: %w", id, err)
	}
	g, err := Open(m.Bytes())
	if err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("graph: region %d: %w", id, err)
	}
	return g, m, nil
}

// Caching is how a run over far memory uses the DPU agent's caches
// (docs/farmem.md, DPU caches), SODA's two options: the vertex data (the
// offset arrays) in the static cache, or the edges served by the dynamic
// cache with a prefetcher.
type Caching struct {
	// Static loads the graph's offset arrays into the static cache.
	Static bool
	// Prefetcher is the region's prefetcher on the agent: "off" keeps the
	// region out of the dynamic cache; "adjacent" (SODA's), "stride" or
	// "hints" (the engine's hints: Hints reports it) use it.
	Prefetcher string
	// WholeRegion lets the dynamic cache hold the offset arrays too. By
	// default it holds only the edge arrays, as SODA's dynamic edge cache
	// does: the offsets' reads then go on to the memory node (or hit the
	// static cache) and take no entry from the edges.
	WholeRegion bool
}

// ParseCaching reads lovelock graph run's --cache (off, static, dynamic),
// --prefetch (adjacent, stride, hints, off; "" for the mode's default:
// off for static, adjacent for dynamic) and --dynamic-scope (edges, the
// default, or region: what the dynamic cache holds). static with a
// prefetcher uses both caches.
func ParseCaching(cache, prefetch, scope string) (Caching, error) {
	c, err := parseCaching(cache, prefetch)
	if err != nil {
		return c, err
	}
	switch scope {
	case "", "edges":
	case "region":
		if c.Prefetcher == "off" {
			return Caching{}, errors.New("graph: --dynamic-scope region needs the dynamic cache (--cache dynamic, or static with --prefetch)")
		}
		c.WholeRegion = true
	default:
		return Caching{}, fmt.Errorf("graph: --dynamic-scope: dynamic cache scope %q: want edges or region", scope)
	}
	return c, nil
}

func parseCaching(cache, prefetch string) (Caching, error) {
	switch prefetch {
	case "", "adjacent", "stride", "hints", "off":
	default:
		return Caching{}, fmt.Errorf("graph: --prefetch: prefetcher %q: want adjacent, stride, hints or off", prefetch)
	}
	switch cache {
	case "off", "":
		if prefetch != "" && prefetch != "off" {
			return Caching{}, fmt.Errorf("graph: --prefetch %s needs the dynamic cache (--cache dynamic)", prefetch)
		}
		return Caching{Prefetcher: "off"}, nil
	case "static":
		if prefetch == "" {
			prefetch = "off"
		}
		return Caching{Static: true, Prefetcher: prefetch}, nil
	case "dynamic":
		switch prefetch {
		case "":
			prefetch = "adjacent"
		case "off":
			return Caching{}, errors.New("graph: --cache dynamic with --prefetch off would cache nothing; use --cache off")
		}
		return Caching{Prefetcher: prefetch}, nil
	}
	return Caching{}, fmt.Errorf("graph: --cache: cache mode %q: want off, static or dynamic", cache)
}

// Hints reports whether the engine should send hints (MappingHinter).
func (c Caching) Hints() bool { return c.Prefetcher == "hints" }

// Apply sets the caching of the region behind m, a mapping of g's image,
// through the host agent (fmap Advise → farmem.Region: SetPrefetcher,
// SetDynamicRanges, then LoadStatic of g's offsets, which returns once
// they are on the DPU). The prefetcher and the dynamic cache's ranges are
// the agent's, for every host reading the region. It fails
// when caching is asked for and the far end cannot give it (a host agent
// whose backend takes no advice, or a region served by a memory node
// directly, which has no cache); Caching{Prefetcher: "off"} then succeeds.
func (c Caching) Apply(ctx context.Context, m Advisor, g *Graph) (fmap.AdviceResult, error) {
	a := fmap.Advice{Prefetcher: c.Prefetcher}
	if c.Prefetcher != "off" && c.Prefetcher != "" {
		a.Dynamic = g.Edges()
		if c.WholeRegion {
			a.Dynamic = []fmap.Extent{{Offset: 0, Size: int64(FileSize(uint64(g.n), g.m, g.Symmetric()))}}
		}
	}
	if c.Static {
		a.Static = g.Offsets()
	}
	res, err := m.Advise(ctx, a)
	if err != nil {
		return res, fmt.Errorf("graph: set the DPU caches (%+v): %w", c, err)
	}
	wantsCache := c.Static || (c.Prefetcher != "off" && c.Prefetcher != "")
	switch {
	case wantsCache && !res.Supported:
		return res, errors.New("graph: the host agent's backend takes no cache advice (not a far-memory region)")
	case c.Static && !res.Static:
		return res, errors.New("graph: the region's far end has no static cache (the host agent reaches a memory node directly, not a DPU agent)")
	}
	return res, nil
}
