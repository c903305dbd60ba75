package cuda

import (
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
)

// Options configure Open.
type Options struct {
	// Index is the CUDA device ordinal.
	Index int
	// Library is the driver library's file name; "" means DriverLibrary.
	Library string
	// NVML is NVML's file name; "" means NVMLLibrary. NVML is optional:
	// without it Info says MIG false and GPUInstances fails.
	NVML string
	// LegacyIPC makes Alloc use cuMemAlloc and export legacy CUDA IPC
	// handles, as on a driver that refuses POSIX descriptors: the fallback
	// path, on demand.
	LegacyIPC bool
	// Staging is the size in bytes of a page-locked buffer that ReadAt
	// and WriteAt of 64 KiB or more copy through (StagingSize suits); 0
	// or less, the default, copies straight from pageable memory, which
	// measured as fast or faster (StagingSize's comment).
	Staging int
	// BlockingWait makes the device's thread sleep while it waits for the
	// GPU (Run's kernel, a copy) until the driver's interrupt wakes it
	// (CU_CTX_SCHED_BLOCKING_SYNC), instead of the driver's default, which
	// spins while the process has fewer contexts than the machine has
	// CPUs. It pays for long waits only: on the lent H100 (TestGPURunCost,
	// 2026-11-25) a checksum run, about 40 µs, cost 44-49 µs of CPU
	// spinning and 73-93 µs blocking; the MLP kernel of before, whose runs
	// took 180-680 µs, cost its whole length spinning and 86-97 µs
	// blocking. Every built-in run now takes under 100 µs alone, so
	// spinning, the default, costs less; blocking is for models that run
	// long, or a GPU shared with other processes (docs/ingest-bench.md).
	// It applies to the GPU's primary context, which every user in this
	// process shares; the first to make it active sets it.
	BlockingWait bool
}

// Device is one GPU, implementing devmem.Device. Its methods may be called
// from any goroutine; all its driver calls run on its own locked thread.
type Device struct {
	cu    *driver
	nv    *nvml      // nil without NVML
	gpu   nvmlDevice // the whole GPU in NVML, when nv is not nil
	t     *thread
	info  devmem.Info
	busID string // PCI bus ID, to find the GPU in NVML when its UUID does not
	opts  Options

	// Set at open on the thread and read-only after.
	dev  cuDevice
	ctx  cuContext
	gran uintptr
	sms  int

	// Touched only on the thread.
	fd      bool   // allocate with cuMemCreate and export POSIX descriptors
	noFD    string // why not, when !fd
	stage   *stage
	kernels *kernels
	buffers map[*buffer]struct{}
}

var _ devmem.Device = (*Device)(nil)

// Open loads the driver, makes device opts.Index's primary context
// current on a new locked thread, loads the kernels and copies the MLP's
// weights to the device. Without an NVIDIA driver the error wraps
// ErrNoDriver and says to use the shm device; with no such GPU it wraps
// ErrNoDevice.
func Open(opts Options) (*Device, error) {
	cu, err := loadDriver(opts.Library)
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	d := &Device{cu: cu, opts: opts, buffers: map[*buffer]struct{}{}}
	d.t, err = startThread(d.init, d.fini)
	if err != nil {
		return nil, fmt.Errorf("cuda: device %d: %w", opts.Index, err)
	}
	d.describeMIG()
	return d, nil
}

// init runs first on the thread: it leaves the context current, or
// undoes everything and fails.
func (d *Device) init() error {
	cu := d.cu
	if err := cu.check("cuInit", cu.cuInit(0)); err != nil {
		return err
	}
	var n int32
	if err := cu.check("cuDeviceGetCount", cu.cuDeviceGetCount(&n)); err != nil {
		return err
	}
	if d.opts.Index < 0 || d.opts.Index >= int(n) {
		return fmt.Errorf("%w: index %d, the driver sees %d GPUs", ErrNoDevice, d.opts.Index, n)
	}
	if err := cu.check("cuDeviceGet", cu.cuDeviceGet(&d.dev, int32(d.opts.Index))); err != nil {
		return err
	}
	var err error
	if d.ctx, err = cu.retainPrimary(d.dev, d.opts.BlockingWait); err != nil {
		return err
	}
	if err := cu.check("cuCtxPushCurrent_v2", cu.cuCtxPushCurrent(d.ctx)); err != nil {
		cu.cuDevicePrimaryCtxRelease(d.dev)
		return err
	}
	if err := d.setup(); err != nil {
		d.fini()
		return err
	}
	return nil
}

// setup describes the device and allocates what every Run needs.
func (d *Device) setup() error {
	cu := d.cu
	var name [256]byte
	if err := cu.check("cuDeviceGetName", cu.cuDeviceGetName(&name[0], int32(len(name)), d.dev)); err != nil {
		return err
	}
	var mem uintptr
	if err := cu.check("cuDeviceTotalMem_v2", cu.cuDeviceTotalMem(&mem, d.dev)); err != nil {
		return err
	}
	d.info = devmem.Info{Index: d.opts.Index, Kind: devmem.KindCUDA, Name: cString(name[:]), MemBytes: uint64(mem)}
	_, uuid, err := deviceUUID(cu, d.dev)
	if err != nil {
		return err
	}
	d.info.UUID = uuid
	if cu.cuDeviceGetPCIBusId != nil {
		var bus [32]byte
		if cu.cuDeviceGetPCIBusId(&bus[0], int32(len(bus)), d.dev) == cuSuccess {
			d.busID = cString(bus[:])
		}
	}
	d.info.Card = CardName(d.info.Name, d.info.MemBytes)
	sms, err := d.attr(attrMultiprocessorCount)
	if err != nil {
		return err
	}
	d.sms = sms
	d.fd, d.noFD = d.fdSupport()
	if d.fd {
		if d.gran, err = granularity(cu, d.dev); err != nil {
			return err
		}
	}
	if d.stage, err = newStage(cu, d.opts.Staging); err != nil {
		return err
	}
	d.kernels, err = loadKernels(cu)
	return err
}

// fdSupport says whether Alloc can make exportable cuMemCreate
// allocations, and if not why.
func (d *Device) fdSupport() (bool, string) {
	switch {
	case d.opts.LegacyIPC:
		return false, "legacy IPC handles requested (Options.LegacyIPC)"
	case !d.cu.hasVMM():
		return false, "the driver lacks the virtual memory management calls"
	}
	for _, a := range []struct {
		attr int32
		what string
	}{{attrVMM, "virtual memory management"}, {attrPOSIXFD, "POSIX file descriptor handles"}} {
		v, err := d.attr(a.attr)
		if err != nil {
			return false, err.Error()
		}
		if v == 0 {
			return false, "the device does not support " + a.what
		}
	}
	return true, ""
}

func (d *Device) attr(a int32) (int, error) {
	var v int32
	err := d.cu.check("cuDeviceGetAttribute", d.cu.cuDeviceGetAttribute(&v, a, d.dev))
	return int(v), err
}

// fini runs last on the thread: everything the device holds is released
// and the context popped.
func (d *Device) fini() {
	cu := d.cu
	for b := range d.buffers {
		b.release()
	}
	d.buffers = nil
	if d.kernels != nil {
		d.kernels.unload(cu)
	}
	if d.stage != nil {
		d.stage.free(cu)
	}
	var ctx cuContext
	cu.cuCtxPopCurrent(&ctx)
	cu.cuDevicePrimaryCtxRelease(d.dev)
}

// describeMIG fills in MIG mode and, when the driver's name is a MIG
// device's, the card from the whole GPU's name; a missing NVML leaves
// them as the driver API alone can say.
func (d *Device) describeMIG() {
	nv, err := loadNVML(d.opts.NVML)
	if err != nil {
		return
	}
	gpu, err := nv.gpu(d.info.UUID, d.busID)
	if err != nil {
		nv.close()
		return
	}
	d.nv, d.gpu = nv, gpu
	d.info.MIG, _ = nv.migEnabled(gpu)
	if name, err := nv.name(gpu); err == nil && d.info.Card == "" {
		d.info.Card = CardName(name, d.info.MemBytes)
	}
}

// deviceUUID returns dev's UUID (cuDeviceGetUuid_v2: a MIG device's own),
// as bytes and as nvidia-smi writes it.
func deviceUUID(cu *driver, dev cuDevice) ([16]byte, string, error) {
	var name [256]byte
	if err := cu.check("cuDeviceGetName", cu.cuDeviceGetName(&name[0], int32(len(name)), dev)); err != nil {
		return [16]byte{}, "", err
	}
	var u [16]byte
	if err := cu.check("cuDeviceGetUuid", cu.cuDeviceGetUuid(&u, dev)); err != nil {
		return [16]byte{}, "", err
	}
	return u, formatUUID(u, strings.Contains(cString(name[:]), " MIG ")), nil
}

// parseUUID reads a UUID that formatUUID wrote (GPU-… or MIG-…).
func parseUUID(s string) ([16]byte, error) {
	var u [16]byte
	hexs, ok := strings.CutPrefix(s, "GPU-")
	if !ok {
		hexs, ok = strings.CutPrefix(s, "MIG-")
	}
	b, err := hex.DecodeString(strings.ReplaceAll(hexs, "-", ""))
	if !ok || err != nil || len(b) != len(u) || strings.Count(hexs, "-") != 4 {
		return u, fmt.Errorf("device UUID %q: want GPU- or MIG- and 32 hex digits, as nvidia-smi writes it", s)
	}
	copy(u[:], b)
	return u, nil
}

// formatUUID writes a device UUID as nvidia-smi does: a MIG device's
// (CUDA names it "… MIG 1g.10gb" and gives its own UUID) as MIG-….
func formatUUID(u [16]byte, mig bool) string {
	prefix := "GPU"
	if mig {
		prefix = "MIG"
	}
	return fmt.Sprintf("%s-%x-%x-%x-%x-%x", prefix, u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// Info implements devmem.Device.
func (d *Device) Info() devmem.Info { return d.info }

// ExportKind returns the handle kind Alloc's buffers export now, and for
// HandleCUDAIPC why the descriptor path is off.
func (d *Device) ExportKind() (kind devmem.HandleKind, why string) {
	err := d.t.do(func() error {
		kind, why = devmem.HandleCUDAFD, ""
		if !d.fd {
			kind, why = devmem.HandleCUDAIPC, d.noFD
		}
		return nil
	})
	if err != nil {
		return "", err.Error()
	}
	return kind, why
}

// GPUInstance is one MIG GPU instance on the device's GPU, as NVML lists
// it: what the scheduler's placements correspond to.
type GPUInstance struct {
	ID        int `json:"id"`
	ProfileID int `json:"profile_id"` // NVML's profile ID, as mig.Profile.ID
	// Profile is the mig profile's name (e.g. "3g.40gb") when the card is
	// one of mig.Cards().
	Profile string `json:"profile,omitempty"`
	Start   int    `json:"start"` // first memory slice
	Size    int    `json:"size"`  // memory slices
}

// GPUInstances lists the MIG GPU instances of the device's GPU. It needs
// NVML and MIG mode, and NVML may require root to list instances.
func (d *Device) GPUInstances() ([]GPUInstance, error) {
	if d.nv == nil {
		return nil, fmt.Errorf("cuda: gpu instances: %w: %s not loaded", ErrNotSupported, NVMLLibrary)
	}
	if !d.info.MIG {
		return nil, fmt.Errorf("cuda: gpu instances: MIG mode is off on %s", d.info.Name)
	}
	gis, err := d.nv.gpuInstances(d.gpu)
	if err != nil {
		return nil, fmt.Errorf("cuda: gpu instances: %w", err)
	}
	names := profileNames(d.info.Card)
	out := make([]GPUInstance, len(gis))
	for i, gi := range gis {
		out[i] = GPUInstance{ID: int(gi.ID), ProfileID: int(gi.ProfileID), Profile: names[int(gi.ProfileID)],
			Start: int(gi.Start), Size: int(gi.Size)}
	}
	return out, nil
}

// MIGProfiles reads the GPU instance profiles of the device's GPU from
// NVML: for each, its NVML ID, compute slices, memory slices, SMs, most
// instances and start slots, as mig.Profile holds them (Name from the mig
// table when the card is one of mig.Cards(); MemGB is left 0: NVML gives
// MiB, the table the marketing name's GB). NVML answers with MIG mode off
// too, so the geometry can be checked without changing the GPU's mode.
// Compare the result with the scheduler's table with mig.Card.Compare.
func (d *Device) MIGProfiles() ([]mig.Profile, error) {
	if d.nv == nil {
		return nil, fmt.Errorf("cuda: mig profiles: %w: %s not loaded", ErrNotSupported, NVMLLibrary)
	}
	infos, places, err := d.nv.profiles(d.gpu)
	if err != nil {
		return nil, fmt.Errorf("cuda: mig profiles of %s: %w", d.info.Name, err)
	}
	names := profileNames(d.info.Card)
	out := make([]mig.Profile, len(infos))
	for i, pi := range infos {
		p := mig.Profile{Name: names[int(pi.ID)], ID: int(pi.ID), Compute: int(pi.SliceCount),
			SMs: int(pi.MultiprocessorCount), Max: int(pi.InstanceCount)}
		for _, pl := range places[i] {
			p.Starts = append(p.Starts, int(pl.Start))
			if p.MemSlices != 0 && p.MemSlices != int(pl.Size) {
				return nil, fmt.Errorf("cuda: mig profiles of %s: profile %d has placements of %d and %d memory slices",
					d.info.Name, pi.ID, p.MemSlices, pl.Size)
			}
			p.MemSlices = int(pl.Size)
		}
		out[i] = p
	}
	return out, nil
}

// Close implements devmem.Device: it frees every buffer, the kernels and
// the staging memory and releases the primary context. Mappings other
// processes hold of exported buffers keep their memory until they close.
func (d *Device) Close() error {
	d.t.close()
	if d.nv != nil {
		d.nv.close()
		d.nv = nil
	}
	// libcuda stays loaded: unloading the driver under its own helper
	// threads is not safe, and the process loads it once anyway.
	return nil
}
