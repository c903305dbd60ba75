package graph

import (
	"context"
	"fmt"

	"github.com/lovelock-dpu/lovelock/dataplane/farmem/fmap"
)

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
