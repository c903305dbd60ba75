// Command mkimage builds the Lovelock appliance image (`make image`): for
// each architecture it cross-builds static lovelockd, lovelock and the
// image's /init, takes the pinned Debian kernel and the modules it needs from
// the kernel package (fetched through apt and checked against
// images/kernel.lock.json), writes a reproducible initramfs, and for arm64 a
// BlueField boot stream (.bfb). A manifest lists versions, sizes and hashes.
//
// `mkimage lock` re-pins the kernel to what the mirror's metapackage names
// now (`make image-lock`).
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/lovelock-dpu/lovelock/images/appconfig"
	"github.com/lovelock-dpu/lovelock/images/bfb"
	"github.com/lovelock-dpu/lovelock/images/initramfs"
	"github.com/lovelock-dpu/lovelock/images/kernel"
	"github.com/lovelock-dpu/lovelock/images/kmod"
	"github.com/lovelock-dpu/lovelock/images/manifest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	app := &ucli.App{
		Name:  "mkimage",
		Usage: "build the Lovelock DPU image (kernel, initramfs, manifest, .bfb)",
		Commands: []*ucli.Command{
			buildCommand(),
			lockCommand(),
		},
		Writer:         os.Stdout,
		ErrWriter:      os.Stderr,
		ExitErrHandler: func(*ucli.Context, error) {},
	}
	if err := app.RunContext(ctx, os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

var commonFlags = []ucli.Flag{
	&ucli.StringFlag{Name: "lock", Value: "images/kernel.lock.json", Usage: "kernel lock file"},
	&ucli.StringFlag{Name: "cache", Value: "images/.cache", Usage: "where downloaded kernel packages are kept"},
	&ucli.StringSliceFlag{Name: "arch", Value: ucli.NewStringSlice("amd64", "arm64"), Usage: "architectures to build"},
}

func buildCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "build",
		Usage: "build the image for every --arch into --out/<arch>/",
		Flags: append([]ucli.Flag{
			&ucli.StringFlag{Name: "out", Value: "bin/image", Usage: "output directory"},
			&ucli.StringFlag{Name: "go", Value: "go", Usage: "Go command used to cross-build the binaries"},
			&ucli.StringFlag{Name: "ldflags", Usage: "linker flags for the binaries (version stamping)"},
			&ucli.StringFlag{Name: "version", Value: "dev", Usage: "version recorded in the manifest and the image"},
			&ucli.StringFlag{Name: "config-dir", Value: "images/config", Usage: "appliance configurations to ship (appliance.json is the default)"},
			&ucli.StringFlag{Name: "default-bfb", EnvVars: []string{"DEFAULT_BFB"}, Usage: "the card's firmware stream (mlxbf-bootimages' default.bfb); without it the .bfb is an OS-only stream"},
		}, commonFlags...),
		Action: func(c *ucli.Context) error {
			lock, err := kernel.LoadLock(c.String("lock"))
			if err != nil {
				return err
			}
			// A wrong DEFAULT_BFB fails now, not after minutes of building.
			if _, _, err := loadFirmware(c.String("default-bfb")); err != nil {
				return err
			}
			b := builder{
				ctx:        c.Context,
				log:        c.App.Writer,
				lock:       lock,
				cache:      c.String("cache"),
				out:        c.String("out"),
				goCmd:      c.String("go"),
				ldflags:    c.String("ldflags"),
				version:    c.String("version"),
				configDir:  c.String("config-dir"),
				defaultBFB: c.String("default-bfb"),
			}
			for _, arch := range c.StringSlice("arch") {
				start := time.Now()
				m, err := b.build(arch)
				if err != nil {
					return fmt.Errorf("%s: %w", arch, err)
				}
				m.Print(c.App.Writer)
				fmt.Fprintf(c.App.Writer, "%s: built in %v\n\n", arch, time.Since(start).Round(100*time.Millisecond))
			}
			return nil
		},
	}
}

func lockCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "lock",
		Usage: "pin each --arch's kernel, and the older kernel its BPF tests boot, to what linux-image-<flavor> names on the mirror now",
		Flags: commonFlags,
		Action: func(c *ucli.Context) error {
			file := c.String("lock")
			lock, err := kernel.LoadLock(file)
			if err != nil {
				return err
			}
			repin := func(pins map[string]kernel.Package, what, arch string) error {
				old := pins[arch]
				p, err := kernel.Repin(c.Context, old, arch)
				if err != nil {
					return err
				}
				if _, err := kernel.Fetch(c.Context, p, arch, c.String("cache"), c.App.Writer); err != nil {
					return err
				}
				pins[arch] = p
				fmt.Fprintf(c.App.Writer, "%s%s: %s %s -> %s %s\n", what, arch, old.Package, old.Version, p.Package, p.Version)
				return nil
			}
			for _, arch := range c.StringSlice("arch") {
				if _, err := lock.For(arch); err != nil {
					return err
				}
				if err := repin(lock.Kernels, "", arch); err != nil {
					return err
				}
				if _, ok := lock.Older[arch]; ok {
					if err := repin(lock.Older, "older ", arch); err != nil {
						return err
					}
				}
			}
			return lock.Save(file)
		},
	}
}

type builder struct {
	ctx        context.Context
	log        io.Writer
	lock       *kernel.Lock
	cache      string
	out        string
	goCmd      string
	ldflags    string
	version    string
	configDir  string
	defaultBFB string
}

// buildinfoVersion is the symbol the linker stamps the version into.
const buildinfoVersion = "github.com/lovelock-dpu/lovelock/control/buildinfo.Version"

// binaries the image carries: where they come from and where they go.
var binaries = []struct{ pkg, dst string }{
	{"./images/cmd/lovelock-init", "/init"},
	{"./appliance/cmd/lovelockd", "/usr/bin/lovelockd"},
	{"./control/cmd/lovelock", "/usr/bin/lovelock"},
}

func (b *builder) build(arch string) (*manifest.Manifest, error) {
	pkg, err := b.lock.For(arch)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(b.out, arch)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	m := &manifest.Manifest{Version: b.version, Arch: arch}

	// Kernel first: a mirror that moved on is the likeliest failure.
	deb, err := kernel.Fetch(b.ctx, pkg, arch, b.cache, b.log)
	if err != nil {
		return nil, err
	}
	kc, err := kernel.Extract(b.ctx, deb, pkg)
	if err != nil {
		return nil, err
	}
	if err := checkKernelFormat(arch, kc.Kernel); err != nil {
		return nil, err
	}
	m.Kernel = manifest.Kernel{Package: pkg.Package, PackageVersion: pkg.Version, PackageSHA256: pkg.SHA256,
		Release: kc.Release, File: kernelName(arch), Size: len(kc.Kernel), SHA256: sum(kc.Kernel),
		RshimLog: ptr(rshimLog(kc))}

	a := initramfs.New()
	for _, d := range []string{"/proc", "/sys", "/dev", "/run", "/tmp", "/etc/lovelock"} {
		if err := a.Add(initramfs.Entry{Path: d, Kind: initramfs.Dir}); err != nil {
			return nil, err
		}
	}
	// The kernel opens /dev/console for init's stdio before anything is
	// mounted: it must be in the archive.
	if err := a.Add(initramfs.Entry{Path: "/dev/console", Kind: initramfs.CharDev, Perm: 0o600, Major: 5, Minor: 1}); err != nil {
		return nil, err
	}
	for _, bin := range binaries {
		data, err := b.goBuild(arch, bin.pkg)
		if err != nil {
			return nil, err
		}
		if err := a.AddFile(bin.dst, 0o755, data); err != nil {
			return nil, err
		}
		m.Binaries = append(m.Binaries, manifest.File{Path: bin.dst, Size: len(data), SHA256: sum(data)})
	}
	if err := b.addConfigs(a, m); err != nil {
		return nil, err
	}
	modDir := "/lib/modules/" + kc.Release
	var dep bytes.Buffer
	if err := kmod.WriteDep(&dep, kc.Modules); err != nil {
		return nil, err
	}
	if err := a.AddFile(modDir+"/modules.dep", 0o644, dep.Bytes()); err != nil {
		return nil, err
	}
	for _, mod := range kc.Modules {
		data := kc.ModuleData[mod.Path]
		if err := a.AddFile(modDir+"/"+mod.Path, 0o644, data); err != nil {
			return nil, err
		}
		m.Modules = append(m.Modules, manifest.Module{Name: mod.Name, Path: mod.Path, Size: len(data)})
	}
	m.Builtin = kc.Builtin
	osRelease := fmt.Sprintf("NAME=Lovelock\nID=lovelock\nVERSION=%s\nPRETTY_NAME=\"Lovelock %s (%s, Debian kernel %s)\"\n",
		b.version, b.version, arch, kc.Release)
	if err := a.AddFile("/etc/os-release", 0o644, []byte(osRelease)); err != nil {
		return nil, err
	}

	var initrd bytes.Buffer
	if err := a.WriteGzip(&initrd); err != nil {
		return nil, err
	}
	m.Initramfs = manifest.File{Path: initramfsName, Size: initrd.Len(), SHA256: sum(initrd.Bytes()), Entries: a.Len()}

	if err := b.install(dir, arch, kc.Kernel, initrd.Bytes(), m); err != nil {
		return nil, err
	}
	return m, nil
}

// Output names that do not depend on the architecture.
const (
	initramfsName = "initramfs.cpio.gz"
	bfbName       = "lovelock.bfb"
)

// install writes one architecture's kernel, initramfs, .bfb (arm64) and
// manifest into dir. Whatever can fail on the inputs (the firmware stream)
// runs before the first write, and the old manifest and .bfb are removed
// before any file is replaced, the new manifest written last: a failed
// build never leaves a manifest or .bfb beside files it does not describe.
func (b *builder) install(dir, arch string, k, initrd []byte, m *manifest.Manifest) error {
	var stream []byte
	if arch == "arm64" {
		var err error
		if stream, m.BFB, err = b.bfbStream(k, initrd); err != nil {
			return err
		}
	}
	js, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	for _, name := range []string{manifest.Name, bfbName} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove the previous build's %s: %w", name, err)
		}
	}
	if err := writeFile(filepath.Join(dir, m.Kernel.File), k); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, initramfsName), initrd); err != nil {
		return err
	}
	if stream != nil {
		if err := writeFile(filepath.Join(dir, bfbName), stream); err != nil {
			return err
		}
	}
	return writeFile(filepath.Join(dir, manifest.Name), append(js, '\n'))
}

// rshimLog says whether the image's kernel can write the rshim log that
// `lovelock image flash` follows: it needs mlxbf-bootctl built in, or as a
// module the image carries. Debian's kernels have neither.
func rshimLog(kc *kernel.Contents) bool {
	switch kc.ConfigOption("MLXBF_BOOTCTL") {
	case "y":
		return true
	case "m":
		for _, mod := range kc.Modules {
			if mod.Name == "mlxbf_bootctl" {
				return true
			}
		}
	}
	return false
}

func kernelName(arch string) string {
	if arch == "arm64" {
		return "Image"
	}
	return "vmlinuz"
}

// checkKernelFormat refuses a kernel the target cannot boot: BlueField's
// UEFI needs an uncompressed arm64 Image ("ARM\x64" at offset 56) and
// rejects gzip.
func checkKernelFormat(arch string, k []byte) error {
	switch arch {
	case "arm64":
		if len(k) < 64 || string(k[56:60]) != "ARM\x64" {
			if len(k) > 2 && k[0] == 0x1f && k[1] == 0x8b {
				return fmt.Errorf("kernel: arm64 vmlinuz is gzip-compressed; BlueField's UEFI needs an uncompressed Image")
			}
			return fmt.Errorf("kernel: arm64 vmlinuz has no Image magic")
		}
	case "amd64":
		if len(k) < 0x206 || string(k[0x202:0x206]) != "HdrS" {
			return fmt.Errorf("kernel: amd64 vmlinuz is not a bzImage")
		}
	}
	return nil
}

// goBuild cross-builds one static binary, reproducibly (-trimpath, no VCS
// stamp, CGO off), and returns it.
func (b *builder) goBuild(arch, pkg string) ([]byte, error) {
	tmp, err := os.CreateTemp("", "mkimage-bin-")
	if err != nil {
		return nil, err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	// The version last: /init announces it in its ready line and the flash
	// compares it with the stream's boot description, so the two must agree
	// whatever --ldflags says (the linker takes the last -X).
	ldflags := strings.TrimSpace(b.ldflags + " -X " + buildinfoVersion + "=" + b.version)
	args := []string{"build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", tmp.Name(), pkg}
	cmd := exec.CommandContext(b.ctx, b.goCmd, args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go build %s for %s: %w\n%s", pkg, arch, err, out.String())
	}
	return os.ReadFile(tmp.Name())
}

// addConfigs ships every *.json of the config directory under
// /etc/lovelock/, each validated; appliance.json is what /init reads
// unless the kernel command line names another (lovelock.config=).
func (b *builder) addConfigs(a *initramfs.Archive, m *manifest.Manifest) error {
	files, err := filepath.Glob(filepath.Join(b.configDir, "*.json"))
	if err != nil {
		return err
	}
	haveDefault := false
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if _, err := appconfig.Parse(data); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		dst := "/etc/lovelock/" + filepath.Base(f)
		haveDefault = haveDefault || dst == appconfig.Path
		if err := a.AddFile(dst, 0o644, data); err != nil {
			return err
		}
		m.Configs = append(m.Configs, manifest.File{Path: dst, Size: len(data), SHA256: sum(data)})
	}
	if !haveDefault {
		return fmt.Errorf("config dir %s has no appliance.json", b.configDir)
	}
	return nil
}

// loadFirmware reads and checks the card's firmware stream (--default-bfb)
// and returns its images and the file's sha256; none when file is empty.
func loadFirmware(file string) ([]bfb.Image, string, error) {
	if file == "" {
		return nil, "", nil
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, "", fmt.Errorf("default bfb: %w (DEFAULT_BFB names the card's firmware stream, default.bfb from "+
			"mlxbf-bootimages; leave it empty for an OS-only .bfb)", err)
	}
	fw, err := bfb.ReadValid(bytes.NewReader(raw))
	if err != nil {
		return nil, "", fmt.Errorf("default bfb %s: %w", file, err)
	}
	if !bfb.HasFirmware(fw) {
		return nil, "", fmt.Errorf("default bfb %s: holds no BL2 image: not a firmware stream (want the card's default.bfb)", file)
	}
	return fw, sum(raw), nil
}

// bfbStream returns lovelock.bfb and its manifest entry: the OS images over
// the firmware of --default-bfb, or the OS images alone.
func (b *builder) bfbStream(k, initrd []byte) ([]byte, *manifest.BFB, error) {
	extra := " initrd=initramfs"
	osImages := bfb.OS{
		Kernel: k, Initramfs: initrd, Description: bfb.LovelockDescription(b.version),
		ArgsBF2: bfb.ConsoleBF2 + extra,
		ArgsBF3: bfb.ConsoleBF3 + extra,
	}.Images()
	images := osImages
	info := &manifest.BFB{File: bfbName, Firmware: "none: OS-only stream (build with DEFAULT_BFB=/path/to/default.bfb to flash a card)"}
	if b.defaultBFB != "" {
		fw, fwSum, err := loadFirmware(b.defaultBFB)
		if err != nil {
			return nil, nil, err
		}
		images = bfb.Merge(fw, osImages)
		info.Firmware = fmt.Sprintf("%s (sha256 %s)", filepath.Base(b.defaultBFB), fwSum)
	}
	stream, err := bfb.Marshal(images)
	if err != nil {
		return nil, nil, err
	}
	// Read back what was written: the writer and the reader agree.
	if _, err := bfb.ReadValid(bytes.NewReader(stream)); err != nil {
		return nil, nil, fmt.Errorf("bfb self-check: %w", err)
	}
	info.Size, info.SHA256 = len(stream), sum(stream)
	for _, img := range images {
		info.Images = append(info.Images, fmt.Sprintf("%s v%d %d bytes", img.ID, img.Version, len(img.Data)))
	}
	return stream, info, nil
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// writeFile replaces path atomically, so a failed build never leaves a
// half-written image that looks complete.
func writeFile(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func ptr[T any](v T) *T { return &v }
