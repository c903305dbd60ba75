package fmap

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// The storm program's shape: more faulting goroutines than Ps, a buffer of
// a third of the region (so faults also wait for evictions), and the GC
// stopping the world in a loop.
const (
	stormProcs      = 2
	stormGoroutines = 32
	stormSize       = 32 << 20
	stormPasses     = 3
)

// TestFaultStorm proves the design does not need the faulting program's Go
// scheduler: goroutines (8 per P) fault at once while another goroutine runs
// runtime.GC in a loop. With the handler in the program's process a
// stop-the-world can wait forever for a P whose thread sleeps in a fault;
// here the handler is another process. The 60 s bound detects a deadlock; it
// is not a performance assertion.
func TestFaultStorm(t *testing.T) {
	a := startAgent(t)
	a.add(1, NewMemBackend(stormSize))
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	out := runHelper(t, ctx, "storm", "FMAP_SOCK="+a.sock)
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "STORM") {
			t.Log(l)
		}
	}
}

// TestFaultStormInProcessControl is the negative control: the same storm
// with the agent as a goroutine of the faulting program must not finish,
// or TestFaultStorm could not tell the designs apart. It does not: the
// goroutines asleep in faults keep both Ps (until the sysmon preempts them,
// and then they fault again) and the handler goroutine waits in the run
// queue, even without the GC loop (FMAP_NOGC=1; see docs/farmem-mapping.md).
func TestFaultStormInProcessControl(t *testing.T) {
	if testing.Short() {
		t.Skip("waits 15 s for a deadlock")
	}
	testenv.RequirePriv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), helperEnv+"=storm", "FMAP_INPROC=1",
		"FMAP_SOCK="+filepath.Join(t.TempDir(), "inproc.sock"))
	out, err := cmd.CombinedOutput()
	if ctx.Err() == nil {
		t.Fatalf("the storm with an in-process handler ended (%v) instead of deadlocking; "+
			"TestFaultStorm no longer proves the out-of-process design:\n%s", err, out)
	}
	t.Logf("in-process handler: no progress in 15 s, killed (%v), as expected", err)
}

func helperStorm() error {
	runtime.GOMAXPROCS(stormProcs)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sock := os.Getenv("FMAP_SOCK")
	if os.Getenv("FMAP_INPROC") == "1" {
		// The negative control: the agent as a goroutine of the faulting
		// program, the design the package forbids.
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
		if err != nil {
			return err
		}
		be := NewMemBackend(stormSize)
		go Serve(ctx, ln, func(context.Context, RegionRef) (Backend, error) { return be, nil })
	}
	m, err := Map(ctx, sock, RegionRef{ID: 1, Name: "storm"}, Options{})
	if err != nil {
		return err
	}
	b := m.Bytes()
	page := os.Getpagesize()
	pages := len(b) / page

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	gcDone := make(chan struct{})
	gcStop := make(chan struct{})
	noGC := os.Getenv("FMAP_NOGC") == "1"
	go func() {
		defer close(gcDone)
		for !noGC {
			select {
			case <-gcStop:
				return
			default:
				runtime.GC()
			}
		}
	}()

	start := time.Now()
	errs := make(chan error, stormGoroutines)
	var wg sync.WaitGroup
	for g := range stormGoroutines {
		wg.Go(func() {
			// Goroutine g owns pages p with p%stormGoroutines == g, walks
			// them in an order that differs per goroutine, writes its mark,
			// then checks all of them: faults, WP faults and evictions
			// interleave across goroutines.
			for pass := range stormPasses {
				mark := byte(g*stormPasses + pass + 1)
				for i := range pages / stormGoroutines {
					p := ((i*7+g*13)%(pages/stormGoroutines))*stormGoroutines + g
					_ = b[(p+1)%pages*page] // a read fault on someone else's page
					b[p*page+g] = mark
				}
				for p := g; p < pages; p += stormGoroutines {
					if got := b[p*page+g]; got != mark {
						errs <- fmt.Errorf("goroutine %d pass %d: page %d holds %d, want %d", g, pass, p, got, mark)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(gcStop)
	<-gcDone
	runtime.ReadMemStats(&after)
	close(errs)
	for err := range errs {
		return err
	}
	gcs := after.NumGC - before.NumGC
	fmt.Printf("STORM %d goroutines on %d Ps touched %d pages %d times in %v while %d GCs ran\n",
		stormGoroutines, stormProcs, pages, stormPasses, elapsed, gcs)
	// A cycle stops the world at least twice, and each stop waits for every
	// goroutine, those asleep in a fault too: cycles completing while the
	// storm runs is the property. How many depends on the machine's load.
	if gcs < 2 && !noGC {
		return fmt.Errorf("only %d GC cycles completed during the storm: the test did not exercise stop-the-world", gcs)
	}
	return m.Close()
}
