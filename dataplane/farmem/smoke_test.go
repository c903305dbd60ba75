package farmem

import (
	"bytes"
	"context"
	"net/netip"
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
)

var loopback = netip.MustParseAddrPort("127.0.0.1:0")

// startServer runs a server on loopback with its state in dir.
func startServer(t *testing.T, dir string, wrap func(*udp.Conn) transport.Transport) *Server {
	t.Helper()
	c, err := udp.Listen(loopback, udp.Options{MaxPayload: udp.MaxPayloadForMTU(9000, false)})
	if err != nil {
		t.Fatal(err)
	}
	opts := ServerOptions{StateDir: dir, Capacity: 64 << 20, Transport: c}
	if wrap != nil {
		opts.Transport = wrap(c)
	}
	s, err := NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

func TestSmokeDirect(t *testing.T) {
	s := startServer(t, t.TempDir(), nil)
	c, err := NewClient(ClientOptions{Server: s.Addr(), Tenant: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	r, err := c.Alloc(ctx, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte("lovelock"), 40000)
	if _, err := r.WriteAt(want, 12345); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := r.ReadAt(got, 12345); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("data differs")
	}
	t.Logf("%+v", c.Stats())
}
