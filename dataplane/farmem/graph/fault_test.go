package graph

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestFaultIsError runs every app over a graph image whose edge array
// cannot be read (its pages made inaccessible, the stand-in here for a
// far-memory chunk the host agent poisoned; TestFarMemoryLost has the real
// one): each run ends with an error wrapping ErrFarMemory, whether the
// fault hits an engine worker or the app's own goroutine, and a fault
// outside the graph's bytes still panics.
func TestFaultIsError(t *testing.T) {
	n, edges, _ := RMAT(12, 8, 3)
	_, img := build(t, n, edges, true)
	page := os.Getpagesize()
	mem, err := unix.Mmap(-1, 0, len(img), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	copy(mem, img)
	g, err := Open(mem)
	if err != nil {
		t.Fatal(err)
	}
	e := g.Edges()[0]
	lo := (int(e.Offset) + page - 1) / page * page
	hi := int(e.Offset+e.Size) / page * page
	if hi-lo < 4*page {
		t.Fatalf("edge array [%d, %d) spans too few whole pages", e.Offset, e.Offset+e.Size)
	}
	if err := unix.Mprotect(mem[lo:hi], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	for _, app := range Apps {
		for _, workers := range []int{1, 4} {
			_, err := Run(t.Context(), NewEngine(g, Options{Workers: workers}), app, Params{Source: -1, Samples: 4, BCSources: 2})
			if !errors.Is(err, ErrFarMemory) {
				t.Errorf("%s, %d workers: %v, want an error wrapping ErrFarMemory", app, workers, err)
			}
		}
	}

	// A fault elsewhere is not the graph's to report.
	other, err := unix.Mmap(-1, 0, page, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(other) })
	eng := NewEngine(g, Options{Workers: 1})
	defer func() {
		if recover() == nil {
			t.Error("a fault outside the graph's bytes did not panic")
		}
	}()
	eng.guarded(func() error { faultSink = other[7]; return nil })
}

// faultSink keeps the compiler from dropping a read made to fault.
var faultSink byte
