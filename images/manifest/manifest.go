// Package manifest is the manifest.json that `make image` (mkimage) writes
// beside each architecture's image, and that `lovelock image flash` reads:
// one type for the writer and the readers.
package manifest

import (
	"fmt"
	"io"
	"strings"
)

// Name is the manifest's file name in an image directory.
const Name = "manifest.json"

// Manifest describes one architecture's image; it carries no timestamps,
// so it is as reproducible as the image.
type Manifest struct {
	Version   string   `json:"version"`
	Arch      string   `json:"arch"`
	Kernel    Kernel   `json:"kernel"`
	Initramfs File     `json:"initramfs"`
	BFB       *BFB     `json:"bfb,omitempty"`
	Binaries  []File   `json:"binaries"`
	Configs   []File   `json:"configs"`
	Modules   []Module `json:"modules"`
	Builtin   []string `json:"builtin_modules,omitempty"`
}

// Kernel is the image's kernel and the package it came from.
type Kernel struct {
	Package        string `json:"package"`
	PackageVersion string `json:"package_version"`
	PackageSHA256  string `json:"package_sha256"`
	Release        string `json:"release"`
	File           string `json:"file"`
	Size           int    `json:"size"`
	SHA256         string `json:"sha256"`
	// RshimLog: the kernel has mlxbf-bootctl, so /init can write the rshim
	// log; the flash warns when it cannot. Nil in manifests written before
	// the field: unknown.
	RshimLog *bool `json:"rshim_log,omitempty"`
}

// File is one file of the image.
type File struct {
	Path    string `json:"path"`
	Size    int    `json:"size"`
	SHA256  string `json:"sha256"`
	Entries int    `json:"entries,omitempty"`
}

// Module is a kernel module in the initramfs.
type Module struct {
	Name string `json:"name"`
	Path string `json:"path"`
	Size int    `json:"size"`
}

// BFB is the boot stream built for the image.
type BFB struct {
	File     string   `json:"file"`
	Size     int      `json:"size"`
	SHA256   string   `json:"sha256"`
	Firmware string   `json:"firmware"`
	Images   []string `json:"images"`
}

// NoRshimLog reports whether the manifest says the kernel cannot write
// the rshim log (false when it does not say).
func (m *Manifest) NoRshimLog() bool { return m.Kernel.RshimLog != nil && !*m.Kernel.RshimLog }

// Print writes a summary of the image for its builder.
func (m *Manifest) Print(w io.Writer) {
	mib := func(n int) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
	fmt.Fprintf(w, "%s image %s: kernel %s (%s %s)\n", m.Arch, m.Version, m.Kernel.Release, m.Kernel.Package, m.Kernel.PackageVersion)
	fmt.Fprintf(w, "  %-20s %10s  sha256 %s\n", m.Kernel.File, mib(m.Kernel.Size), m.Kernel.SHA256)
	if m.NoRshimLog() && m.Arch == "arm64" {
		fmt.Fprintf(w, "  kernel lacks mlxbf-bootctl (CONFIG_MLXBF_BOOTCTL): a flash cannot see this image come up; watch the card's UART console\n")
	}
	fmt.Fprintf(w, "  %-20s %10s  sha256 %s (%d entries)\n", m.Initramfs.Path, mib(m.Initramfs.Size), m.Initramfs.SHA256, m.Initramfs.Entries)
	if m.BFB != nil {
		fmt.Fprintf(w, "  %-20s %10s  sha256 %s (firmware: %s)\n", m.BFB.File, mib(m.BFB.Size), m.BFB.SHA256, m.BFB.Firmware)
	}
	var mods []string
	for _, mod := range m.Modules {
		mods = append(mods, mod.Name)
	}
	fmt.Fprintf(w, "  modules: %s (built in: %s)\n", strings.Join(mods, " "), strings.Join(m.Builtin, " "))
}
