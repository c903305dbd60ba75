// Package mig owns the geometry of NVIDIA Multi-Instance GPU (MIG) cards: the
// GPU instance profiles of each supported card, the fixed memory-slice start
// slots each profile may occupy, the enumeration of every feasible layout, the
// validity check of a layout, and the placement state of one GPU as an 8-bit
// mask of occupied memory slices.
//
// A MIG card has seven compute slices and eight memory slices. A GPU instance
// of a profile covers a contiguous range of memory slices that must begin at
// one of the profile's start slots; instances fit together only if their
// memory ranges do not overlap. A capacity sum is not enough: 3g+3g+1g adds
// up to seven compute slices but does not fit, because each 3g instance covers
// four memory slices and the two of them cover all eight.
//
// The tables are static, taken from NVIDIA's MIG user guide (the "supported
// profiles" tables for A100, H100 and H200). Reading the live geometry from
// NVML and creating instances on a real GPU are not implemented: no GPU was
// available to test that code against.
package mig
