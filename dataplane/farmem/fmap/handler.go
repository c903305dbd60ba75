package fmap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// chunkState is where one chunk of a mapping is. Every chunk that is not
// absent occupies a slot of the buffer.
type chunkState uint8

const (
	absent   chunkState = iota // not in the program's memory; a touch faults MISSING
	fetching                   // the fault loop is reading it from the backend
	resident                   // installed; on the LRU list
	flushing                   // resident, being written back by Sync; not evictable
	evicting                   // being written back and dropped; faults on it wait
	poisoned                   // its fetch failed for Options.FetchTimeout; a touch raises SIGBUS
)

// handler serves one mapping inside the host agent. Three goroutines share
// it: the fault loop (reads the userfaultfd, fetches, installs, evicts when
// the buffer is full), the cleaner (evicts down to the low-water mark in the
// background), and the connection's request loop (Sync, Close). mu guards the
// chunk table; backend I/O runs outside it, with the chunk marked fetching,
// flushing or evicting so the others keep away.
//
// Invariant: a resident chunk that is clean is write-protected in the
// program, so its first write raises a WP fault that marks it dirty. (A
// dirty chunk is usually writable; after a failed write-back it may stay
// protected, which costs one more WP fault and nothing else.) Before a chunk's data is read for write-back it is
// write-protected and marked clean under mu, so a write that lands during the
// write-back faults and marks it dirty again instead of being lost.
type handler struct {
	region RegionRef
	be     Backend
	r      resolved
	uffd   int // owned by uffdFile
	memfd  int
	base   uint64

	mu       sync.Mutex
	cond     *sync.Cond
	state    []chunkState
	dirty    []bool
	lru      *lru
	occupied int // chunks not absent
	stats    Stats
	err      error // first write-back error since the last Sync reported it
	poison   error // why the first chunk was poisoned; every Sync reports it
	gone     bool  // the program's mm is gone (it exited): nothing can write or fault any more
	noPoison error // why UFFDIO_POISON cannot be used on this mapping (poisonSupport); nil if it can

	kick chan struct{}

	// Read-ahead: the chunks of the last faults and the last chunks of the
	// last read-ahead windows (plus one; 0 is none), and the chunks queued
	// to be read ahead.
	recent      [8]int
	recentAt    int
	queued      []bool
	queuedAhead int
}

// Stats counts what the host agent did for one mapping.
type Stats struct {
	Faults     uint64 `json:"faults"`     // missing-page faults that fetched a chunk
	ReadAhead  uint64 `json:"read_ahead"` // chunks fetched ahead of a sequential run of faults
	WPFaults   uint64 `json:"wp_faults"`  // write-protect faults that marked a chunk dirty
	Spurious   uint64 `json:"spurious"`   // faults on a chunk already served or already gone
	Evictions  uint64 `json:"evictions"`  // chunks dropped
	Writebacks uint64 `json:"writebacks"` // dirty chunks written to the backend
	Background uint64 `json:"background"` // evictions by the cleaner, off the fault path
	Inline     uint64 `json:"inline"`     // evictions a fault had to wait for
	Retries    uint64 `json:"retries"`    // failed attempts to serve a fault (a fetch from the backend, mostly), each retried
	Poisoned   uint64 `json:"poisoned"`   // chunks given up on after Options.FetchTimeout of failed fetches
	Resident   int    `json:"resident"`   // chunks in the buffer now
	Capacity   int    `json:"capacity"`   // the buffer's size in chunks
}

// Fetched is the number of chunks read from the backend: by faults and
// ahead of them.
func (s Stats) Fetched() uint64 { return s.Faults + s.ReadAhead }

func newHandler(region RegionRef, be Backend, r resolved, uffd, memfd int, base uint64) *handler {
	h := &handler{
		region: region, be: be, r: r, uffd: uffd, memfd: memfd, base: base,
		state:  make([]chunkState, r.nchunks),
		dirty:  make([]bool, r.nchunks),
		lru:    newLRU(r.nchunks),
		queued: make([]bool, r.nchunks),
		kick:   make(chan struct{}, 1),
	}
	h.cond = sync.NewCond(&h.mu)
	return h
}

// span returns chunk ci's offset and its length in the mapping.
func (h *handler) span(ci int) (uint64, uint64) {
	off := uint64(ci) * uint64(h.r.chunk)
	return off, min(uint64(h.r.chunk), uint64(h.r.mapLen)-off)
}

// fetchers is the number of goroutines that serve faults and read ahead
// at once: a fault waits for a fetch (a round trip to the memory node),
// and several faulting threads, or one thread's read-ahead, keep several
// fetches in flight instead of one.
const fetchers = 8

// work is a fault to serve, or a chunk to read ahead (ahead >= 0).
type work struct {
	m     uffdMsg
	ahead int
}

// faultLoop reads fault messages until ctx ends and hands them to the
// fetchers; after a fault that continues a sequential run it queues the
// next Options.ReadAhead chunks too.
func (h *handler) faultLoop(ctx context.Context, f *os.File) error {
	stop := context.AfterFunc(ctx, func() { f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	queue := make(chan work, 64)
	var wg sync.WaitGroup
	for range fetchers {
		wg.Go(func() { h.fetcher(ctx, queue) })
	}
	defer wg.Wait()
	defer close(queue)
	msgs := make([]byte, 64*uffdMsgSize)
	for {
		n, err := f.Read(msgs)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("read userfaultfd: %w", err)
		}
		for i := 0; i+uffdMsgSize <= n; i += uffdMsgSize {
			m := parseMsg(msgs[i:])
			if m.Event != eventPagefault {
				continue // no other events were asked for
			}
			select {
			case queue <- work{m: m, ahead: -1}:
			case <-ctx.Done():
				return nil
			}
			for _, ci := range h.readAhead(m) {
				select {
				case queue <- work{ahead: ci}:
				default: // the fetchers are busy with faults: skip it
					h.unqueue(ci)
				}
			}
		}
	}
}

// fetcher serves the queue's faults and read-aheads until it is closed or
// ctx ends.
func (h *handler) fetcher(ctx context.Context, queue <-chan work) {
	buf := make([]byte, h.r.chunk)
	for w := range queue {
		if ctx.Err() != nil {
			continue // the mapping is ending: drain the queue, serve nothing
		}
		if w.ahead >= 0 {
			h.fetchAhead(w.ahead, buf)
			continue
		}
		h.serve(ctx, w.m, buf)
	}
}

// serve serves one fault, retrying a failing one until it is served,
// poisoned, or ctx ends.
func (h *handler) serve(ctx context.Context, m uffdMsg, buf []byte) {
	var failing time.Time // since when this fault's service fails
	warned := false       // a failed poisoning was reported
	for backoff := time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		err := h.fault(m, buf)
		if err == nil || errors.Is(err, errGone) {
			return // served, or the program exited: nobody waits
		}
		// The program's thread stays blocked until this fault is served;
		// keep trying (a backend may come back) for FetchTimeout, then
		// poison the chunk so that the access fails instead of waiting for
		// ever. A fault served in the end lost nothing: it is counted, not
		// reported by Sync. A lost backend (ErrLost) will not come back:
		// poison at once.
		lost := errors.Is(err, ErrLost)
		if failing.IsZero() {
			failing = time.Now()
		}
		if lost || h.r.fetchTimeout >= 0 && time.Since(failing) >= h.r.fetchTimeout {
			if done, perr := h.poisonChunk(m.Address, time.Since(failing), err); done {
				return
			} else if perr != nil && !warned {
				h.setErr(perr) // no poisoning here: Sync says why the fault still waits
				warned = true
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		// Counted here, as it is made: the failure that got the chunk
		// poisoned, or that ctx's end cut short, is not retried.
		h.countRetry()
	}
}

// readAhead notes a missing-page fault's chunk among the recent ones and,
// when the chunk before it is there too, faulted on or the end of a
// read-ahead window (a sequential run: one thread's scan, or one of several
// threads' interleaved scans; a random access continues one by chance with
// a probability of about 8 / the mapping's chunks), returns
// the next Options.ReadAhead chunks that are absent and not queued yet,
// marking them queued. It reads ahead only into free slots, one slot always
// left for a fault. A chunk read ahead is installed clean, so a write scan
// gains too: its writes then take a write-protect fault, not a fetch.
func (h *handler) readAhead(m uffdMsg) []int {
	ci, ok := h.chunkAt(m.Address)
	if !ok || m.Flags&pagefaultFlagWP != 0 {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	seq := ci > 0 && h.recentLocked(ci-1)
	h.noteLocked(ci)
	if !seq || h.r.readAhead <= 0 {
		return nil
	}
	var out []int
	free := h.r.capacity - 1 - h.occupied - h.queuedAhead
	for c := ci + 1; c < h.r.nchunks && c <= ci+h.r.readAhead && len(out) < free; c++ {
		if h.state[c] == absent && !h.queued[c] {
			h.queued[c] = true
			h.queuedAhead++
			out = append(out, c)
		}
	}
	if len(out) > 0 {
		// The run's next fault comes after the window: it continues the
		// run if it is on the chunk after the window's last.
		h.noteLocked(out[len(out)-1])
	}
	return out
}

// recentLocked reports whether chunk ci is among the last fetches noted.
func (h *handler) recentLocked(ci int) bool {
	for _, c := range h.recent {
		if c == ci+1 { // stored plus one, so that the zero value is no chunk
			return true
		}
	}
	return false
}

func (h *handler) noteLocked(ci int) {
	h.recent[h.recentAt] = ci + 1
	h.recentAt = (h.recentAt + 1) % len(h.recent)
}

// unqueue forgets that chunk ci was queued for read-ahead.
func (h *handler) unqueue(ci int) {
	h.mu.Lock()
	h.unqueueLocked(ci)
	h.mu.Unlock()
}

func (h *handler) unqueueLocked(ci int) {
	if h.queued[ci] {
		h.queued[ci] = false
		h.queuedAhead--
	}
}

// fetchAhead reads chunk ci ahead of the program, clean (write-protected),
// if it is still absent and a slot is free: read-ahead never evicts, and a
// failed one is dropped (a fault on the chunk fetches it again).
func (h *handler) fetchAhead(ci int, buf []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.unqueueLocked(ci)
	if h.state[ci] != absent || h.occupied >= h.r.capacity-1 {
		return
	}
	if h.fetchLocked(ci, false, buf) == nil {
		h.stats.ReadAhead++
	}
}

// poisonChunk poisons the chunk at addr, absent after its failed fetch,
// so that the faulting access and every later one raise SIGBUS. It reports
// whether the fault is over: poisoned, or outside the mapping. Without
// UFFD_FEATURE_POISON (the program's kernel is older than 6.6) it fails,
// and the fault goes on waiting.
func (h *handler) poisonChunk(addr uint64, after time.Duration, cause error) (bool, error) {
	ci, ok := h.chunkAt(addr)
	if !ok {
		return true, nil
	}
	off, n := h.span(ci)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state[ci] != absent {
		return false, nil // served or being served meanwhile: retry the fault
	}
	// A chunk evicted clean keeps the uffd-wp markers of its clean install
	// on its zapped pages, which poisoning steps over: lift them first, or
	// the chunk counts as poisoned while its touches fault for ever.
	err := uffdWriteProtect(h.uffd, h.base+off, n, false)
	if err == nil {
		err = h.poisonRange(h.base+off, n)
	}
	if err != nil {
		return false, fmt.Errorf("poison chunk %d after %v of failed fetches: %w", ci, after.Round(time.Millisecond), err)
	}
	h.state[ci] = poisoned
	h.stats.Poisoned++
	if h.poison == nil {
		why := fmt.Sprintf("its fetch failed for %v", after.Round(time.Millisecond))
		if errors.Is(cause, ErrLost) {
			why = "its data is lost"
		}
		h.poison = fmt.Errorf("chunk %d (bytes %d-%d) poisoned, its accesses raise SIGBUS: %s: %w",
			ci, off, off+n-1, why, cause)
	}
	return true, nil
}

// dropLostLocked gives up on chunk ci, being evicted or flushed, whose
// write-back failed with ErrLost (the region is gone, or another writer
// holds it since this one's lease lapsed): its writes can never land, so
// rather than stay dirty in the buffer for good (a buffer full of such
// chunks would leave faults no slot), it is dropped and poisoned, its
// accesses raise SIGBUS, and every Sync reports the loss. The chunk is
// write-protected (for its write-back): it is punched out first, then the
// protection lifted, which clears the uffd-wp markers poisoning would step
// over (see retire), and wakes writers waiting on it, whose retried faults
// find the chunk poisoned. It reports whether the chunk left the buffer.
//
// Where the mapping cannot poison (a kernel before 6.6: poisonSupport) it
// does nothing and reports false, as when the punch fails: the chunk stays
// resident and dirty, its bytes readable, and every Sync's write-back fails
// again and says so. Punched but not poisoned, it would be resident without
// pages, and the program's every touch of it would fault, be woken as
// spurious and fault again, for ever. If poisoning fails after the punch
// all the same, the bytes are gone: the chunk is left absent, so that its
// next touch fetches it again instead (a fetch that fails with ErrLost
// poisons it there), and the next Sync reports the lost writes.
func (h *handler) dropLostLocked(ci int, cause error) bool {
	if h.noPoison != nil {
		return false
	}
	off, n := h.span(ci)
	if err := unix.Fallocate(h.memfd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(off), int64(n)); err != nil {
		return false
	}
	var err error
	if !h.gone {
		err = uffdWriteProtect(h.uffd, h.base+off, n, false)
		if err == nil {
			err = h.poisonRange(h.base+off, n)
		}
		if err == nil {
			err = uffdWake(h.uffd, h.base+off, n)
		}
		if errors.Is(err, errGone) {
			h.gone = true
			err = nil
		}
	}
	h.dirty[ci] = false
	h.occupied--
	h.cond.Broadcast()
	if err != nil {
		h.state[ci] = absent
		h.setErrLocked(fmt.Errorf("chunk %d (bytes %d-%d): its writes can never be written back and are lost; poisoning it failed (%v), so its next touch fetches it again: %w",
			ci, off, off+n-1, err, cause))
		return true
	}
	h.state[ci] = poisoned
	h.stats.Poisoned++
	if h.poison == nil {
		h.poison = fmt.Errorf("chunk %d (bytes %d-%d) poisoned, its accesses raise SIGBUS: its writes can never be written back: %w",
			ci, off, off+n-1, cause)
	}
	return true
}

// poisonSupport says why UFFDIO_POISON cannot be used on a mapping's
// userfaultfd, nil if it can: the program asks for UFFD_FEATURE_POISON
// whenever its kernel, which is the agent's, offers it (Linux 6.6+).
// features is uffdFeatures, or a test's stand-in when not nil.
func poisonSupport(features func() (uint64, error)) error {
	if features == nil {
		features = uffdFeatures
	}
	f, err := features()
	if err != nil {
		return err
	}
	if f&featurePoison == 0 {
		return fmt.Errorf("this kernel's userfaultfd lacks UFFD_FEATURE_POISON (Linux 6.6+; features %#x)", f)
	}
	return nil
}

// poisonRange poisons [addr, addr+n) with uffdPoison. Where the mapping
// cannot poison, it fails as the kernel's UFFDIO_POISON would, EINVAL.
func (h *handler) poisonRange(addr, n uint64) error {
	if h.noPoison != nil {
		return fmt.Errorf("%w (%w)", h.noPoison, unix.EINVAL)
	}
	return uffdPoison(h.uffd, addr, n, h.r.pageSize)
}

func (h *handler) countRetry() {
	h.mu.Lock()
	h.stats.Retries++
	h.mu.Unlock()
}

func (h *handler) setErr(err error) {
	h.mu.Lock()
	if h.err == nil {
		h.err = err
	}
	h.mu.Unlock()
}

// chunkAt returns the index of the chunk that holds addr, and false when
// addr is outside the mapping.
func (h *handler) chunkAt(addr uint64) (int, bool) {
	if addr < h.base || addr >= h.base+uint64(h.r.mapLen) {
		return 0, false
	}
	return int((addr - h.base) / uint64(h.r.chunk)), true
}

// fault serves one page-fault message.
func (h *handler) fault(m uffdMsg, buf []byte) error {
	ci, ok := h.chunkAt(m.Address)
	if !ok {
		return nil // outside the mapping: nothing to serve
	}
	off, n := h.span(ci)
	h.mu.Lock()
	defer h.mu.Unlock()
	for {
		switch h.state[ci] {
		case evicting, fetching:
			h.cond.Wait()
		case resident, flushing:
			h.lru.pushFront(ci)
			if m.Flags&pagefaultFlagWP != 0 {
				// First write to a clean chunk: it is dirty from now on.
				// Lifting the protection wakes the writer.
				h.dirty[ci] = true
				h.stats.WPFaults++
				if err := uffdWriteProtect(h.uffd, h.base+off, n, false); err != nil {
					return fmt.Errorf("unprotect chunk %d: %w", ci, err)
				}
				return nil
			}
			h.stats.Spurious++
			return wake(h.uffd, h.base+off, n)
		case poisoned:
			// The kernel raises SIGBUS on poisoned pages without asking us;
			// a fault here is on a page that was present when the chunk was
			// poisoned and has gone since: poison it too.
			h.stats.Spurious++
			return h.poisonRange(h.base+off, n)
		case absent:
			if m.Flags&pagefaultFlagWP != 0 {
				// A write that hit the protection set before an eviction
				// that has finished since: let it retry, it faults missing.
				h.stats.Spurious++
				return wake(h.uffd, h.base+off, n)
			}
			if h.occupied >= h.r.capacity {
				if v := h.victimLocked(); v >= 0 {
					if err := h.evictLocked(v, buf); err != nil {
						// Serve the fault over capacity rather than leave the
						// program blocked (or try every other victim against
						// a failing backend); the error surfaces at Sync.
						h.setErrLocked(err)
						return h.fetchFaultLocked(ci, m, buf)
					}
					h.stats.Inline++ // an eviction that happened, as Evictions counts
					continue
				}
				if h.occupied-h.lru.len() > 0 {
					h.cond.Wait() // slots are busy in write-back; one frees soon
					continue
				}
			}
			return h.fetchFaultLocked(ci, m, buf)
		}
	}
}

func (h *handler) setErrLocked(err error) {
	if h.err == nil {
		h.err = err
	}
}

func wake(uffd int, addr, n uint64) error {
	if err := uffdWake(uffd, addr, n); err != nil {
		return fmt.Errorf("wake %#x+%d: %w", addr, n, err)
	}
	return nil
}

// fetchFaultLocked fetches chunk ci for fault m and counts it.
func (h *handler) fetchFaultLocked(ci int, m uffdMsg, buf []byte) error {
	if err := h.fetchLocked(ci, m.Flags&pagefaultFlagWrite != 0, buf); err != nil {
		return err
	}
	h.stats.Faults++
	return nil
}

// fetchLocked reads chunk ci from the backend and installs it, writable and
// dirty for a write fault, write-protected and clean for a read fault.
func (h *handler) fetchLocked(ci int, write bool, buf []byte) error {
	off, n := h.span(ci)
	h.state[ci] = fetching
	h.occupied++
	h.mu.Unlock()
	kept, err := h.install(ci, off, buf[:n], write)
	h.mu.Lock()
	h.cond.Broadcast()
	if err != nil {
		h.state[ci] = absent
		h.occupied--
		return err
	}
	h.state[ci] = resident
	// A kept page may hold a write the agent never saw (made after the
	// writable install that left it): the chunk differs from the backend.
	h.dirty[ci] = write || kept
	h.lru.pushFront(ci)
	if h.occupied > h.r.lowWater {
		select {
		case h.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// install reads chunk ci from the backend and copies it into the
// program's memory. It reports whether it kept pages that were there
// already.
func (h *handler) install(ci int, off uint64, buf []byte, write bool) (bool, error) {
	// The mapping may be longer than the backend (rounded up to a page); the
	// tail reads as zeros.
	valid := max(min(int64(len(buf)), h.r.size-int64(off)), 0)
	got, err := h.be.ReadAt(buf[:valid], int64(off))
	if err != nil && !(errors.Is(err, io.EOF) && got == int(valid)) {
		return false, fmt.Errorf("fetch chunk %d (%d bytes at %d): %w", ci, valid, off, err)
	}
	clear(buf[valid:])
	// Copy without waking, and wake once the whole chunk is in place: a
	// thread woken after part of it could otherwise write a page that was
	// already there before the fallback below protects it.
	mode := uint64(copyModeDontWake)
	if !write {
		mode |= copyModeWP
	}
	done, err := uffdCopy(h.uffd, h.base+off, buf, mode)
	kept := errors.Is(err, unix.EEXIST)
	if kept {
		// Some page of the chunk is present although the chunk was absent
		// (a writable install that failed part way left it); install the
		// rest page by page and keep what is there. The chunk counts dirty
		// (fetchLocked): a kept page may have been written since.
		err = nil
		page := h.r.pageSize
		for p := done - done%page + page; p < len(buf) && err == nil; p += page {
			_, err = uffdCopy(h.uffd, h.base+off+uint64(p), buf[p:p+page], mode)
			if errors.Is(err, unix.EEXIST) {
				err = nil
			}
		}
		if err == nil && !write {
			// A page kept may be writable, and a write to it would then
			// never mark the chunk dirty: protect them all, as a clean
			// chunk must be (a page not mapped yet gets a marker).
			err = uffdWriteProtect(h.uffd, h.base+off, uint64(len(buf)), true)
		}
	}
	if err == nil {
		err = uffdWake(h.uffd, h.base+off, uint64(len(buf)))
	}
	if err != nil {
		return false, fmt.Errorf("install chunk %d (UFFDIO_COPY %d bytes at %#x): %w", ci, len(buf), h.base+off, err)
	}
	return kept, nil
}

// victimLocked picks the least recently used resident chunk other than the
// most recently used one, or -1. The newest chunk is spared because the
// program is about to touch it: evicting it would let two accesses evict
// each other's chunk forever in a small buffer.
func (h *handler) victimLocked() int {
	front := h.lru.front()
	for v := h.lru.back(); v >= 0 && v != front; v = h.lru.newer(v) {
		if h.state[v] == resident {
			return v
		}
	}
	return -1
}

// evictLocked writes chunk ci back if dirty and drops it. It unlocks mu
// during the I/O and returns with mu held.
func (h *handler) evictLocked(ci int, buf []byte) error {
	off, n := h.span(ci)
	h.state[ci] = evicting
	h.lru.remove(ci)
	// Protect before reading: a write from here on faults and waits for the
	// eviction instead of landing after the data was read and being lost
	// when the hole is punched.
	if err := h.protectLocked(off, n); err != nil {
		h.state[ci] = resident
		h.lru.pushFront(ci)
		h.cond.Broadcast()
		return fmt.Errorf("protect chunk %d for eviction: %w", ci, err)
	}
	dirty := h.dirty[ci]
	h.dirty[ci] = false
	h.mu.Unlock()
	var err error
	if dirty {
		err = h.writeBack(ci, off, buf[:n])
	}
	if err == nil {
		// Dropping the pages from the memfd unmaps them from the program
		// too; its next touch faults missing. The agent cannot
		// madvise(MADV_DONTNEED) another process's memory; this is the
		// shared-memory equivalent.
		if perr := unix.Fallocate(h.memfd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(off), int64(n)); perr != nil {
			err = fmt.Errorf("punch chunk %d out of the memfd: %w", ci, perr)
		}
	}
	h.mu.Lock()
	h.cond.Broadcast()
	if err != nil && dirty && errors.Is(err, ErrLost) {
		if h.dropLostLocked(ci, err) {
			h.stats.Evictions++ // it left the buffer; Sync reports its lost writes
			return nil
		}
	}
	if err != nil {
		h.state[ci] = resident
		h.dirty[ci] = h.dirty[ci] || dirty
		h.lru.pushFront(ci)
		return err
	}
	h.state[ci] = absent
	h.occupied--
	h.stats.Evictions++
	if dirty {
		h.stats.Writebacks++
	}
	return nil
}

// protectLocked write-protects [off, off+n) of the mapping before its data
// is read for write-back. When the program has exited, the kernel tore its
// mm down before closing its sockets, and the ioctl fails with ESRCH: then
// nothing can write the chunk any more, so it needs no protection, and its
// bytes are still in the memfd, which the agent holds and writes back from.
func (h *handler) protectLocked(off, n uint64) error {
	if h.gone {
		return nil
	}
	err := uffdWriteProtect(h.uffd, h.base+off, n, true)
	if errors.Is(err, errGone) {
		h.gone = true
		return nil
	}
	return err
}

// writeBack copies chunk ci from the memfd to the backend. pread on a shmem
// file neither faults through the program's userfaultfd nor fills holes, so
// it is safe whatever the chunk's state.
func (h *handler) writeBack(ci int, off uint64, buf []byte) error {
	valid := int(max(min(int64(len(buf)), h.r.size-int64(off)), 0))
	for got := 0; got < valid; {
		n, err := unix.Pread(h.memfd, buf[got:valid], int64(off)+int64(got))
		if err != nil {
			return fmt.Errorf("read chunk %d from the memfd: %w", ci, err)
		}
		if n == 0 {
			return fmt.Errorf("read chunk %d from the memfd: short read at %d", ci, got)
		}
		got += n
	}
	if _, err := h.be.WriteAt(buf[:valid], int64(off)); err != nil {
		return fmt.Errorf("write back chunk %d (%d bytes at %d): %w", ci, valid, off, err)
	}
	return nil
}

// cleaner evicts least recently used chunks down to the low-water mark
// whenever the fault loop says the buffer is above it, so that faults find
// free slots (SODA's proactive eviction at a load factor).
func (h *handler) cleaner(ctx context.Context) {
	buf := make([]byte, h.r.chunk)
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.kick:
		}
		h.mu.Lock()
		for h.occupied > h.r.lowWater && ctx.Err() == nil {
			v := h.victimLocked()
			if v < 0 {
				break
			}
			if err := h.evictLocked(v, buf); err != nil {
				h.setErrLocked(err)
				break
			}
			h.stats.Background++
		}
		h.mu.Unlock()
	}
}

// flush writes every dirty chunk back without evicting it, waits for
// evictions in flight, then syncs the backend. It reports and clears the
// first error the background work met since the last flush. final says
// the mapping ends after it (Close, or the program is gone), so that a
// chunk whose write-back failed gets no later try.
func (h *handler) flush(final bool) error {
	buf := make([]byte, h.r.chunk)
	var errs []error
	failed := 0  // chunks left dirty
	dropped := 0 // chunks whose writes can never land, poisoned (dropLostLocked)
	kept := 0    // chunks whose writes can never land, left dirty (dropLostLocked could not poison them)
	h.mu.Lock()
	for ci := range h.state {
		for h.state[ci] == evicting || h.state[ci] == fetching {
			h.cond.Wait()
		}
		if h.state[ci] != resident || !h.dirty[ci] {
			continue
		}
		off, n := h.span(ci)
		h.state[ci] = flushing
		if err := h.protectLocked(off, n); err != nil {
			h.state[ci] = resident
			failed++
			errs = append(errs, fmt.Errorf("protect chunk %d for write-back: %w", ci, err))
			continue
		}
		h.dirty[ci] = false
		h.mu.Unlock()
		err := h.writeBack(ci, off, buf[:n])
		h.mu.Lock()
		h.cond.Broadcast()
		if err != nil && errors.Is(err, ErrLost) {
			h.lru.remove(ci)
			if h.dropLostLocked(ci, err) {
				if h.state[ci] == poisoned {
					dropped++
				}
				continue
			}
			h.lru.pushFront(ci)
			h.state[ci] = resident
			h.dirty[ci] = true
			kept++
			errs = append(errs, err)
			continue
		}
		h.state[ci] = resident
		if err != nil {
			h.dirty[ci] = true
			failed++
			errs = append(errs, err)
			continue
		}
		h.stats.Writebacks++
	}
	if h.err != nil {
		errs = append([]error{h.err}, errs...)
		h.err = nil
	}
	if h.poison != nil {
		// For as long as the mapping lives: those bytes are lost to it.
		errs = append([]error{fmt.Errorf("poisoned chunks: %d; the first: %w", h.stats.Poisoned, h.poison)}, errs...)
	}
	h.mu.Unlock()
	if err := h.be.Sync(); err != nil {
		errs = append(errs, fmt.Errorf("sync backend: %w", err))
	}
	if len(errs) == 0 {
		return nil
	}
	// One line, not one per chunk: a failing backend fails them all.
	var notes []string
	if len(errs) > 1 {
		notes = append(notes, fmt.Sprintf("and %d more errors", len(errs)-1))
	}
	if dropped > 0 {
		what := fmt.Sprintf("%d chunks", dropped)
		if dropped == 1 {
			what = "1 chunk"
		}
		notes = append(notes, fmt.Sprintf("the writes in %s can never be written back and are lost; their accesses raise SIGBUS", what))
	}
	if kept > 0 {
		what := fmt.Sprintf("%d chunks", kept)
		if kept == 1 {
			what = "1 chunk"
		}
		notes = append(notes, fmt.Sprintf("the writes in %s can never be written back and are lost, though the mapping still reads them", what))
	}
	switch {
	case failed > 0 && final:
		what := fmt.Sprintf("%d chunks", failed)
		if failed == 1 {
			what = "1 chunk"
		}
		notes = append(notes, fmt.Sprintf("the mapping ends: the writes in the %s whose write-back failed are lost", what))
	case failed > 0:
		notes = append(notes, "chunks whose write-back failed stay dirty for the next Sync")
	}
	if len(notes) == 0 {
		return errs[0]
	}
	return fmt.Errorf("%w (%s)", errs[0], strings.Join(notes, "; "))
}

// retire makes every page of the mapping raise SIGBUS from now on, for an
// agent that stops while the program still maps the region: nobody will
// read the program's userfaultfd any more, so without it the program's next
// fault (a touch of an absent chunk, a write to a clean one) would block
// forever. Call it after the fault loop and the cleaner have stopped and the
// final write-back has run, so that no write can land any more (every
// writable chunk was dirty and was protected for its write-back).
//
// The agent cannot madvise(MADV_DONTNEED) the program's memory, so it
// zaps the present pages by punching the whole memfd, as eviction does;
// UFFDIO_POISON then marks every page (it skips present ones). A page
// that was write-protected leaves a uffd-wp marker when zapped, which
// poisoning would step over (EEXIST) and a touch would fault MISSING on:
// lifting the protection on the range first clears the markers. Poisoning
// and lifting the protection wake the threads blocked in the range, which
// retry and get SIGBUS.
func (h *handler) retire() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gone {
		return nil // the program exited: nobody to wake
	}
	if h.noPoison != nil {
		return fmt.Errorf("poison the mapping: %w: its program blocks on its next fault", h.noPoison)
	}
	n := uint64(h.r.mapLen)
	if err := unix.Fallocate(h.memfd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, int64(n)); err != nil {
		return fmt.Errorf("poison the mapping: punch the memfd: %w; its program blocks on its next fault", err)
	}
	for i := range h.state {
		if h.state[i] != absent && h.state[i] != poisoned {
			h.occupied--
		}
		h.state[i] = poisoned
		h.dirty[i] = false
	}
	err := uffdWriteProtect(h.uffd, h.base, n, false)
	if err == nil {
		err = h.poisonRange(h.base, n)
	}
	if err == nil {
		err = uffdWake(h.uffd, h.base, n)
	}
	if errors.Is(err, errGone) {
		h.gone = true
		return nil
	}
	if err != nil {
		return fmt.Errorf("poison the mapping: %w; its program may block on its next fault", err)
	}
	return nil
}

// snapshot returns the handler's counters.
func (h *handler) snapshot() Stats {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.stats
	st.Resident, st.Capacity = h.occupied, h.r.capacity
	return st
}
