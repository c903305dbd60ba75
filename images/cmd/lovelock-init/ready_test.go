package main

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/control/api"
)

// TestHealthy: the init calls the DPU ready only when lovelockd's status
// says ok; a degraded one is not ready, and says why.
func TestHealthy(t *testing.T) {
	for _, c := range []struct {
		st   api.Status
		want string // "" ready, else part of the error
	}{
		{api.Status{Health: api.HealthOK}, ""},
		{api.Status{Health: api.HealthDegraded, Failures: []api.Failure{
			{What: "attachment p0 xdp", Cause: "interface p0: device or resource busy"},
			{What: "service messaging", Cause: "failed: no node dpu9"},
		}}, "attachment p0 xdp: interface p0: device or resource busy; service messaging: failed: no node dpu9"},
		{api.Status{Health: api.HealthStarting}, "starting"},
		{api.Status{}, "no health"},
	} {
		err := healthy(c.st)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("healthy(%+v) = %v, want %q", c.st, err, c.want)
		}
	}
}

func TestSocketArg(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, api.DefaultSocket},
		{[]string{"--socket", "/run/a.sock"}, "/run/a.sock"},
		{[]string{"--socket=/run/a.sock"}, "/run/a.sock"},
		{[]string{"-socket", "/run/a.sock"}, "/run/a.sock"},
		{[]string{"-socket=/run/a.sock"}, "/run/a.sock"},
		{[]string{"--xdp", "eth0", "--socket=/run/a.sock", "--socket", "/run/b.sock"}, "/run/b.sock"}, // the last wins
		{[]string{"--socket-mode", "0600", "--sockets=/x"}, api.DefaultSocket},
		{[]string{"--socket"}, api.DefaultSocket}, // no value: lovelockd refuses it anyway
		{[]string{"--", "--socket=/run/a.sock"}, api.DefaultSocket},
	} {
		if got := socketArg(c.args); got != c.want {
			t.Errorf("socketArg(%q) = %q, want %q", c.args, got, c.want)
		}
	}
}

// TestAnnounceReadyRetries: lovelockd says ready once, but its API does not
// confirm it at first; /init asks again on its own (lovelockd would not say
// ready again) and says each not-ready reason once.
func TestAnnounceReadyRetries(t *testing.T) {
	ready := make(chan struct{}, 1)
	ready <- struct{}{}
	calls := 0
	confirm := func(context.Context) error {
		calls++
		if calls < 4 {
			return errors.New("lovelockd is starting")
		}
		return nil
	}
	var mu sync.Mutex
	var said []string
	say := func(s string) { mu.Lock(); said = append(said, s); mu.Unlock() }
	done := make(chan bool, 1)
	go func() { done <- announceReady(t.Context(), ready, confirm, 10*time.Millisecond, say) }()
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("announceReady returned false")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no ready after a failed confirmation: not retried without another ready line")
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(said, []string{"DPU is not ready: lovelockd is starting"}) || calls != 4 {
		t.Errorf("said %q after %d confirmations; want one not-ready line, 4 confirmations", said, calls)
	}
}
