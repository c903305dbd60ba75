package main

import (
	"bytes"
	"testing"

	"github.com/lovelock-dpu/lovelock/images/kernel"
	"github.com/lovelock-dpu/lovelock/images/kmod"
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

// TestRshimLog: the manifest says the kernel can write the rshim log only
// with mlxbf-bootctl built in or shipped as a module.
func TestRshimLog(t *testing.T) {
	mod := []kmod.Info{{Name: "mlxbf_bootctl"}}
	for _, tc := range []struct {
		config string
		mods   []kmod.Info
		want   bool
	}{
		{"CONFIG_MLXBF_BOOTCTL=y\n", nil, true},
		{"CONFIG_MLXBF_BOOTCTL=m\n", mod, true},
		{"CONFIG_MLXBF_BOOTCTL=m\n", nil, false},
		{"# CONFIG_MLXBF_BOOTCTL is not set\n", nil, false},
	} {
		if got := rshimLog(&kernel.Contents{Config: []byte(tc.config), Modules: tc.mods}); got != tc.want {
			t.Errorf("rshimLog(%q, %v) = %v", tc.config, tc.mods, got)
		}
	}
}
