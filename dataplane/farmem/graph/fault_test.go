package graph

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/dataplane/farmem/fmap"
)

// TestFaultIsError runs every app over a graph image whose edge array
// cannot be read (its pages made inaccessible, the stand-in here for a
// far-memory chunk the host agent poisoned; TestFarMemoryLost has the real
// one): each run ends with an error wrapping ErrFarMemory, whether the
// fault hits an engine worker or the app's own goroutine, and a fault
// outside the graph's bytes still panics.
func TestFaultIsError(t *testing.T) {
	g, mem := mappedGraph(t)
	e := g.Edges()[0]
	unreadable(t, mem, e.Offset, e.Offset+e.Size)
	for _, app := range Apps {
		for _, workers := range []int{1, 4} {
			_, err := Run(t.Context(), NewEngine(g, Options{Workers: workers}), app, Params{Source: -1, Samples: 4, BCSources: 2})
			if !errors.Is(err, ErrFarMemory) {
				t.Errorf("%s, %d workers: %v, want an error wrapping ErrFarMemory", app, workers, err)
			}
		}
	}

	// A fault elsewhere is not the graph's to report.
	page := os.Getpagesize()
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

// TestFaultInHintsIsError is TestFaultIsError with a Hinter and the second
// half of the offsets unreadable: the hints, computed from the offsets
// ahead of the workers, meet the fault first, and it must end the run with
// ErrFarMemory too, not crash the program.
func TestFaultInHintsIsError(t *testing.T) {
	g, mem := mappedGraph(t)
	o := g.Offsets()[0]
	unreadable(t, mem, o.Offset+o.Size/2, o.Offset+o.Size)
	for _, app := range Apps {
		for _, workers := range []int{1, 4} {
			_, err := Run(t.Context(), NewEngine(g, Options{Workers: workers, Hints: nopHinter{}}), app,
				Params{Source: -1, Samples: 4, BCSources: 2})
			if !errors.Is(err, ErrFarMemory) {
				t.Errorf("%s, %d workers: %v, want an error wrapping ErrFarMemory", app, workers, err)
			}
		}
	}
}

type nopHinter struct{}

func (nopHinter) Hint([]fmap.Extent) {}

// mappedGraph returns an R-MAT graph opened over an anonymous mapping of its
// image, whose pages a test may make unreadable.
func mappedGraph(t *testing.T) (*Graph, []byte) {
	n, edges, _ := RMAT(12, 8, 3)
	_, img := build(t, n, edges, true)
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
	return g, mem
}

// unreadable makes the whole pages of mem[from:to) inaccessible.
func unreadable(t *testing.T, mem []byte, from, to int64) {
	page := int64(os.Getpagesize())
	lo := (from + page - 1) / page * page
	hi := to / page * page
	if hi-lo < 2*page {
		t.Fatalf("[%d, %d) spans too few whole pages", from, to)
	}
	if err := unix.Mprotect(mem[lo:hi], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
}

// faultSink keeps the compiler from dropping a read made to fault.
var faultSink byte
