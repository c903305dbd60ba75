package fmap

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/control/testenv"
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

// TestAcceptErrors: an accept that fails for want of descriptors (EMFILE)
// is retried, so a program that connects meanwhile, and one that maps
// after, get their mappings while another mapping lives; an accept error
// no retry fixes (the listener closed under the agent) makes Serve close
// the listener, end the live mappings and return the error, for
// lovelockd's supervisor to report and restart. (Before, Serve stopped
// accepting on the first error and then waited for every live mapping to
// end: new programs hung in the backlog, and Serve did not return.)
func TestAcceptErrors(t *testing.T) {
	t.Run("temporary", func(t *testing.T) {
		a := startAgent(t)
		a.add(1, NewMemBackend(1<<20))
		a.add(2, NewMemBackend(1<<20))
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		m, err := Map(ctx, a.sock, RegionRef{ID: 1}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()

		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		var old unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
			t.Fatal(err)
		}
		// No descriptor above fd can be had: the agent's accept fails
		// with EMFILE, and the connection waits in the backlog.
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: uint64(fd + 1), Max: old.Max}); err != nil {
			t.Fatal(err)
		}
		cerr := unix.Connect(fd, &unix.SockaddrUnix{Name: a.sock})
		time.Sleep(200 * time.Millisecond)
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
			t.Fatal(err)
		}
		if cerr != nil {
			t.Fatal(cerr)
		}

		mctx, mcancel := context.WithTimeout(ctx, 5*time.Second)
		defer mcancel()
		m2, err := Map(mctx, a.sock, RegionRef{ID: 2}, Options{})
		if err != nil {
			t.Fatalf("Map after a failed accept: %v", err)
		}
		if err := m2.Close(); err != nil {
			t.Fatal(err)
		}
		a.log.wait(t, "too many open files")
	})

	t.Run("fatal", func(t *testing.T) {
		testenv.RequirePriv(t)
		sock := filepath.Join(t.TempDir(), "agent.sock")
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		agent := &Agent{Logger: slog.New(slog.NewTextHandler(tbWriter{t, &logLines{}}, nil))}
		go func() {
			done <- agent.Serve(t.Context(), ln, func(context.Context, RegionRef) (Backend, error) { return NewMemBackend(1 << 20), nil })
		}()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		m, err := Map(ctx, sock, RegionRef{ID: 1}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		ln.Close() // Accept fails with net.ErrClosed: nothing to retry
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "accept") {
				t.Fatalf("Serve returned %v, want the accept error", err)
			}
			t.Logf("Serve: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("Serve did not return after a fatal accept error while a mapping lived")
		}
		// The agent ended the mapping: the program's Close cannot reach it.
		if err := m.Close(); err == nil {
			t.Fatal("Close of a mapping the agent ended succeeded")
		}
	})
}
