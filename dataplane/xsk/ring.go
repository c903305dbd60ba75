package xsk

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// entry is what a ring holds: frame addresses (fill, completion) or
// descriptors (RX, TX).
type entry interface{ uint64 | Desc }

// ring is this process's view of one AF_XDP ring. The same type serves both
// roles; a ring is only ever used in one role, fixed at creation:
//
//	producer (fill, TX):        reserve, write at(i), submit
//	consumer (RX, completion):  peek, read at(i), release
//
// Indices are free-running uint32 counters; the slot is index & mask, and
// differences are taken modulo 2^32, so wrap-around needs no special case.
// The cached indices belong to this side alone; the shared words are only
// touched through sync/atomic (a store publishes the entries written before
// it, a load makes the other side's entries visible after it).
type ring[T entry] struct {
	producer *uint32
	consumer *uint32
	flags    *uint32
	entries  []T
	mask     uint32
	size     uint32

	// For a producer: cachedProd is the next index to reserve, cachedCons
	// the kernel's consumer index plus size (so cachedCons-cachedProd is
	// the free count). For a consumer: cachedCons is the next index to
	// peek, cachedProd the last producer index seen.
	cachedProd uint32
	cachedCons uint32
}

// newRing lays a ring over mem using the kernel's offsets.
func newRing[T entry](mem []byte, off unix.XDPRingOffset, size uint32, producer bool) (*ring[T], error) {
	var zero T
	esz := uint64(unsafe.Sizeof(zero))
	if size == 0 || size&(size-1) != 0 {
		return nil, fmt.Errorf("ring size %d is not a power of two", size)
	}
	end := off.Desc + uint64(size)*esz
	for _, o := range []uint64{off.Producer, off.Consumer, off.Flags} {
		if o%4 != 0 || o+4 > uint64(len(mem)) {
			return nil, fmt.Errorf("ring offset %d outside a %d-byte mapping", o, len(mem))
		}
	}
	if off.Desc%8 != 0 || end > uint64(len(mem)) {
		return nil, fmt.Errorf("ring descriptors [%d,%d) outside a %d-byte mapping", off.Desc, end, len(mem))
	}
	r := &ring[T]{
		producer: (*uint32)(unsafe.Pointer(&mem[off.Producer])),
		consumer: (*uint32)(unsafe.Pointer(&mem[off.Consumer])),
		flags:    (*uint32)(unsafe.Pointer(&mem[off.Flags])),
		entries:  unsafe.Slice((*T)(unsafe.Pointer(&mem[off.Desc])), size),
		mask:     size - 1,
		size:     size,
	}
	r.cachedProd = atomic.LoadUint32(r.producer)
	r.cachedCons = atomic.LoadUint32(r.consumer)
	if producer {
		r.cachedCons += size
	}
	return r, nil
}

// at returns the entry for index i.
func (r *ring[T]) at(i uint32) *T { return &r.entries[i&r.mask] }

// free returns how many entries a producer can reserve, looking at the
// kernel's consumer index only when the cache promises fewer than n.
func (r *ring[T]) free(n uint32) uint32 {
	f := r.cachedCons - r.cachedProd
	if f >= n {
		return f
	}
	r.cachedCons = atomic.LoadUint32(r.consumer) + r.size
	return r.cachedCons - r.cachedProd
}

// reserve claims up to n entries starting at index idx.
func (r *ring[T]) reserve(n uint32) (idx, got uint32) {
	got = min(n, r.free(n))
	idx = r.cachedProd
	r.cachedProd += got
	return idx, got
}

// cancel gives back the last n reserved, unsubmitted entries.
func (r *ring[T]) cancel(n uint32) { r.cachedProd -= n }

// submit publishes every reserved entry to the kernel. The atomic store
// orders the entry writes before the new producer index.
func (r *ring[T]) submit() { atomic.StoreUint32(r.producer, r.cachedProd) }

// avail returns how many entries a consumer can peek, up to n, loading the
// producer index only when the cache holds fewer than n.
func (r *ring[T]) avail(n uint32) uint32 {
	e := r.cachedProd - r.cachedCons
	if e < n {
		r.cachedProd = atomic.LoadUint32(r.producer)
		e = r.cachedProd - r.cachedCons
	}
	return min(e, n)
}

// peek claims up to n filled entries starting at index idx.
func (r *ring[T]) peek(n uint32) (idx, got uint32) {
	got = r.avail(n)
	idx = r.cachedCons
	r.cachedCons += got
	return idx, got
}

// release hands every peeked entry back to the kernel. The atomic store
// orders the entry reads before the new consumer index.
// unpeek gives back the last n entries peek returned, unread: the next
// peek returns them again.
func (r *ring[T]) unpeek(n uint32) { r.cachedCons -= n }

func (r *ring[T]) release() { atomic.StoreUint32(r.consumer, r.cachedCons) }

// present reports whether a consumer ring has entries not yet released.
// It reads only the shared words, so it is safe beside a concurrent peek.
func (r *ring[T]) present() bool {
	return atomic.LoadUint32(r.producer) != atomic.LoadUint32(r.consumer)
}

// unconsumed is how many submitted entries of a producer ring the kernel
// has not consumed yet.
func (r *ring[T]) unconsumed() uint32 {
	return atomic.LoadUint32(r.producer) - atomic.LoadUint32(r.consumer)
}

// needsWakeup reports the kernel's XDP_RING_NEED_WAKEUP flag.
func (r *ring[T]) needsWakeup() bool {
	return atomic.LoadUint32(r.flags)&unix.XDP_RING_NEED_WAKEUP != 0
}
