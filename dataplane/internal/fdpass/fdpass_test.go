package fdpass

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pair returns the two ends of a stream unix socketpair.
func pair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// TestTorn checks that a Read or Write cut by a deadline says whether part
// of its frame had crossed (ErrTorn) or none of it.
func TestTorn(t *testing.T) {
	type msg struct{ S string }
	soon := func(c *net.UnixConn) { c.SetDeadline(time.Now().Add(20 * time.Millisecond)) }

	for _, tc := range []struct {
		name string
		sent []byte // raw bytes the peer sent before the deadline
		torn bool
	}{
		{"nothing sent", nil, false},
		{"half a header", []byte{0, 0}, true},
		{"header and part of the body", []byte{0, 0, 0, 10, '{'}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t)
			if len(tc.sent) > 0 {
				if _, err := b.Write(tc.sent); err != nil {
					t.Fatal(err)
				}
			}
			soon(a)
			var m msg
			_, err := Read(a, &m)
			if !errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, ErrTorn) != tc.torn {
				t.Fatalf("Read: %v; want a deadline error, torn %v", err, tc.torn)
			}
		})
	}

	t.Run("write", func(t *testing.T) {
		a, _ := pair(t)
		big := msg{S: strings.Repeat("x", MaxFrame-100)} // more than the socket buffers hold
		// Long enough for Write to encode the frame and start sending
		// before the deadline, on a busy machine too.
		a.SetDeadline(time.Now().Add(500 * time.Millisecond))
		err := Write(a, big)
		if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.Is(err, ErrTorn) {
			t.Fatalf("Write of a frame larger than the socket's buffers: %v; want a torn deadline error", err)
		}
		// The buffers are full now: nothing of the next frame crosses.
		err = Write(a, msg{S: "y"})
		if !errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, ErrTorn) {
			t.Fatalf("Write to a full socket: %v; want a deadline error, not torn", err)
		}
	})

	t.Run("whole frame", func(t *testing.T) {
		a, b := pair(t)
		if err := Write(b, msg{S: "ok"}); err != nil {
			t.Fatal(err)
		}
		soon(a)
		var m msg
		if _, err := Read(a, &m); err != nil || m.S != "ok" {
			t.Fatalf("Read: %v, %q", err, m.S)
		}
	})
}
