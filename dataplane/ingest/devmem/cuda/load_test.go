package cuda

import (
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// TestNoDriver: where libcuda is absent, Open and NewImporter fail with
// ErrNoDriver and say what to do instead.
func TestNoDriver(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libcuda.so.1")
	_, err := Open(Options{Library: missing})
	checkNoDriver(t, "Open", err, missing)
	_, err = NewImporter(ImporterOptions{Library: missing})
	checkNoDriver(t, "NewImporter", err, missing)
}

func checkNoDriver(t *testing.T, call string, err error, lib string) {
	t.Helper()
	if !errors.Is(err, ErrNoDriver) {
		t.Fatalf("%s: %v, want an error wrapping ErrNoDriver", call, err)
	}
	for _, want := range []string{lib + " not found", "no NVIDIA driver on this machine", "use device kind shm"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %q does not say %q", call, err, want)
		}
	}
}

// TestDefaultDriver opens device 0 with the default library: on a machine
// without the driver (CI, this repository's dev machines) that must be the
// clear ErrNoDriver error; with a driver but no GPU, ErrNoDevice; on a GPU
// machine it must work.
func TestDefaultDriver(t *testing.T) {
	d, err := Open(Options{})
	switch {
	case err == nil:
		t.Logf("opened %+v", d.Info())
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	case errors.Is(err, ErrNoDriver):
		if !strings.Contains(err.Error(), DriverLibrary+" not found") || !strings.Contains(err.Error(), "use device kind shm") {
			t.Errorf("unclear error: %v", err)
		}
	case errors.Is(err, ErrNoDevice):
		t.Logf("driver present, no GPU: %v", err)
	default:
		t.Fatalf("Open: %v", err)
	}
}

// TestDriverTooOld loads a library that is not the driver: binding fails
// naming the missing entry point.
func TestDriverTooOld(t *testing.T) {
	_, err := Open(Options{Library: "libc.so.6"})
	if !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "lacks cuInit") {
		t.Fatalf("Open(libc): %v, want ErrNoDriver naming cuInit", err)
	}
	if _, err := loadNVML("libc.so.6"); err == nil || !strings.Contains(err.Error(), "lacks nvmlInit_v2") {
		t.Fatalf("loadNVML(libc): %v, want an error naming nvmlInit_v2", err)
	}
}

// TestThread: closures from many goroutines run on one OS thread, in
// turn, and after close do returns ErrClosed.
func TestThread(t *testing.T) {
	var tid int
	finished := false
	th, err := startThread(func() error { tid = unix.Gettid(); return nil }, func() { finished = true })
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 8 {
				errs <- th.do(func() error {
					if got := unix.Gettid(); got != tid {
						return errors.New("ran on another thread")
					}
					return nil
				})
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	want := errors.New("from the closure")
	if err := th.do(func() error { return want }); err != want {
		t.Errorf("do returned %v, want the closure's error", err)
	}
	th.close()
	th.close()
	if !finished {
		t.Error("fini did not run")
	}
	if err := th.do(func() error { return nil }); !errors.Is(err, ErrClosed) {
		t.Errorf("do after close: %v, want ErrClosed", err)
	}
	if _, err := startThread(func() error { return want }, func() {}); err != want {
		t.Errorf("startThread with a failing init: %v", err)
	}
}

func TestError(t *testing.T) {
	e := &Error{Call: "cuMemCreate", Code: errNotSupportedCode, Name: "CUDA_ERROR_NOT_SUPPORTED", Text: "operation not supported"}
	if got, want := e.Error(), "cuMemCreate: CUDA_ERROR_NOT_SUPPORTED (801): operation not supported"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(e, ErrNotSupported) || errors.Is(e, ErrNoDevice) {
		t.Error("801 should be ErrNotSupported only")
	}
	e = &Error{Call: "cuModuleLoadDataEx", Code: 218, Name: "CUDA_ERROR_INVALID_PTX", Text: "a PTX JIT compilation failed", Log: "ptxas fatal"}
	if !strings.Contains(e.Error(), "JIT log:\nptxas fatal") || errors.Is(e, ErrNotSupported) {
		t.Errorf("Error() = %q", e.Error())
	}
}

func TestFormatUUID(t *testing.T) {
	u := [16]byte{0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef}
	if got, want := formatUUID(u, false), "GPU-12345678-9abc-def0-0123-456789abcdef"; got != want {
		t.Errorf("formatUUID = %q, want %q", got, want)
	}
	if got, want := formatUUID(u, true), "MIG-12345678-9abc-def0-0123-456789abcdef"; got != want {
		t.Errorf("formatUUID of a MIG device = %q, want %q", got, want)
	}
	for _, mig := range []bool{false, true} {
		if got, err := parseUUID(formatUUID(u, mig)); err != nil || got != u {
			t.Errorf("parseUUID(%q) = %x, %v, want %x", formatUUID(u, mig), got, err, u)
		}
	}
	for _, bad := range []string{"", "GPU-", "12345678-9abc-def0-0123-456789abcdef", "GPU-12345678-9abc-def0-0123-456789abcd",
		"GPU-12345678-9abc-def0-0123-456789abcdefff", "GPU-123456789abcdef00123456789abcdef", "GPU-12345678-9abc-def0-0123-456789abcdeg", "0"} {
		if _, err := parseUUID(bad); err == nil || !strings.Contains(err.Error(), "32 hex digits") {
			t.Errorf("parseUUID(%q): %v, want an error", bad, err)
		}
	}
}
