package bpf

import (
	"bytes"
	"debug/elf"
	"embed"
	"encoding/binary"
	"fmt"
	"testing"
)

// committedObjects are the objects the bindings embed, embedded here too:
// the test binary also runs inside make image-bpf-test's guests, which
// have no source tree to open them from.
//
//go:embed steer_bpfel.o wirecheck/wirecheck_bpfel.o
var committedObjects embed.FS

// TestNoFallThroughBackEdge walks every function of the committed objects
// the way 6.1's check_cfg does and fails on the edge it refuses: a plain
// fall-through (from an instruction that is not a jump) into an
// instruction still on the walk's stack, "back-edge from insn N to N+1".
// 6.3 and later accept it, so the host's verifier cannot catch it (since
// 721def0 clang laid out skip_ipv6_ext's loop that way and every parsing
// program failed to load on 6.1); make image-bpf-test-older loads the
// objects on 6.1 itself.
func TestNoFallThroughBackEdge(t *testing.T) {
	for _, obj := range []string{"steer_bpfel.o", "wirecheck/wirecheck_bpfel.o"} {
		t.Run(obj, func(t *testing.T) {
			funcs, err := objectFuncs(obj)
			if err != nil {
				t.Fatal(err)
			}
			if len(funcs) == 0 {
				t.Fatalf("%s: no functions found", obj)
			}
			for _, f := range funcs {
				if err := checkCFG61(f.insns, f.entry); err != nil {
					t.Errorf("%s: %s (section %s): %v", obj, f.name, f.section, err)
				}
			}
		})
	}
}

// TestCheckCFG61 holds the walk itself against hand-written programs.
func TestCheckCFG61(t *testing.T) {
	const (
		mov  = 0xb7 // r0 = imm (ALU64 MOV K)
		jeq  = 0x15 // if r0 == imm goto +off
		ja   = 0x05
		exit = 0x95
	)
	ins := func(op byte, off int16) [8]byte {
		var b [8]byte
		b[0] = op
		binary.LittleEndian.PutUint16(b[2:], uint16(off))
		return b
	}
	for _, tc := range []struct {
		name  string
		insns [][8]byte
		ok    bool
	}{
		{"straight", [][8]byte{ins(mov, 0), ins(exit, 0)}, true},
		// 0: r0 = 0; 1: if r0 == 0 goto 4 (the loop's test); 2: r0 = 0;
		// 3: goto 1. The back-edge is a jump, which 6.1 accepts.
		{"jump back-edge", [][8]byte{ins(mov, 0), ins(jeq, 2), ins(mov, 0), ins(ja, -3), ins(exit, 0)}, true},
		// 0: goto 3; 1: r0 = 0; 2: r0 = 0; 3: if r0 == 0 goto 5 (the
		// loop's test); 4: goto 1; 5: exit. The latch (2) falls through
		// into the test, as clang laid out skip_ipv6_ext's loop.
		{"fall-through back-edge", [][8]byte{ins(ja, 2), ins(mov, 0), ins(mov, 0), ins(jeq, 1), ins(ja, -4), ins(exit, 0)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := make([]byte, 0, 8*len(tc.insns))
			for _, b := range tc.insns {
				raw = append(raw, b[:]...)
			}
			err := checkCFG61(raw, 0)
			if (err == nil) != tc.ok {
				t.Errorf("checkCFG61 = %v, want ok %v", err, tc.ok)
			}
		})
	}
}

type objFunc struct {
	name, section string
	insns         []byte // the whole section
	entry         int    // the function's first instruction in it
}

// objectFuncs returns the functions of the BPF object at path.
func objectFuncs(path string) ([]objFunc, error) {
	b, err := committedObjects.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s (make generate builds it): %w", path, err)
	}
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		return nil, fmt.Errorf("%s: symbols: %w", path, err)
	}
	var out []objFunc
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) != elf.STT_FUNC || int(s.Section) >= len(f.Sections) {
			continue
		}
		sec := f.Sections[s.Section]
		if sec.Flags&elf.SHF_EXECINSTR == 0 {
			continue
		}
		data, err := sec.Data()
		if err != nil {
			return nil, fmt.Errorf("%s: section %s: %w", path, sec.Name, err)
		}
		out = append(out, objFunc{name: s.Name, section: sec.Name, insns: data, entry: int(s.Value / 8)})
	}
	return out, nil
}

// checkCFG61 is 6.1's check_cfg (kernel/bpf/verifier.c) over one function
// of raw instructions starting at entry: a depth-first walk that takes an
// instruction's fall-through edge before its jump, and refuses an edge to
// an instruction still on the stack unless the edge comes from a jump
// (loop_ok). Calls are followed to the next instruction only; their
// targets are functions of their own.
func checkCFG61(raw []byte, entry int) error {
	n := len(raw) / 8
	const (
		discovered = 1
		explored   = 2
	)
	state := make([]uint8, n)
	type edge struct {
		to     int
		loopOK bool
	}
	edges := func(t int) []edge {
		code := raw[8*t]
		off := int(int16(binary.LittleEndian.Uint16(raw[8*t+2:])))
		class := code & 7
		if code == 0x18 { // ld_imm64: two slots
			return []edge{{t + 2, false}}
		}
		if class != 5 && class != 6 { // not BPF_JMP or BPF_JMP32
			return []edge{{t + 1, false}}
		}
		switch code & 0xf0 {
		case 0x90: // exit
			return nil
		case 0x80: // call
			return []edge{{t + 1, false}}
		case 0x00: // ja
			return []edge{{t + off + 1, true}}
		}
		return []edge{{t + 1, true}, {t + off + 1, true}}
	}
	stack := []int{entry}
	state[entry] = discovered
	for len(stack) > 0 {
		t := stack[len(stack)-1]
		pushed := false
		for _, e := range edges(t) {
			if e.to < 0 || e.to >= n {
				return fmt.Errorf("jump out of range from insn %d to %d", t, e.to)
			}
			switch state[e.to] {
			case 0:
				state[e.to] = discovered
				stack = append(stack, e.to)
				pushed = true
			case discovered:
				if !e.loopOK {
					return fmt.Errorf("back-edge from insn %d to %d (6.1 refuses a loop whose back-edge is a fall-through)", t-entry, e.to-entry)
				}
			}
			if pushed {
				break
			}
		}
		if !pushed {
			state[t] = explored
			stack = stack[:len(stack)-1]
		}
	}
	return nil
}
