package farmem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
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

// TestAgentWorkers: an agent with two host-facing transports (two workers,
// as with two AF_XDP queues) and two fabric transports serves a client on
// each; every worker forwards and completes its own requests.
func TestAgentWorkers(t *testing.T) {
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	hosts := []transport.Transport{listen(t, loopback), listen(t, loopback)}
	fabric := []transport.Transport{listen(t, loopback), listen(t, loopback)}
	agent, err := NewAgent(AgentConfig{Config: testConfig(), Servers: []ServerSpec{{Addr: srv.Addr()}}},
		AgentOptions{HostTransports: hosts, FabricTransports: fabric})
	if err != nil {
		t.Fatal(err)
	}
	run(t, agent.Run)
	var wg sync.WaitGroup
	for i, h := range hosts {
		c := newClient(t, h.LocalAddr(), 2)
		r, err := c.Alloc(context.Background(), 512<<10)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); workload(t, r, uint64(30+i), 2, 5) }()
	}
	wg.Wait()
	st := agent.Stats()
	if st.Host.RXDatagrams == 0 || st.Errors != (ErrorCounts{}) {
		t.Fatalf("agent %+v", st)
	}
	// A read the client retransmitted after the agent had answered it
	// (reads' replies are not kept) is forwarded again and may still be
	// on its way when the workload ends: wait for the fabric to drain.
	for i, f := range agent.fabric {
		waitFor(t, fmt.Sprintf("fabric transport %d to drain", i), func() bool {
			f.mu.Lock()
			defer f.mu.Unlock()
			return len(f.pending) == 0
		})
		f.mu.Lock()
		batches := f.batches
		f.mu.Unlock()
		if batches == 0 {
			t.Errorf("fabric transport %d sent no task batches", i)
		}
	}
}
