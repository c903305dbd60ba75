package cuda

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
)

// ImporterOptions configure NewImporter.
type ImporterOptions struct {
	// Library is the driver library's file name; "" means DriverLibrary.
	Library string
	// Staging is the size of a page-locked buffer per device that
	// WriteAt and ReadAt copy through, as Options.Staging; 0 or less, the
	// default, copies straight from pageable memory.
	Staging int
	// BlockingWait, as Options.BlockingWait: sleep through the copies'
	// waits instead of the driver's default.
	BlockingWait bool
}

// Importer maps exported CUDA buffers into this process: the DPU-side
// writer on the testbed, a separate process on the GPU host. It opens a
// device's primary context, on a locked thread of its own, the first time
// a handle of that device arrives. It finds the device by the handle's
// UUID among the GPUs this process sees, not by the exporter's ordinal,
// which follows the exporter's CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER.
// Its methods, and its mappings', may be called from any goroutine.
type Importer struct {
	cu   *driver
	opts ImporterOptions

	mu     sync.Mutex
	ctxs   map[string]*importCtx // by devKey
	closed bool
}

var _ devmem.Importer = (*Importer)(nil)

// importCtx is one device's context in the importing process.
type importCtx struct {
	cu       *driver
	t        *thread
	dev      cuDevice
	ctx      cuContext
	gran     uintptr // 0 where the driver lacks the VMM calls
	stage    *stage
	mappings map[*mapping]struct{} // on the thread
}

// NewImporter loads the driver. Without an NVIDIA driver the error wraps
// ErrNoDriver and says to use the shm device.
func NewImporter(opts ImporterOptions) (*Importer, error) {
	cu, err := loadDriver(opts.Library)
	if err != nil {
		return nil, fmt.Errorf("cuda importer: %w", err)
	}
	return &Importer{cu: cu, opts: opts, ctxs: map[string]*importCtx{}}, nil
}

// Import implements devmem.Importer. It takes ownership of h.FD: the
// descriptor is closed once imported (the mapping keeps the allocation).
// A HandleCUDAFD is imported with cuMemImportFromShareableHandle and
// mapped; a HandleCUDAIPC is opened with cuIpcOpenMemHandle, which a
// process cannot do with its own handles.
func (im *Importer) Import(h devmem.Handle) (devmem.Mapping, error) {
	if h.Kind == devmem.HandleCUDAFD {
		defer unix.Close(h.FD)
	}
	if h.Kind != devmem.HandleCUDAFD && h.Kind != devmem.HandleCUDAIPC {
		if h.FD >= 0 {
			unix.Close(h.FD)
		}
		return nil, fmt.Errorf("cuda import: a %s handle: this importer maps CUDA handles only (is the host agent on another device kind?)", h.Kind)
	}
	if h.Size <= 0 {
		return nil, fmt.Errorf("cuda import: handle of %d bytes", h.Size)
	}
	if h.Kind == devmem.HandleCUDAIPC && len(h.IPC) != ipcHandleLen {
		return nil, fmt.Errorf("cuda import: IPC handle of %d bytes, want %d", len(h.IPC), ipcHandleLen)
	}
	c, err := im.context(h)
	if err != nil {
		return nil, fmt.Errorf("cuda import: %w", err)
	}
	var m *mapping
	err = c.t.do(func() error {
		var err error
		if h.Kind == devmem.HandleCUDAFD {
			m, err = c.importFD(h)
		} else {
			m, err = c.openIPC(h)
		}
		if err == nil {
			c.mappings[m] = struct{}{}
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cuda import %s handle of %d bytes on %s: %w", h.Kind, h.Size, devName(h), err)
	}
	return m, nil
}

// devKey names the device a handle imports on: its UUID, or for a handle
// without one (an older exporter) the exporter's ordinal.
func devKey(h devmem.Handle) string {
	if h.UUID != "" {
		return h.UUID
	}
	return "#" + strconv.Itoa(h.Device)
}

// devName names the device of h in messages.
func devName(h devmem.Handle) string {
	if h.UUID != "" {
		return h.UUID
	}
	return fmt.Sprintf("device %d (the exporter's ordinal: the handle has no UUID)", h.Device)
}

// context returns the context of the device h names, opening it on first
// use.
func (im *Importer) context(h devmem.Handle) (*importCtx, error) {
	im.mu.Lock()
	defer im.mu.Unlock()
	if im.closed {
		return nil, ErrClosed
	}
	key := devKey(h)
	if c := im.ctxs[key]; c != nil {
		return c, nil
	}
	c := &importCtx{cu: im.cu, mappings: map[*mapping]struct{}{}}
	t, err := startThread(func() error { return c.init(h.UUID, h.Device, im.opts.Staging, im.opts.BlockingWait) }, c.fini)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", devName(h), err)
	}
	c.t = t
	im.ctxs[key] = c
	return c, nil
}

// init opens the device with uuid, or without one the device with
// ordinal index, and makes its primary context current.
func (c *importCtx) init(uuid string, index, staging int, block bool) error {
	cu := c.cu
	if err := cu.check("cuInit", cu.cuInit(0)); err != nil {
		return err
	}
	var n int32
	if err := cu.check("cuDeviceGetCount", cu.cuDeviceGetCount(&n)); err != nil {
		return err
	}
	var err error
	if uuid != "" {
		c.dev, err = findUUID(cu, uuid, int(n))
	} else {
		err = openOrdinal(cu, &c.dev, index, int(n))
	}
	if err != nil {
		return err
	}
	if c.ctx, err = cu.retainPrimary(c.dev, block); err != nil {
		return err
	}
	if err := cu.check("cuCtxPushCurrent_v2", cu.cuCtxPushCurrent(c.ctx)); err != nil {
		cu.cuDevicePrimaryCtxRelease(c.dev)
		return err
	}
	if cu.hasVMM() {
		c.gran, err = granularity(cu, c.dev)
	}
	if err == nil {
		c.stage, err = newStage(cu, staging)
	}
	if err != nil {
		c.fini()
		return err
	}
	return nil
}

func (c *importCtx) fini() {
	for m := range c.mappings {
		m.release()
	}
	c.mappings = nil
	if c.stage != nil {
		c.stage.free(c.cu)
	}
	var ctx cuContext
	c.cu.cuCtxPopCurrent(&ctx)
	c.cu.cuDevicePrimaryCtxRelease(c.dev)
}

// importFD runs on the thread.
func (c *importCtx) importFD(h devmem.Handle) (*mapping, error) {
	cu := c.cu
	if c.gran == 0 {
		return nil, fmt.Errorf("%w: the driver lacks cuMemImportFromShareableHandle", ErrNotSupported)
	}
	span := roundUp(uintptr(h.Size), c.gran)
	var a cuMemHandle
	if err := cu.check("cuMemImportFromShareableHandle", cu.cuMemImportFromShareableHandle(&a, uintptr(h.FD), memHandleTypePOSIXFD)); err != nil {
		return nil, err
	}
	ptr, err := mapHandle(cu, a, span, c.dev)
	if err != nil {
		cu.cuMemRelease(a)
		return nil, err
	}
	return &mapping{c: c, size: h.Size, ptr: ptr, fd: true, handle: a, span: span}, nil
}

// openIPC runs on the thread.
func (c *importCtx) openIPC(h devmem.Handle) (*mapping, error) {
	var ipc ipcMemHandle
	copy(ipc.Reserved[:], h.IPC)
	var ptr cuDevPtr
	if err := c.cu.check("cuIpcOpenMemHandle_v2", c.cu.cuIpcOpenMemHandle(&ptr, ipc, ipcMemLazyEnablePeer)); err != nil {
		return nil, err
	}
	return &mapping{c: c, size: h.Size, ptr: ptr}, nil
}

// Close implements devmem.Importer: every mapping is closed and every
// context released.
func (im *Importer) Close() error {
	im.mu.Lock()
	ctxs := im.ctxs
	im.ctxs, im.closed = nil, true
	im.mu.Unlock()
	for _, c := range ctxs {
		c.t.close()
	}
	return nil
}

// mapping is an imported buffer.
type mapping struct {
	c    *importCtx
	size int
	ptr  cuDevPtr

	fd     bool
	handle cuMemHandle // fd: the imported allocation
	span   uintptr     // fd: the mapped size

	closed bool // on the thread
}

var _ devmem.Mapping = (*mapping)(nil)

func (m *mapping) Size() int { return m.size }

func (m *mapping) WriteAt(p []byte, off int) error {
	if err := devmem.CheckRange(off, len(p), m.size); err != nil {
		return err
	}
	return m.c.t.do(func() error {
		if m.closed {
			return fmt.Errorf("cuda mapping: %w", ErrClosed)
		}
		return m.c.stage.htod(m.c.cu, m.ptr+cuDevPtr(off), p)
	})
}

func (m *mapping) ReadAt(p []byte, off int) error {
	if err := devmem.CheckRange(off, len(p), m.size); err != nil {
		return err
	}
	return m.c.t.do(func() error {
		if m.closed {
			return fmt.Errorf("cuda mapping: %w", ErrClosed)
		}
		return m.c.stage.dtoh(m.c.cu, p, m.ptr+cuDevPtr(off))
	})
}

// Close implements devmem.Mapping: it unmaps the buffer and releases this
// process's reference; the exporter's buffer lives on.
func (m *mapping) Close() error {
	err := m.c.t.do(func() error {
		if m.closed {
			return nil
		}
		delete(m.c.mappings, m)
		return m.release()
	})
	if err == ErrClosed {
		return nil // the importer's Close released it
	}
	return err
}

// release runs on the thread.
func (m *mapping) release() error {
	if m.closed {
		return nil
	}
	m.closed = true
	if m.fd {
		return unmapHandle(m.c.cu, m.ptr, m.span, m.handle)
	}
	return m.c.cu.check("cuIpcCloseMemHandle", m.c.cu.cuIpcCloseMemHandle(m.ptr))
}

// openOrdinal gets the device with ordinal index of the n this process
// sees.
func openOrdinal(cu *driver, dev *cuDevice, index, n int) error {
	if index < 0 || index >= n {
		return fmt.Errorf("%w: index %d, the driver sees %d GPUs", ErrNoDevice, index, n)
	}
	return cu.check("cuDeviceGet", cu.cuDeviceGet(dev, int32(index)))
}

// findUUID returns the device whose UUID is uuid (as Info.UUID writes it)
// among the n this process sees. The error for a GPU not among them names
// the UUID, the ones seen, and CUDA_VISIBLE_DEVICES, which hides GPUs.
func findUUID(cu *driver, uuid string, n int) (cuDevice, error) {
	want, err := parseUUID(uuid)
	if err != nil {
		return 0, err
	}
	seen := make([]string, 0, n)
	for i := range n {
		var dev cuDevice
		if err := cu.check("cuDeviceGet", cu.cuDeviceGet(&dev, int32(i))); err != nil {
			return 0, err
		}
		u, s, err := deviceUUID(cu, dev)
		if err != nil {
			return 0, err
		}
		if u == want {
			return dev, nil
		}
		seen = append(seen, fmt.Sprintf("%d: %s", i, s))
	}
	env := "CUDA_VISIBLE_DEVICES is not set"
	if v, ok := os.LookupEnv("CUDA_VISIBLE_DEVICES"); ok {
		env = fmt.Sprintf("CUDA_VISIBLE_DEVICES=%q", v)
	}
	return 0, fmt.Errorf("%w: no GPU with UUID %s among the %d this process sees [%s] (%s): the exporter's GPU is hidden from this process; check CUDA_VISIBLE_DEVICES of this process, which must include that GPU (by index or by UUID)",
		ErrNoDevice, uuid, n, strings.Join(seen, ", "), env)
}
