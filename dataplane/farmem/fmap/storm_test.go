package fmap

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
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

func helperStorm() error {
	runtime.GOMAXPROCS(stormProcs)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := Map(ctx, os.Getenv("FMAP_SOCK"), RegionRef{ID: 1, Name: "storm"}, Options{})
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
	go func() {
		defer close(gcDone)
		for {
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
	if gcs < 10 {
		return fmt.Errorf("only %d GC cycles ran during the storm: the test did not exercise stop-the-world", gcs)
	}
	return m.Close()
}
