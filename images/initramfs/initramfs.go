// Package initramfs owns the Lovelock image's initial RAM filesystem: a
// newc cpio archive (written with u-root's pkg/cpio), gzip-compressed, built
// reproducibly: the same files give the same bytes, whatever the build
// machine, the time or the order the files were added in.
package initramfs

import (
	"compress/gzip"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"

	"github.com/u-root/u-root/pkg/cpio"
)

// Kind is the type of an archive entry.
type Kind int

// Entry kinds.
const (
	File Kind = iota
	Dir
	Symlink
	CharDev
)

// Entry is one file of the archive. Owners are always root, times always
// zero.
type Entry struct {
	// Path inside the archive, absolute or relative ("/init", "etc/x").
	Path string
	Kind Kind
	// Perm is the permission bits (0o755); 0 gives 0o644 for files and
	// 0o755 for directories.
	Perm uint64
	// Data is a file's content or a symlink's target.
	Data []byte
	// Major and Minor number a character device.
	Major, Minor uint64
}

// Archive collects entries; parent directories are added on their own.
type Archive struct {
	entries map[string]Entry
}

// New returns an empty archive.
func New() *Archive {
	return &Archive{entries: make(map[string]Entry)}
}

// Add adds e, and every missing parent directory with mode 0755. Adding a
// path twice is an error, except for the same directory.
func (a *Archive) Add(e Entry) error {
	p := path.Clean(strings.TrimPrefix(e.Path, "/"))
	if p == "." || p == "" || strings.HasPrefix(p, "../") || p == ".." {
		return fmt.Errorf("initramfs: bad path %q", e.Path)
	}
	e.Path = p
	if old, ok := a.entries[p]; ok {
		if old.Kind == Dir && e.Kind == Dir {
			return nil
		}
		return fmt.Errorf("initramfs: %s added twice", p)
	}
	if dir := path.Dir(p); dir != "." {
		if err := a.Add(Entry{Path: dir, Kind: Dir}); err != nil {
			return err
		}
	}
	a.entries[p] = e
	return nil
}

// AddFile adds a regular file.
func (a *Archive) AddFile(p string, perm uint64, data []byte) error {
	return a.Add(Entry{Path: p, Kind: File, Perm: perm, Data: data})
}

// Len returns the number of entries.
func (a *Archive) Len() int { return len(a.entries) }

// records returns the archive's cpio records sorted by path, so that every
// directory precedes its contents, with inode numbers given in that order.
func (a *Archive) records() []cpio.Record {
	paths := make([]string, 0, len(a.entries))
	for p := range a.entries {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	recs := make([]cpio.Record, 0, len(paths))
	for i, p := range paths {
		e := a.entries[p]
		var r cpio.Record
		switch e.Kind {
		case Dir:
			r = cpio.Directory(p, permOr(e.Perm, 0o755))
			r.NLink = 2
		case Symlink:
			r = cpio.Symlink(p, string(e.Data))
			r.NLink = 1
		case CharDev:
			r = cpio.CharDev(p, permOr(e.Perm, 0o600), e.Major, e.Minor)
			r.NLink = 1
		default:
			r = cpio.StaticRecord(e.Data, cpio.Info{Name: p, Mode: cpio.S_IFREG | permOr(e.Perm, 0o644)})
			r.NLink = 1
		}
		r = cpio.MakeReproducible(r)
		r.Ino = uint64(i + 1)
		recs = append(recs, r)
	}
	return recs
}

func permOr(p, def uint64) uint64 {
	if p == 0 {
		return def
	}
	return p & 0o7777
}

// WriteCPIO writes the archive as an uncompressed newc cpio stream with its
// trailer.
func (a *Archive) WriteCPIO(w io.Writer) error {
	rw := cpio.Newc.Writer(w)
	if err := cpio.WriteRecords(rw, a.records()); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	if err := cpio.WriteTrailer(rw); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	return nil
}

// WriteGzip writes the archive as a gzip-compressed newc cpio stream. The
// gzip header carries no name and no time, so the bytes are reproducible.
func (a *Archive) WriteGzip(w io.Writer) error {
	zw, err := gzip.NewWriterLevel(w, gzip.BestCompression)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	if err := a.WriteCPIO(zw); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("initramfs: gzip: %w", err)
	}
	return nil
}

// List reads a newc cpio stream and returns its entries' paths and sizes, in
// archive order; tests and the manifest use it.
func List(r io.ReaderAt) ([]cpio.Info, error) {
	recs, err := cpio.ReadAllRecords(cpio.Newc.Reader(r))
	if err != nil {
		return nil, fmt.Errorf("initramfs: %w", err)
	}
	out := make([]cpio.Info, 0, len(recs))
	for _, r := range recs {
		if r.Name == cpio.Trailer {
			continue
		}
		out = append(out, r.Info)
	}
	return out, nil
}
