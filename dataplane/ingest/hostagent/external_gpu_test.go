//go:build gpu

// The external models on a real GPU: built with -tags gpu (make lint
// compiles them), run on a machine with an NVIDIA GPU, its driver and a
// Python with numpy, cupy and torch (docs/ingest-cuda.md), where every one
// must pass; none skips. They fail with the driver's error where there is
// no GPU.

package hostagent

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem/cuda"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/hostagent/workertest"
)

// newGPURig is newExtRig with CUDA device 0 exporting legacy IPC handles,
// the only ones lovelock_ingest maps (cupy opens them). A test binary
// carried to a GPU machine runs where it is started: the rig works from
// this package's directory in the tree around it, as go test would, so
// that testdata/ and lovelock_ingest are found.
func newGPURig(t *testing.T) *extRig {
	t.Helper()
	root, err := workertest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(filepath.Join(root, "dataplane", "ingest", "hostagent"))
	dev, err := cuda.Open(cuda.Options{Index: 0, LegacyIPC: true})
	if err != nil {
		t.Fatalf("open CUDA device 0 (these tests need an NVIDIA GPU and its driver): %v", err)
	}
	t.Cleanup(func() { dev.Close() }) // after the rig's cleanup has freed the buffers
	if kind, why := dev.ExportKind(); kind != devmem.HandleCUDAIPC {
		t.Fatalf("device exports %q handles (%s), want %q", kind, why, devmem.HandleCUDAIPC)
	}
	return newExtRig(t, func(c *Config) { c.Devices = []devmem.Device{dev} })
}

// testGPUModels runs affine and rowsum through testdata/cudaworker.py
// workers that compute with lib over the slots' device memory and reply
// with lib's device arrays, and checks every output byte.
func testGPUModels(t *testing.T, lib string) {
	r := newGPURig(t)
	r.script("cudaworker.py", "affine", 1, lib)
	r.script("cudaworker.py", "rowsum", 1, lib)
	runs := checkAffineRowsum(t, r)
	if s := r.agent.Stats(); s.ExternalRuns != uint64(runs) || s.ExternalFailed != 0 || s.WorkerLost != 0 {
		t.Fatalf("stats after %d runs: %+v", runs, s)
	}
}

// TestGPUExternalCupy: req.cupy() views the slot's device memory (affine
// computes in place in it, and the DPU side reads 2x+1 in the input
// buffer), and req.reply() of a cupy array, a view of the input or a new
// array, lands in the output buffer.
func TestGPUExternalCupy(t *testing.T) { testGPUModels(t, "cupy") }

// TestGPUExternalTorch: the same through req.torch(), DLPack from cupy,
// replying with torch tensors.
func TestGPUExternalTorch(t *testing.T) { testGPUModels(t, "torch") }

// TestGPUExternalOrdering: the worker's output is in the output buffer
// for the DPU side's read as soon as the completion comes, though the GPU
// work it depends on was still running when the worker called
// req.reply() (the worker checks that, and fails the request if not):
// reply waits for the device (deviceSynchronize) before it tells the host
// agent done. The output buffer is overwritten first each time, so that a
// read that came before the worker's copy would see the old bytes.
func TestGPUExternalOrdering(t *testing.T) {
	r := newGPURig(t)
	r.script("cudaworker.py", "affine", 1, "torch", "slow")
	for i, rows := range []int{256, 1, 100, 255, 256, 7} {
		slot := i % 2
		if err := r.slots[slot][1].WriteAt(bytes.Repeat([]byte{0xaa}, slotOut), 0); err != nil {
			t.Fatal(err)
		}
		in := affineInput(rows, i)
		c := r.run(slot, "affine", in)
		want := affineWant(in)
		wantOK(t, c, len(want))
		if got := r.read(slot, 1, len(want)); !bytes.Equal(got, want) {
			t.Fatalf("run %d, %d rows: the output buffer does not hold the output when the completion came (first bytes %x, want %x): done went before the worker's writes landed",
				i, rows, got[:16], want[:16])
		}
	}
	if s := r.agent.Stats(); s.ExternalRuns != 6 || s.ExternalFailed != 0 {
		t.Fatalf("stats: %+v", s)
	}
}
