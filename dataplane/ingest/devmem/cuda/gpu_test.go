//go:build gpu

// The GPU tests: built with -tags gpu (CI compiles them with `go test -tags
// gpu -c`), run on a machine with an NVIDIA GPU and driver, where every one
// must pass; none skips.

package cuda

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
)

// The child process: TestMain re-executes the test binary with these set,
// and the child plays the DPU-side writer (childImport) instead of running
// tests.
const (
	envChild  = "LOVELOCK_CUDA_CHILD"
	envHandle = "LOVELOCK_CUDA_HANDLE"
	childFD   = 3 // the exported descriptor, as cmd.ExtraFiles[0]
)

func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		if err := childImport(); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// pattern returns n bytes that seed determines.
func pattern(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 0x10fe10c))
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	return p
}

// childImport imports the handle, checks the parent's bytes (pattern 1),
// writes pattern 2 for the parent to check, and closes.
func childImport() error {
	var h devmem.Handle
	if err := json.Unmarshal([]byte(os.Getenv(envHandle)), &h); err != nil {
		return err
	}
	h.FD = -1
	if h.Kind == devmem.HandleCUDAFD {
		h.FD = childFD
	}
	im, err := NewImporter(ImporterOptions{})
	if err != nil {
		return err
	}
	defer im.Close()
	m, err := im.Import(h)
	if err != nil {
		return err
	}
	got := make([]byte, h.Size)
	if err := m.ReadAt(got, 0); err != nil {
		return err
	}
	if !bytes.Equal(got, pattern(1, h.Size)) {
		return fmt.Errorf("the parent's %d bytes differ in the child's mapping", h.Size)
	}
	if err := m.WriteAt(pattern(2, h.Size), 0); err != nil {
		return err
	}
	return m.Close()
}

func openDevice(t *testing.T, opts Options) *Device {
	t.Helper()
	d, err := Open(opts)
	if err != nil {
		t.Fatalf("Open(%+v): %v", opts, err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func alloc(t *testing.T, d *Device, size int) devmem.Buffer {
	t.Helper()
	b, err := d.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free() })
	return b
}

func TestGPUInfo(t *testing.T) {
	d := openDevice(t, Options{})
	info := d.Info()
	kind, why := d.ExportKind()
	t.Logf("device: %+v; buffers export %s %s", info, kind, why)
	if info.Kind != devmem.KindCUDA || info.Name == "" || !strings.HasPrefix(info.UUID, "GPU-") || info.MemBytes == 0 {
		t.Errorf("incomplete info %+v", info)
	}
	if strings.Contains(info.Name, "H100 80GB") && info.Card != "H100-80GB" {
		t.Errorf("card %q for %q", info.Card, info.Name)
	}
	gis, err := d.GPUInstances()
	t.Logf("gpu instances: %+v, %v", gis, err)
	if info.MIG && err != nil && !strings.Contains(err.Error(), "Permission") {
		t.Errorf("MIG on but no instances listed: %v", err)
	}
}

var sizes = []int{1, 3, 4, 255, 4095, 4096, 65535, 65536, 65537, 1<<20 + 7, 8 << 20}

// TestGPUCopy: bytes written are the bytes read, at every size from 1 B to
// 8 MiB, at offsets, with and without the staging buffer, on both kinds of
// allocation.
func TestGPUCopy(t *testing.T) {
	for _, opts := range []Options{{}, {Staging: StagingSize}, {LegacyIPC: true}, {Staging: 4096}} {
		t.Run(fmt.Sprintf("staging=%d,legacy=%v", opts.Staging, opts.LegacyIPC), func(t *testing.T) {
			d := openDevice(t, opts)
			for i, n := range sizes {
				b := alloc(t, d, n+13)
				zero := make([]byte, n+13)
				if err := b.ReadAt(zero, 0); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(zero, make([]byte, n+13)) {
					t.Fatalf("%d B: a new buffer is not zeroed", n)
				}
				want := pattern(uint64(i), n)
				if err := b.WriteAt(want, 13); err != nil {
					t.Fatal(err)
				}
				got := make([]byte, n)
				if err := b.ReadAt(got, 13); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("%d B at offset 13: read differs from written", n)
				}
				if err := b.WriteAt([]byte{1}, n+13); !errors.Is(err, devmem.ErrRange) {
					t.Errorf("write past the end: %v", err)
				}
			}
		})
	}
}

// TestGPUImportInProcess: a descriptor exported and imported in the same
// process maps the same memory.
func TestGPUImportInProcess(t *testing.T) {
	d := openDevice(t, Options{})
	if kind, why := d.ExportKind(); kind != devmem.HandleCUDAFD {
		t.Fatalf("buffers export %s (%s), want %s on this GPU", kind, why, devmem.HandleCUDAFD)
	}
	im, err := NewImporter(ImporterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	for _, n := range []int{1, 4096, 3<<20 + 1} {
		b := alloc(t, d, n)
		h, err := b.Export()
		if err != nil {
			t.Fatal(err)
		}
		m, err := im.Import(h)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.WriteAt(pattern(7, n), 0); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, n)
		if err := b.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, pattern(7, n)) {
			t.Fatalf("%d B written through the mapping differ in the buffer", n)
		}
		if err := b.WriteAt(pattern(8, n), 0); err != nil {
			t.Fatal(err)
		}
		if err := m.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, pattern(8, n)) {
			t.Fatalf("%d B written to the buffer differ in the mapping", n)
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		if err := m.WriteAt([]byte{1}, 0); !errors.Is(err, ErrClosed) {
			t.Errorf("write after Close: %v, want ErrClosed", err)
		}
	}
}

// TestGPUImportChild: another process imports the exported buffer, reads
// what this one wrote and writes back (descriptor and IPC fallback).
func TestGPUImportChild(t *testing.T) {
	for _, opts := range []Options{{}, {LegacyIPC: true}} {
		t.Run(fmt.Sprintf("legacy=%v", opts.LegacyIPC), func(t *testing.T) {
			d := openDevice(t, opts)
			const n = 3<<20 + 5
			b := alloc(t, d, n)
			if err := b.WriteAt(pattern(1, n), 0); err != nil {
				t.Fatal(err)
			}
			h, err := b.Export()
			if err != nil {
				t.Fatal(err)
			}
			want := devmem.HandleCUDAFD
			if opts.LegacyIPC {
				want = devmem.HandleCUDAIPC
			}
			if h.Kind != want {
				t.Fatalf("exported a %s handle, want %s", h.Kind, want)
			}
			js, err := json.Marshal(h)
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), envChild+"=1", envHandle+"="+string(js))
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if h.Kind == devmem.HandleCUDAFD {
				f := os.NewFile(uintptr(h.FD), "cuda-fd")
				defer f.Close()
				cmd.ExtraFiles = []*os.File{f}
			}
			if err := cmd.Run(); err != nil {
				t.Fatalf("child: %v: %s", err, stderr.String())
			}
			got := make([]byte, n)
			if err := b.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, pattern(2, n)) {
				t.Fatal("the child's bytes differ in the buffer")
			}
		})
	}
}

// visibleGPUs returns how many GPUs this process sees and the
// CUDA_VISIBLE_DEVICES entries that name them, in this process's order.
func visibleGPUs(t *testing.T) (int, []string) {
	t.Helper()
	cu, err := loadDriver("")
	if err != nil {
		t.Fatal(err)
	}
	var n int32
	if err := cu.check("cuInit", cu.cuInit(0)); err != nil {
		t.Fatal(err)
	}
	if err := cu.check("cuDeviceGetCount", cu.cuDeviceGetCount(&n)); err != nil {
		t.Fatal(err)
	}
	var names []string
	if v, ok := os.LookupEnv("CUDA_VISIBLE_DEVICES"); ok {
		names = strings.Split(v, ",")[:n]
	} else {
		for i := range int(n) {
			names = append(names, fmt.Sprint(i))
		}
	}
	return int(n), names
}

// TestGPUImportReordered: the importing process numbers the GPUs the other
// way round (CUDA_VISIBLE_DEVICES reversed), as a DPU writer started with
// another environment than the GPU host agent would, and still maps the
// exporter's GPU, not the one that has the exporter's ordinal here. It
// exports from the last GPU, which is the child's ordinal 0; with one GPU
// the order cannot differ and only the lookup is checked.
func TestGPUImportReordered(t *testing.T) {
	n, names := visibleGPUs(t)
	if n < 2 {
		t.Logf("%d GPU: the child sees the same order; only the lookup by device is checked", n)
	}
	slices.Reverse(names)
	for _, opts := range []Options{{Index: n - 1}, {Index: n - 1, LegacyIPC: true}} {
		t.Run(fmt.Sprintf("legacy=%v", opts.LegacyIPC), func(t *testing.T) {
			d := openDevice(t, opts)
			const n = 1<<20 + 3
			b := alloc(t, d, n)
			if err := b.WriteAt(pattern(1, n), 0); err != nil {
				t.Fatal(err)
			}
			h, err := b.Export()
			if err != nil {
				t.Fatal(err)
			}
			js, err := json.Marshal(h)
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), envChild+"=1", envHandle+"="+string(js), "CUDA_VISIBLE_DEVICES="+strings.Join(names, ","))
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if h.Kind == devmem.HandleCUDAFD {
				f := os.NewFile(uintptr(h.FD), "cuda-fd")
				defer f.Close()
				cmd.ExtraFiles = []*os.File{f}
			}
			if err := cmd.Run(); err != nil {
				t.Fatalf("child with CUDA_VISIBLE_DEVICES=%s importing %s's %s handle: %v: %s", strings.Join(names, ","), d.Info().UUID, h.Kind, err, stderr.String())
			}
			got := make([]byte, n)
			if err := b.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, pattern(2, n)) {
				t.Fatal("the child's bytes differ in the buffer")
			}
		})
	}
}

// TestGPUImportHiddenGPU: a handle of a GPU this process does not see
// fails with an error that names its UUID and says to check
// CUDA_VISIBLE_DEVICES; it does not fall back to the handle's ordinal.
func TestGPUImportHiddenGPU(t *testing.T) {
	im, err := NewImporter(ImporterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	const hidden = "GPU-deadbeef-0000-4000-8000-00000000f00d"
	_, err = im.Import(devmem.Handle{Kind: devmem.HandleCUDAIPC, Size: 4096, Device: 0, UUID: hidden, FD: -1, IPC: make([]byte, ipcHandleLen)})
	if !errors.Is(err, ErrNoDevice) {
		t.Fatalf("import on a hidden GPU: %v, want ErrNoDevice", err)
	}
	for _, want := range []string{"no GPU with UUID " + hidden, "check CUDA_VISIBLE_DEVICES"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	t.Logf("hidden GPU: %v", err)
	_, err = im.Import(devmem.Handle{Kind: devmem.HandleCUDAIPC, Size: 4096, UUID: "GPU-1", FD: -1, IPC: make([]byte, ipcHandleLen)})
	if err == nil || !strings.Contains(err.Error(), `"GPU-1"`) {
		t.Errorf("import with a malformed UUID: %v", err)
	}
}

// TestGPUChecksum: the kernel's checksum equals model.Checksum bit for bit.
func TestGPUChecksum(t *testing.T) {
	m, err := model.Builtin("checksum")
	if err != nil {
		t.Fatal(err)
	}
	d := openDevice(t, Options{})
	out := alloc(t, d, 64)
	for i, n := range append(sizes, 5, 6, 7, 1000, 100<<20+3) {
		in := alloc(t, d, n)
		data := pattern(uint64(100+i), n)
		if i == 0 {
			data[0] = 0xff
		}
		if err := in.WriteAt(data, 0); err != nil {
			t.Fatal(err)
		}
		k, err := d.Run(m, in, n, out)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, k)
		if err := out.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if want := model.Checksum(data); !bytes.Equal(got, want[:]) {
			t.Errorf("%d B: GPU checksum %x, CPU %x", n, got, want)
		}
		in.Free()
	}
	// A prefix of the buffer: the bytes past inLen must not count.
	in := alloc(t, d, 4096)
	data := pattern(9, 4096)
	if err := in.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Run(m, in, 1001, out); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, model.ChecksumLen)
	if err := out.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if want := model.Checksum(data[:1001]); !bytes.Equal(got, want[:]) {
		t.Errorf("prefix of 1001 B: GPU %x, CPU %x", got, want)
	}
}

// TestGPUMLP: the kernel's output is within model.Close of the reference.
func TestGPUMLP(t *testing.T) {
	m, err := model.Builtin("mlp")
	if err != nil {
		t.Fatal(err)
	}
	d := openDevice(t, Options{})
	for _, rows := range []int{1, 7, 255, 256, 257, 5000} {
		n := rows * m.Multiple
		r := rand.New(rand.NewPCG(uint64(rows), 1))
		data := make([]byte, n)
		for i := 0; i < n; i += 4 {
			binary.LittleEndian.PutUint32(data[i:], math.Float32bits(r.Float32()*4-2))
		}
		in, out := alloc(t, d, n), alloc(t, d, m.OutputSize(n))
		if err := in.WriteAt(data, 0); err != nil {
			t.Fatal(err)
		}
		k, err := d.Run(m, in, n, out)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, k)
		if err := out.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		want := make([]byte, m.OutputSize(n))
		want = want[:m.Reference(data, want)]
		if !model.Close(got, want) {
			t.Errorf("%d rows: GPU output differs from the CPU reference beyond tolerance", rows)
		}
	}
	in, out := alloc(t, d, 100), alloc(t, d, 100)
	if _, err := d.Run(m, in, 100, out); !errors.Is(err, model.ErrBadInput) {
		t.Errorf("100 B (not whole rows): %v, want ErrBadInput", err)
	}
	ext := model.NewExternal("user", 1, func(n int) int { return n })
	if _, err := d.Run(ext, in, 10, out); err == nil || !strings.Contains(err.Error(), "not supported by the CUDA runner") {
		t.Errorf("external model: %v", err)
	}
}

// TestGPUConcurrent: goroutines writing and reading disjoint ranges of one
// buffer and of its mapping.
func TestGPUConcurrent(t *testing.T) {
	d := openDevice(t, Options{})
	const part, parts = 256 << 10, 8
	b := alloc(t, d, part*parts)
	var wg sync.WaitGroup
	errs := make(chan error, parts)
	for i := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			want := pattern(uint64(i), part)
			got := make([]byte, part)
			for range 10 {
				if err := b.WriteAt(want, i*part); err != nil {
					errs <- err
					return
				}
				if err := b.ReadAt(got, i*part); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(got, want) {
					errs <- fmt.Errorf("part %d differs", i)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestGPULifetime: freed buffers and closed devices refuse use.
func TestGPULifetime(t *testing.T) {
	d, err := Open(Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	if err := b.WriteAt([]byte{1}, 0); !errors.Is(err, ErrClosed) {
		t.Errorf("write after Free: %v", err)
	}
	if _, err := d.Alloc(4096); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Alloc(4096); !errors.Is(err, ErrClosed) {
		t.Errorf("Alloc after Close: %v", err)
	}
}

// TestGPUBandwidth prints copy bandwidth at the bench's input sizes and at
// 64 MiB: host to device and back, through the staging buffer and from
// pageable memory, on the device and through an imported mapping; and,
// as the ceiling both are measured against, straight from page-locked
// memory (no memmove).
func TestGPUBandwidth(t *testing.T) {
	const total = 512 << 20 // bytes per measurement, whatever the size
	for _, n := range []int{64 << 10, 1 << 20, 64 << 20} {
		data := pattern(3, n)
		rounds := max(total/n, 2)
		for _, opts := range []Options{{Staging: StagingSize}, {}} {
			d := openDevice(t, opts)
			b := alloc(t, d, n)
			what := "staged"
			if opts.Staging == 0 {
				what = "pageable"
			}
			t.Logf("%8s  device  %-8s HtoD %5.1f GB/s, DtoH %5.1f GB/s", farSize(n), what,
				rate(t, n, rounds, func() error { return b.WriteAt(data, 0) }),
				rate(t, n, rounds, func() error { return b.ReadAt(data, 0) }))
			h, err := b.Export()
			if err != nil {
				t.Fatal(err)
			}
			im, err := NewImporter(ImporterOptions{Staging: opts.Staging})
			if err != nil {
				t.Fatal(err)
			}
			m, err := im.Import(h)
			if err != nil {
				im.Close()
				t.Fatal(err)
			}
			t.Logf("%8s  mapping %-8s HtoD %5.1f GB/s, DtoH %5.1f GB/s (%s handle)", farSize(n), what,
				rate(t, n, rounds, func() error { return m.WriteAt(data, 0) }),
				rate(t, n, rounds, func() error { return m.ReadAt(data, 0) }), h.Kind)
			im.Close()
			if opts.Staging == 0 {
				continue
			}
			// The DMA alone: from the device's own page-locked staging
			// buffer, which holds n bytes at these sizes up to 4 MiB.
			if n > len(d.stage.buf) {
				continue
			}
			ptr := b.(*buffer).ptr
			src := unsafe.Pointer(&d.stage.buf[0])
			t.Logf("%8s  device  %-8s HtoD %5.1f GB/s, DtoH %5.1f GB/s", farSize(n), "pinned",
				rate(t, n, rounds, func() error {
					return d.t.do(func() error { return d.cu.check("cuMemcpyHtoD_v2", d.cu.cuMemcpyHtoD(ptr, src, uintptr(n))) })
				}),
				rate(t, n, rounds, func() error {
					return d.t.do(func() error { return d.cu.check("cuMemcpyDtoH_v2", d.cu.cuMemcpyDtoH(src, ptr, uintptr(n))) })
				}))
		}
	}
}

// farSize writes n in KiB or MiB.
func farSize(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

func rate(t *testing.T, n, rounds int, f func() error) float64 {
	t.Helper()
	if err := f(); err != nil { // warm up
		t.Fatal(err)
	}
	start := time.Now()
	for range rounds {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	return float64(n*rounds) / time.Since(start).Seconds() / 1e9
}

// TestGPUMIGProfiles reads the GPU's MIG geometry from NVML and checks
// that the scheduler's table for its card (package mig) is the same. The
// fake libcuda has no NVML: there the call must fail with ErrNotSupported;
// so must it on a GPU whose card is not in the table.
func TestGPUMIGProfiles(t *testing.T) {
	d := openDevice(t, Options{})
	info := d.Info()
	live, err := d.MIGProfiles()
	if strings.HasPrefix(info.Name, "fake libcuda") || info.Card == "" {
		t.Logf("%s: no NVML or no card of the mig table: profiles %+v, %v", info.Name, live, err)
		if info.Card != "" && !errors.Is(err, ErrNotSupported) {
			t.Errorf("without NVML: %v, want ErrNotSupported", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("%s (card %s): %v", info.Name, info.Card, err)
	}
	for _, p := range live {
		t.Logf("NVML profile %2d %-10s compute %d, memory slices %d, SMs %3d, most %d, starts %v",
			p.ID, p.Name, p.Compute, p.MemSlices, p.SMs, p.Max, p.Starts)
	}
	card, err := mig.CardByName(info.Card)
	if err != nil {
		t.Fatal(err)
	}
	if diffs := card.Compare(live); diffs != nil {
		t.Errorf("the mig table's %s differs from what NVML reports:\n%s", card.Name, strings.Join(diffs, "\n"))
	}
}

// TestGPUWait: a device's thread waits for the GPU as the driver does by
// default unless Options.BlockingWait asks it to sleep, also after a
// device that blocked (the flags outlive the context). (An importer sets
// its contexts the same way, through the same call; in this process the
// device's context is active already, so only another process could tell
// them apart.)
func TestGPUWait(t *testing.T) {
	for _, block := range []bool{false, true, false} {
		want := ctxSchedAuto
		if block {
			want = ctxSchedBlockingSync
		}
		d := openDevice(t, Options{BlockingWait: block})
		if got := schedFlags(d.cu, d.dev); got != want {
			t.Errorf("BlockingWait %v: the primary context's scheduling flags are %#x, want %#x", block, got, want)
		}
		b := alloc(t, d, 1<<20)
		in := pattern(9, 1<<20)
		if err := b.WriteAt(in, 0); err != nil {
			t.Fatal(err)
		}
		out := make([]byte, len(in))
		if err := b.ReadAt(out, 0); err != nil || !bytes.Equal(in, out) {
			t.Fatalf("BlockingWait %v: read back %v, equal %v", block, err, bytes.Equal(in, out))
		}
		b.Free()
		d.Close()
	}
}

// schedFlags returns the scheduling flags of dev's primary context
// (ctxSchedAuto, ctxSchedBlockingSync, ...), -1 where the driver cannot say.
func schedFlags(d *driver, dev cuDevice) int {
	if d.cuDevicePrimaryCtxGetState == nil {
		return -1
	}
	var flags uint32
	var active int32
	if d.cuDevicePrimaryCtxGetState(dev, &flags, &active) != cuSuccess {
		return -1
	}
	return int(flags & ctxSchedMask)
}

// TestGPURunCost prints what one Run costs the host agent: wall time and
// this process's CPU time per run of each built-in model, at the bench's
// input sizes, with the driver's default wait (spin) and BlockingWait.
func TestGPURunCost(t *testing.T) {
	const maxRuns = 2000
	for _, block := range []bool{false, true} {
		d := openDevice(t, Options{BlockingWait: block})
		for _, name := range []string{"checksum", "mlp"} {
			m, err := model.Builtin(name)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range []int{4 << 10, 64 << 10, 1 << 20} {
				in := alloc(t, d, n)
				out := alloc(t, d, max(m.OutputSize(n), 1))
				if err := in.WriteAt(pattern(5, n), 0); err != nil {
					t.Fatal(err)
				}
				if _, err := d.Run(m, in, n, out); err != nil { // warm up
					t.Fatal(err)
				}
				// At least 20 runs and 300 ms, at most 2000 runs: a GPU
				// does 2000; the fake libcuda's C kernels take longer.
				cpu0, start := cpuTime(t), time.Now()
				k := 0
				for ; k < maxRuns && (k < 20 || time.Since(start) < 300*time.Millisecond); k++ {
					if _, err := d.Run(m, in, n, out); err != nil {
						t.Fatal(err)
					}
				}
				wall, cpu := time.Since(start)/time.Duration(k), (cpuTime(t)-cpu0)/time.Duration(k)
				t.Logf("BlockingWait %-5v %-8s %8s: %6.1f µs wall, %6.1f µs CPU per run (%d runs)", block, name, farSize(n),
					float64(wall)/1e3, float64(cpu)/1e3, k)
			}
		}
		d.Close()
	}
}

// cpuTime is this process's user and system time so far.
func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
