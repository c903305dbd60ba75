package devmem

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// socketPair returns the two ends of a unix stream socket pair, each a
// net.UnixConn in the runtime's poller, as the executor's connection is.
func socketPair(t *testing.T) (a, b *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var cs [2]*net.UnixConn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "pair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		cs[i] = c.(*net.UnixConn)
		t.Cleanup(func() { cs[i].Close() })
	}
	return cs[0], cs[1]
}

func rawOf(t *testing.T, c *net.UnixConn) rawConn {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return rawConn{rc}
}

// waitBlocked returns once some goroutine waits in the poller inside fn
// (a function name as a stack trace writes it), or fails the test.
func waitBlocked(t *testing.T, wait, fn string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		for _, g := range bytes.Split(buf[:runtime.Stack(buf, true)], []byte("\n\n")) {
			if bytes.Contains(g, []byte(wait)) && bytes.Contains(g, []byte(fn)) {
				return
			}
		}
	}
	t.Fatalf("no goroutine waits in %s", fn)
}

// TestRawConn: the launcher's raw reads and writes on the executor's
// connection move every byte of a write larger than the socket buffer (it
// waits for room), read end of stream as io.EOF, and a Close of the
// connection wakes a read or a write that waits, with an error.
func TestRawConn(t *testing.T) {
	await := func(t *testing.T, errc <-chan error) error {
		t.Helper()
		select {
		case err := <-errc:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("did not return")
			return nil
		}
	}
	t.Run("write larger than the buffer", func(t *testing.T) {
		a, b := socketPair(t)
		want := make([]byte, 8<<20)
		for i := range want {
			want[i] = byte(i * 7)
		}
		ra := rawOf(t, a)
		errc := make(chan error, 1)
		go func() { errc <- ra.write(want) }()
		got := make([]byte, len(want))
		if _, err := io.ReadFull(rawOf(t, b), got); err != nil {
			t.Fatal(err)
		}
		if err := await(t, errc); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatal("the bytes read are not the bytes written")
		}
	})
	t.Run("peer closes", func(t *testing.T) {
		a, b := socketPair(t)
		if err := rawOf(t, a).write([]byte("last")); err != nil {
			t.Fatal(err)
		}
		a.Close()
		got, err := io.ReadAll(rawOf(t, b))
		if string(got) != "last" || err != nil {
			t.Fatalf("ReadAll = %q, %v; want last, nil (end of stream)", got, err)
		}
		if n, err := rawOf(t, b).Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Fatalf("Read after end of stream = %d, %v", n, err)
		}
	})
	t.Run("close wakes a read", func(t *testing.T) {
		a, _ := socketPair(t)
		ra := rawOf(t, a)
		errc := make(chan error, 1)
		go func() {
			_, err := ra.Read(make([]byte, 16))
			errc <- err
		}()
		waitBlocked(t, "waitRead", "devmem.rawConn.Read")
		a.Close()
		if err := await(t, errc); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("read on a closed connection: %v, want net.ErrClosed", err)
		}
	})
	t.Run("close wakes a write", func(t *testing.T) {
		a, _ := socketPair(t)
		ra := rawOf(t, a)
		errc := make(chan error, 1)
		go func() { errc <- ra.write(make([]byte, 64<<20)) }()
		waitBlocked(t, "waitWrite", "devmem.rawConn.write")
		a.Close()
		if err := await(t, errc); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("write on a closed connection: %v, want net.ErrClosed", err)
		}
	})
}
