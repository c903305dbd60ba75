package graph

import (
	"context"
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
