package cuda

import (
	"fmt"
	"strings"

	"github.com/ebitengine/purego"
)

// NVMLLibrary is the file name of the NVML library Open loads, for what
// the CUDA driver API does not say: MIG mode and GPU instances.
const NVMLLibrary = "libnvidia-ml.so.1"

type (
	nvmlReturn      int32
	nvmlDevice      uintptr
	nvmlGPUInstance uintptr
)

const (
	nvmlSuccess     = 0
	nvmlNameLen     = 96 // NVML_DEVICE_NAME_V2_BUFFER_SIZE
	nvmlMIGEnabled  = 1  // NVML_DEVICE_MIG_ENABLE
	nvmlProfileEnum = 32 // NVML_GPU_INSTANCE_PROFILE_* values tried: COUNT grows with drivers (0x11 in 2024 headers); unknown ones fail and are skipped
)

// giProfileInfo is nvmlGpuInstanceProfileInfo_t (48 bytes).
type giProfileInfo struct {
	ID, IsP2PSupported, SliceCount, InstanceCount, MultiprocessorCount uint32
	CopyEngineCount, DecoderCount, EncoderCount, JpegCount, OfaCount   uint32
	MemorySizeMB                                                       uint64
}

// giPlacement is nvmlGpuInstancePlacement_t: a span of memory slices.
type giPlacement struct {
	Start, Size uint32
}

// giInfo is nvmlGpuInstanceInfo_t (24 bytes).
type giInfo struct {
	Device    nvmlDevice
	ID        uint32
	ProfileID uint32
	Start     uint32 // placement: first memory slice
	Size      uint32 // placement: memory slices
}

// nvml is one loaded libnvidia-ml. The MIG fields are nil on drivers
// without MIG support.
type nvml struct {
	lib uintptr

	nvmlInit                   func() nvmlReturn
	nvmlShutdown               func() nvmlReturn
	nvmlErrorString            func(r nvmlReturn) string
	nvmlDeviceGetHandleByIndex func(i uint32, h *nvmlDevice) nvmlReturn
	nvmlDeviceGetHandleByUUID  func(uuid string, h *nvmlDevice) nvmlReturn
	nvmlDeviceGetHandleByPci   func(busID string, h *nvmlDevice) nvmlReturn
	nvmlDeviceGetName          func(h nvmlDevice, name *byte, n uint32) nvmlReturn

	nvmlDeviceGetMigMode                         func(h nvmlDevice, current, pending *uint32) nvmlReturn
	nvmlDeviceIsMigDeviceHandle                  func(h nvmlDevice, isMIG *uint32) nvmlReturn
	nvmlDeviceGetDeviceHandleFromMigDeviceHandle func(mig nvmlDevice, parent *nvmlDevice) nvmlReturn
	nvmlDeviceGetGpuInstanceProfileInfo          func(h nvmlDevice, profile uint32, info *giProfileInfo) nvmlReturn
	nvmlDeviceGetGpuInstances                    func(h nvmlDevice, profileID uint32, gis *nvmlGPUInstance, count *uint32) nvmlReturn
	nvmlGpuInstanceGetInfo                       func(gi nvmlGPUInstance, info *giInfo) nvmlReturn
	nvmlDeviceGetGpuInstancePossiblePlacements   func(h nvmlDevice, profileID uint32, pl *giPlacement, count *uint32) nvmlReturn
}

func (n *nvml) symbols() []symbol {
	req := func(fptr any, names ...string) symbol { return symbol{fptr: fptr, names: names} }
	opt := func(fptr any, names ...string) symbol { return symbol{fptr: fptr, names: names, optional: true} }
	return []symbol{
		req(&n.nvmlInit, "nvmlInit_v2"),
		req(&n.nvmlShutdown, "nvmlShutdown"),
		req(&n.nvmlErrorString, "nvmlErrorString"),
		req(&n.nvmlDeviceGetHandleByIndex, "nvmlDeviceGetHandleByIndex_v2"),
		req(&n.nvmlDeviceGetHandleByUUID, "nvmlDeviceGetHandleByUUID"),
		req(&n.nvmlDeviceGetName, "nvmlDeviceGetName"),
		opt(&n.nvmlDeviceGetHandleByPci, "nvmlDeviceGetHandleByPciBusId_v2"),
		opt(&n.nvmlDeviceGetMigMode, "nvmlDeviceGetMigMode"),
		opt(&n.nvmlDeviceIsMigDeviceHandle, "nvmlDeviceIsMigDeviceHandle"),
		opt(&n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle"),
		opt(&n.nvmlDeviceGetGpuInstanceProfileInfo, "nvmlDeviceGetGpuInstanceProfileInfo"),
		opt(&n.nvmlDeviceGetGpuInstances, "nvmlDeviceGetGpuInstances"),
		opt(&n.nvmlGpuInstanceGetInfo, "nvmlGpuInstanceGetInfo"),
		opt(&n.nvmlDeviceGetGpuInstancePossiblePlacements, "nvmlDeviceGetGpuInstancePossiblePlacements_v2"),
	}
}

// loadNVML opens and initialises NVML at path ("" for NVMLLibrary).
func loadNVML(path string) (*nvml, error) {
	if path == "" {
		path = NVMLLibrary
	}
	lib, err := openLibrary(path, "no NVIDIA driver on this machine")
	if err != nil {
		return nil, err
	}
	n := &nvml{lib: lib}
	if err := bind(lib, path, n.symbols()); err != nil {
		purego.Dlclose(lib)
		return nil, fmt.Errorf("nvml: %w", err)
	}
	if err := n.check("nvmlInit_v2", n.nvmlInit()); err != nil {
		purego.Dlclose(lib)
		return nil, err
	}
	return n, nil
}

func (n *nvml) close() {
	n.nvmlShutdown()
	purego.Dlclose(n.lib)
}

func (n *nvml) check(call string, r nvmlReturn) error {
	if r == nvmlSuccess {
		return nil
	}
	return fmt.Errorf("nvml: %s: %s (%d)", call, n.nvmlErrorString(r), r)
}

// gpu returns the handle of the whole GPU that the CUDA device with uuid
// (or, failing that, PCI bus ID) is or belongs to. Not by index: CUDA's
// ordinals follow CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER, NVML's the
// PCI order, so an index could name another GPU.
func (n *nvml) gpu(uuid, busID string) (nvmlDevice, error) {
	var h nvmlDevice
	if err := n.check("nvmlDeviceGetHandleByUUID", n.nvmlDeviceGetHandleByUUID(uuid, &h)); err != nil {
		if busID == "" || n.nvmlDeviceGetHandleByPci == nil {
			return 0, err
		}
		if err2 := n.check("nvmlDeviceGetHandleByPciBusId_v2", n.nvmlDeviceGetHandleByPci(busID, &h)); err2 != nil {
			return 0, fmt.Errorf("%w; %w", err, err2)
		}
	}
	if n.nvmlDeviceIsMigDeviceHandle != nil && n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle != nil {
		var isMIG uint32
		if n.nvmlDeviceIsMigDeviceHandle(h, &isMIG) == nvmlSuccess && isMIG != 0 {
			var parent nvmlDevice
			if err := n.check("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h, &parent)); err != nil {
				return 0, err
			}
			h = parent
		}
	}
	return h, nil
}

func (n *nvml) name(h nvmlDevice) (string, error) {
	var buf [nvmlNameLen]byte
	if err := n.check("nvmlDeviceGetName", n.nvmlDeviceGetName(h, &buf[0], nvmlNameLen)); err != nil {
		return "", err
	}
	return cString(buf[:]), nil
}

// migEnabled reports whether MIG mode is on (current mode, not pending).
func (n *nvml) migEnabled(h nvmlDevice) (bool, error) {
	if n.nvmlDeviceGetMigMode == nil {
		return false, nil
	}
	var cur, pending uint32
	if err := n.check("nvmlDeviceGetMigMode", n.nvmlDeviceGetMigMode(h, &cur, &pending)); err != nil {
		if strings.Contains(err.Error(), "Not Supported") {
			return false, nil
		}
		return false, err
	}
	return cur == nvmlMIGEnabled, nil
}

// gpuInstances lists the GPU instances of every profile with their
// placements.
func (n *nvml) gpuInstances(h nvmlDevice) ([]giInfo, error) {
	if n.nvmlDeviceGetGpuInstanceProfileInfo == nil || n.nvmlDeviceGetGpuInstances == nil || n.nvmlGpuInstanceGetInfo == nil {
		return nil, fmt.Errorf("nvml: %w: the library has no GPU instance calls", ErrNotSupported)
	}
	seen := map[uint32]bool{}
	var out []giInfo
	for p := uint32(0); p < nvmlProfileEnum; p++ {
		var pi giProfileInfo
		if n.nvmlDeviceGetGpuInstanceProfileInfo(h, p, &pi) != nvmlSuccess || seen[pi.ID] || pi.InstanceCount == 0 {
			continue // profile enum unknown to this GPU or driver
		}
		seen[pi.ID] = true
		gis := make([]nvmlGPUInstance, pi.InstanceCount)
		count := pi.InstanceCount
		if err := n.check("nvmlDeviceGetGpuInstances", n.nvmlDeviceGetGpuInstances(h, pi.ID, &gis[0], &count)); err != nil {
			return nil, err
		}
		for _, gi := range gis[:min(count, pi.InstanceCount)] {
			var info giInfo
			if err := n.check("nvmlGpuInstanceGetInfo", n.nvmlGpuInstanceGetInfo(gi, &info)); err != nil {
				return nil, err
			}
			out = append(out, info)
		}
	}
	return out, nil
}

// profiles reads every GPU instance profile the GPU offers and each
// one's possible placements: the card's MIG geometry as the driver has it.
func (n *nvml) profiles(h nvmlDevice) ([]giProfileInfo, [][]giPlacement, error) {
	if n.nvmlDeviceGetGpuInstanceProfileInfo == nil || n.nvmlDeviceGetGpuInstancePossiblePlacements == nil {
		return nil, nil, fmt.Errorf("nvml: %w: the library has no GPU instance profile calls", ErrNotSupported)
	}
	seen := map[uint32]bool{}
	var infos []giProfileInfo
	var places [][]giPlacement
	for p := uint32(0); p < nvmlProfileEnum; p++ {
		var pi giProfileInfo
		if n.nvmlDeviceGetGpuInstanceProfileInfo(h, p, &pi) != nvmlSuccess || seen[pi.ID] || pi.InstanceCount == 0 {
			continue // profile enum unknown to this GPU or driver
		}
		seen[pi.ID] = true
		// At most one placement per memory slice; count says how many.
		pl := make([]giPlacement, 8)
		count := uint32(len(pl))
		if err := n.check("nvmlDeviceGetGpuInstancePossiblePlacements_v2",
			n.nvmlDeviceGetGpuInstancePossiblePlacements(h, pi.ID, &pl[0], &count)); err != nil {
			return nil, nil, fmt.Errorf("profile %d: %w", pi.ID, err)
		}
		infos = append(infos, pi)
		places = append(places, pl[:min(count, uint32(len(pl)))])
	}
	if len(infos) == 0 {
		return nil, nil, fmt.Errorf("nvml: %w: the GPU lists no GPU instance profiles (not a MIG-capable GPU)", ErrNotSupported)
	}
	return infos, places, nil
}

// cString returns b up to its first NUL.
func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
