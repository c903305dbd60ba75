// Package devmem is accelerator memory behind one interface, seen from both
// ends of Conspirator's path: the GPU host allocates buffers on a Device and
// exports them as Handles; the DPU imports each Handle into a Mapping and
// writes client inputs straight into it, as a DMA engine would, and reads
// results out of it.
//
// Two implementations exist: Shm (this package), memfd-backed buffers for
// the testbed and CI, in which "launching" a model runs its CPU reference on
// the buffer in place; and CUDA (subpackage cuda), device memory through the
// CUDA driver API loaded at run time (no cgo, no toolkit at build time),
// whose models are PTX kernels embedded in the binary. docs/ingest.md says
// what a BlueField's DMA engine or GPUDirect RDMA would change.
package devmem

import (
	"errors"
	"fmt"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
)

// Kind names an implementation of Device.
type Kind string

// The implementations.
const (
	KindShm  Kind = "shm"
	KindCUDA Kind = "cuda"
)

// Info describes one device.
type Info struct {
	Index int    `json:"index"`
	Kind  Kind   `json:"kind"`
	Name  string `json:"name"`           // e.g. "NVIDIA H100 80GB HBM3", or "shm"
	UUID  string `json:"uuid,omitempty"` // the driver's, if it has one
	// Card is the MIG card model (package mig's name, e.g. "H100-80GB"),
	// empty when the device is not one of them.
	Card     string `json:"card,omitempty"`
	MemBytes uint64 `json:"mem_bytes"`
	// MIG is whether MIG mode is enabled on the device.
	MIG bool `json:"mig"`
}

// Device is one accelerator's memory and launcher, on the host that owns
// it. Its methods may be called from several goroutines.
type Device interface {
	Info() Info
	// Alloc returns a buffer of at least size bytes, zeroed.
	Alloc(size int) (Buffer, error)
	// Run runs m on the first inLen bytes of in, writes its output to
	// the start of out and returns the output's length. Errors wrap
	// model.ErrBadInput when the input is not one m accepts.
	Run(m *model.Model, in Buffer, inLen int, out Buffer) (int, error)
	// Close frees the device's resources; buffers still allocated are
	// freed with it.
	Close() error
}

// Buffer is a range of device memory.
type Buffer interface {
	Size() int
	// Export returns a handle another process may import to write and
	// read the buffer. The caller owns the handle's descriptor.
	Export() (Handle, error)
	// ReadAt copies len(p) bytes from offset off into host memory.
	ReadAt(p []byte, off int) error
	// WriteAt copies p from host memory into the buffer at off (the host
	// path that Conspirator's baselines take).
	WriteAt(p []byte, off int) error
	Free() error
}

// HandleKind says how a Handle is imported.
type HandleKind string

// The handle kinds.
const (
	// HandleMemfd is a memfd to mmap (Shm).
	HandleMemfd HandleKind = "memfd"
	// HandleCUDAFD is a POSIX file descriptor exported from a cuMemCreate
	// allocation (cuMemExportToShareableHandle), imported with
	// cuMemImportFromShareableHandle and mapped with cuMemMap.
	HandleCUDAFD HandleKind = "cuda-fd"
	// HandleCUDAIPC is a legacy CUDA IPC handle (cuIpcGetMemHandle), 64
	// bytes, opened with cuIpcOpenMemHandle: the fallback where the driver
	// refuses POSIX descriptors.
	HandleCUDAIPC HandleKind = "cuda-ipc"
)

// Handle is an exported buffer. FD is -1 for kinds without a descriptor.
type Handle struct {
	Kind HandleKind `json:"kind"`
	Size int        `json:"size"`
	// Device is the exporting device's index in the exporter's process.
	Device int `json:"device"`
	// UUID is the exporting device's (Info.UUID), where it has one. CUDA
	// kinds import on the GPU with this UUID: an ordinal names another GPU
	// in a process whose CUDA_VISIBLE_DEVICES or CUDA_DEVICE_ORDER differ.
	// Without it (an older exporter) they import on ordinal Device.
	UUID string `json:"uuid,omitempty"`
	FD   int    `json:"-"`
	IPC  []byte `json:"ipc,omitempty"`
}

// Importer maps handles on the writer's side.
type Importer interface {
	Import(h Handle) (Mapping, error)
	Close() error
}

// Mapping is an imported buffer: what the DPU writes inputs into and reads
// results out of. Its methods may be called from several goroutines on
// disjoint ranges.
type Mapping interface {
	Size() int
	WriteAt(p []byte, off int) error
	ReadAt(p []byte, off int) error
	// Close unmaps the buffer; the exporter's buffer lives on.
	Close() error
}

// ErrRange is returned for an access outside a buffer or mapping.
var ErrRange = errors.New("access outside the buffer")

// CheckRange returns an error wrapping ErrRange unless [off, off+n) lies
// within size bytes.
func CheckRange(off, n, size int) error {
	if off < 0 || n < 0 || off > size || n > size-off {
		return fmt.Errorf("%w: [%d, %d) of %d bytes", ErrRange, off, off+n, size)
	}
	return nil
}
