package daemon

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// brokenListener fails every Accept, as a listener whose socket broke.
type brokenListener struct{ net.Listener }

func (brokenListener) Accept() (net.Conn, error) { return nil, errors.New("accept: socket broke") }

// TestRunServeFails: when the metrics server fails, Run returns its error
// and stops everything it started, without waiting for ctx to end.
func TestRunServeFails(t *testing.T) {
	testenv.RequirePriv(t)
	cfg, _ := tempConfig(t)
	cfg.Metrics = "127.0.0.1:0"
	cfg.Normalize()
	ln, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln.Metrics = brokenListener{ln.Metrics}
	d, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	defer d.Close()
	done := make(chan error, 1)
	go func() { done <- d.Run(context.Background(), ln) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "socket broke") {
			t.Errorf("Run: %v, want the metrics server's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its metrics server failed")
	}
}
