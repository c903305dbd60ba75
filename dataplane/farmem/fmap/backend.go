package fmap

import (
	"errors"
	"fmt"
	"io"
	"sync"
)

// RegionRef names a far-memory region. The host agent's open function
// resolves it to a Backend; fmap itself only carries it from the program to
// the agent.
type RegionRef struct {
	// ID is the region's number on its memory node.
	ID uint64 `json:"id"`
	// Name is an optional human-readable name, also used for the memfd.
	Name string `json:"name,omitempty"`
	// ReadOnly maps the region without asking for its writer lease: many
	// programs may map it so at once, and a write-back fails (Sync says
	// so). A writable mapping holds the lease while it lives.
	ReadOnly bool `json:"read_only,omitempty"`
}

func (r RegionRef) String() string {
	if r.Name != "" {
		return fmt.Sprintf("region %d (%s)", r.ID, r.Name)
	}
	return fmt.Sprintf("region %d", r.ID)
}

// ErrLost marks a Backend read error that retrying cannot fix: the region
// was freed, or belongs to another tenant. A fault whose fetch fails with an
// error wrapping it is not retried for Options.FetchTimeout: its chunk is
// poisoned at once, whatever the timeout.
var ErrLost = errors.New("fmap: backend data lost")

// Backend is where a mapping's data lives: the far-memory client's region,
// or, in tests and examples, a MemBackend. ReadAt of the tail past Size may
// return io.EOF; the mapping reads zeros there. A ReadAt error that no retry
// can fix should wrap ErrLost, so that the program learns it at once.
type Backend interface {
	io.ReaderAt
	io.WriterAt
	Size() int64
	// Sync makes acknowledged writes durable on the memory node.
	Sync() error
}

// MemBackend is a Backend in local memory, safe for concurrent use.
type MemBackend struct {
	mu   sync.RWMutex
	data []byte
}

// NewMemBackend returns a zeroed MemBackend of size bytes.
func NewMemBackend(size int64) *MemBackend {
	return &MemBackend{data: make([]byte, size)}
}

// ReadAt implements io.ReaderAt.
func (m *MemBackend) ReadAt(p []byte, off int64) (int, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if off < 0 || off > int64(len(m.data)) {
		return 0, fmt.Errorf("membackend: read at %d of %d bytes: out of range", off, len(m.data))
	}
	n := copy(p, m.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// WriteAt implements io.WriterAt; it does not grow the backend.
func (m *MemBackend) WriteAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if off < 0 || off+int64(len(p)) > int64(len(m.data)) {
		return 0, fmt.Errorf("membackend: write of %d bytes at %d of %d: out of range", len(p), off, len(m.data))
	}
	return copy(m.data[off:], p), nil
}

// Size implements Backend.
func (m *MemBackend) Size() int64 { return int64(len(m.data)) }

// Sync implements Backend; memory is as durable as it gets.
func (m *MemBackend) Sync() error { return nil }
