package farmem

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
)

// TestTwoClientsOneAgent: two host processes share one DPU agent. Each
// allocates a region and works on it concurrently; the second writer on a
// region is refused with ErrWriterBusy while readers are many; once the
// writer closes, the other client gets the lease.
func TestTwoClientsOneAgent(t *testing.T) {
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	agent, _ := startAgent(t, listen(t, loopback), []netip.AddrPort{srv.Addr()}, nil)
	ctx := context.Background()
	a, b := newClient(t, agent.Addr(), 9), newClient(t, agent.Addr(), 9)
	ra, err := a.Alloc(ctx, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := b.Alloc(ctx, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i, r := range []*Region{ra, rb} {
		wg.Add(1)
		go func() { defer wg.Done(); workload(t, r, uint64(10+i), 2, 6) }()
	}
	wg.Wait()

	if _, err := b.Open(ctx, ra.ID(), true); !errors.Is(err, ErrWriterBusy) {
		t.Fatalf("second writer on region %d: %v, want ErrWriterBusy", ra.ID(), err)
	}
	want := []byte("written by a")
	if _, err := ra.WriteAt(want, 100); err != nil {
		t.Fatal(err)
	}
	readers := []*Region{}
	for range 2 {
		r, err := b.Open(ctx, ra.ID(), false)
		if err != nil {
			t.Fatalf("reader: %v", err)
		}
		readers = append(readers, r)
	}
	for _, r := range readers {
		got := make([]byte, len(want))
		if _, err := r.ReadAt(got, 100); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("reader got %q, %v", got, err)
		}
		if _, err := r.WriteAt(want, 0); !errors.Is(err, ErrNotWriter) {
			t.Fatalf("write through a reader: %v, want ErrNotWriter", err)
		}
	}
	if err := ra.Close(); err != nil {
		t.Fatal(err)
	}
	rb2, err := b.Open(ctx, ra.ID(), true)
	if err != nil {
		t.Fatalf("writer after the first closed: %v", err)
	}
	if _, err := rb2.WriteAt([]byte("now b"), 100); err != nil {
		t.Fatal(err)
	}
	if _, err := ra.WriteAt(want, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("write through a closed region: %v, want ErrClosed", err)
	}
	st := agent.Stats()
	t.Logf("agent: %+v", st)
	if st.Errors.WriterBusy != 1 {
		t.Errorf("writer_busy %d, want 1", st.Errors.WriterBusy)
	}
	if st.Host.Requests == 0 || st.ReadBytes == 0 || st.WriteBytes == 0 || st.Latency.Count == 0 {
		t.Errorf("counters missing: %+v", st)
	}
}
