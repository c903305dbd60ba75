package main

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// counter is a minimal XDP program that counts every frame in a per-CPU
// array and returns a fixed verdict. As XDP_DROP on dut's ingress it is the
// floor: the cost of getting a frame to XDP at all. On the sink's veth it
// counts redirected frames (and, being an XDP program, makes veth deliver
// them: see docs/steering.md).
type counter struct {
	prog *ebpf.Program
	m    *ebpf.Map
}

func newCounter(name string, verdict int32) (*counter, error) {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		return nil, fmt.Errorf("counter %s: map: %w", name, err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:    name,
		Type:    ebpf.XDP,
		License: "Dual BSD/GPL",
		Instructions: asm.Instructions{
			// key = 0 on the stack; r0 = lookup(map, &key)
			asm.StoreImm(asm.RFP, -4, 0, asm.Word),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -4),
			asm.LoadMapPtr(asm.R1, m.FD()),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "out"),
			// (*r0)++: per-CPU, so no atomic needed
			asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
			asm.Add.Imm(asm.R1, 1),
			asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
			asm.Mov.Imm(asm.R0, verdict).WithSymbol("out"),
			asm.Return(),
		},
	})
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("counter %s: load: %w", name, err)
	}
	return &counter{prog: prog, m: m}, nil
}

// read sums the per-CPU counts.
func (c *counter) read() (uint64, error) {
	var per []uint64
	if err := c.m.Lookup(uint32(0), &per); err != nil {
		return 0, fmt.Errorf("read counter: %w", err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n, nil
}

func (c *counter) Close() {
	c.prog.Close()
	c.m.Close()
}
