package main

import (
	"errors"
	"fmt"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
)

// The GPU host's device kinds (-device).
const (
	deviceShm  = "shm"  // shared memory; the models run in the executor role
	deviceCUDA = "cuda" // GPU 0 through the CUDA driver; the models run on it
)

// errNoCUDA is -device cuda in a binary built without the CUDA backend,
// which the default build leaves out so that it stays statically linked.
var errNoCUDA = errors.New("bench-ingest was built without the CUDA backend: build it with -tags cuda " +
	"(CGO_ENABLED=0 go build -tags cuda ./appliance/cmd/bench-ingest)")

// checkDevice validates -device before anything is brought up.
func checkDevice(kind string) error {
	switch kind {
	case deviceShm:
		return nil
	case deviceCUDA:
		if !cudaBuilt {
			return errNoCUDA
		}
		return nil
	}
	return fmt.Errorf("-device %q: want %s or %s", kind, deviceShm, deviceCUDA)
}

// openDevice opens the host side's device: the shared-memory stand-in,
// which hands every run to the executor role, or GPU 0.
func openDevice() (devmem.Device, error) {
	if *deviceKind == deviceCUDA {
		return openCUDA()
	}
	return devmem.NewShmWith(devmem.Info{}, devmem.ShmOptions{Executor: *executor}), nil
}

// openImporter returns the DPU agent's importer for the host's buffers:
// memfds for shm, CUDA handles (and memfds) for cuda.
func openImporter() (devmem.Importer, error) {
	if *deviceKind == deviceCUDA {
		return newCUDAImporter()
	}
	return devmem.ShmImporter{}, nil
}

// hostCard is the MIG card the host agent registers its device as: the
// shared-memory device stands in for an H100; a GPU says its own.
func hostCard(dev devmem.Device) (string, error) {
	if *deviceKind != deviceCUDA {
		return "H100-80GB", nil
	}
	info := dev.Info()
	if info.Card == "" {
		return "", fmt.Errorf("GPU %d (%s, %d MiB) is none of the MIG cards the host agent knows (cuda.CardName): "+
			"run the bench on an H100, H200 or A100, or with -device shm", info.Index, info.Name, info.MemBytes>>20)
	}
	return info.Card, nil
}

// describeGPU names the device the models run on, for the header lines;
// for cuda it opens GPU 0 once, so that a machine without the driver or
// the GPU fails before the testbed is brought up.
func describeGPU() (string, error) {
	if *deviceKind != deviceCUDA {
		return "", nil
	}
	dev, err := openCUDA()
	if err != nil {
		return "", fmt.Errorf("-device cuda: %w", err)
	}
	defer dev.Close()
	if _, err := hostCard(dev); err != nil {
		return "", fmt.Errorf("-device cuda: %w", err)
	}
	info := dev.Info()
	mig := "MIG off"
	if info.MIG {
		mig = "MIG on"
	}
	wait := "threads wait for the GPU as the driver does by default (spinning)"
	if *cudaBlock {
		wait = "threads sleep while they wait for the GPU (-cuda-block)"
	}
	return fmt.Sprintf("GPU %d, %s (%s, %d MiB, %s; %s)", info.Index, info.Name, info.Card, info.MemBytes>>20, mig, wait), nil
}
