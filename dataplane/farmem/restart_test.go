package farmem

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
)

// TestServerRestart: every acknowledged write is read back exactly after
// the memory node restarts on the same state directory and address, and
// the writer's lease survives the restart: the writer goes on writing, a
// second writer is refused until the first closes.
func TestServerRestart(t *testing.T) {
	dir := t.TempDir()
	srv, run1 := startServer(t, dir, listen(t, loopback))
	addr := srv.Addr()
	agent, _ := startAgent(t, listen(t, loopback), []netip.AddrPort{addr}, nil)
	c := newClient(t, agent.Addr(), 4)
	ctx := context.Background()
	r, err := c.Alloc(ctx, 512<<10)
	if err != nil {
		t.Fatal(err)
	}
	shadow := make([]byte, r.Size())
	rng := rand.New(rand.NewPCG(3, 4))
	write := func(n int) {
		for range n {
			p := make([]byte, 1+rng.IntN(100<<10))
			off := rng.IntN(len(shadow) - len(p))
			for i := range p {
				p[i] = byte(rng.Uint32())
			}
			if _, err := r.WriteAt(p, int64(off)); err != nil {
				t.Fatal(err)
			}
			copy(shadow[off:], p)
		}
	}
	write(20)
	run1.stop()
	srv2, _ := startServer(t, dir, listen(t, addr))
	if got := srv2.List(0); len(got) != 1 || got[0].ID != r.ID() || got[0].Size != uint64(len(shadow)) {
		t.Fatalf("after restart the server lists %+v", got)
	}
	checkRegion(t, r, shadow)
	other := newClient(t, agent.Addr(), 4)
	if _, err := other.Open(ctx, r.ID(), true); !errors.Is(err, ErrWriterBusy) {
		t.Fatalf("a second writer after the restart: %v, want ErrWriterBusy", err)
	}
	write(20)
	checkRegion(t, r, shadow)
	if err := r.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	r2, err := other.Open(ctx, r.ID(), true)
	if err != nil {
		t.Fatalf("the second writer once the first closed: %v", err)
	}
	if _, err := r2.WriteAt([]byte{1}, 0); err != nil {
		t.Fatal(err)
	}
}

// TestAgentRestart: the DPU agent is stopped while four writers are busy
// and a new one starts on the same address. Every write either completes
// (the client retransmits to the new agent) or fails with an error; every
// acknowledged write is there afterwards.
func TestAgentRestart(t *testing.T) {
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	host := listen(t, loopback)
	agentAddr := host.LocalAddr()
	_, run1 := startAgent(t, host, []netip.AddrPort{srv.Addr()}, nil)
	c := newClient(t, agentAddr, 4)
	r, err := c.Alloc(context.Background(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	shadow := make([]byte, r.Size())
	known := make([]bool, r.Size()) // false where a failed write left old or new bytes
	for i := range known {
		known[i] = true
	}
	var acked, failed atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	halfway := make(chan struct{})
	var once sync.Once
	const writers, ops = 4, 30
	stripe := len(shadow) / writers
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 77))
			for i := range ops {
				if i == ops/3 {
					once.Do(func() { close(halfway) })
				}
				p := make([]byte, 1+rng.IntN(80<<10))
				off := g*stripe + rng.IntN(stripe-len(p))
				for j := range p {
					p[j] = byte(rng.Uint32())
				}
				_, err := r.WriteAt(p, int64(off))
				mu.Lock()
				if err == nil {
					acked.Add(1)
					copy(shadow[off:], p)
					for j := off; j < off+len(p); j++ {
						known[j] = true
					}
				} else {
					failed.Add(1)
					if !errors.Is(err, ErrUnavailable) {
						t.Errorf("write failed with %v, want ErrUnavailable", err)
					}
					for j := off; j < off+len(p); j++ {
						known[j] = false
					}
				}
				mu.Unlock()
			}
		}()
	}
	<-halfway
	run1.stop()
	a2, _ := startAgent(t, listen(t, agentAddr), []netip.AddrPort{srv.Addr()}, nil)
	wg.Wait()
	t.Logf("%d writes acknowledged, %d failed; new agent: %+v", acked.Load(), failed.Load(), a2.Stats())
	if a2.Stats().HostRequests == 0 {
		t.Fatal("the new agent served nothing: the test restarted nothing")
	}
	got := make([]byte, len(shadow))
	if _, err := r.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if known[i] && got[i] != shadow[i] {
			t.Fatal(fmt.Errorf("byte %d: %d, acknowledged %d", i, got[i], shadow[i]))
		}
	}
}
