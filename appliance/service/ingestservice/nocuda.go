//go:build !cuda

package ingestservice

import (
	"errors"
	"log/slog"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
)

// CUDABuilt says whether this lovelockd has the CUDA backend: built with
// -tags cuda (make lovelockd-cuda), which links it dynamically (purego
// loads libcuda through the system's loader). This one, the static build
// the DPU image ships, has not.
const CUDABuilt = false

var errNoCUDA = errors.New("this lovelockd is the static build without the CUDA backend (the DPU image's); " +
	"on a GPU host run the lovelockd of 'make lovelockd-cuda' (dynamically linked, for libcuda), or use device shm")

func cudaDevices([]GPUConfig, bool, *slog.Logger) ([]devmem.Device, []string, error) {
	return nil, nil, errNoCUDA
}

type importer struct{}

func newImporter() devmem.Importer { return importer{} }

func (importer) Import(h devmem.Handle) (devmem.Mapping, error) {
	if h.Kind != devmem.HandleMemfd {
		devmem.ShmImporter{}.Import(h) // closes the descriptor
		return nil, errNoCUDA
	}
	return devmem.ShmImporter{}.Import(h)
}

func (importer) Close() error { return nil }
