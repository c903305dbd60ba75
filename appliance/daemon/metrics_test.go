package daemon

import (
	"net"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMetricsListenError: only an address in use hints at another
// lovelockd; an address not on the node and a privileged port say so.
func TestMetricsListenError(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	listenErr := func(addr string) error {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			ln.Close()
			t.Fatalf("listen on %s succeeded", addr)
		}
		return err
	}
	for _, c := range []struct {
		name      string
		err       error
		want, not string
	}{
		{"in use", listenErr(taken.Addr().String()), "another lovelockd", ""},
		// 192.0.2.0/24 is for documentation: no node has it.
		{"not on the node", listenErr("192.0.2.1:9477"), "not on this node", "another lovelockd"},
		{"privileged", &net.OpError{Op: "listen", Net: "tcp", Err: os.NewSyscallError("bind", unix.EACCES)}, "privileged port", "another lovelockd"},
		{"other", listenErr("127.0.0.1:notaport"), "check metrics:", "another lovelockd"},
	} {
		got := metricsListenError(c.err).Error()
		if !strings.HasPrefix(got, "metrics: "+c.err.Error()) || !strings.Contains(got, c.want) || c.not != "" && strings.Contains(got, c.not) {
			t.Errorf("%s: %q; want the error, %q and not %q", c.name, got, c.want, c.not)
		}
	}
}
