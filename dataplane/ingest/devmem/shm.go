package devmem

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
)

// Shm is a device of shared memory: each buffer is a memfd mapped into the
// host agent, exported as the memfd itself. The DPU-side process maps the
// same pages (ShmImporter) and writes into them, as a DMA engine writes into
// device memory; Run runs the model's CPU reference on the bytes in place.
// It stands in for a GPU on the testbed and in CI.
type Shm struct {
	info Info
	exec *executorConn // nil: models run in this process
	ids  uint32

	mu      sync.Mutex
	buffers map[*shmBuffer]struct{}
	closed  bool
}

// NewShm returns a shared-memory device described by info (Kind is set to
// KindShm; Name defaults to "shm").
func NewShm(info Info) *Shm {
	return NewShmWith(info, ShmOptions{})
}

// ShmOptions configure a shared-memory device.
type ShmOptions struct {
	// Executor is the unix socket of an executor process (ServeExecutor)
	// that runs the models, as a GPU's engines would, off the CPU of the
	// process that calls Run. "": Run computes in the caller.
	Executor string
}

// NewShmWith returns a shared-memory device with options.
func NewShmWith(info Info, opts ShmOptions) *Shm {
	info.Kind = KindShm
	if info.Name == "" {
		info.Name = "shm"
	}
	d := &Shm{info: info, buffers: map[*shmBuffer]struct{}{}}
	if opts.Executor != "" {
		d.exec = &executorConn{path: opts.Executor}
	}
	return d
}

// Info implements Device.
func (d *Shm) Info() Info { return d.info }

// Alloc implements Device.
func (d *Shm) Alloc(size int) (Buffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("shm alloc: size %d: want a positive size", size)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("shm alloc: device closed")
	}
	fd, err := unix.MemfdCreate(fmt.Sprintf("lovelock-ingest-%d", d.info.Index), unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("shm alloc: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm alloc: size memfd to %d bytes: %w", size, err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm alloc: mmap %d bytes: %w", size, err)
	}
	d.ids++
	b := &shmBuffer{dev: d, fd: fd, mem: mem, id: d.ids}
	d.buffers[b] = struct{}{}
	return b, nil
}

// Run implements Device: the model's CPU reference, on the buffers' own
// pages, without a copy.
func (d *Shm) Run(m *model.Model, in Buffer, inLen int, out Buffer) (int, error) {
	ib, ob, err := checkRun(m, in, inLen, out)
	if err != nil {
		return 0, err
	}
	if d.exec != nil {
		return d.exec.run(m, ib, ob, inLen)
	}
	return m.Reference(ib.mem[:inLen], ob.mem), nil
}

// checkRun checks Run's arguments.
func checkRun(m *model.Model, in Buffer, inLen int, out Buffer) (*shmBuffer, *shmBuffer, error) {
	ib, ok1 := in.(*shmBuffer)
	ob, ok2 := out.(*shmBuffer)
	if !ok1 || !ok2 {
		return nil, nil, fmt.Errorf("shm run: buffers of another device")
	}
	if m.Reference == nil {
		return nil, nil, fmt.Errorf("shm run: model %s has no built-in implementation", m.Name)
	}
	if err := CheckRange(0, inLen, len(ib.mem)); err != nil {
		return nil, nil, fmt.Errorf("shm run %s: input: %w", m.Name, err)
	}
	if err := m.Check(inLen); err != nil {
		return nil, nil, err
	}
	if n := m.OutputSize(inLen); n > len(ob.mem) {
		return nil, nil, fmt.Errorf("shm run %s: output of %d bytes does not fit the %d-byte output buffer", m.Name, n, len(ob.mem))
	}
	return ib, ob, nil
}

// newQueue implements queuer: with an executor, launches go to it on a
// connection of their own and come back batched; without one, nil (the
// Launcher runs them in goroutines of this process).
func (d *Shm) newQueue(done func([]Completion)) launchQueue {
	if d.exec == nil {
		return nil
	}
	return &execQueue{path: d.exec.path, done: done}
}

// Close implements Device.
func (d *Shm) Close() error {
	d.mu.Lock()
	bufs := d.buffers
	d.buffers, d.closed = nil, true
	d.mu.Unlock()
	if d.exec != nil {
		d.exec.close()
	}
	for b := range bufs {
		b.release()
	}
	return nil
}

type shmBuffer struct {
	dev  *Shm
	id   uint32 // the executor's name for it
	fd   int
	mem  []byte
	once sync.Once
}

func (b *shmBuffer) Size() int { return len(b.mem) }

// Bytes returns the buffer's pages (shared-memory buffers only): what a
// user's model reads in place.
func (b *shmBuffer) Bytes() []byte { return b.mem }

func (b *shmBuffer) Export() (Handle, error) {
	fd, err := unix.FcntlInt(uintptr(b.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return Handle{}, fmt.Errorf("export shm buffer: dup memfd: %w", err)
	}
	return Handle{Kind: HandleMemfd, Size: len(b.mem), Device: b.dev.info.Index, FD: fd}, nil
}

func (b *shmBuffer) ReadAt(p []byte, off int) error {
	if err := CheckRange(off, len(p), len(b.mem)); err != nil {
		return err
	}
	copy(p, b.mem[off:])
	return nil
}

func (b *shmBuffer) WriteAt(p []byte, off int) error {
	if err := CheckRange(off, len(p), len(b.mem)); err != nil {
		return err
	}
	copy(b.mem[off:], p)
	return nil
}

func (b *shmBuffer) Free() error {
	b.dev.mu.Lock()
	delete(b.dev.buffers, b)
	b.dev.mu.Unlock()
	b.release()
	return nil
}

func (b *shmBuffer) release() {
	b.once.Do(func() {
		unix.Munmap(b.mem)
		unix.Close(b.fd)
	})
}

// HostBytes returns the pages of a shared-memory buffer, for code that
// hands them to a model in place (the external-model hand-off), or false
// for a buffer of another device.
func HostBytes(b Buffer) ([]byte, bool) {
	sb, ok := b.(*shmBuffer)
	if !ok {
		return nil, false
	}
	return sb.mem, true
}

// ShmImporter maps memfd handles.
type ShmImporter struct{}

// Import implements Importer. It takes ownership of h.FD: the descriptor is
// closed once mapped (the mapping keeps the pages).
func (ShmImporter) Import(h Handle) (Mapping, error) {
	if h.Kind != HandleMemfd {
		unix.Close(h.FD)
		return nil, fmt.Errorf("shm import: a %s handle: this importer maps memfds only (is the host agent on another device kind?)", h.Kind)
	}
	defer unix.Close(h.FD)
	var st unix.Stat_t
	if err := unix.Fstat(h.FD, &st); err != nil {
		return nil, fmt.Errorf("shm import: fstat: %w", err)
	}
	if st.Size < int64(h.Size) || h.Size <= 0 {
		return nil, fmt.Errorf("shm import: memfd of %d bytes, handle says %d", st.Size, h.Size)
	}
	mem, err := unix.Mmap(h.FD, 0, h.Size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shm import: mmap %d bytes: %w", h.Size, err)
	}
	return &shmMapping{mem: mem}, nil
}

// Close implements Importer.
func (ShmImporter) Close() error { return nil }

type shmMapping struct {
	mem  []byte
	once sync.Once
}

func (m *shmMapping) Size() int { return len(m.mem) }

func (m *shmMapping) WriteAt(p []byte, off int) error {
	if err := CheckRange(off, len(p), len(m.mem)); err != nil {
		return err
	}
	copy(m.mem[off:], p)
	return nil
}

func (m *shmMapping) ReadAt(p []byte, off int) error {
	if err := CheckRange(off, len(p), len(m.mem)); err != nil {
		return err
	}
	copy(p, m.mem[off:])
	return nil
}

func (m *shmMapping) Close() error {
	m.once.Do(func() { unix.Munmap(m.mem) })
	return nil
}
