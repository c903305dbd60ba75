package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// isReady reports whether a line of lovelockd's log says it is ready: its
// data plane attached ("data plane ready") or, from the release with the
// local API on, the API served (msg=ready, in text or JSON logs).
func isReady(line string) bool {
	return strings.Contains(line, "data plane ready") ||
		strings.Contains(line, "msg=ready ") || strings.HasSuffix(line, "msg=ready") ||
		strings.Contains(line, `"msg":"ready"`)
}

// exitStatus is how a supervised process ended.
type exitStatus struct {
	code   int
	signal string
}

func (e exitStatus) String() string {
	if e.signal != "" {
		return "killed by " + e.signal
	}
	return fmt.Sprintf("exit status %d", e.code)
}

// startFunc starts cmd and returns a channel that yields its exit status
// once.
type startFunc func(cmd *exec.Cmd) (<-chan exitStatus, error)

// backoff doubles the delay between restarts from min to max, and starts
// over after a run that lasted longer than max.
type backoff struct {
	min, max time.Duration
	cur      time.Duration
}

func (b *backoff) next(ran time.Duration) time.Duration {
	if b.cur == 0 || ran > b.max {
		b.cur = b.min
		return b.cur
	}
	b.cur = min(2*b.cur, b.max)
	return b.cur
}

// supervisor keeps one process running: it starts it, copies its output
// line by line to the console (and to onLine), and restarts it with backoff
// whenever it exits, until its context ends.
type supervisor struct {
	log     *slog.Logger
	path    string
	args    []string
	start   startFunc
	onLine  func(string)
	console io.Writer // os.Stdout when nil
	backoff backoff

	mu      sync.Mutex
	proc    *os.Process
	exited  <-chan exitStatus
	restart int
}

// run supervises until ctx ends; it returns ctx's error.
func (s *supervisor) run(ctx context.Context) error {
	for {
		began := time.Now()
		exited, err := s.startOnce()
		if err != nil {
			s.log.Error("start failed", "cmd", s.path, "err", err)
		} else {
			select {
			case st := <-exited:
				s.log.Error("lovelockd exited; restarting", "status", st.String(), "ran", time.Since(began).Round(time.Millisecond))
				s.mu.Lock()
				// The process is gone and reaped; drop its handle.
				_ = s.proc.Release()
				s.proc = nil
				s.mu.Unlock()
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		delay := s.backoff.next(time.Since(began))
		s.mu.Lock()
		s.restart++
		s.mu.Unlock()
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (s *supervisor) startOnce() (<-chan exitStatus, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("pipe: %w", err)
	}
	cmd := exec.Command(s.path, s.args...)
	cmd.Stdout = w
	cmd.Stderr = w
	// Its own process group, so a stop reaches whatever it starts.
	cmd.SysProcAttr = &unix.SysProcAttr{Setpgid: true}
	s.log.Info("starting", "cmd", s.path, "args", strings.Join(s.args, " "))
	exited, err := s.start(cmd)
	w.Close()
	if err != nil {
		r.Close()
		return nil, err
	}
	s.mu.Lock()
	s.proc, s.exited = cmd.Process, exited
	s.mu.Unlock()
	go s.copyLines(r)
	return exited, nil
}

func (s *supervisor) copyLines(r *os.File) {
	defer r.Close()
	out := s.console
	if out == nil {
		out = os.Stdout
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(out, line)
		if s.onLine != nil {
			s.onLine(line)
		}
	}
}

// stop sends SIGTERM to the running process and waits up to grace for it
// to exit, then kills it.
func (s *supervisor) stop(grace time.Duration) {
	s.mu.Lock()
	proc, exited := s.proc, s.exited
	s.mu.Unlock()
	if proc == nil {
		return
	}
	_ = unix.Kill(-proc.Pid, unix.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		s.log.Warn("lovelockd ignored SIGTERM; killing it")
		_ = unix.Kill(-proc.Pid, unix.SIGKILL)
	}
}

// restarts returns how often the process was restarted.
func (s *supervisor) restarts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.restart
}

// readyWatcher returns an onLine function that signals ready (without
// blocking) every time lovelockd reports ready.
func readyWatcher(ready chan<- struct{}) func(string) {
	return func(line string) {
		if isReady(line) {
			select {
			case ready <- struct{}{}:
			default:
			}
		}
	}
}

// reaper owns wait4(2) for PID 1: it collects every child that exits, hands
// the exit status of the processes it started to their waiters, and reaps
// orphans that the kernel re-parents to init so they never pile up as
// zombies. Starting a process holds the reaper's lock, so the process cannot
// be reaped before its waiter is registered.
type reaper struct {
	log     *slog.Logger
	mu      sync.Mutex
	waiting map[int]chan exitStatus
}

func newReaper(log *slog.Logger) *reaper {
	return &reaper{log: log, waiting: make(map[int]chan exitStatus)}
}

// start implements startFunc. The caller must not call cmd.Wait.
func (r *reaper) start(cmd *exec.Cmd) (<-chan exitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ch := make(chan exitStatus, 1)
	r.waiting[cmd.Process.Pid] = ch
	return ch, nil
}

func (r *reaper) run(ctx context.Context) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGCHLD)
	defer signal.Stop(sigs)
	// SIGCHLD coalesces; a slow tick catches anything it folded away.
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-sigs:
		case <-tick.C:
		}
		r.reap()
	}
}

func (r *reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
		st := exitStatus{code: ws.ExitStatus()}
		if ws.Signaled() {
			st.signal = ws.Signal().String()
		}
		if ch, ok := r.waiting[pid]; ok {
			delete(r.waiting, pid)
			ch <- st
			continue
		}
		r.log.Debug("reaped orphan", "pid", pid, "status", st.String())
	}
}
