package farmem

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
)

// newClientTTL is newClient with its own lease TTL (renewals at a third of
// it) and transport.
func newClientTTL(t testing.TB, server netip.AddrPort, tenant uint32, ttl time.Duration, tr transport.Transport) *Client {
	t.Helper()
	cfg := testConfig()
	cfg.LeaseTTL = Duration(ttl)
	c, err := NewClient(ClientOptions{Config: cfg, Server: server, Tenant: tenant, Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// leaseServer starts a memory node in dir whose leases live an hour of
// clock.
func leaseServer(t *testing.T, dir string, clock *fakeClock, tr transport.Transport) (*Server, *running) {
	t.Helper()
	cfg := testConfig()
	cfg.LeaseTTL = Duration(time.Hour)
	s, err := NewServer(ServerOptions{Config: cfg, StateDir: dir, Capacity: 1 << 20, Transport: tr, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return s, run(t, s.Run)
}

// takeOver lets A's lease lapse, then has another writer open the region,
// write b's bytes at 0 and close it.
func takeOver(t *testing.T, clock *fakeClock, addr netip.AddrPort, id uint32, b []byte) {
	t.Helper()
	clock.Advance(time.Hour + time.Second)
	other := newClientTTL(t, addr, 2, time.Hour, listen(t, loopback))
	r, err := other.Open(context.Background(), id, true)
	if err != nil {
		t.Fatalf("the second writer after the first's lease lapsed: %v", err)
	}
	if _, err := r.WriteAt(b, 0); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// checkLost checks that writer a, whose lease another writer got, neither
// writes nor syncs, says so, and that the other writer's bytes b are
// still at 0.
func checkLost(t *testing.T, a *Region, b []byte) {
	t.Helper()
	if _, err := a.WriteAt(make([]byte, 4096), 0); !errors.Is(err, ErrLeaseLost) || !errors.Is(err, ErrWriterBusy) {
		t.Fatalf("stale writer's write after another writer held the region: %v, want ErrLeaseLost (and ErrWriterBusy)", err)
	}
	if _, err := a.WriteAt([]byte{1}, 100); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("stale writer's next write: %v, want ErrLeaseLost", err)
	}
	if err := a.Sync(); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("stale writer's sync: %v, want ErrLeaseLost", err)
	}
	if err := a.Err(); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Err: %v, want ErrLeaseLost", err)
	}
	got := make([]byte, 4096)
	if _, err := a.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	want := append(append([]byte(nil), b...), make([]byte, 4096-len(b))...)
	if !bytes.Equal(got, want) {
		t.Fatalf("the other writer's acknowledged bytes now read %q", got[:len(b)+2])
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close of a handle that lost its lease: %v", err)
	}
}

// TestLeaseLostToAnotherWriter: a writer whose lease lapsed (its DPU agent
// was down for a TTL) while another writer opened, wrote and closed the
// region does not take the lease back silently: its next write fails with
// ErrLeaseLost instead of landing over the other writer's acknowledged
// bytes, and so do its later writes and Sync. The memory node remembers
// the last lease granted in leases.json, so a restart in between changes
// nothing.
func TestLeaseLostToAnotherWriter(t *testing.T) {
	for _, restart := range []bool{false, true} {
		name := "no restart"
		if restart {
			name = "server restarted"
		}
		t.Run(name, func(t *testing.T) {
			clock := &fakeClock{now: time.Unix(1e9, 0)}
			dir := t.TempDir()
			s, r1 := leaseServer(t, dir, clock, listen(t, loopback))
			addr := s.Addr()
			a := newClientTTL(t, addr, 2, time.Hour, listen(t, loopback)) // no renewal fires
			ra, err := a.Alloc(context.Background(), 4096)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ra.WriteAt([]byte("AAAA"), 0); err != nil {
				t.Fatal(err)
			}
			takeOver(t, clock, addr, ra.ID(), []byte("BBBBBBBB"))
			if restart {
				r1.stop()
				leaseServer(t, dir, clock, listen(t, addr))
			}
			checkLost(t, ra, []byte("BBBBBBBB"))
		})
	}
}

// TestLeaseRetaken: a writer whose lease lapsed, or was lost to a restart
// of a memory node whose leases.json was removed, takes it back at its
// next write when no other writer was granted the region meanwhile, and
// then holds it against others.
func TestLeaseRetaken(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	dir := t.TempDir()
	s, r1 := leaseServer(t, dir, clock, listen(t, loopback))
	addr := s.Addr()
	a := newClientTTL(t, addr, 2, time.Hour, listen(t, loopback))
	ra, err := a.Alloc(context.Background(), 4096)
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Hour + time.Second)
	if _, err := ra.WriteAt([]byte("lapsed"), 0); err != nil {
		t.Fatalf("write after the lease lapsed, no other writer: %v", err)
	}
	other := newClientTTL(t, addr, 2, time.Hour, listen(t, loopback))
	if _, err := other.Open(context.Background(), ra.ID(), true); !errors.Is(err, ErrWriterBusy) {
		t.Fatalf("a second writer once the first took its lease back: %v, want ErrWriterBusy", err)
	}
	r1.stop()
	if err := os.Remove(filepath.Join(dir, leasesName)); err != nil {
		t.Fatal(err)
	}
	leaseServer(t, dir, clock, listen(t, addr))
	if _, err := ra.WriteAt([]byte("forgot"), 0); err != nil {
		t.Fatalf("write after a restart that forgot the lease: %v", err)
	}
	if err := ra.Err(); err != nil {
		t.Fatalf("Err: %v", err)
	}
	if err := ra.Close(); err != nil {
		t.Fatal(err)
	}
}

// dropSends drops every datagram sent while drop is set: the host's DPU
// agent is down.
type dropSends struct {
	transport.Transport
	drop atomic.Bool
}

func (d *dropSends) Send(pkts []transport.Packet) (int, error) {
	if d.drop.Load() {
		return len(pkts), nil
	}
	return d.Transport.Send(pkts)
}

// TestRenewFindsLeaseLost: a writer cut off from the memory node for
// longer than the lease TTL, during which another writer held the region,
// learns from its next renewal that the lease is lost (Err, and its next
// write fails) instead of taking it back.
func TestRenewFindsLeaseLost(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	s, _ := leaseServer(t, t.TempDir(), clock, listen(t, loopback))
	tr := &dropSends{Transport: listen(t, loopback)}
	a := newClientTTL(t, s.Addr(), 2, 150*time.Millisecond, tr) // renews every 50 ms
	ra, err := a.Alloc(context.Background(), 4096)
	if err != nil {
		t.Fatal(err)
	}
	tr.drop.Store(true)
	takeOver(t, clock, s.Addr(), ra.ID(), []byte("BBBBBBBB"))
	tr.drop.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for ra.Err() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the renewals never found the lease lost")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if w := s.Stats().Writers; w != 0 {
		t.Fatalf("%d writer leases held after the stale writer's renewals, want 0", w)
	}
	checkLost(t, ra, []byte("BBBBBBBB"))
}
