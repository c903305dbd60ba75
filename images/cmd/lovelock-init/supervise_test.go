package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/control/testenv"
)

func TestParseCmdline(t *testing.T) {
	o := parseCmdline("console=ttyAMA0 lovelock.check lovelock.config=/etc/lovelock/qemu.json quiet\n")
	if !o.check || o.config != "/etc/lovelock/qemu.json" {
		t.Fatalf("got %+v", o)
	}
	o = parseCmdline("console=ttyS0 lovelock.check=0")
	if o.check || o.config != "/etc/lovelock/appliance.json" {
		t.Fatalf("got %+v", o)
	}
}

func TestIsReady(t *testing.T) {
	for line, want := range map[string]bool{
		`2026/11/21 05:38:07 INFO data plane ready version=dev pins=/sys/fs/bpf/lovelock`:    true,
		`time=2026-11-21T05:38:07Z level=INFO msg=ready socket=/run/lovelock/lovelockd.sock`: true,
		`{"time":"2026-11-21T05:38:07Z","level":"INFO","msg":"ready","socket":"/run/x"}`:     true,
		`time=2026-11-21T05:38:07Z level=INFO msg=ready`:                                     true,
		`time=2026-11-21T05:38:07Z level=INFO msg="rules applied" rules=0`:                   false,
		`time=2026-11-21T05:38:07Z level=INFO msg=readying`:                                  false,
	} {
		if isReady(line) != want {
			t.Errorf("isReady(%q) = %v, want %v", line, !want, want)
		}
	}
}

func TestBackoff(t *testing.T) {
	b := backoff{min: time.Second, max: 8 * time.Second}
	var got []time.Duration
	for range 6 {
		got = append(got, b.next(0))
	}
	want := []time.Duration{1, 2, 4, 8, 8, 8}
	for i := range want {
		if got[i] != want[i]*time.Second {
			t.Fatalf("delays %v, want %v s", got, want)
		}
	}
	if d := b.next(time.Minute); d != time.Second {
		t.Fatalf("after a long run the delay is %v, want it back at 1s", d)
	}
}

// waitStart is a startFunc for tests: the test process is not PID 1, so
// cmd.Wait does the reaping.
func waitStart(cmd *exec.Cmd) (<-chan exitStatus, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ch := make(chan exitStatus, 1)
	go func() {
		err := cmd.Wait()
		var ee *exec.ExitError
		st := exitStatus{}
		if errors.As(err, &ee) {
			st.code = ee.ExitCode()
		}
		ch <- st
	}()
	return ch, nil
}

// TestSupervisorRestarts runs a daemon that reports ready and dies at once:
// the supervisor must copy its output, see the ready line and restart it.
func TestSupervisorRestarts(t *testing.T) {
	ready := make(chan struct{}, 1)
	var console testenv.SyncBuffer
	s := &supervisor{
		log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		path:    "/bin/sh",
		args:    []string{"-c", `echo 'level=INFO msg="data plane ready"'; echo to-stderr >&2; exit 3`},
		start:   waitStart,
		onLine:  readyWatcher(ready),
		console: &console,
		backoff: backoff{min: 5 * time.Millisecond, max: 20 * time.Millisecond},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.run(ctx) }()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("ready line not seen")
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.restarts() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d restarts in 10s", s.restarts())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("run returned %v", err)
	}
	out := console.String()
	if !strings.Contains(out, "data plane ready") || !strings.Contains(out, "to-stderr") {
		t.Fatalf("console did not get the daemon's output:\n%s", out)
	}
}

// TestSupervisorStop checks that stop ends a daemon that keeps running.
func TestSupervisorStop(t *testing.T) {
	s := &supervisor{
		log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		path:    "/bin/sh",
		args:    []string{"-c", "echo up; exec sleep 60"},
		start:   waitStart,
		console: io.Discard,
		backoff: backoff{min: time.Hour, max: time.Hour},
	}
	if _, err := s.startOnce(); err != nil {
		t.Fatal(err)
	}
	pid := s.proc.Pid
	begin := time.Now()
	s.stop(5 * time.Second)
	if took := time.Since(begin); took > 4*time.Second {
		t.Fatalf("stop took %v: SIGTERM was not enough", took)
	}
	// stop returns once the exit status is in: the process is reaped.
	if err := unix.Kill(pid, 0); !errors.Is(err, unix.ESRCH) {
		t.Fatalf("process %d still there after stop: kill 0 = %v", pid, err)
	}
}

// TestReaper starts a child through the reaper and reaps it by hand.
func TestReaper(t *testing.T) {
	r := newReaper(slog.New(slog.NewTextHandler(io.Discard, nil)))
	exited, err := r.start(exec.Command("/bin/sh", "-c", "exit 7"))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.reap()
		select {
		case st := <-exited:
			if st.code != 7 || st.String() != "exit status 7" {
				t.Fatalf("status %v, want exit status 7", st)
			}
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("child not reaped")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
