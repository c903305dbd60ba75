package bpf

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// TestSpecContract: the committed object agrees with the Go constants, and
// a drift on either side is caught before load with a message naming the
// constant to fix. Needs no privileges: it reads the object only.
func TestSpecContract(t *testing.T) {
	spec, err := loadSteer()
	if err != nil {
		t.Fatal(err)
	}
	if err := checkSpec(spec); err != nil {
		t.Fatalf("committed object: %v", err)
	}
	for _, l := range steerLimits(spec) {
		t.Run(l.mapName, func(t *testing.T) {
			drift := spec.Copy()
			ms := drift.Maps[l.mapName]
			if l.inner {
				ms = ms.InnerMap
			}
			ms.MaxEntries *= 2
			err := checkSpec(drift)
			if err == nil {
				t.Fatalf("%s doubled in the object: checkSpec passed", l.mapName)
			}
			for _, want := range []string{l.mapName, l.cName, l.goName, fmt.Sprint(ms.MaxEntries), "make generate"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}
	t.Run("value size", func(t *testing.T) {
		drift := spec.Copy()
		drift.Maps[steerMapShapesets].ValueSize += 8
		if err := checkSpec(drift); err == nil || !strings.Contains(err.Error(), steerMapShapesets) {
			t.Fatalf("shapeset grown by 8 bytes in the object: checkSpec said %v", err)
		}
	})
}

// TestEnumsFromBTF: the Go names of C enums and limits are the generated
// values, and every counter has a name.
func TestEnumsFromBTF(t *testing.T) {
	if MaxShapes != 32 || len(shapeset{}.Shapes) != MaxShapes {
		t.Errorf("MaxShapes = %d, the generated shapeset holds %d", MaxShapes, len(shapeset{}.Shapes))
	}
	for s := Stat(0); s < NumStats; s++ {
		if name := s.String(); name == "" || strings.HasPrefix(name, "stat(") {
			t.Errorf("counter %d has no name", s)
		}
	}
	if NumStats.String() != fmt.Sprintf("stat(%d)", NumStats) {
		t.Errorf("NumStats names a counter: %s", NumStats)
	}
	for a, want := range map[Action]string{ActionPass: "pass", ActionDrop: "drop", ActionRedirect: "redirect", ActionXSK: "xsk"} {
		if a.String() != want {
			t.Errorf("action %d is %q, want %q", a, a, want)
		}
	}
	if ActionPass != 0 || ActionXSK != 3 || StatRX != 0 || StatXSKMiss != 9 {
		t.Errorf("enum values moved: pass %d xsk %d rx %d xsk_miss %d; rule files and metrics name them, check docs/steering.md", ActionPass, ActionXSK, StatRX, StatXSKMiss)
	}
}

// TestLoadErrorUnwraps: a refused load unwraps to the verifier's error, and
// its message keeps the whole log.
func TestLoadErrorUnwraps(t *testing.T) {
	cause := &ebpf.VerifierError{Cause: os.ErrPermission, Log: []string{"0: (b7) r0 = 0", "1: R0 !read_ok", "processed 2 insns"}}
	var err error = fmt.Errorf("attach: %w", &LoadError{Object: "steer", Err: fmt.Errorf("program xdp_steer: %w", cause)})
	var ve *ebpf.VerifierError
	if !errors.As(err, &ve) || ve != cause {
		t.Fatalf("errors.As found no *ebpf.VerifierError in %v", err)
	}
	if !errors.Is(err, os.ErrPermission) {
		t.Errorf("errors.Is(%v, os.ErrPermission) = false", err)
	}
	for _, line := range cause.Log {
		if !strings.Contains(err.Error(), line) {
			t.Errorf("message lacks log line %q: %s", line, err)
		}
	}
}

// TestLoadVerifierError: a program the verifier rejects fails Load with an
// error that errors.As finds the *ebpf.VerifierError in, and that carries
// the verifier's log.
func TestLoadVerifierError(t *testing.T) {
	testenv.RequirePriv(t)
	spec, err := loadSteer()
	if err != nil {
		t.Fatal(err)
	}
	// Read far past the end of struct xdp_md: the verifier refuses it.
	spec.Programs[steerProgXdpPass].Instructions = asm.Instructions{
		asm.LoadMem(asm.R0, asm.R1, 4000, asm.Word),
		asm.Return(),
	}
	s, err := load(spec, Options{})
	if err == nil {
		s.Close()
		t.Fatal("a program reading past its context loaded")
	}
	var le *LoadError
	var ve *ebpf.VerifierError
	if !errors.As(err, &le) || !errors.As(err, &ve) {
		t.Fatalf("errors.As found no *LoadError and *ebpf.VerifierError in %v", err)
	}
	if len(ve.Log) == 0 || !strings.Contains(err.Error(), ve.Log[0]) {
		t.Errorf("message lacks the verifier log %q: %v", ve.Log, err)
	}
}
