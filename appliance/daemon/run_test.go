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
	d, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	d.listenMetrics = func(network, addr string) (net.Listener, error) {
		ln, err := net.Listen(network, addr)
		return brokenListener{ln}, err
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(context.Background()) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "socket broke") {
			t.Errorf("Run: %v, want the metrics server's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its metrics server failed")
	}
}
