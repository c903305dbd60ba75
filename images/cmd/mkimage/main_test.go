package main

import (
	"bytes"
	"testing"
)

func TestCheckKernelFormat(t *testing.T) {
	image := make([]byte, 64)
	copy(image[56:], "ARM\x64")
	bz := make([]byte, 0x210)
	copy(bz[0x202:], "HdrS")
	tests := []struct {
		arch string
		k    []byte
		ok   bool
	}{
		{"arm64", image, true},
		{"arm64", append([]byte{0x1f, 0x8b}, bytes.Repeat([]byte{0}, 100)...), false}, // gzip: UEFI rejects it
		{"arm64", bz, false},
		{"amd64", bz, true},
		{"amd64", image, false},
	}
	for i, tt := range tests {
		if err := checkKernelFormat(tt.arch, tt.k); (err == nil) != tt.ok {
			t.Errorf("case %d (%s): err = %v", i, tt.arch, err)
		}
	}
}
