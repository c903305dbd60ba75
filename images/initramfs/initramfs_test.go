package initramfs

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"io"
	"testing"

	"github.com/u-root/u-root/pkg/cpio"
)

func build(t *testing.T, order []Entry) []byte {
	t.Helper()
	a := New()
	for _, e := range order {
		if err := a.Add(e); err != nil {
			t.Fatal(err)
		}
	}
	var b bytes.Buffer
	if err := a.WriteGzip(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func entries() []Entry {
	return []Entry{
		{Path: "/init", Perm: 0o755, Data: bytes.Repeat([]byte("init"), 5000)},
		{Path: "/usr/bin/lovelockd", Perm: 0o755, Data: []byte("daemon")},
		{Path: "/etc/lovelock/appliance.json", Data: []byte("{}\n")},
		{Path: "/dev/console", Kind: CharDev, Major: 5, Minor: 1},
		{Path: "/proc", Kind: Dir},
		{Path: "/bin", Kind: Symlink, Data: []byte("usr/bin")},
		{Path: "/lib/modules/6.1.0/kernel/x.ko", Data: []byte("ko")},
	}
}

// TestReproducible builds the same files twice, in different orders, and
// wants identical bytes.
func TestReproducible(t *testing.T) {
	es := entries()
	first := build(t, es)
	rev := make([]Entry, len(es))
	for i := range es {
		rev[len(es)-1-i] = es[i]
	}
	second := build(t, rev)
	if sha256.Sum256(first) != sha256.Sum256(second) {
		t.Fatal("two builds of the same files differ")
	}
	// And a different file gives different bytes.
	es[2].Data = []byte("{ }\n")
	if bytes.Equal(first, build(t, es)) {
		t.Fatal("changing a file did not change the archive")
	}
}

func TestContents(t *testing.T) {
	z, err := gzip.NewReader(bytes.NewReader(build(t, entries())))
	if err != nil {
		t.Fatal(err)
	}
	if !z.ModTime.IsZero() || z.Name != "" {
		t.Fatalf("gzip header carries time %v or name %q", z.ModTime, z.Name)
	}
	raw, err := io.ReadAll(z)
	if err != nil {
		t.Fatal(err)
	}
	infos, err := List(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{
		"bin": cpio.S_IFLNK, "dev": cpio.S_IFDIR, "dev/console": cpio.S_IFCHR, "etc": cpio.S_IFDIR,
		"etc/lovelock": cpio.S_IFDIR, "etc/lovelock/appliance.json": cpio.S_IFREG, "init": cpio.S_IFREG,
		"lib": cpio.S_IFDIR, "lib/modules": cpio.S_IFDIR, "lib/modules/6.1.0": cpio.S_IFDIR,
		"lib/modules/6.1.0/kernel": cpio.S_IFDIR, "lib/modules/6.1.0/kernel/x.ko": cpio.S_IFREG,
		"proc": cpio.S_IFDIR, "usr": cpio.S_IFDIR, "usr/bin": cpio.S_IFDIR, "usr/bin/lovelockd": cpio.S_IFREG,
	}
	if len(infos) != len(want) {
		t.Fatalf("archive has %d entries, want %d: %v", len(infos), len(want), infos)
	}
	prev := ""
	for _, i := range infos {
		typ, ok := want[i.Name]
		if !ok || i.Mode&cpio.S_IFMT != typ {
			t.Errorf("%s: mode %o unexpected", i.Name, i.Mode)
		}
		if i.MTime != 0 || i.UID != 0 || i.GID != 0 {
			t.Errorf("%s: mtime %d uid %d gid %d, want zeros", i.Name, i.MTime, i.UID, i.GID)
		}
		if i.Name <= prev {
			t.Errorf("%s after %s: not sorted (a directory must precede its contents)", i.Name, prev)
		}
		prev = i.Name
		if i.Name == "dev/console" && (i.Rmajor != 5 || i.Rminor != 1) {
			t.Errorf("dev/console is %d:%d", i.Rmajor, i.Rminor)
		}
		if i.Name == "init" && i.Mode&0o777 != 0o755 {
			t.Errorf("init mode %o", i.Mode&0o777)
		}
	}
}

func TestAddRejects(t *testing.T) {
	a := New()
	if err := a.AddFile("/x", 0, nil); err != nil {
		t.Fatal(err)
	}
	if err := a.AddFile("/x", 0, nil); err == nil {
		t.Error("adding a file twice succeeded")
	}
	for _, p := range []string{"/", "", "../etc", "/.."} {
		if err := a.AddFile(p, 0, nil); err == nil {
			t.Errorf("bad path %q accepted", p)
		}
	}
}
