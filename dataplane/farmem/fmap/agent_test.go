package fmap

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// closingBackend is a region whose Close (the far-memory client's release
// of the writer lease) takes a round trip and may fail.
type closingBackend struct {
	*MemBackend
	closed  atomic.Bool
	failErr error
}

func (b *closingBackend) Close() error {
	time.Sleep(200 * time.Millisecond) // a release round trip to a slow DPU agent
	b.closed.Store(true)
	return b.failErr
}

// TestCloseReleasesBackend: a program's Close returns only after the agent
// has closed the mapping's backend (released the writer lease), so that a
// writable Map right after it is not refused as a second writer, and a
// release that fails is reported by Close. (Before, the agent answered
// Close first and closed the backend afterwards, its error unseen.)
func TestCloseReleasesBackend(t *testing.T) {
	a := startAgent(t)
	ok := &closingBackend{MemBackend: NewMemBackend(1 << 20)}
	bad := &closingBackend{MemBackend: NewMemBackend(1 << 20), failErr: errors.New("release lease: injected failure")}
	a.mu.Lock()
	a.advisors = map[uint64]Backend{1: ok, 2: bad}
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	// The program maps without touching the bytes: no fault is served in
	// this process.
	m, err := Map(ctx, a.sock, RegionRef{ID: 1}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !ok.closed.Load() {
		t.Fatal("Close returned before the agent closed the backend (released the writer lease)")
	}

	m, err = Map(ctx, a.sock, RegionRef{ID: 2}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = m.Close()
	if err == nil || !strings.Contains(err.Error(), "injected failure") {
		t.Fatalf("Close with a failing release: %v, want the release's error", err)
	}
	if !bad.closed.Load() {
		t.Fatal("Close returned before the agent closed the backend")
	}
}
