// Package kernel owns the Debian kernel the Lovelock image boots: the lock
// file that pins one kernel package per architecture (name, version, sha256,
// modules the image needs), fetching that exact package through apt into a
// cache and verifying it, and taking the kernel and the needed modules out
// of it. It never installs a kernel on the build machine.
package kernel

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ulikunitz/xz"

	"github.com/lovelock-dpu/lovelock/images/kmod"
)

// ErrNotOnMirror reports that the pinned package version can no longer be
// downloaded: the mirror has moved on to a newer kernel.
var ErrNotOnMirror = errors.New("pinned kernel package is not on the mirror any more")

// ErrDownload reports that apt could not download the pinned package
// although apt's lists offer it: the network, a proxy or apt itself failed.
var ErrDownload = errors.New("kernel package download failed")

// ErrChecksum reports a downloaded package whose sha256 is not the pinned one.
var ErrChecksum = errors.New("kernel package sha256 mismatch")

// Lock pins the kernel package of every architecture the image is built for.
// It is kept as JSON in images/kernel.lock.json.
type Lock struct {
	// Note says what the file is; it is not read.
	Note string `json:"note,omitempty"`
	// Kernels maps a Go architecture (amd64, arm64) to its pinned package.
	Kernels map[string]Package `json:"kernels"`
	// Older maps a Go architecture to an older kernel that only the BPF
	// tests boot (make image-bpf-test-older), never the image: Debian's
	// 6.1, for the paths that differ by version (no tcx before 6.6, no
	// netdev family before 6.3), which the build machine cannot take.
	Older map[string]Package `json:"older,omitempty"`
}

// Package is one pinned Debian kernel package.
type Package struct {
	// Flavor is the Debian kernel flavor ("cloud-amd64", "arm64"); the
	// metapackage linux-image-<Flavor> names the current package of it.
	Flavor string `json:"flavor"`
	// Package is the versioned package name, e.g. linux-image-6.1.0-56-arm64.
	Package string `json:"package"`
	// Version is the Debian version of the package.
	Version string `json:"version"`
	// SHA256 is the hex sha256 of the .deb file.
	SHA256 string `json:"sha256"`
	// Release is the kernel release (uname -r), the name of the package's
	// /lib/modules directory.
	Release string `json:"release"`
	// Modules lists the modules the image loads at boot; their dependencies
	// are added automatically.
	Modules []string `json:"modules,omitempty"`
	// Series, when set, is the kernel series ("6.1") the package must stay
	// in: re-pinning refuses a metapackage that has moved to another.
	Series string `json:"series,omitempty"`
}

// LoadLock reads a lock file.
func LoadLock(file string) (*Lock, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("kernel lock: %w", err)
	}
	var l Lock
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("kernel lock %s: %w", file, err)
	}
	for _, pins := range []struct {
		what string
		m    map[string]Package
	}{{"", l.Kernels}, {"older ", l.Older}} {
		for arch, p := range pins.m {
			if p.Package == "" || p.Version == "" || p.Release == "" || len(p.SHA256) != 64 {
				return nil, fmt.Errorf("kernel lock %s: %s%s: package, version, release and a 64-digit sha256 are required", file, pins.what, arch)
			}
			if err := p.InSeries(p.Version); err != nil {
				return nil, fmt.Errorf("kernel lock %s: %s%s: %w", file, pins.what, arch, err)
			}
		}
	}
	return &l, nil
}

// Save writes the lock file, indented, with a trailing newline.
func (l *Lock) Save(file string) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(l); err != nil {
		return fmt.Errorf("kernel lock: %w", err)
	}
	if err := os.WriteFile(file, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("kernel lock: %w", err)
	}
	return nil
}

// For returns the pinned package of a Go architecture.
func (l *Lock) For(arch string) (Package, error) {
	p, ok := l.Kernels[arch]
	if !ok {
		return Package{}, fmt.Errorf("kernel lock: no kernel pinned for %s", arch)
	}
	return p, nil
}

// OlderFor returns the older kernel pinned for a Go architecture's BPF
// tests.
func (l *Lock) OlderFor(arch string) (Package, error) {
	p, ok := l.Older[arch]
	if !ok {
		return Package{}, fmt.Errorf("kernel lock: no older kernel pinned for %s (the \"older\" section of images/kernel.lock.json)", arch)
	}
	return p, nil
}

// InSeries checks that a Debian version ("6.1.192-2", "1:6.1.192-2") is
// of p.Series; any is when p has none.
func (p Package) InSeries(version string) error {
	if p.Series == "" {
		return nil
	}
	if i := strings.Index(version, ":"); i >= 0 {
		version = version[i+1:]
	}
	if !strings.HasPrefix(version, p.Series+".") {
		return fmt.Errorf("version %s is not of the pinned series %s (linux-image-%s has moved on: pin a flavor whose metapackage stays in %s, or change the series on purpose)",
			version, p.Series, p.Flavor, p.Series)
	}
	return nil
}

// Repin resolves the package linux-image-<old.Flavor> names now (Resolve),
// keeps old's modules and series, and refuses a package of another series.
func Repin(ctx context.Context, old Package, arch string) (Package, error) {
	p, err := Resolve(ctx, old.Flavor, arch)
	if err != nil {
		return Package{}, err
	}
	p.Modules, p.Series = old.Modules, old.Series
	if err := old.InSeries(p.Version); err != nil {
		return Package{}, fmt.Errorf("kernel: re-pin %s: %w", arch, err)
	}
	return p, nil
}

// DebName is the file name apt gives the package's .deb for a Debian
// architecture (an epoch's colon is written %3a).
func (p Package) DebName(arch string) string {
	return fmt.Sprintf("%s_%s_%s.deb", p.Package, strings.ReplaceAll(p.Version, ":", "%3a"), arch)
}

// Fetch returns the path of the package's .deb in cacheDir, downloading it
// with `apt-get download` when it is not there yet. Either way the file's
// sha256 must be the pinned one. arch is the Debian architecture; a foreign
// one must have been added with dpkg --add-architecture and apt-get update
// (make image-deps does both). log receives apt's progress.
func Fetch(ctx context.Context, p Package, arch, cacheDir string, log io.Writer) (string, error) {
	deb := filepath.Join(cacheDir, p.DebName(arch))
	if err := verify(deb, p.SHA256); err == nil {
		return deb, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(log, "kernel: cached %s: %v; downloading again\n", deb, err)
		if err := os.Remove(deb); err != nil {
			return "", fmt.Errorf("kernel: %w", err)
		}
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("kernel: cache: %w", err)
	}
	tmp, err := os.MkdirTemp(cacheDir, "download-")
	if err != nil {
		return "", fmt.Errorf("kernel: cache: %w", err)
	}
	defer os.RemoveAll(tmp)

	spec := fmt.Sprintf("%s:%s=%s", p.Package, arch, p.Version)
	cmd := exec.CommandContext(ctx, "apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", spec)
	cmd.Dir = tmp
	var out bytes.Buffer
	cmd.Stdout = io.MultiWriter(log, &out)
	cmd.Stderr = io.MultiWriter(log, &out)
	fmt.Fprintf(log, "kernel: apt-get download %s\n", spec)
	if err := cmd.Run(); err != nil {
		return "", downloadFailed(ctx, p, arch, strings.TrimSpace(out.String()), err)
	}
	got := filepath.Join(tmp, p.DebName(arch))
	if err := verify(got, p.SHA256); err != nil {
		return "", fmt.Errorf("kernel: downloaded %s: %w", spec, err)
	}
	if err := os.Rename(got, deb); err != nil {
		return "", fmt.Errorf("kernel: %w", err)
	}
	return deb, nil
}

// downloadFailed explains a failed download. Only when apt's lists do not
// offer the pinned version has the mirror moved on (ErrNotOnMirror, and
// re-pinning is the fix); otherwise the download itself failed, and
// re-pinning would not help.
func downloadFailed(ctx context.Context, p Package, arch, aptOut string, err error) error {
	listed, lerr := offered(ctx, p, arch)
	if lerr == nil && !listed {
		return notOnMirror(ctx, p, arch, aptOut, err)
	}
	check := "apt's lists offer that version"
	if lerr != nil {
		check = "could not ask apt whether its lists offer that version: " + lerr.Error()
	}
	return fmt.Errorf("kernel: %s %s (%s): %w (apt-get download: %v: %s); %s\n"+
		"  fix: check the network and apt's sources and proxy (apt-get download %s:%s=%s shows apt's whole output), then run make image again",
		p.Package, p.Version, arch, ErrDownload, err, lastLine(aptOut), check, p.Package, arch, p.Version)
}

// offered says whether apt's lists offer version p.Version of the package
// from a source (`apt-cache madison`; dpkg's status, an installed version,
// does not count: apt-get download cannot fetch from it).
func offered(ctx context.Context, p Package, arch string) (bool, error) {
	name := p.Package + ":" + arch
	cmd := exec.CommandContext(ctx, "apt-cache", "madison", name)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return false, fmt.Errorf("apt-cache madison %s: %w: %s", name, err, strings.TrimSpace(stderr.String()))
	}
	// " linux-image-… | 6.12.117-1~deb12u1 | http://deb.debian.org/debian bookworm/main arm64 Packages"
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Split(line, "|")
		if len(f) == 3 && strings.TrimSpace(f[1]) == p.Version && !strings.Contains(f[2], "dpkg/status") {
			return true, nil
		}
	}
	return false, nil
}

// notOnMirror explains a download that failed because the mirror moved on:
// it asks apt what the mirror offers now, so the message says how far it has
// moved on and how to re-pin.
func notOnMirror(ctx context.Context, p Package, arch, aptOut string, err error) error {
	now, _ := exec.CommandContext(ctx, "apt-cache", "policy", p.Package+":"+arch).Output()
	current := "nothing"
	if cur, rerr := Resolve(ctx, p.Flavor, arch); rerr == nil {
		current = cur.Package + " " + cur.Version
	}
	return fmt.Errorf("kernel: %s %s (%s): %w (apt-get download: %v: %s)\n"+
		"  apt-cache policy %s:%s says: %s\n"+
		"  the mirror's current linux-image-%s is %s\n"+
		"  fix: make image-deps IMAGE_APT_UPDATE=1 (refreshes apt's lists), then make image-lock to pin the current kernel, review and commit images/kernel.lock.json",
		p.Package, p.Version, arch, ErrNotOnMirror, err, lastLine(aptOut),
		p.Package, arch, oneLine(string(now)), p.Flavor, current)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if s == "" {
		return "no such package"
	}
	return s
}

// Resolve asks apt which package the metapackage linux-image-<flavor> of a
// Debian architecture depends on now, and returns it pinned: name, candidate
// version, the .deb's sha256 from the archive's index, and its release.
// Modules are left empty for the caller to fill.
func Resolve(ctx context.Context, flavor, arch string) (Package, error) {
	meta := "linux-image-" + flavor + ":" + arch
	deps, err := exec.CommandContext(ctx, "apt-cache", "depends", "--important", meta).Output()
	if err != nil {
		return Package{}, fmt.Errorf("kernel: apt-cache depends %s: %w", meta, err)
	}
	var name string
	for _, line := range strings.Split(string(deps), "\n") {
		if d, ok := strings.CutPrefix(strings.TrimSpace(line), "Depends: "); ok && strings.HasPrefix(d, "linux-image-") {
			name, _, _ = strings.Cut(d, ":")
			break
		}
	}
	if name == "" {
		return Package{}, fmt.Errorf("kernel: %s depends on no linux-image package", meta)
	}
	show, err := exec.CommandContext(ctx, "apt-cache", "show", "--no-all-versions", name+":"+arch).Output()
	if err != nil {
		return Package{}, fmt.Errorf("kernel: apt-cache show %s:%s: %w", name, arch, err)
	}
	p := Package{Flavor: flavor, Package: name, Release: strings.TrimPrefix(name, "linux-image-")}
	for _, line := range strings.Split(string(show), "\n") {
		if v, ok := strings.CutPrefix(line, "Version: "); ok {
			p.Version = v
		}
		if v, ok := strings.CutPrefix(line, "SHA256: "); ok {
			p.SHA256 = v
		}
	}
	if p.Version == "" || p.SHA256 == "" {
		return Package{}, fmt.Errorf("kernel: apt-cache show %s:%s: no version or sha256", name, arch)
	}
	return p, nil
}

func verify(file, want string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%s: sha256 %s, lock file pins %s: %w", file, got, want, ErrChecksum)
	}
	return nil
}

// Contents is what the image takes from a kernel package.
type Contents struct {
	// Release is the kernel release.
	Release string
	// Kernel is /boot/vmlinuz-<release> as packaged: a bzImage on amd64, an
	// uncompressed Image on arm64.
	Kernel []byte
	// Config is /boot/config-<release>.
	Config []byte
	// Modules lists the requested modules and their dependencies, in load
	// order.
	Modules []kmod.Info
	// Builtin lists requested modules that the kernel has built in.
	Builtin []string
	// ModuleData maps Info.Path to the module file, uncompressed.
	ModuleData map[string][]byte
}

// ConfigOption returns the value of CONFIG_<name> in the kernel's config
// ("y", "m", a number or string), or "" when it is not set.
func (c *Contents) ConfigOption(name string) string {
	key := "CONFIG_" + name + "="
	for _, line := range strings.Split(string(c.Config), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key); ok {
			return v
		}
	}
	return ""
}

// Extract takes the kernel, its config and the modules p.Modules needs out
// of a verified .deb, in one pass over the package's data archive (through
// `dpkg-deb --fsys-tarfile`). Modules stay as packaged (xz-compressed from
// 6.12 on) until the dependency walk needs one, so only the modules the
// image carries are ever decompressed.
func Extract(ctx context.Context, deb string, p Package) (*Contents, error) {
	modRoot := "lib/modules/" + p.Release + "/"
	type packed struct {
		name string // as in the package, with its compression suffix
		data []byte
	}
	modules := make(map[string]packed) // by module name
	builtin := make(map[string]bool)
	c := &Contents{Release: p.Release, ModuleData: make(map[string][]byte)}
	err := walkDeb(ctx, deb, func(name string, r io.Reader) error {
		var dst *[]byte
		switch name {
		case "boot/vmlinuz-" + p.Release:
			dst = &c.Kernel
		case "boot/config-" + p.Release:
			dst = &c.Config
		}
		if dst != nil {
			b, err := io.ReadAll(r)
			*dst = b
			return err
		}
		if strings.TrimPrefix(name, "usr/") == modRoot+"modules.builtin" {
			b, err := io.ReadAll(r)
			for _, line := range strings.Fields(string(b)) {
				builtin[kmod.Normalize(line)] = true
			}
			return err
		}
		if _, ok := moduleRel(name, modRoot); !ok {
			return nil
		}
		b, err := io.ReadAll(r)
		modules[kmod.Normalize(name)] = packed{name: name, data: b}
		return err
	})
	if err != nil {
		return nil, err
	}
	if c.Kernel == nil {
		return nil, fmt.Errorf("kernel: %s has no /boot/vmlinuz-%s (is the release %q right?)", deb, p.Release, p.Release)
	}
	if len(modules) == 0 {
		return nil, fmt.Errorf("kernel: %s: no modules under /%s (is the release %q right?)", deb, modRoot, p.Release)
	}

	// A module the flavor builds in needs no loading (virtio_pci is a
	// module in 6.1 and built in from 6.12 on).
	var load []string
	for _, m := range p.Modules {
		if builtin[kmod.Normalize(m)] {
			c.Builtin = append(c.Builtin, kmod.Normalize(m))
		} else {
			load = append(load, m)
		}
	}
	// Walk the dependencies, decompressing each module once.
	all := make(map[string]kmod.Info)
	queue := slices.Clone(load)
	for len(queue) > 0 {
		n := kmod.Normalize(queue[0])
		queue = queue[1:]
		if _, done := all[n]; done {
			continue
		}
		pk, ok := modules[n]
		if !ok {
			// Closure below reports it with the module that needs it.
			continue
		}
		b, err := readModule(pk.name, bytes.NewReader(pk.data))
		if err != nil {
			return nil, fmt.Errorf("kernel: %w", err)
		}
		rel, _ := moduleRel(pk.name, modRoot)
		info, err := kmod.ReadInfo(b, rel)
		if err != nil {
			return nil, fmt.Errorf("kernel: %w", err)
		}
		if !strings.HasPrefix(info.Vermagic, p.Release+" ") {
			return nil, fmt.Errorf("kernel: module %s: vermagic %q is not for %s", rel, info.Vermagic, p.Release)
		}
		all[n] = info
		c.ModuleData[rel] = b
		queue = append(queue, info.Depends...)
	}
	closure, err := kmod.Closure(all, load)
	if err != nil {
		return nil, fmt.Errorf("kernel %s: %w", p.Release, err)
	}
	c.Modules = closure
	return c, nil
}

// moduleRel returns a module's path relative to /lib/modules/<release>
// (Debian also ships them under /usr/lib after the merged-/usr move), as
// the image stores it: uncompressed, so always ending in .ko.
func moduleRel(name, modRoot string) (string, bool) {
	name = strings.TrimPrefix(name, "usr/")
	rel, ok := strings.CutPrefix(name, modRoot)
	if !ok {
		return "", false
	}
	for _, ext := range []string{".ko", ".ko.xz", ".ko.gz", ".ko.zst"} {
		if base, found := strings.CutSuffix(rel, ext); found {
			return base + ".ko", true
		}
	}
	return "", false
}

// readModule reads a module file, decompressing it: Debian compresses
// modules with xz from 6.12 on, and the image loads them with a plain
// finit_module(2), which wants ELF. The module signature sits inside the
// compressed data, so it survives.
func readModule(name string, r io.Reader) ([]byte, error) {
	switch {
	case strings.HasSuffix(name, ".ko.xz"):
		zr, err := xz.NewReader(r)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return io.ReadAll(zr)
	case strings.HasSuffix(name, ".ko.gz"):
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return io.ReadAll(zr)
	case strings.HasSuffix(name, ".ko.zst"):
		return nil, fmt.Errorf("%s: zstd-compressed modules are not supported (Debian uses xz)", name)
	}
	return io.ReadAll(r)
}

// walkDeb calls fn for every regular file of the package's data archive,
// with its path cleaned of the leading "./".
func walkDeb(ctx context.Context, deb string, fn func(name string, r io.Reader) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", deb)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("kernel: dpkg-deb: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("kernel: dpkg-deb: %w", err)
	}
	walkErr := func() error {
		tr := tar.NewReader(out)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			if h.Typeflag != tar.TypeReg {
				continue
			}
			if err := fn(path.Clean(strings.TrimPrefix(h.Name, "./")), tr); err != nil {
				return err
			}
		}
	}()
	if walkErr != nil {
		cancel()
		_ = cmd.Wait()
		return fmt.Errorf("kernel: %s: %w", deb, walkErr)
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("kernel: dpkg-deb --fsys-tarfile %s: %w: %s", deb, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}
