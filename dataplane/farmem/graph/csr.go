package graph

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"unsafe"

	"github.com/lovelock-dpu/lovelock/dataplane/farmem/fmap"
)

// The binary CSR file (docs/graph.md): a 32-byte header, then the out-edge
// offsets ((n+1) × uint64) and neighbours (m × uint32), padded to 8 bytes,
// then, for a directed graph only, the in-edge (transposed) offsets and
// neighbours. All integers little-endian. No field is a pointer, so the
// bytes mean the same wherever a region is mapped.
const (
	// Magic opens every CSR file.
	Magic = "LVLKCSR\x00"
	// Version is the format's version; readers refuse others.
	Version = 1
	// HeaderSize is the header's length in bytes.
	HeaderSize = 32
)

// Header flags.
const (
	// FlagSymmetric marks an undirected graph stored with both directions
	// of every edge; it has no transposed section (in-edges are out-edges).
	FlagSymmetric uint32 = 1 << 0
)

// MaxVertices bounds n: neighbour IDs are uint32, and the engine's vertex
// arrays are indexed by int.
const MaxVertices = 1<<32 - 1

// MaxEdges bounds m, the stored edges (8 TiB of neighbours per section).
const MaxEdges = 1 << 40

// ErrFormat is wrapped by every error about a malformed CSR file.
var ErrFormat = errors.New("graph: malformed CSR")

// ErrFarMemory is wrapped by a run's error when the graph's bytes could not
// be read: far memory whose chunk the host agent poisoned (Engine.Err).
var ErrFarMemory = errors.New("graph: far memory lost")

// adj is one direction's adjacency: offsets and neighbours, read from bytes
// (a file image in memory, or a far-memory mapping) on every access.
type adj struct {
	off   []byte // (n+1) × uint64
	edges []byte // m × uint32
}

func (a adj) offset(v uint32) uint64 { return binary.LittleEndian.Uint64(a.off[8*uint64(v):]) }

func (a adj) neighbor(i uint64) uint32 { return binary.LittleEndian.Uint32(a.edges[4*i:]) }

// Graph is a CSR graph over bytes in the file format. Its methods only read
// those bytes, so a Graph over a far-memory mapping faults chunks in as the
// algorithms touch them. A Graph is safe for concurrent use.
type Graph struct {
	n, m  uint64
	flags uint32
	out   adj
	in    adj
	// Byte offsets in the image of the out- and in-edge arrays (the same
	// for a symmetric graph), for hints.
	outAt, inAt uint64
	// Byte ranges of the offset arrays.
	offsets []fmap.Extent
	// image is the bytes the graph was opened over, to tell a fault on
	// them (a far-memory chunk lost) from any other.
	image []byte
}

// holds reports whether addr is in the bytes the graph was opened over.
func (g *Graph) holds(addr uintptr) bool {
	base := uintptr(unsafe.Pointer(unsafe.SliceData(g.image)))
	return addr >= base && addr-base < uintptr(len(g.image))
}

// Offsets returns the byte ranges of the image that hold the graph's
// offset arrays (one for a symmetric graph, two for a directed one): the
// vertex-indexed data, which a DPU's static cache holds.
func (g *Graph) Offsets() []fmap.Extent { return append([]fmap.Extent(nil), g.offsets...) }

// Edges returns the byte ranges of the image that hold the edge arrays.
func (g *Graph) Edges() []fmap.Extent {
	out := []fmap.Extent{{Offset: int64(g.outAt), Size: int64(4 * g.m)}}
	if !g.Symmetric() {
		out = append(out, fmap.Extent{Offset: int64(g.inAt), Size: int64(4 * g.m)})
	}
	return out
}

// N is the number of vertices.
func (g *Graph) N() int { return int(g.n) }

// M is the number of stored (directed) edges; an undirected edge counts
// twice.
func (g *Graph) M() uint64 { return g.m }

// Symmetric reports whether the graph is undirected.
func (g *Graph) Symmetric() bool { return g.flags&FlagSymmetric != 0 }

// OutDegree is v's number of out-neighbours.
func (g *Graph) OutDegree(v uint32) uint64 { return g.out.offset(v+1) - g.out.offset(v) }

// FileSize is the length of a CSR file with n vertices and m edges.
func FileSize(n, m uint64, symmetric bool) uint64 {
	one := pad8(8*(n+1) + 4*m)
	if symmetric {
		return HeaderSize + one
	}
	return HeaderSize + 2*one
}

func pad8(x uint64) uint64 { return (x + 7) &^ 7 }

// Header is a CSR file's header.
type Header struct {
	N, M  uint64
	Flags uint32
}

// ParseHeader reads the header at the start of b.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("%w: %d bytes, shorter than the header", ErrFormat, len(b))
	}
	if string(b[:8]) != Magic {
		return Header{}, fmt.Errorf("%w: bad magic %q", ErrFormat, b[:8])
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != Version {
		return Header{}, fmt.Errorf("%w: version %d, want %d", ErrFormat, v, Version)
	}
	h := Header{
		Flags: binary.LittleEndian.Uint32(b[12:]),
		N:     binary.LittleEndian.Uint64(b[16:]),
		M:     binary.LittleEndian.Uint64(b[24:]),
	}
	if h.Flags&^FlagSymmetric != 0 {
		return Header{}, fmt.Errorf("%w: unknown flags %#x", ErrFormat, h.Flags)
	}
	if h.N == 0 || h.N > MaxVertices {
		return Header{}, fmt.Errorf("%w: %d vertices", ErrFormat, h.N)
	}
	if h.M > MaxEdges {
		return Header{}, fmt.Errorf("%w: %d edges", ErrFormat, h.M)
	}
	return h, nil
}

func (h Header) put(b []byte) {
	copy(b, Magic)
	binary.LittleEndian.PutUint32(b[8:], Version)
	binary.LittleEndian.PutUint32(b[12:], h.Flags)
	binary.LittleEndian.PutUint64(b[16:], h.N)
	binary.LittleEndian.PutUint64(b[24:], h.M)
}

// Open reads the header of the CSR file image b and returns the graph over
// it. It checks that b is exactly as long as the header says (no bytes
// missing, none trailing) and the first and last offsets, not every
// offset and neighbour (that reads the whole file: Validate does it); the
// algorithms check bounds as they read, so a corrupt file gives an error,
// not a crash.
func Open(b []byte) (*Graph, error) {
	h, err := ParseHeader(b)
	if err != nil {
		return nil, err
	}
	sym := h.Flags&FlagSymmetric != 0
	// The length must match exactly: bytes past the arrays are no part of
	// any graph, so the file was cut short or grew (corrupt, or two files
	// run together), and its header cannot be trusted either.
	switch want := FileSize(h.N, h.M, sym); {
	case uint64(len(b)) < want:
		return nil, fmt.Errorf("%w: %d bytes, want %d for %d vertices and %d edges: the file is truncated; write it again (lovelock graph gen or convert)",
			ErrFormat, len(b), want, h.N, h.M)
	case uint64(len(b)) > want:
		return nil, fmt.Errorf("%w: %d bytes, %d more than the %d of %d vertices and %d edges: trailing bytes after the arrays, so the file is corrupt; write it again (lovelock graph gen or convert)",
			ErrFormat, len(b), uint64(len(b))-want, want, h.N, h.M)
	}
	g := &Graph{n: h.N, m: h.M, flags: h.Flags, image: b}
	section := func(at uint64) adj {
		offEnd := at + 8*(h.N+1)
		return adj{off: b[at:offEnd:offEnd], edges: b[offEnd : offEnd+4*h.M : offEnd+4*h.M]}
	}
	g.out = section(HeaderSize)
	g.in = g.out
	offLen := int64(8 * (h.N + 1))
	g.outAt = HeaderSize + 8*(h.N+1)
	g.inAt = g.outAt
	g.offsets = []fmap.Extent{{Offset: HeaderSize, Size: offLen}}
	if !sym {
		at := HeaderSize + pad8(8*(h.N+1)+4*h.M)
		g.in = section(at)
		g.inAt = at + 8*(h.N+1)
		g.offsets = append(g.offsets, fmap.Extent{Offset: int64(at), Size: offLen})
	}
	for _, a := range []adj{g.out, g.in} {
		if a.offset(0) != 0 || a.offset(uint32(h.N-1)+1) != h.M {
			return nil, fmt.Errorf("%w: offsets run from %d to %d, want 0 to %d", ErrFormat, a.offset(0), a.offset(uint32(h.N-1)+1), h.M)
		}
	}
	return g, nil
}

// Validate reads every offset and neighbour and checks what the format
// promises (docs/graph.md): offsets never decrease and stay within m;
// each vertex's neighbours are vertices, sorted, without duplicates or
// self loops; a symmetric file holds every edge both ways, and a directed
// file's transposed section holds exactly the reverse of its out-edges.
// The engine's dense steps pull over the in-edges (the out-edges of a
// symmetric file), so a file that lies about them gives answers that
// depend on the traversal mode.
func (g *Graph) Validate() error {
	names := []string{"out-edge", "in-edge"}
	for k, a := range []adj{g.out, g.in} {
		prev := uint64(0)
		for v := uint64(0); v <= g.n-1; v++ {
			next := a.offset(uint32(v) + 1)
			if next < prev || next > g.m {
				return fmt.Errorf("%w: offset of vertex %d is %d after %d (m = %d)", ErrFormat, v+1, next, prev, g.m)
			}
			for i := prev; i < next; i++ {
				u := a.neighbor(i)
				switch {
				case uint64(u) >= g.n:
					return fmt.Errorf("%w: %s %d (of vertex %d) points at vertex %d of %d", ErrFormat, names[k], i, v, u, g.n)
				case uint64(u) == v:
					return fmt.Errorf("%w: %s %d is a self loop on vertex %d", ErrFormat, names[k], i, v)
				case i > prev && u <= a.neighbor(i-1):
					return fmt.Errorf("%w: vertex %d's %ss are not sorted without duplicates: %d after %d at edge %d",
						ErrFormat, v, names[k], u, a.neighbor(i-1), i)
				}
			}
			prev = next
		}
	}
	// Walk the out-edges in order of their source: each one u→v must be
	// the next unmatched entry of v's (sorted) in-list. Every out-edge
	// matched and both sections m long means the in-lists hold nothing
	// else.
	matched := make([]uint64, g.n)
	for u := range uint32(g.n) {
		for i := g.out.offset(u); i < g.out.offset(u+1); i++ {
			v := g.out.neighbor(i)
			at := g.in.offset(v) + matched[v]
			if at < g.in.offset(v+1) && g.in.neighbor(at) == u {
				matched[v]++
				continue
			}
			if g.Symmetric() {
				return fmt.Errorf("%w: the file is flagged symmetric, but edge %d→%d has no edge back", ErrFormat, u, v)
			}
			return fmt.Errorf("%w: out-edge %d→%d is not in the transposed section (vertex %d's in-edges)", ErrFormat, u, v, v)
		}
	}
	return nil
}

// encode builds the CSR file image of a graph with n vertices from
// per-vertex sorted adjacency given as offsets (n+1 entries) and
// neighbours, and, for a directed graph, its transpose.
func encode(n uint64, sym bool, out, in csrArrays) []byte {
	m := uint64(len(out.edges))
	b := make([]byte, FileSize(n, m, sym))
	flags := uint32(0)
	if sym {
		flags |= FlagSymmetric
	}
	Header{N: n, M: m, Flags: flags}.put(b)
	put := func(at uint64, a csrArrays) {
		for i, o := range a.off {
			binary.LittleEndian.PutUint64(b[at+8*uint64(i):], o)
		}
		at += 8 * uint64(len(a.off))
		for i, e := range a.edges {
			binary.LittleEndian.PutUint32(b[at+4*uint64(i):], e)
		}
	}
	put(HeaderSize, out)
	if !sym {
		put(HeaderSize+pad8(8*(n+1)+4*m), in)
	}
	return b
}

// CopyTo writes the CSR image b to w (a far-memory region) at offset 0 in
// pieces of piece bytes (1 MiB if 0 or less), so that each write stays a
// bounded number of the region's chunks.
func CopyTo(w io.WriterAt, b []byte, piece int) error {
	if piece <= 0 {
		piece = 1 << 20
	}
	for off := 0; off < len(b); off += piece {
		end := min(off+piece, len(b))
		if _, err := w.WriteAt(b[off:end], int64(off)); err != nil {
			return fmt.Errorf("graph: write bytes %d-%d: %w", off, end, err)
		}
	}
	return nil
}
