package kernel

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ulikunitz/xz"
)

func TestShippedLock(t *testing.T) {
	l, err := LoadLock("../kernel.lock.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, arch := range []string{"amd64", "arm64"} {
		p, err := l.For(arch)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(p.Package, "linux-image-") || p.Release != strings.TrimPrefix(p.Package, "linux-image-") {
			t.Errorf("%s: package %q and release %q disagree", arch, p.Package, p.Release)
		}
		if len(p.Modules) == 0 {
			t.Errorf("%s: no modules: the image could not reach its NIC", arch)
		}
	}
	// The BPF tests' older kernel: Debian's 6.1, a cloud flavor (amd64).
	older, err := l.OlderFor("amd64")
	if err != nil {
		t.Fatal(err)
	}
	if older.Series != "6.1" || !strings.HasPrefix(older.Version, "6.1.") || older.Release != strings.TrimPrefix(older.Package, "linux-image-") {
		t.Errorf("older amd64 kernel %+v: want a 6.1 package pinned to its series", older)
	}
	// Save writes what LoadLock reads.
	tmp := filepath.Join(t.TempDir(), "lock.json")
	if err := l.Save(tmp); err != nil {
		t.Fatal(err)
	}
	again, err := LoadLock(tmp)
	if err != nil || again.Kernels["arm64"].SHA256 != l.Kernels["arm64"].SHA256 || again.Older["amd64"].SHA256 != older.SHA256 {
		t.Fatalf("round trip: %v", err)
	}
	if b, _ := os.ReadFile(tmp); bytes.Contains(b, []byte(`\u003c`)) {
		t.Error("Save escapes < and > in the note")
	}
}

func TestLockRejects(t *testing.T) {
	tmp := filepath.Join(t.TempDir(), "lock.json")
	os.WriteFile(tmp, []byte(`{"kernels": {"amd64": {"package": "linux-image-x", "version": "1", "release": "x", "sha256": "short"}}}`), 0o644)
	if _, err := LoadLock(tmp); err == nil {
		t.Fatal("LoadLock accepted a short sha256")
	}
	l := &Lock{}
	if _, err := l.For("riscv64"); err == nil {
		t.Fatal("For found a kernel for an architecture without one")
	}
	if _, err := l.OlderFor("amd64"); err == nil {
		t.Fatal("OlderFor found a kernel in a lock without older ones")
	}
	sha := strings.Repeat("0", 64)
	for name, older := range map[string]string{
		"short sha256":   `{"package": "linux-image-x", "version": "6.1.1-1", "release": "x", "sha256": "short"}`,
		"another series": `{"package": "linux-image-x", "version": "6.12.1-1", "release": "x", "sha256": "` + sha + `", "series": "6.1"}`,
		"no release":     `{"package": "linux-image-x", "version": "6.1.1-1", "sha256": "` + sha + `", "series": "6.1"}`,
	} {
		os.WriteFile(tmp, []byte(`{"kernels": {}, "older": {"amd64": `+older+`}}`), 0o644)
		if _, err := LoadLock(tmp); err == nil || !strings.Contains(err.Error(), "older amd64") {
			t.Errorf("%s: LoadLock: %v, want an error naming older amd64", name, err)
		}
	}
}

// TestInSeries: a package pinned to a series accepts only versions of it
// (make image-lock refuses to re-pin Debian's 6.1 to the 6.12 a moved
// metapackage names); one without a series accepts any.
func TestInSeries(t *testing.T) {
	for _, tc := range []struct {
		series, version string
		ok              bool
	}{
		{"6.1", "6.1.192-2", true},
		{"6.1", "1:6.1.192-2", true},
		{"6.1", "6.12.117-1~deb12u1", false},
		{"6.1", "6.10.1-1", false},
		{"6.1", "5.10.1-1", false},
		{"", "6.12.117-1~deb12u1", true},
	} {
		err := Package{Flavor: "cloud-amd64", Series: tc.series}.InSeries(tc.version)
		if (err == nil) != tc.ok {
			t.Errorf("series %q, version %q: %v, want ok=%v", tc.series, tc.version, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "linux-image-cloud-amd64 has moved on") {
			t.Errorf("series %q, version %q: %v, want it to say the metapackage moved on", tc.series, tc.version, err)
		}
	}
}

func TestDebName(t *testing.T) {
	p := Package{Package: "linux-image-6.12.117+deb12-arm64", Version: "1:6.12.117-1~deb12u1"}
	if got := p.DebName("arm64"); got != "linux-image-6.12.117+deb12-arm64_1%3a6.12.117-1~deb12u1_arm64.deb" {
		t.Fatalf("DebName = %s", got)
	}
}

func TestFetchUsesVerifiedCache(t *testing.T) {
	dir := t.TempDir()
	p := Package{Package: "linux-image-test", Version: "1", SHA256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"} // sha256("test")
	os.WriteFile(filepath.Join(dir, p.DebName("amd64")), []byte("test"), 0o644)
	got, err := Fetch(context.Background(), p, "amd64", dir, &bytes.Buffer{})
	if err != nil || got != filepath.Join(dir, p.DebName("amd64")) {
		t.Fatalf("Fetch = %q, %v", got, err)
	}
	if err := verify(got, strings.Repeat("0", 64)); !errors.Is(err, ErrChecksum) {
		t.Fatalf("verify with a wrong sum: %v", err)
	}
}

// fakeKO is the smallest ELF64 module debug/elf reads: a .modinfo section.
func fakeKO(fields ...string) []byte {
	modinfo := []byte(strings.Join(fields, "\x00") + "\x00")
	shstr := []byte("\x00.modinfo\x00.shstrtab\x00")
	shOff := (64 + len(modinfo) + len(shstr) + 7) &^ 7
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, elf.Header64{
		Ident: [16]byte{0x7f, 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)},
		Type:  uint16(elf.ET_REL), Machine: uint16(elf.EM_AARCH64), Version: uint32(elf.EV_CURRENT),
		Shoff: uint64(shOff), Ehsize: 64, Shentsize: 64, Shnum: 3, Shstrndx: 2,
	})
	b.Write(modinfo)
	b.Write(shstr)
	b.Write(make([]byte, shOff-b.Len()))
	for _, sh := range []elf.Section64{{},
		{Name: 1, Type: uint32(elf.SHT_PROGBITS), Off: 64, Size: uint64(len(modinfo)), Addralign: 1},
		{Name: 10, Type: uint32(elf.SHT_STRTAB), Off: uint64(64 + len(modinfo)), Size: uint64(len(shstr)), Addralign: 1},
	} {
		binary.Write(&b, binary.LittleEndian, sh)
	}
	return b.Bytes()
}

func xzBytes(t *testing.T, b []byte) []byte {
	var out bytes.Buffer
	w, err := xz.NewWriter(&out)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(b)
	w.Close()
	return out.Bytes()
}

// TestExtract builds a small kernel package with dpkg-deb (xz-compressed
// and plain modules, a built-in one) and takes the image's files out of it.
func TestExtract(t *testing.T) {
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Fatalf("dpkg-deb (Debian's dpkg) is needed: %v", err)
	}
	const rel = "6.12.0-test-arm64"
	vermagic := "vermagic=" + rel + " SMP preempt mod_unload modversions aarch64"
	root := t.TempDir()
	files := map[string][]byte{
		"DEBIAN/control":                          []byte("Package: linux-image-test\nVersion: 1\nArchitecture: all\nMaintainer: t <t@t>\nDescription: test\n"),
		"boot/vmlinuz-" + rel:                     []byte("the kernel"),
		"boot/config-" + rel:                      []byte("CONFIG_BPF=y\n"),
		"lib/modules/" + rel + "/modules.builtin": []byte("kernel/drivers/virtio/virtio_pci.ko\n"),
		"lib/modules/" + rel + "/kernel/drivers/net/virtio_net.ko.xz":   xzBytes(t, fakeKO("depends=net_failover", "name=virtio_net", vermagic)),
		"lib/modules/" + rel + "/kernel/drivers/net/net_failover.ko.xz": xzBytes(t, fakeKO("depends=failover", "name=net_failover", vermagic)),
		"lib/modules/" + rel + "/kernel/net/core/failover.ko":           fakeKO("depends=", "name=failover", vermagic),
		"lib/modules/" + rel + "/kernel/drivers/unused.ko.xz":           []byte("never decompressed"),
	}
	for name, data := range files {
		p := filepath.Join(root, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	deb := filepath.Join(t.TempDir(), "test.deb")
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "-b", root, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -b: %v\n%s", err, out)
	}
	c, err := Extract(context.Background(), deb, Package{Release: rel, Modules: []string{"virtio_pci", "virtio-net"}})
	if err != nil {
		t.Fatal(err)
	}
	if string(c.Kernel) != "the kernel" || string(c.Config) != "CONFIG_BPF=y\n" {
		t.Fatalf("kernel %q config %q", c.Kernel, c.Config)
	}
	var order []string
	for _, m := range c.Modules {
		order = append(order, m.Path)
	}
	want := "kernel/net/core/failover.ko kernel/drivers/net/net_failover.ko kernel/drivers/net/virtio_net.ko"
	if strings.Join(order, " ") != want {
		t.Fatalf("modules %v, want %s", order, want)
	}
	if len(c.Builtin) != 1 || c.Builtin[0] != "virtio_pci" {
		t.Fatalf("builtin = %v", c.Builtin)
	}
	if _, err := elf.NewFile(bytes.NewReader(c.ModuleData["kernel/drivers/net/virtio_net.ko"])); err != nil {
		t.Fatalf("virtio_net.ko not decompressed to ELF: %v", err)
	}

	// A module the package lacks, and a module built for another kernel.
	if _, err := Extract(context.Background(), deb, Package{Release: rel, Modules: []string{"mlx5_core"}}); err == nil {
		t.Fatal("Extract found a module the package does not have")
	}
	if _, err := Extract(context.Background(), deb, Package{Release: "6.1.0-other", Modules: nil}); err == nil {
		t.Fatal("Extract accepted a wrong release")
	}
}

func TestConfigOption(t *testing.T) {
	c := &Contents{Config: []byte("# CONFIG_MLXBF_BOOTCTL is not set\nCONFIG_BPF=y\nCONFIG_MLX5_CORE=m\nCONFIG_NR_CPUS=512\n")}
	for name, want := range map[string]string{"BPF": "y", "MLX5_CORE": "m", "NR_CPUS": "512", "MLXBF_BOOTCTL": "", "BP": ""} {
		if got := c.ConfigOption(name); got != want {
			t.Errorf("ConfigOption(%s) = %q, want %q", name, got, want)
		}
	}
}

// fakeApt puts apt-get and apt-cache scripts first on PATH: apt-get download
// fails with aptErr, apt-cache madison lists madison, apt-cache depends and
// show describe a newer kernel.
func fakeApt(t *testing.T, aptErr, madison string) {
	t.Helper()
	dir := t.TempDir()
	scripts := map[string]string{
		"apt-get": "#!/bin/sh\necho \"" + aptErr + "\" >&2\nexit 100\n",
		"apt-cache": "#!/bin/sh\ncase \"$1\" in\n" +
			"madison) printf '%s\\n' \"" + madison + "\" ;;\n" +
			"policy) echo \"$2:\"; echo '  Candidate: 2' ;;\n" +
			"depends) echo \"linux-image-cloud-amd64\"; echo '  Depends: linux-image-new' ;;\n" +
			"show) echo 'Version: 2'; echo 'SHA256: abc' ;;\n" +
			"esac\n",
	}
	for name, script := range scripts {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// TestFetchFailure: a failed download is "not on the mirror" (re-pin) only
// when apt's lists no longer offer the pinned version; otherwise it is a
// download failure with apt's error and no advice to re-pin.
func TestFetchFailure(t *testing.T) {
	p := Package{Flavor: "cloud-amd64", Package: "linux-image-old", Version: "1", SHA256: strings.Repeat("0", 64)}
	for _, tc := range []struct {
		name, madison string
		want          error
		says, not     []string
	}{
		{"network", " linux-image-old | 1 | http://deb.debian.org/debian bookworm/main amd64 Packages", ErrDownload,
			[]string{"Could not resolve 'deb.debian.org'", "apt's lists offer that version", "check the network"},
			[]string{"IMAGE_APT_UPDATE", "image-lock"}},
		{"moved on", " linux-image-old | 2 | http://deb.debian.org/debian bookworm/main amd64 Packages", ErrNotOnMirror,
			[]string{"linux-image-new 2", "make image-lock"}, nil},
		{"installed only", " linux-image-old | 1 | /var/lib/dpkg/status", ErrNotOnMirror, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fakeApt(t, "E: Failed to fetch http://deb.debian.org/x.deb  Could not resolve 'deb.debian.org'", tc.madison)
			_, err := Fetch(context.Background(), p, "amd64", t.TempDir(), &bytes.Buffer{})
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if tc.want == ErrDownload && errors.Is(err, ErrNotOnMirror) {
				t.Errorf("a download failure is reported as not on the mirror: %v", err)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error lacks %q: %v", s, err)
				}
			}
			for _, s := range tc.not {
				if strings.Contains(err.Error(), s) {
					t.Errorf("error says %q: %v", s, err)
				}
			}
		})
	}
}
