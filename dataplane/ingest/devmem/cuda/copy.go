package cuda

import "unsafe"

// DefaultStaging is the page-locked staging buffer a device or importer
// copies through unless Options say otherwise. The driver DMAs from
// page-locked memory at full PCIe speed and from pageable memory only
// through its own bounce buffers, an order of magnitude slower (~45 vs
// ~4.5 GB/s host-to-device on the lent H100).
const DefaultStaging = 4 << 20

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
