package xsk

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fakeRing lays out a ring in ordinary memory the way the kernel does, with
// both indices starting at start, and returns a producer and a consumer view
// of it: the kernel's side is played by the other view.
func fakeRing[T entry](t testing.TB, size, start uint32) (prod, cons *ring[T]) {
	t.Helper()
	var zero T
	off := unix.XDPRingOffset{Producer: 0, Consumer: 64, Flags: 128, Desc: 192}
	words := make([]uint64, (192+uint64(size)*uint64(unsafe.Sizeof(zero)))/8)
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)
	*(*uint32)(unsafe.Pointer(&mem[off.Producer])) = start
	*(*uint32)(unsafe.Pointer(&mem[off.Consumer])) = start
	var err error
	if prod, err = newRing[T](mem, off, size, true); err != nil {
		t.Fatal(err)
	}
	if cons, err = newRing[T](mem, off, size, false); err != nil {
		t.Fatal(err)
	}
	return prod, cons
}

// TestRingWrap pushes 10× the ring size through a 64-entry ring whose
// indices start just below 2^32, in random batch sizes, and checks order,
// capacity and the uint32 wrap.
func TestRingWrap(t *testing.T) {
	const size = 64
	for _, start := range []uint32{0, 1<<32 - 100, 1<<32 - 1} {
		prod, cons := fakeRing[Desc](t, size, start)
		rng := rand.New(rand.NewPCG(1, uint64(start)))
		next, want := uint64(0), uint64(0)
		for want < 10*size {
			idx, got := prod.reserve(uint32(rng.IntN(size + 8)))
			if outstanding := uint32(next - want); outstanding+got > size {
				t.Fatalf("start %#x: reserved %d with %d outstanding in a ring of %d", start, got, outstanding, size)
			}
			for i := range got {
				*prod.at(idx + i) = Desc{Addr: next, Len: uint32(next)}
				next++
			}
			prod.submit()
			idx, got = cons.peek(uint32(rng.IntN(size + 8)))
			for i := range got {
				if d := *cons.at(idx + i); d.Addr != want {
					t.Fatalf("start %#x: entry %d, want %d", start, d.Addr, want)
				}
				want++
			}
			cons.release()
		}
		if start != 0 && *prod.producer >= start {
			t.Fatalf("start %#x: producer %#x did not wrap", start, *prod.producer)
		}
	}
}

// TestRingFull checks reserve against a full ring and cancel.
func TestRingFull(t *testing.T) {
	prod, cons := fakeRing[uint64](t, 8, 1<<32-3)
	if _, got := prod.reserve(100); got != 8 {
		t.Fatalf("reserve on an empty ring of 8 got %d", got)
	}
	prod.cancel(3)
	prod.submit()
	if _, got := prod.reserve(10); got != 3 {
		t.Fatalf("reserve after 5 submitted got %d, want 3", got)
	}
	prod.cancel(3)
	if _, got := cons.peek(2); got != 2 {
		t.Fatalf("peek 2 got %d", got)
	}
	if _, got := prod.reserve(10); got != 3 {
		t.Fatalf("peeked but unreleased entries must stay owned by the consumer; got %d", got)
	}
	prod.cancel(3)
	cons.release()
	if _, got := prod.reserve(10); got != 5 {
		t.Fatalf("reserve after release got %d, want 5", got)
	}
	if !cons.present() {
		t.Fatal("consumer sees no entries")
	}
}

// TestRingConcurrent runs a producer and a consumer goroutine over one
// ring. Under -race this checks that the atomics on the shared words order
// the plain entry accesses (here the memory is Go's, which the detector
// sees; the kernel's mmap'd rings are invisible to it).
func TestRingConcurrent(t *testing.T) {
	const n = 200_000
	prod, cons := fakeRing[uint64](t, 256, 1<<32-1000)
	var wg sync.WaitGroup
	var bad atomic.Uint64
	wg.Go(func() {
		for next := uint64(0); next < n; {
			idx, got := prod.reserve(uint32(min(64, n-next)))
			for i := range got {
				*prod.at(idx + i) = next
				next++
			}
			prod.submit()
		}
	})
	wg.Go(func() {
		for want := uint64(0); want < n; {
			idx, got := cons.peek(64)
			for i := range got {
				if *cons.at(idx + i) != want {
					bad.Add(1)
				}
				want++
			}
			cons.release()
		}
	})
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d entries out of order", bad.Load())
	}
}

func TestNewRingRejectsBadLayout(t *testing.T) {
	mem := make([]byte, 256)
	for _, tc := range []struct {
		name string
		off  unix.XDPRingOffset
		size uint32
	}{
		{"size not a power of two", unix.XDPRingOffset{Consumer: 4, Flags: 8, Desc: 64}, 3},
		{"descriptors past the end", unix.XDPRingOffset{Consumer: 4, Flags: 8, Desc: 64}, 64},
		{"index past the end", unix.XDPRingOffset{Consumer: 300, Flags: 8, Desc: 64}, 4},
		{"misaligned index", unix.XDPRingOffset{Consumer: 5, Flags: 8, Desc: 64}, 4},
	} {
		if _, err := newRing[uint64](mem, tc.off, tc.size, true); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
}

func TestConfigDefaultsAndLimits(t *testing.T) {
	u, err := (*UMEMConfig)(nil).normalise()
	if err != nil || u.FrameSize != 4096 || u.FrameCount != 4096 || u.FillSize != 2048 || u.CompletionSize != 2048 {
		t.Fatalf("UMEM defaults %+v, %v", u, err)
	}
	s, err := (*SocketConfig)(nil).normalise()
	if err != nil || s.RXSize != 2048 || s.TXSize != 2048 || s.BatchSize != 64 || s.Mode != ModeAuto {
		t.Fatalf("socket defaults %+v, %v", s, err)
	}
	for _, c := range []UMEMConfig{
		{FrameSize: 3000},
		{FrameSize: 1024},
		{FrameCount: -1},
		{Headroom: 4096 - 256},
		{Headroom: -1},
		{FillSize: 1000},
		{CompletionSize: 3},
	} {
		if _, err := c.normalise(); err == nil {
			t.Errorf("UMEM config %+v accepted", c)
		}
	}
	for _, c := range []SocketConfig{
		{NoRX: true, NoTX: true},
		{RXSize: 100},
		{TXSize: 7},
		{BatchSize: -1},
		{FillFrames: -1},
		{Mode: 7},
	} {
		if _, err := c.normalise(); err == nil {
			t.Errorf("socket config %+v accepted", c)
		}
	}
}

// TestFrameOwnership drives the allocator and the per-frame states without
// a kernel: every frame has one owner, and a frame in the wrong state is
// refused.
func TestFrameOwnership(t *testing.T) {
	u, err := NewUMEM(&UMEMConfig{FrameCount: 16, FrameSize: 2048, Headroom: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	fill := kernelState(frameFill, 3)
	got := u.alloc(make([]uint32, 0, 10), fill)
	if len(got) != 10 || got[0] != 0 || got[9] != 9 {
		t.Fatalf("alloc 10 = %v", got)
	}
	if st := u.Frames(); st != (FrameStats{Total: 16, Free: 6, Fill: 10}) {
		t.Fatalf("after alloc: %+v", st)
	}
	if !u.take(uint64(got[0]), fill, frameUser) {
		t.Fatal("fill -> user refused")
	}
	if u.take(uint64(got[0]), fill, frameUser) {
		t.Fatal("second fill -> user of the same frame accepted")
	}
	if u.take(99, frameFree, frameUser) {
		t.Fatal("frame out of range accepted")
	}
	if u.FrameErrors() != 2 {
		t.Fatalf("frame errors %d, want 2", u.FrameErrors())
	}
	u.reclaimQueue(3)
	if st := u.Frames(); st != (FrameStats{Total: 16, Free: 15, User: 1}) || u.freeCount() != 15 {
		t.Fatalf("after reclaiming queue 3: %+v (free list %d)", u.Frames(), u.freeCount())
	}
	more := u.alloc(make([]uint32, 0, 100), frameTX)
	if len(more) != 15 {
		t.Fatalf("alloc of the rest got %d", len(more))
	}
	if len(u.alloc(make([]uint32, 0, 1), frameTX)) != 0 {
		t.Fatal("alloc from an empty free list")
	}

	for _, tc := range []struct {
		d  Desc
		ok bool
	}{
		{Desc{Addr: 0, Len: 2048}, true},
		{Desc{Addr: 2048 + 64, Len: 1984}, true},
		{Desc{Addr: 2048 + 64, Len: 1985}, false}, // crosses into the next frame
		{Desc{Addr: 15 * 2048, Len: 1}, true},
		{Desc{Addr: 16 * 2048, Len: 1}, false},
		{Desc{Addr: 1 << 63, Len: 1}, false},
		{Desc{Addr: 0, Len: 0}, false},
	} {
		if f := u.Frame(tc.d); (f != nil) != tc.ok {
			t.Errorf("Frame(%+v) = %d bytes, want ok=%v", tc.d, len(f), tc.ok)
		} else if f != nil && (len(f) != int(tc.d.Len) || uint64(cap(f)) != 2048-tc.d.Addr%2048) {
			t.Errorf("Frame(%+v): len %d cap %d", tc.d, len(f), cap(f))
		}
	}
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	if u.Frame(Desc{Addr: 0, Len: 1}) != nil {
		t.Fatal("Frame after Close")
	}
	if _, err := u.NewSocket(1, 0, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("NewSocket after Close: %v", err)
	}
}

// TestDrainCompletions plays the kernel on a completion ring in ordinary
// memory: drainCompletions frees the frames of the entries that name a
// frame in TX state for the queue, refuses the others (counted as frame
// errors), and returns how many it freed, which Reclaim reports. Before,
// it returned every entry it consumed, refused ones included.
func TestDrainCompletions(t *testing.T) {
	const qid = 3
	tests := []struct {
		name   string
		addrs  func(tx []uint64) []uint64 // completions, given the addresses of 4 frames in TX state
		freed  int
		errors uint64
	}{
		{"all valid", func(tx []uint64) []uint64 { return tx }, 4, 0},
		{"completed twice", func(tx []uint64) []uint64 { return append(tx[:2:2], tx[1], tx[0]) }, 2, 2},
		{"outside the UMEM", func(tx []uint64) []uint64 { return []uint64{tx[0], 16 << 11, 1 << 40, tx[3]} }, 2, 2},
		{"a free frame", func(tx []uint64) []uint64 { return []uint64{15 << 11} }, 0, 1},
		{"more than a scratch", func(tx []uint64) []uint64 {
			var a []uint64
			for range 3 {
				a = append(a, tx...)
			}
			return a
		}, 4, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, err := NewUMEM(&UMEMConfig{FrameCount: 16, FrameSize: 2048})
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			kernel, comp := fakeRing[uint64](t, 16, 1<<32-3)
			q := &queueRings{id: qid, comp: comp}
			var tx []uint64
			for _, fi := range u.alloc(make([]uint32, 0, 4), kernelState(frameTX, qid)) {
				tx = append(tx, uint64(fi)<<11)
			}
			addrs := tt.addrs(tx)
			idx, got := kernel.reserve(uint32(len(addrs)))
			if int(got) != len(addrs) {
				t.Fatalf("reserved %d of %d", got, len(addrs))
			}
			for i, a := range addrs {
				*kernel.at(idx + uint32(i)) = a
			}
			kernel.submit()
			if freed := u.drainCompletions(q, make([]uint32, 0, 5)); freed != tt.freed {
				t.Errorf("drainCompletions of %d entries: %d, want the %d frames freed", len(addrs), freed, tt.freed)
			}
			if e := u.FrameErrors(); e != tt.errors {
				t.Errorf("frame errors %d, want %d", e, tt.errors)
			}
			if fs := u.Frames(); fs.TX != 4-tt.freed || fs.Free != 12+tt.freed || u.freeCount() != fs.Free {
				t.Errorf("frames %+v (free list %d), want %d in TX", fs, u.freeCount(), 4-tt.freed)
			}
			if kernel.unconsumed() != 0 {
				t.Errorf("%d completions left on the ring", kernel.unconsumed())
			}
		})
	}
}
