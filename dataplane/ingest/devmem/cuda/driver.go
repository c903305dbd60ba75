package cuda

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// DriverLibrary is the file name of the CUDA driver library Open loads
// unless told otherwise.
const DriverLibrary = "libcuda.so.1"

// ErrNoDriver is wrapped by errors about a driver library that cannot be
// loaded: the machine has no NVIDIA driver (use devmem.KindShm there).
var ErrNoDriver = errors.New("no CUDA driver")

// The driver API's handle types, as the C headers declare them on 64-bit
// Linux.
type (
	cuResult    int32
	cuDevice    int32
	cuContext   uintptr
	cuDevPtr    uint64 // CUdeviceptr: unsigned long long
	cuModule    uintptr
	cuFunction  uintptr
	cuStream    uintptr
	cuMemHandle uint64 // CUmemGenericAllocationHandle
)

// ipcMemHandle is CUipcMemHandle, passed by value to cuIpcOpenMemHandle
// (purego passes structs by value on linux/amd64 and linux/arm64).
type ipcMemHandle struct{ Reserved [ipcHandleLen]byte }

const ipcHandleLen = 64

// allocProp is CUmemAllocationProp (32 bytes; layout unchanged since CUDA
// 11.0).
type allocProp struct {
	Type                 uint32 // CUmemAllocationType
	RequestedHandleTypes uint32 // CUmemAllocationHandleType
	LocationType         uint32 // CUmemLocation.type
	LocationID           int32  // CUmemLocation.id
	Win32HandleMetaData  uintptr
	CompressionType      uint8
	GPUDirectRDMACapable uint8
	Usage                uint16
	Reserved             [4]uint8
}

// accessDesc is CUmemAccessDesc (12 bytes).
type accessDesc struct {
	LocationType uint32
	LocationID   int32
	Flags        uint32
}

// Constants of the driver API's enums that this package uses.
const (
	cuSuccess = 0

	ctxSchedAuto         = 0x0 // CU_CTX_SCHED_AUTO
	ctxSchedBlockingSync = 0x4 // CU_CTX_SCHED_BLOCKING_SYNC
	ctxSchedMask         = 0x7 // CU_CTX_SCHED_MASK

	errPrimaryContextActive = 708 // CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE

	attrMultiprocessorCount = 16  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
	attrComputeMajor        = 75  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
	attrComputeMinor        = 76  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
	attrVMM                 = 102 // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
	attrPOSIXFD             = 103 // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED

	memAllocationTypePinned  = 1 // CU_MEM_ALLOCATION_TYPE_PINNED
	memHandleTypePOSIXFD     = 1 // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
	memLocationTypeDevice    = 1 // CU_MEM_LOCATION_TYPE_DEVICE
	memAccessProtReadWrite   = 3 // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
	memGranularityMinimum    = 0 // CU_MEM_ALLOC_GRANULARITY_MINIMUM
	ipcMemLazyEnablePeer     = 1 // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
	memHostAllocPortable     = 1 // CU_MEMHOSTALLOC_PORTABLE
	jitErrorLogBuffer        = 5 // CU_JIT_ERROR_LOG_BUFFER
	jitErrorLogBufferSize    = 6 // CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
	jitInfoLogBuffer         = 3 // CU_JIT_INFO_LOG_BUFFER
	jitInfoLogBufferSize     = 4 // CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES
	errNotSupportedCode      = 801
	errNotPermittedCode      = 800
	errNoDeviceCode          = 100
	errInvalidContextCode    = 201
	errUnsupportedPTXVersion = 222
)

// driver is one loaded libcuda: a function per driver API entry point this
// package calls. Fields of the virtual memory management calls are nil on
// a driver too old to export them (the IPC fallback then applies).
type driver struct {
	lib uintptr

	cuInit                    func(flags uint32) cuResult
	cuDriverGetVersion        func(v *int32) cuResult
	cuGetErrorName            func(r cuResult, s **byte) cuResult
	cuGetErrorString          func(r cuResult, s **byte) cuResult
	cuDeviceGetCount          func(n *int32) cuResult
	cuDeviceGet               func(d *cuDevice, ordinal int32) cuResult
	cuDeviceGetName           func(name *byte, n int32, d cuDevice) cuResult
	cuDeviceGetUuid           func(uuid *[16]byte, d cuDevice) cuResult
	cuDeviceGetPCIBusId       func(id *byte, n int32, d cuDevice) cuResult
	cuDeviceTotalMem          func(bytes *uintptr, d cuDevice) cuResult
	cuDeviceGetAttribute      func(v *int32, attr int32, d cuDevice) cuResult
	cuDevicePrimaryCtxRetain  func(ctx *cuContext, d cuDevice) cuResult
	cuDevicePrimaryCtxRelease func(d cuDevice) cuResult
	// Optional: without it the context keeps the driver's default
	// scheduling (spin while there are fewer active contexts than CPUs).
	cuDevicePrimaryCtxSetFlags func(d cuDevice, flags uint32) cuResult
	// Optional; the GPU tests read the flags back with it.
	cuDevicePrimaryCtxGetState func(d cuDevice, flags *uint32, active *int32) cuResult
	cuCtxPushCurrent           func(ctx cuContext) cuResult
	cuCtxPopCurrent            func(ctx *cuContext) cuResult
	cuCtxSynchronize           func() cuResult

	cuMemAlloc     func(p *cuDevPtr, size uintptr) cuResult
	cuMemFree      func(p cuDevPtr) cuResult
	cuMemsetD8     func(p cuDevPtr, v uint8, n uintptr) cuResult
	cuMemcpyHtoD   func(dst cuDevPtr, src unsafe.Pointer, n uintptr) cuResult
	cuMemcpyDtoH   func(dst unsafe.Pointer, src cuDevPtr, n uintptr) cuResult
	cuMemHostAlloc func(p *unsafe.Pointer, n uintptr, flags uint32) cuResult
	cuMemFreeHost  func(p unsafe.Pointer) cuResult

	cuIpcGetMemHandle   func(h *ipcMemHandle, p cuDevPtr) cuResult
	cuIpcOpenMemHandle  func(p *cuDevPtr, h ipcMemHandle, flags uint32) cuResult
	cuIpcCloseMemHandle func(p cuDevPtr) cuResult

	cuModuleLoadDataEx  func(m *cuModule, image *byte, n uint32, opts *int32, vals *uintptr) cuResult
	cuModuleUnload      func(m cuModule) cuResult
	cuModuleGetFunction func(f *cuFunction, m cuModule, name string) cuResult
	cuLaunchKernel      func(f cuFunction, gx, gy, gz, bx, by, bz, shared uint32, s cuStream, params *unsafe.Pointer, extra *unsafe.Pointer) cuResult

	cuMemGetAllocationGranularity  func(g *uintptr, prop *allocProp, option int32) cuResult
	cuMemCreate                    func(h *cuMemHandle, size uintptr, prop *allocProp, flags uint64) cuResult
	cuMemRelease                   func(h cuMemHandle) cuResult
	cuMemAddressReserve            func(p *cuDevPtr, size, align uintptr, addr cuDevPtr, flags uint64) cuResult
	cuMemAddressFree               func(p cuDevPtr, size uintptr) cuResult
	cuMemMap                       func(p cuDevPtr, size, offset uintptr, h cuMemHandle, flags uint64) cuResult
	cuMemUnmap                     func(p cuDevPtr, size uintptr) cuResult
	cuMemSetAccess                 func(p cuDevPtr, size uintptr, desc *accessDesc, count uintptr) cuResult
	cuMemExportToShareableHandle   func(out *int32, h cuMemHandle, kind int32, flags uint64) cuResult
	cuMemImportFromShareableHandle func(h *cuMemHandle, osHandle uintptr, kind int32) cuResult
}

// symbol binds one function field to the first of names the library
// exports (the versioned name first: cuMemAlloc_v2 is the 64-bit-size
// entry point, plain cuMemAlloc the legacy 32-bit one).
type symbol struct {
	fptr     any
	names    []string
	optional bool
}

func (d *driver) symbols() []symbol {
	req := func(fptr any, names ...string) symbol { return symbol{fptr: fptr, names: names} }
	opt := func(fptr any, names ...string) symbol { return symbol{fptr: fptr, names: names, optional: true} }
	return []symbol{
		req(&d.cuInit, "cuInit"),
		req(&d.cuDriverGetVersion, "cuDriverGetVersion"),
		req(&d.cuGetErrorName, "cuGetErrorName"),
		req(&d.cuGetErrorString, "cuGetErrorString"),
		req(&d.cuDeviceGetCount, "cuDeviceGetCount"),
		req(&d.cuDeviceGet, "cuDeviceGet"),
		req(&d.cuDeviceGetName, "cuDeviceGetName"),
		req(&d.cuDeviceGetUuid, "cuDeviceGetUuid_v2", "cuDeviceGetUuid"),
		opt(&d.cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId"),
		req(&d.cuDeviceTotalMem, "cuDeviceTotalMem_v2"),
		req(&d.cuDeviceGetAttribute, "cuDeviceGetAttribute"),
		req(&d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
		req(&d.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"),
		opt(&d.cuDevicePrimaryCtxSetFlags, "cuDevicePrimaryCtxSetFlags_v2", "cuDevicePrimaryCtxSetFlags"),
		opt(&d.cuDevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState"),
		req(&d.cuCtxPushCurrent, "cuCtxPushCurrent_v2"),
		req(&d.cuCtxPopCurrent, "cuCtxPopCurrent_v2"),
		req(&d.cuCtxSynchronize, "cuCtxSynchronize"),
		req(&d.cuMemAlloc, "cuMemAlloc_v2"),
		req(&d.cuMemFree, "cuMemFree_v2"),
		req(&d.cuMemsetD8, "cuMemsetD8_v2"),
		req(&d.cuMemcpyHtoD, "cuMemcpyHtoD_v2"),
		req(&d.cuMemcpyDtoH, "cuMemcpyDtoH_v2"),
		req(&d.cuMemHostAlloc, "cuMemHostAlloc"),
		req(&d.cuMemFreeHost, "cuMemFreeHost"),
		req(&d.cuIpcGetMemHandle, "cuIpcGetMemHandle"),
		req(&d.cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"),
		req(&d.cuIpcCloseMemHandle, "cuIpcCloseMemHandle"),
		req(&d.cuModuleLoadDataEx, "cuModuleLoadDataEx"),
		req(&d.cuModuleUnload, "cuModuleUnload"),
		req(&d.cuModuleGetFunction, "cuModuleGetFunction"),
		req(&d.cuLaunchKernel, "cuLaunchKernel"),
		opt(&d.cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity"),
		opt(&d.cuMemCreate, "cuMemCreate"),
		opt(&d.cuMemRelease, "cuMemRelease"),
		opt(&d.cuMemAddressReserve, "cuMemAddressReserve"),
		opt(&d.cuMemAddressFree, "cuMemAddressFree"),
		opt(&d.cuMemMap, "cuMemMap"),
		opt(&d.cuMemUnmap, "cuMemUnmap"),
		opt(&d.cuMemSetAccess, "cuMemSetAccess"),
		opt(&d.cuMemExportToShareableHandle, "cuMemExportToShareableHandle"),
		opt(&d.cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle"),
	}
}

// retainPrimary retains dev's primary context after setting how a thread
// waits for the GPU in it (a kernel, a synchronous copy): the driver's
// default (CU_CTX_SCHED_AUTO: spin while the process has fewer active
// contexts than the machine has CPUs), or, if block, sleeping until the
// GPU's interrupt wakes it (CU_CTX_SCHED_BLOCKING_SYNC). The flags are set
// either way, since they outlive the context: a context made after one
// that blocked would block too. A context that another user in this
// process made active keeps its flags (older drivers refuse to change
// them then); a driver without the call keeps its default.
func (d *driver) retainPrimary(dev cuDevice, block bool) (cuContext, error) {
	if d.cuDevicePrimaryCtxSetFlags != nil {
		flags := uint32(ctxSchedAuto)
		if block {
			flags = ctxSchedBlockingSync
		}
		if r := d.cuDevicePrimaryCtxSetFlags(dev, flags); r != cuSuccess && r != errPrimaryContextActive {
			return 0, d.check("cuDevicePrimaryCtxSetFlags_v2", r)
		}
	}
	var ctx cuContext
	if err := d.check("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(&ctx, dev)); err != nil {
		return 0, err
	}
	return ctx, nil
}

// hasVMM reports whether the driver exports every call that cuMemCreate
// allocations with POSIX descriptors need.
func (d *driver) hasVMM() bool {
	return d.cuMemGetAllocationGranularity != nil && d.cuMemCreate != nil && d.cuMemRelease != nil &&
		d.cuMemAddressReserve != nil && d.cuMemAddressFree != nil && d.cuMemMap != nil &&
		d.cuMemUnmap != nil && d.cuMemSetAccess != nil && d.cuMemExportToShareableHandle != nil &&
		d.cuMemImportFromShareableHandle != nil
}

// loadDriver opens the driver library at path ("" for DriverLibrary) and
// binds its functions. It does not call cuInit.
func loadDriver(path string) (*driver, error) {
	if path == "" {
		path = DriverLibrary
	}
	lib, err := openLibrary(path, "no NVIDIA driver on this machine; use device kind shm")
	if err != nil {
		return nil, err
	}
	d := &driver{lib: lib}
	if err := bind(lib, path, d.symbols()); err != nil {
		purego.Dlclose(lib)
		return nil, fmt.Errorf("%w: %v: the driver is too old (want CUDA 11.4 or later)", ErrNoDriver, err)
	}
	return d, nil
}

// openLibrary dlopens path; a failure wraps ErrNoDriver and carries hint.
func openLibrary(path, hint string) (uintptr, error) {
	lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		// dlerror's text is process-wide and may be empty or another
		// call's, so whether the file is there is asked of the file
		// system where the path names one.
		missing := strings.Contains(err.Error(), "No such file")
		if strings.Contains(path, "/") {
			_, serr := os.Stat(path)
			missing = errors.Is(serr, os.ErrNotExist)
		}
		if missing || err.Error() == "" {
			return 0, fmt.Errorf("%w: %s not found: %s (dlopen: %v)", ErrNoDriver, path, hint, err)
		}
		return 0, fmt.Errorf("%w: cannot load %s: %v (%s)", ErrNoDriver, path, err, hint)
	}
	return lib, nil
}

// bind resolves each symbol and registers it with purego.
func bind(lib uintptr, path string, syms []symbol) error {
	for _, s := range syms {
		var addr uintptr
		for _, name := range s.names {
			if a, err := purego.Dlsym(lib, name); err == nil && a != 0 {
				addr = a
				break
			}
		}
		if addr == 0 {
			if s.optional {
				continue
			}
			return fmt.Errorf("%s lacks %s", path, strings.Join(s.names, " or "))
		}
		purego.RegisterFunc(s.fptr, addr)
	}
	return nil
}

// goString copies the NUL-terminated C string at p.
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}
