package fmap

import (
	"fmt"
	"os"
	"time"
)

// Defaults, from SODA's evaluation: 64 KiB chunks ("page size") and a host
// buffer of one third of the memory footprint.
const (
	DefaultChunkSize = 64 << 10
	// DefaultLoadFactor is the share of the buffer above which the agent
	// writes back and evicts in the background, so that a fault finds a free
	// slot instead of waiting for a write-back. SODA gives no number; 0.8
	// leaves a fifth of the buffer as headroom.
	DefaultLoadFactor = 0.8
	// DefaultFetchTimeout is how long a fault's fetch may keep failing
	// before the agent poisons the chunk: long enough for a memory node or
	// a DPU agent to restart (the far-memory client itself gives up on a
	// silent node after about 5 s and the fault is retried), short enough
	// that a program whose memory is gone learns it within a minute.
	DefaultFetchTimeout = time.Minute
	// SuggestedReadAhead is a read-ahead (Options.ReadAhead) for sequential
	// work: sixteen 64 KiB chunks keep the fetchers busy over a round trip
	// of about a millisecond (bench-mem's fault-in: 2.4–3× the bytes per
	// second without it).
	SuggestedReadAhead = 16
	// minBufferChunks keeps two chunks resident at least: one access may
	// straddle a chunk boundary, and with one slot two such accesses evict
	// each other forever.
	minBufferChunks = 2
	// maxChunkSize bounds ChunkSize: the agent, one per node, holds about
	// ten chunk buffers per mapping (its fetchers, cleaner and write-back),
	// so a program's chunk size must not decide how much of its memory they
	// take (at 2^48 bytes and above, allocating them crashes it). 16 MiB is
	// 16 times the largest chunk measured (docs/farmem-mapping.md).
	maxChunkSize = 16 << 20
)

// Options tune one mapping. The zero value takes every default.
type Options struct {
	// ChunkSize is the unit of fetch, write-back and eviction: a power of
	// two, a multiple of the page size, at most 16 MiB. Default
	// DefaultChunkSize.
	ChunkSize int `json:"chunk_size,omitempty"`
	// BufferBytes bounds the bytes resident in the program's memory; it is
	// rounded up to whole chunks (two at least). Default one third of the
	// region.
	BufferBytes int64 `json:"buffer_bytes,omitempty"`
	// LoadFactor in (0, 1]: above it the agent evicts the least recently
	// used chunks in the background. Default DefaultLoadFactor.
	LoadFactor float64 `json:"load_factor,omitempty"`
	// FetchTimeout bounds how long the agent keeps retrying a fault whose
	// chunk cannot be read from the backend. Then it poisons the chunk
	// (UFFDIO_POISON, Linux 6.6+): the faulting access, and every later
	// access to that chunk, raises SIGBUS, which a goroutine that called
	// runtime/debug.SetPanicOnFault(true) gets as a panic it can recover
	// (and otherwise ends the program with "unexpected fault address"), and
	// Sync and Close report the error. Default DefaultFetchTimeout; a
	// negative value retries until the agent stops, the faulting thread
	// blocked all along (an agent that stops gracefully then poisons the
	// mapping: the fault raises SIGBUS). A fetch that fails with ErrLost (the region was
	// freed, a wrong tenant) is poisoned at once, whatever the timeout.
	// Without UFFD_FEATURE_POISON in the kernel the agent retries as if it
	// were negative.
	FetchTimeout time.Duration `json:"fetch_timeout,omitempty"`
	// ReadAhead is how many chunks the agent fetches ahead when a fault
	// continues a sequential run (the chunk before it was faulted on, or
	// ended the last read-ahead), into free slots of the buffer only;
	// SuggestedReadAhead for sequential work. Default 0, off, until it
	// has been measured more (docs/farmem-mapping.md: it speeds scans, and
	// a random access pattern pays 7–9 % more backend reads).
	ReadAhead int `json:"read_ahead,omitempty"`
}

// resolved is Options made concrete for a region.
type resolved struct {
	chunk        int
	capacity     int // chunks
	lowWater     int // chunks
	nchunks      int
	size         int64 // backend bytes
	mapLen       int   // mapped bytes: size rounded up to a page
	pageSize     int
	loadRatio    float64
	fetchTimeout time.Duration // < 0: retry for ever
	readAhead    int           // chunks; 0: off
}

// check refuses the options no region size makes valid, before Map sends
// them: a NaN or infinite LoadFactor would otherwise fail as an unclear
// JSON error on the way to the agent.
func (o Options) check() error {
	// Written so that NaN, which fails every comparison, is refused too.
	if lf := o.LoadFactor; !(lf >= 0 && lf <= 1) {
		return fmt.Errorf("fmap: Options.LoadFactor %g: want a value in (0, 1], or 0 for the default %g", lf, DefaultLoadFactor)
	}
	return nil
}

func (o Options) resolve(size int64) (resolved, error) {
	page := os.Getpagesize()
	r := resolved{chunk: o.ChunkSize, size: size, pageSize: page, loadRatio: o.LoadFactor, fetchTimeout: o.FetchTimeout}
	if r.fetchTimeout == 0 {
		r.fetchTimeout = DefaultFetchTimeout
	}
	if o.ReadAhead < 0 {
		return r, fmt.Errorf("fmap: read-ahead of %d chunks: want 0 (off) or more", o.ReadAhead)
	}
	r.readAhead = o.ReadAhead
	if r.chunk == 0 {
		r.chunk = DefaultChunkSize
	}
	if r.chunk < page || r.chunk > maxChunkSize || r.chunk&(r.chunk-1) != 0 {
		return r, fmt.Errorf("fmap: chunk size %d: want a power of two from the page size %d to %d", r.chunk, page, maxChunkSize)
	}
	if size <= 0 {
		return r, fmt.Errorf("fmap: region size %d: nothing to map", size)
	}
	r.mapLen = int((size + int64(page) - 1) / int64(page) * int64(page))
	r.nchunks = (r.mapLen + r.chunk - 1) / r.chunk
	buf := o.BufferBytes
	if buf == 0 {
		buf = (size + 2) / 3
	}
	if buf < 0 {
		return r, fmt.Errorf("fmap: buffer of %d bytes: want a positive size", buf)
	}
	// No more than the region, which also keeps the rounding up from
	// overflowing (math.MaxInt64 became two chunks).
	buf = min(buf, int64(r.mapLen))
	r.capacity = int((buf + int64(r.chunk) - 1) / int64(r.chunk))
	r.capacity = max(r.capacity, minBufferChunks)
	r.capacity = min(r.capacity, r.nchunks)
	if err := o.check(); err != nil {
		return r, err
	}
	if r.loadRatio == 0 {
		r.loadRatio = DefaultLoadFactor
	}
	r.lowWater = max(int(float64(r.capacity)*r.loadRatio), 1)
	if r.capacity == r.nchunks {
		// Everything fits: no fault will ever need a slot freed, so
		// evicting ahead would only cost refetches.
		r.lowWater = r.capacity
	}
	return r, nil
}
