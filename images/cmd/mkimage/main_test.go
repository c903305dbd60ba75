package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lovelock-dpu/lovelock/images/kernel"
	"github.com/lovelock-dpu/lovelock/images/kmod"
	"github.com/lovelock-dpu/lovelock/images/manifest"
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

// requireConsistent fails t unless every file dir's manifest names is there
// with the manifest's sha256 (no manifest at all is consistent too).
func requireConsistent(t *testing.T, dir string) {
	t.Helper()
	js, err := os.ReadFile(filepath.Join(dir, manifest.Name))
	if os.IsNotExist(err) {
		return
	}
	var m manifest.Manifest
	if err := json.Unmarshal(js, &m); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{m.Kernel.File: m.Kernel.SHA256, m.Initramfs.Path: m.Initramfs.SHA256}
	if m.BFB != nil {
		want[m.BFB.File] = m.BFB.SHA256
	}
	for name, h := range want {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || sum(b) != h {
			t.Errorf("manifest says %s has sha256 %s; the file: %v, sha256 %s", name, h, err, sum(b))
		}
	}
}

// TestInstallFailsCleanly: a rebuild that fails, on a missing DEFAULT_BFB or
// while writing, never leaves a manifest (or .bfb) beside files it does not
// describe.
func TestInstallFailsCleanly(t *testing.T) {
	image := func(fill string) []byte {
		k := []byte(strings.Repeat(fill, 64))
		copy(k[56:], "ARM\x64")
		return k
	}
	build := func(b *builder, dir, fill string) error {
		k, initrd := image(fill), []byte("initramfs "+fill)
		m := &manifest.Manifest{Version: b.version, Arch: "arm64",
			Kernel:    manifest.Kernel{File: kernelName("arm64"), Size: len(k), SHA256: sum(k)},
			Initramfs: manifest.File{Path: initramfsName, Size: len(initrd), SHA256: sum(initrd)}}
		return b.install(dir, "arm64", k, initrd, m)
	}
	dir := t.TempDir()
	if err := build(&builder{version: "v1"}, dir, "a"); err != nil {
		t.Fatal(err)
	}
	requireConsistent(t, dir)
	if _, err := os.Stat(filepath.Join(dir, bfbName)); err != nil {
		t.Fatal(err)
	}

	missing := filepath.Join(t.TempDir(), "default.bfb")
	err := build(&builder{version: "v2", defaultBFB: missing}, dir, "b")
	if err == nil || !strings.Contains(err.Error(), "default bfb") {
		t.Fatalf("build with a missing default bfb: err = %v", err)
	}
	requireConsistent(t, dir)

	// The initramfs cannot be written: the manifest and .bfb of the
	// previous build must not survive beside the new kernel.
	if err := os.Mkdir(filepath.Join(dir, initramfsName+".tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := build(&builder{version: "v3"}, dir, "c"); err == nil {
		t.Fatal("build succeeded although the initramfs could not be written")
	}
	requireConsistent(t, dir)
	for _, name := range []string{manifest.Name, bfbName} {
		if _, err := os.Stat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("%s of the previous build left: %v", name, err)
		}
	}
}

func TestLoadFirmware(t *testing.T) {
	if fw, _, err := loadFirmware(""); err != nil || fw != nil {
		t.Fatalf("no firmware: %v, %v", fw, err)
	}
	if _, _, err := loadFirmware(filepath.Join(t.TempDir(), "none.bfb")); err == nil || !strings.Contains(err.Error(), "DEFAULT_BFB") {
		t.Fatalf("missing file: %v", err)
	}
}
