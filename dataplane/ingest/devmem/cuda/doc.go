// Package cuda is devmem's CUDA implementation: device memory on an NVIDIA
// GPU through the CUDA driver API, loaded at run time with purego (no cgo,
// no CUDA toolkit at build time), and the built-in models as PTX kernels
// embedded in the binary and JIT-compiled by the driver.
//
// It owns everything that touches libcuda and libnvidia-ml: the GPU host
// agent's Device (allocate, export, copy, launch), the DPU-side writer's
// Importer, and the device description (name, UUID, memory, MIG mode, the
// mig package's card name). Every driver call of a Device or of one
// imported device runs on one goroutine locked to its OS thread, with the
// device's primary context current, so the exported methods are safe from
// any goroutine.
//
// Buffers are cuMemCreate allocations exported as POSIX file descriptors
// (devmem.HandleCUDAFD); where the driver refuses those, cuMemAlloc
// allocations exported as legacy CUDA IPC handles (devmem.HandleCUDAIPC).
// On a machine without the NVIDIA driver, Open and NewImporter return an
// error wrapping ErrNoDriver that says to use the shm device instead.
// docs/ingest-cuda.md says what has been verified on a GPU and what not.
package cuda
