package bpf

import "github.com/cilium/ebpf"

// SteerSpec returns the steering objects' collection spec as Load loads it,
// for tests and tools that build a variant of it (another build of the
// programs, to test upgrades).
func SteerSpec() (*ebpf.CollectionSpec, error) { return loadSteer() }
