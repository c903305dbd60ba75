package cuda

import "unsafe"

// StagingSize is a staging buffer's size that suits ReadAt and WriteAt,
// for Options.Staging. Copies go straight from pageable memory unless a
// staging buffer is asked for: on the lent H100 (2026-11-25,
// TestGPUBandwidth) staging through page-locked memory one chunk at a time
// was no faster at 64 KiB and 1 MiB (1.7 and 7.5-8.7 GB/s host to device
// either way) and slower at 64 MiB (6-8 against 8-10 GB/s; 6-8 against
// 12-15 back), since the memmove into the staging buffer and the DMA
// from it take turns, while the driver overlaps its own bounce buffers'
// copies. The DMA from page-locked memory alone ran at 20-21 GB/s at 1 MiB.
const StagingSize = 4 << 20

// stageMin is the copy size from which the staging buffer is used;
// below it one pageable cuMemcpy costs less than the extra memmove.
const stageMin = 64 << 10

// stage is page-locked host memory (cuMemHostAlloc) through which large
// copies go. It belongs to one thread: only that thread's closures use it.
type stage struct {
	buf []byte
}

// newStage allocates size bytes of page-locked memory; size ≤ 0 returns
// an empty stage (every copy straight from pageable memory).
func newStage(cu *driver, size int) (*stage, error) {
	if size <= 0 {
		return &stage{}, nil
	}
	var p unsafe.Pointer
	if err := cu.check("cuMemHostAlloc", cu.cuMemHostAlloc(&p, uintptr(size), memHostAllocPortable)); err != nil {
		return nil, err
	}
	return &stage{buf: unsafe.Slice((*byte)(p), size)}, nil
}

func (s *stage) free(cu *driver) {
	if len(s.buf) > 0 {
		cu.cuMemFreeHost(unsafe.Pointer(&s.buf[0]))
		s.buf = nil
	}
}

// htod copies src to device address dst.
func (s *stage) htod(cu *driver, dst cuDevPtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	if len(src) < stageMin || len(s.buf) == 0 {
		if err := cu.check("cuMemcpyHtoD_v2", cu.cuMemcpyHtoD(dst, unsafe.Pointer(&src[0]), uintptr(len(src)))); err != nil {
			return err
		}
		// From pageable memory the copy returns once the driver has the
		// bytes in its staging memory, before the DMA lands ("API
		// synchronization behavior"); another process (the GPU host's
		// kernel) must not read the buffer before it does. From pinned
		// memory, below, the copy is synchronous.
		return cu.check("cuCtxSynchronize", cu.cuCtxSynchronize())
	}
	for len(src) > 0 {
		n := copy(s.buf, src)
		if err := cu.check("cuMemcpyHtoD_v2", cu.cuMemcpyHtoD(dst, unsafe.Pointer(&s.buf[0]), uintptr(n))); err != nil {
			return err
		}
		dst += cuDevPtr(n)
		src = src[n:]
	}
	return nil
}

// dtoh copies len(dst) bytes from device address src into dst.
func (s *stage) dtoh(cu *driver, dst []byte, src cuDevPtr) error {
	if len(dst) == 0 {
		return nil
	}
	if len(dst) < stageMin || len(s.buf) == 0 {
		return cu.check("cuMemcpyDtoH_v2", cu.cuMemcpyDtoH(unsafe.Pointer(&dst[0]), src, uintptr(len(dst))))
	}
	for len(dst) > 0 {
		n := min(len(dst), len(s.buf))
		if err := cu.check("cuMemcpyDtoH_v2", cu.cuMemcpyDtoH(unsafe.Pointer(&s.buf[0]), src, uintptr(n))); err != nil {
			return err
		}
		copy(dst, s.buf[:n])
		src += cuDevPtr(n)
		dst = dst[n:]
	}
	return nil
}
