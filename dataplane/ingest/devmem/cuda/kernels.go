package cuda

import (
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"unsafe"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
)

// The kernels are OpenCL C compiled by clang's NVPTX backend (no CUDA
// toolkit): PTX 7.0 for sm_70, which every driver since CUDA 11.0 JITs for
// Volta and every later GPU (A100, H100, H200). The nvidia-cuda target
// (not nvcl) emits `.visible .entry`, the form cuModuleGetFunction finds.
//go:generate clang -target nvptx64-nvidia-cuda -x cl -cl-std=CL2.0 -O2 -Xclang -target-cpu -Xclang sm_70 -Xclang -target-feature -Xclang +ptx70 -S -o kernels/kernels.ptx kernels/kernels.cl

//go:embed kernels/kernels.ptx
var kernelsPTX string

// The entry points and their parameter counts, as the Go side launches
// them; TestPTX holds the PTX to these.
var entries = map[string]int{
	"checksum": 3, // in, n, out
	"mlp":      4, // in, rows, weights, out
}

// threadsPerBlock is THREADS in kernels.cl: the kernels' shared arrays
// and reductions are sized for exactly this many.
const threadsPerBlock = 256

// mlpRowsPerBlock is MLP_ROWS in kernels.cl: the mlp kernel gives each row
// one thread per hidden unit.
const mlpRowsPerBlock = threadsPerBlock / model.MLPHidden

// jitLogSize bounds the JIT compiler's error log kept in errors.
const jitLogSize = 16 << 10

// ptxInfo is what parsePTX reads from a PTX module's text.
type ptxInfo struct {
	Version string         // ".version", e.g. "7.0"
	Target  string         // ".target", e.g. "sm_70"
	Entries map[string]int // kernel name → number of parameters
}

// parsePTX reads a module's directives and kernel signatures: enough to
// check, without a GPU, that the embedded text is the module the Go side
// launches.
func parsePTX(text string) (ptxInfo, error) {
	info := ptxInfo{Entries: map[string]int{}}
	entry := ""
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "//") {
			continue
		}
		switch {
		case f[0] == ".version" && len(f) > 1:
			info.Version = f[1]
		case f[0] == ".target" && len(f) > 1:
			info.Target = strings.TrimSuffix(f[1], ",")
		case entry == "" && (f[0] == ".entry" || len(f) > 2 && f[0] == ".visible" && f[1] == ".entry"):
			name := f[len(f)-1]
			if f[0] == ".visible" {
				name = f[2]
			}
			entry = strings.TrimSuffix(name, "(")
			info.Entries[entry] = 0
			if strings.HasSuffix(line, ")") || strings.HasSuffix(strings.TrimSpace(line), "()") {
				entry = ""
			}
		case entry != "" && f[0] == ".param":
			info.Entries[entry]++
		case entry != "" && strings.HasPrefix(f[0], ")"):
			entry = ""
		}
	}
	if info.Version == "" || info.Target == "" {
		return info, errors.New("ptx: no .version or .target directive")
	}
	return info, nil
}

// kernels is the loaded module and what its launches need.
type kernels struct {
	mod      cuModule
	checksum cuFunction
	mlp      cuFunction
	weights  cuDevPtr // model.Weights(), as W1, B1, W2, B2 float32s
}

// loadKernels runs on the thread.
func loadKernels(cu *driver) (*kernels, error) {
	if _, err := parsePTX(kernelsPTX); err != nil {
		return nil, err
	}
	k := &kernels{}
	var err error
	if k.mod, err = loadModule(cu, kernelsPTX); err != nil {
		return nil, err
	}
	for name, fn := range map[string]*cuFunction{"checksum": &k.checksum, "mlp": &k.mlp} {
		if err := cu.check("cuModuleGetFunction", cu.cuModuleGetFunction(fn, k.mod, name)); err != nil {
			k.unload(cu)
			return nil, fmt.Errorf("kernel %s: %w", name, err)
		}
	}
	w, err := binary.Append(nil, binary.LittleEndian, model.Weights())
	if err != nil {
		k.unload(cu)
		return nil, fmt.Errorf("mlp weights: %w", err)
	}
	if err := cu.check("cuMemAlloc_v2", cu.cuMemAlloc(&k.weights, uintptr(len(w)))); err != nil {
		k.unload(cu)
		return nil, fmt.Errorf("mlp weights: %w", err)
	}
	if err := cu.check("cuMemcpyHtoD_v2", cu.cuMemcpyHtoD(k.weights, unsafe.Pointer(&w[0]), uintptr(len(w)))); err != nil {
		k.unload(cu)
		return nil, fmt.Errorf("mlp weights: %w", err)
	}
	return k, nil
}

// loadModule JIT-compiles PTX text; a failure carries the compiler's
// error log.
func loadModule(cu *driver, ptx string) (cuModule, error) {
	image := append([]byte(ptx), 0)
	errLog := make([]byte, jitLogSize)
	opts := [...]int32{jitErrorLogBuffer, jitErrorLogBufferSize}
	// The driver reads a pointer-sized value per option: the buffer's
	// address, then its size as an integer.
	vals := [...]uintptr{uintptr(unsafe.Pointer(&errLog[0])), uintptr(len(errLog))}
	var m cuModule
	r := cu.cuModuleLoadDataEx(&m, &image[0], uint32(len(opts)), &opts[0], &vals[0])
	runtime.KeepAlive(errLog)
	runtime.KeepAlive(image)
	if err := cu.check("cuModuleLoadDataEx", r); err != nil {
		var e *Error
		if errors.As(err, &e) {
			e.Log = strings.TrimSpace(cString(errLog))
		}
		return 0, err
	}
	return m, nil
}

func (k *kernels) unload(cu *driver) {
	if k.weights != 0 {
		cu.cuMemFree(k.weights)
		k.weights = 0
	}
	if k.mod != 0 {
		cu.cuModuleUnload(k.mod)
		k.mod = 0
	}
}

// launch runs fn on a 1-D grid and waits for it. args are pointers to
// each kernel parameter's value, in order.
func launch(cu *driver, fn cuFunction, blocks uint32, args ...unsafe.Pointer) error {
	if err := cu.check("cuLaunchKernel", cu.cuLaunchKernel(fn, blocks, 1, 1, threadsPerBlock, 1, 1, 0, 0, &args[0], nil)); err != nil {
		return err
	}
	runtime.KeepAlive(args)
	return cu.check("cuCtxSynchronize", cu.cuCtxSynchronize())
}
