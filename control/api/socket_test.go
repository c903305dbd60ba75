package api_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// serveOn runs api.Serve on sock until the returned stop is called, which
// returns Serve's error.
func serveOn(t *testing.T, sock string) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- api.Serve(ctx, sock, api.Handler(&fakeService{})) }()
	cl := api.NewClient(sock)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := cl.Status(context.Background()); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("no answer on %s: %v", sock, err)
		}
	}
	var once bool
	stop = func() error {
		if once {
			return nil
		}
		once = true
		cancel()
		return <-done
	}
	t.Cleanup(func() { stop() })
	return stop
}

// TestSecondDaemonRefused: a second server on a socket a live one serves
// fails at once, naming the socket and the holder, and leaves the first one
// answering, also after it gave up.
func TestSecondDaemonRefused(t *testing.T) {
	testenv.RequirePriv(t) // the API answers root only
	sock := filepath.Join(t.TempDir(), "api.sock")
	serveOn(t, sock)

	_, err := api.Listen(sock)
	if !errors.Is(err, api.ErrSocketInUse) || !strings.Contains(err.Error(), sock) ||
		!strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("second Listen: err = %v, want ErrSocketInUse naming %s and pid %d", err, sock, os.Getpid())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := api.Serve(ctx, sock, api.Handler(&fakeService{})); !errors.Is(err, api.ErrSocketInUse) {
		t.Fatalf("second Serve: err = %v, want ErrSocketInUse", err)
	}
	if _, err := api.NewClient(sock).Status(context.Background()); err != nil {
		t.Fatalf("the first server no longer answers after the second gave up: %v", err)
	}
}

// TestStaleSocketReplaced: a socket file nobody listens on (a daemon that
// died) is removed and served.
func TestStaleSocketReplaced(t *testing.T) {
	testenv.RequirePriv(t)
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	if _, err := os.Lstat(sock); err != nil {
		t.Fatalf("stale socket not left behind: %v", err)
	}
	stop := serveOn(t, sock)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("own socket left behind after exit: %v", err)
	}
}

// TestExitLeavesOthersSocket: on exit a server removes its socket only if
// the path still holds it; a socket put there since stays.
func TestExitLeavesOthersSocket(t *testing.T) {
	testenv.RequirePriv(t)
	sock := filepath.Join(t.TempDir(), "api.sock")
	stop := serveOn(t, sock)
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	other, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(sock); err != nil {
		t.Errorf("exit removed a socket it did not create: %v", err)
	}
}

// TestNotASocket: a file that is not a socket is an error and stays.
func TestNotASocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "api.sock")
	if err := os.WriteFile(sock, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Listen(sock); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("Listen on a regular file: err = %v", err)
	}
	if b, err := os.ReadFile(sock); err != nil || string(b) != "keep" {
		t.Errorf("the file was touched: %q, %v", b, err)
	}
}

// TestClientSocketErrors: a client says what is wrong with its socket path.
// Before, a regular file or a directory there was "lovelockd is not
// running" (which lovelockd itself then refused: "not a socket"), and an
// empty path the raw "dial unix: missing address".
func TestClientSocketErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "dir")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	for _, tc := range []struct {
		name, path string
		is         error
		want       string
	}{
		{"regular file", file, api.ErrNotSocket, file + ": exists and is not a socket: remove it, or pass --socket PATH"},
		{"directory", sub, api.ErrNotSocket, sub + ": exists and is not a socket: remove it, or pass --socket PATH"},
		{"missing", filepath.Join(dir, "none.sock"), api.ErrNoDaemon, "lovelockd is not running"},
		{"stale socket", stale, api.ErrNoDaemon, "lovelockd is not running"},
		{"empty", "", api.ErrNoSocket, "no API socket given: pass --socket PATH"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := api.NewClient(tc.path).Status(context.Background())
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %v saying %q", err, tc.is, tc.want)
			}
		})
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "keep" {
		t.Errorf("the file was touched: %q, %v", b, err)
	}
}
