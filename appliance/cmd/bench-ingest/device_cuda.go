//go:build cuda

package main

import (
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem/cuda"
)

// cudaBuilt says whether this binary has the CUDA backend: built with
// -tags cuda (make bench-ingest-cuda-bin), which links it dynamically
// (purego loads libcuda through the system's loader).
const cudaBuilt = true

// openCUDA opens GPU 0; without the NVIDIA driver the error wraps
// cuda.ErrNoDriver.
func openCUDA() (devmem.Device, error) {
	d, err := cuda.Open(cuda.Options{Index: 0, BlockingWait: *cudaBlock})
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return d, nil
}

// cudaImporter maps memfds itself and CUDA handles through the driver, as
// lovelockd's ingest service does; the driver is loaded up front, so that
// a DPU agent that cannot map the GPU's buffers fails before it is ready.
type cudaImporter struct{ cu *cuda.Importer }

func newCUDAImporter() (devmem.Importer, error) {
	c, err := cuda.NewImporter(cuda.ImporterOptions{BlockingWait: *cudaBlock})
	if err != nil {
		return nil, err
	}
	return cudaImporter{cu: c}, nil
}

func (im cudaImporter) Import(h devmem.Handle) (devmem.Mapping, error) {
	if h.Kind == devmem.HandleMemfd {
		return devmem.ShmImporter{}.Import(h)
	}
	return im.cu.Import(h)
}

func (im cudaImporter) Close() error { return im.cu.Close() }
