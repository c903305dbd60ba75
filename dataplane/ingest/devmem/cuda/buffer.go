package cuda

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
)

// buffer is device memory of one Device: a cuMemCreate allocation mapped
// at ptr (fd true) or a cuMemAlloc one.
type buffer struct {
	d    *Device
	size int
	ptr  cuDevPtr

	fd     bool
	handle cuMemHandle // fd: the allocation
	span   uintptr     // fd: the mapped size, size rounded to the granularity

	freed bool // on the thread
}

var _ devmem.Buffer = (*buffer)(nil)

// Alloc implements devmem.Device. It makes a cuMemCreate allocation that
// can be exported as a POSIX descriptor; where the driver refuses one
// (ErrNotSupported), it falls back to cuMemAlloc and legacy IPC handles
// for this and every later buffer (ExportKind says which and why).
func (d *Device) Alloc(size int) (devmem.Buffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("cuda alloc: size %d: want a positive size", size)
	}
	var b *buffer
	err := d.t.do(func() error {
		var err error
		if d.fd {
			b, err = d.allocFD(size)
			if err == nil || !errors.Is(err, ErrNotSupported) {
				return err
			}
			d.fd, d.noFD = false, err.Error()
		}
		b, err = d.allocLegacy(size)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cuda alloc %d bytes on device %d: %w", size, d.info.Index, err)
	}
	return b, nil
}

// allocFD runs on the thread.
func (d *Device) allocFD(size int) (*buffer, error) {
	cu := d.cu
	span := roundUp(uintptr(size), d.gran)
	prop := fdProp(d.dev)
	var h cuMemHandle
	if err := cu.check("cuMemCreate", cu.cuMemCreate(&h, span, &prop, 0)); err != nil {
		return nil, err
	}
	ptr, err := mapHandle(cu, h, span, d.dev)
	if err != nil {
		cu.cuMemRelease(h)
		return nil, err
	}
	b := &buffer{d: d, size: size, ptr: ptr, fd: true, handle: h, span: span}
	return b, d.zero(b)
}

// allocLegacy runs on the thread.
func (d *Device) allocLegacy(size int) (*buffer, error) {
	var ptr cuDevPtr
	if err := d.cu.check("cuMemAlloc_v2", d.cu.cuMemAlloc(&ptr, uintptr(size))); err != nil {
		return nil, err
	}
	b := &buffer{d: d, size: size, ptr: ptr}
	return b, d.zero(b)
}

// zero clears a new buffer and records it, or releases it.
func (d *Device) zero(b *buffer) error {
	// A memset is asynchronous to the host; the buffer may be exported
	// to another process right after, whose writes must come after it.
	if err := d.cu.check("cuMemsetD8_v2", d.cu.cuMemsetD8(b.ptr, 0, uintptr(b.size))); err != nil {
		b.release()
		return err
	}
	if err := d.cu.check("cuCtxSynchronize", d.cu.cuCtxSynchronize()); err != nil {
		b.release()
		return err
	}
	d.buffers[b] = struct{}{}
	return nil
}

func (b *buffer) Size() int { return b.size }

// Export implements devmem.Buffer: a POSIX descriptor (HandleCUDAFD,
// close-on-exec, the caller's to close or pass on) or a legacy IPC handle
// (HandleCUDAIPC, which another process opens; not this one).
func (b *buffer) Export() (devmem.Handle, error) {
	h := devmem.Handle{Size: b.size, Device: b.d.info.Index, UUID: b.d.info.UUID, FD: -1}
	err := b.d.t.do(func() error {
		if err := b.live(); err != nil {
			return err
		}
		cu := b.d.cu
		if b.fd {
			var fd int32
			if err := cu.check("cuMemExportToShareableHandle", cu.cuMemExportToShareableHandle(&fd, b.handle, memHandleTypePOSIXFD, 0)); err != nil {
				return err
			}
			unix.CloseOnExec(int(fd))
			h.Kind, h.FD = devmem.HandleCUDAFD, int(fd)
			return nil
		}
		var ipc ipcMemHandle
		if err := cu.check("cuIpcGetMemHandle", cu.cuIpcGetMemHandle(&ipc, b.ptr)); err != nil {
			return err
		}
		h.Kind, h.IPC = devmem.HandleCUDAIPC, append([]byte(nil), ipc.Reserved[:]...)
		return nil
	})
	if err != nil {
		return devmem.Handle{}, fmt.Errorf("export cuda buffer: %w", err)
	}
	return h, nil
}

func (b *buffer) ReadAt(p []byte, off int) error {
	if err := devmem.CheckRange(off, len(p), b.size); err != nil {
		return err
	}
	return b.d.t.do(func() error {
		if err := b.live(); err != nil {
			return err
		}
		return b.d.stage.dtoh(b.d.cu, p, b.ptr+cuDevPtr(off))
	})
}

func (b *buffer) WriteAt(p []byte, off int) error {
	if err := devmem.CheckRange(off, len(p), b.size); err != nil {
		return err
	}
	return b.d.t.do(func() error {
		if err := b.live(); err != nil {
			return err
		}
		return b.d.stage.htod(b.d.cu, b.ptr+cuDevPtr(off), p)
	})
}

// Free implements devmem.Buffer. Other processes' mappings of an exported
// descriptor keep the memory until they close them.
func (b *buffer) Free() error {
	return b.d.t.do(func() error {
		if err := b.live(); err != nil {
			return err
		}
		delete(b.d.buffers, b)
		return b.release()
	})
}

// live runs on the thread.
func (b *buffer) live() error {
	if b.freed {
		return fmt.Errorf("cuda buffer: %w: freed", ErrClosed)
	}
	return nil
}

// release runs on the thread.
func (b *buffer) release() error {
	if b.freed {
		return nil
	}
	b.freed = true
	cu := b.d.cu
	if b.fd {
		return unmapHandle(cu, b.ptr, b.span, b.handle)
	}
	return cu.check("cuMemFree_v2", cu.cuMemFree(b.ptr))
}
