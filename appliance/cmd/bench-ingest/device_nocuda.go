//go:build !cuda

package main

import "github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"

// cudaBuilt says whether this binary has the CUDA backend. This one, the
// default static build, has not: importing the backend (purego) would link
// it dynamically.
const cudaBuilt = false

func openCUDA() (devmem.Device, error) { return nil, errNoCUDA }

func newCUDAImporter() (devmem.Importer, error) { return nil, errNoCUDA }
