package xsk

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Frame states. The low byte is the owner; for frames the kernel holds, the
// rest is the id of the fill/completion ring pair they belong to, so that
// closing a queue can take back exactly its frames.
const (
	frameFree uint32 = iota // on the UMEM's free list
	frameUser               // returned by RecvBatch, held by the caller
	frameFill               // in a fill ring or the kernel's receive path
	frameTX                 // in a TX ring or the kernel's transmit path
)

func kernelState(kind, queue uint32) uint32 { return kind | queue<<8 }

// FrameStats counts a UMEM's frames by owner. Total is always the sum.
type FrameStats struct {
	Total int // frames in the UMEM
	Free  int // on the free list
	Fill  int // in fill rings, or taken by the kernel for receive
	TX    int // submitted for transmit, not yet back on a completion ring
	User  int // received and not yet recycled or transmitted
}

// UMEM is the packet memory shared by one or more AF_XDP sockets: an
// anonymous mapping of FrameCount frames of FrameSize bytes, the free-frame
// list, and one fill and completion ring pair per (interface, queue) bound.
//
// The kernel registration (XDP_UMEM_REG) happens on the first socket, in the
// network namespace of the thread that creates it. Close closes the sockets
// and unmaps the memory.
type UMEM struct {
	cfg      UMEMConfig
	area     []byte // never resliced: Frame reads it without a lock
	shift    uint
	size     uint64
	unmapped atomic.Bool

	state       []atomic.Uint32
	frameErrors atomic.Uint64

	allocMu sync.Mutex
	free    []uint32 // frame indices, used as a stack

	mu      sync.Mutex // guards the fields below
	closed  bool
	sockets map[*Socket]struct{}
	queues  map[queueKey]*queueRings
	nextID  uint32
}

type queueKey struct {
	ifindex int
	queue   uint32
}

// queueRings is the fill and completion ring pair of one (interface, queue).
// Sockets bound to the same (interface, queue) share it, as the kernel shares
// its buffer pool; fillMu and compMu serialise them.
type queueRings struct {
	id   uint32
	key  queueKey
	refs int

	fillMu  sync.Mutex
	fillMem []byte
	fill    *ring[uint64]
	compMu  sync.Mutex
	compMem []byte
	comp    *ring[uint64]

	target  atomic.Int64 // fill level the receive path keeps
	fillOut atomic.Int64 // frames in fill state for this pair
}

// NewUMEM maps the packet memory. It needs no privilege; the kernel sees it
// when the first socket is created. A nil cfg takes the defaults.
func NewUMEM(cfg *UMEMConfig) (*UMEM, error) {
	c, err := cfg.normalise()
	if err != nil {
		return nil, fmt.Errorf("xsk umem: %w", err)
	}
	size := c.FrameSize * c.FrameCount
	// MAP_POPULATE: the kernel pins every page at registration anyway;
	// faulting them in now keeps the first packets off the slow path.
	area, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("xsk umem: map %d bytes: %w", size, err)
	}
	u := &UMEM{
		cfg:     c,
		area:    area,
		shift:   log2(c.FrameSize),
		size:    uint64(size),
		state:   make([]atomic.Uint32, c.FrameCount),
		free:    make([]uint32, c.FrameCount),
		sockets: make(map[*Socket]struct{}),
		queues:  make(map[queueKey]*queueRings),
	}
	// Lowest addresses on top of the stack: the first frames used are the
	// first pages mapped.
	for i := range u.free {
		u.free[i] = uint32(c.FrameCount - 1 - i)
	}
	return u, nil
}

// FrameSize returns the size of one frame in bytes.
func (u *UMEM) FrameSize() int { return u.cfg.FrameSize }

// FrameCount returns the number of frames.
func (u *UMEM) FrameCount() int { return u.cfg.FrameCount }

// Headroom returns the bytes reserved in front of each frame's packet.
func (u *UMEM) Headroom() int { return u.cfg.Headroom }

// Frames counts frames by owner. Taken while packets flow it is a snapshot
// of moving counts; at rest it is exact.
func (u *UMEM) Frames() FrameStats {
	st := FrameStats{Total: len(u.state)}
	for i := range u.state {
		switch u.state[i].Load() & 0xff {
		case frameFree:
			st.Free++
		case frameUser:
			st.User++
		case frameFill:
			st.Fill++
		case frameTX:
			st.TX++
		}
	}
	return st
}

// FrameErrors counts descriptors the kernel or the caller handed in that
// named a frame in the wrong state (never expected; each is refused).
func (u *UMEM) FrameErrors() uint64 { return u.frameErrors.Load() }

// Frame returns the bytes d describes, with capacity up to the end of its
// frame, or nil when d does not lie inside one frame. The slice aliases the
// UMEM: it is valid while the caller holds the frame, and never after Close.
func (u *UMEM) Frame(d Desc) []byte {
	end := d.Addr + uint64(d.Len)
	fend := (d.Addr>>u.shift + 1) << u.shift
	if d.Len == 0 || end > fend || fend > u.size || d.Addr >= u.size || u.unmapped.Load() {
		return nil
	}
	return u.area[d.Addr:end:fend]
}

// Close closes every socket on the UMEM and unmaps its memory. Closing
// twice is safe.
func (u *UMEM) Close() error {
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return nil
	}
	u.closed = true
	socks := make([]*Socket, 0, len(u.sockets))
	for s := range u.sockets {
		socks = append(socks, s)
	}
	u.mu.Unlock()

	var errs []error
	for _, s := range socks {
		errs = append(errs, s.Close())
	}
	u.unmapped.Store(true)
	if err := unix.Munmap(u.area); err != nil {
		errs = append(errs, fmt.Errorf("xsk umem: unmap: %w", err))
	}
	return errors.Join(errs...)
}

// alloc takes up to cap(dst)-len(dst) frames off the free list, marks them
// st and appends their indices to dst.
func (u *UMEM) alloc(dst []uint32, st uint32) []uint32 {
	u.allocMu.Lock()
	defer u.allocMu.Unlock()
	for len(dst) < cap(dst) && len(u.free) > 0 {
		fi := u.free[len(u.free)-1]
		u.free = u.free[:len(u.free)-1]
		if !u.state[fi].CompareAndSwap(frameFree, st) {
			// On the free list but not free: drop it from the list
			// rather than hand out a frame someone else owns.
			u.frameErrors.Add(1)
			continue
		}
		dst = append(dst, fi)
	}
	return dst
}

// release puts frames, already marked free, back on the free list.
func (u *UMEM) release(frames []uint32) {
	if len(frames) == 0 {
		return
	}
	u.allocMu.Lock()
	u.free = append(u.free, frames...)
	u.allocMu.Unlock()
}

// freeCount is the length of the free list.
func (u *UMEM) freeCount() int {
	u.allocMu.Lock()
	defer u.allocMu.Unlock()
	return len(u.free)
}

// take moves frame fi from state from to state to; false when fi is out of
// range or not in state from.
func (u *UMEM) take(fi uint64, from, to uint32) bool {
	if fi >= uint64(len(u.state)) || !u.state[fi].CompareAndSwap(from, to) {
		u.frameErrors.Add(1)
		return false
	}
	return true
}

// reclaimQueue returns to the free list every frame the kernel held for
// queue pair q. Called once its last socket is closed, when the kernel no
// longer touches them.
func (u *UMEM) reclaimQueue(id uint32) {
	var back []uint32
	for i := range u.state {
		st := u.state[i].Load()
		if st == kernelState(frameFill, id) || st == kernelState(frameTX, id) {
			if u.state[i].CompareAndSwap(st, frameFree) {
				back = append(back, uint32(i))
			}
		}
	}
	u.release(back)
}

// newQueue creates and maps the fill and completion rings of a new
// (interface, queue) on fd; called with u.mu held.
func (u *UMEM) newQueue(key queueKey, fd int, off unix.XDPMmapOffsets) (*queueRings, error) {
	q := &queueRings{id: u.nextID, key: key}
	var err error
	q.fillMem, q.fill, err = mapRing[uint64](fd, unix.XDP_UMEM_FILL_RING, unix.XDP_UMEM_PGOFF_FILL_RING, off.Fr, u.cfg.FillSize, true)
	if err != nil {
		return nil, err
	}
	q.compMem, q.comp, err = mapRing[uint64](fd, unix.XDP_UMEM_COMPLETION_RING, unix.XDP_UMEM_PGOFF_COMPLETION_RING, off.Cr, u.cfg.CompletionSize, false)
	if err != nil {
		_ = munmap(&q.fillMem)
		return nil, err
	}
	// Ids are 24 bits wide in the frame state; wrapping after 16M queue
	// pairs would need all of them alive at once to collide.
	u.nextID = (u.nextID + 1) & 0xffffff
	return q, nil
}

func (q *queueRings) unmap() error {
	return errors.Join(munmap(&q.fillMem), munmap(&q.compMem))
}

// fillUp tops the fill ring of q up to its target from the free list and
// returns how many frames it added.
func (u *UMEM) fillUp(q *queueRings, scratch []uint32) int {
	added := 0
	for {
		need := q.target.Load() - q.fillOut.Load()
		if need <= 0 {
			return added
		}
		n := u.fillOnce(q, scratch[:0:min(need, int64(cap(scratch)))])
		if n == 0 {
			return added
		}
		added += n
	}
}

func (u *UMEM) fillOnce(q *queueRings, scratch []uint32) int {
	q.fillMu.Lock()
	defer q.fillMu.Unlock()
	idx, got := q.fill.reserve(uint32(cap(scratch)))
	if got == 0 {
		return 0
	}
	frames := u.alloc(scratch[:0:got], kernelState(frameFill, q.id))
	for i, fi := range frames {
		*q.fill.at(idx + uint32(i)) = uint64(fi) << u.shift
	}
	q.fill.cancel(got - uint32(len(frames)))
	if len(frames) > 0 {
		q.fillOut.Add(int64(len(frames)))
		q.fill.submit()
	}
	return len(frames)
}

// drainCompletions moves every completed TX frame of q back to the free
// list and returns how many it freed. It consumes every entry, but one that
// names a frame not in TX state for q is refused (a frame error) and not
// counted: Reclaim reports frames freed, and kick takes a count of 0 for a
// stalled completion ring.
func (u *UMEM) drainCompletions(q *queueRings, scratch []uint32) int {
	q.compMu.Lock()
	defer q.compMu.Unlock()
	total := 0
	want := kernelState(frameTX, q.id)
	for {
		idx, got := q.comp.peek(uint32(cap(scratch)))
		if got == 0 {
			return total
		}
		back := scratch[:0]
		for i := range got {
			fi := *q.comp.at(idx + i) >> u.shift
			if u.take(fi, want, frameFree) {
				back = append(back, uint32(fi))
			}
		}
		q.comp.release()
		u.release(back)
		total += len(back)
	}
}
