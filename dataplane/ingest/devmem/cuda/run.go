package cuda

import (
	"fmt"
	"unsafe"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
)

// blocksPerSM bounds the checksum grid: enough blocks to fill every SM,
// few enough that one atomic add per block costs nothing.
const blocksPerSM = 8

// Run implements devmem.Device with the embedded kernels of the built-in
// models; the output stays in out on the device. External models are not
// the CUDA runner's: their own process reads the buffer.
func (d *Device) Run(m *model.Model, in devmem.Buffer, inLen int, out devmem.Buffer) (int, error) {
	ib, ok1 := in.(*buffer)
	ob, ok2 := out.(*buffer)
	if !ok1 || !ok2 || ib.d != d || ob.d != d {
		return 0, fmt.Errorf("cuda run %s: buffers of another device", m.Name)
	}
	if m.External || m.Reference == nil {
		return 0, fmt.Errorf("cuda run %s: an external model is not supported by the CUDA runner (it has kernels for %v only); serve it from a process attached to the host agent", m.Name, model.BuiltinNames())
	}
	if err := devmem.CheckRange(0, inLen, ib.size); err != nil {
		return 0, fmt.Errorf("cuda run %s: input: %w", m.Name, err)
	}
	if err := m.Check(inLen); err != nil {
		return 0, err
	}
	n := m.OutputSize(inLen)
	if n > ob.size {
		return 0, fmt.Errorf("cuda run %s: output of %d bytes does not fit the %d-byte output buffer", m.Name, n, ob.size)
	}
	var run func() error
	switch m.Name {
	case "checksum":
		run = func() error { return d.checksum(ib, inLen, ob) }
	case "mlp":
		run = func() error { return d.mlp(ib, inLen, ob) }
	default:
		return 0, fmt.Errorf("cuda run %s: no kernel for this model", m.Name)
	}
	err := d.t.do(func() error {
		if err := ib.live(); err != nil {
			return err
		}
		if err := ob.live(); err != nil {
			return err
		}
		return run()
	})
	if err != nil {
		return 0, fmt.Errorf("cuda run %s: %w", m.Name, err)
	}
	return n, nil
}

// checksum runs on the thread.
func (d *Device) checksum(in *buffer, n int, out *buffer) error {
	cu := d.cu
	if err := cu.check("cuMemsetD8_v2", cu.cuMemsetD8(out.ptr, 0, model.ChecksumLen)); err != nil {
		return err
	}
	words := uint64(n / 4)
	blocks := max(1, min((words+threadsPerBlock-1)/threadsPerBlock, uint64(d.sms*blocksPerSM)))
	inPtr, size, outPtr := in.ptr, uint64(n), out.ptr
	return launch(cu, d.kernels.checksum, uint32(blocks),
		unsafe.Pointer(&inPtr), unsafe.Pointer(&size), unsafe.Pointer(&outPtr))
}

// mlp runs on the thread.
func (d *Device) mlp(in *buffer, n int, out *buffer) error {
	rows := uint64(n / (model.MLPIn * 4))
	blocks := (rows + mlpRowsPerBlock - 1) / mlpRowsPerBlock
	inPtr, weights, outPtr := in.ptr, d.kernels.weights, out.ptr
	return launch(d.cu, d.kernels.mlp, uint32(blocks),
		unsafe.Pointer(&inPtr), unsafe.Pointer(&rows), unsafe.Pointer(&weights), unsafe.Pointer(&outPtr))
}
