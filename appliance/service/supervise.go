package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/lovelock-dpu/lovelock/control/api"
)

// DefaultRestartDelay is the wait before a failed service's first restart.
const DefaultRestartDelay = time.Second

// MaxRestartDelay caps the wait between restarts: each failure in a row
// doubles it, so a service failing at every start (a missing GPU, a port
// taken) costs a full setup and a log line twice a minute, not every
// second.
const MaxRestartDelay = 30 * time.Second

// Supervisor runs one service under lovelockd: plan, bind, run, unbind,
// and again after a failure, until its context ends. Status says at any
// time where it stands.
type Supervisor struct {
	svc      Service
	steer    Steering
	log      *slog.Logger
	delay    time.Duration // before the first restart
	maxDelay time.Duration
	// now and sleep are the clock; tests replace them.
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) bool

	mu     sync.Mutex
	status api.ServiceStatus
	// readyAt is when the current run said it serves; zero before.
	readyAt time.Time
	// bound is the current run's binding while it serves, nil otherwise.
	bound *Binding
}

// NewSupervisor returns a supervisor of svc bound through steer; delay
// is the wait before the first restart after a failure (0:
// DefaultRestartDelay), doubled for each further failure in a row up to
// MaxRestartDelay.
func NewSupervisor(svc Service, steer Steering, log *slog.Logger, delay time.Duration) *Supervisor {
	if delay <= 0 {
		delay = DefaultRestartDelay
	}
	return &Supervisor{svc: svc, steer: steer, log: log.With("service", svc.Name()), delay: delay, maxDelay: max(delay, MaxRestartDelay),
		now: time.Now, sleep: sleep,
		status: api.ServiceStatus{Name: svc.Name(), State: api.ServiceStarting, Since: time.Now()}}
}

// sleep waits d or until ctx ends, and reports whether it waited d.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// nextDelay returns the wait before the next restart, after a run that
// served for up (0: it never got to serve) and had been started after
// waiting prev (0: the first run). A run that served long enough counts
// as a recovery: the wait starts from first again. Otherwise each failure
// in a row doubles it, up to limit.
func nextDelay(first, limit, prev, up time.Duration) time.Duration {
	if prev == 0 || up >= stableRun(prev) {
		return first
	}
	return min(2*prev, limit)
}

// stableRun is how long a run must serve to reset the backoff after a
// wait of d: ten times the wait, at most a minute.
func stableRun(d time.Duration) time.Duration { return min(10*d, time.Minute) }

// Service returns the supervised service.
func (s *Supervisor) Service() Service { return s.svc }

// Status returns where the service stands.
func (s *Supervisor) Status() api.ServiceStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.status
	st.Degraded = append([]string(nil), st.Degraded...)
	return st
}

// Run runs the service until ctx ends, restarting it when it fails: a
// plan that does not load (an operator may be fixing a file), a bind that
// fails (an interface not there yet) or a run that returns.
func (s *Supervisor) Run(ctx context.Context) {
	var delay time.Duration
	lastErr := ""
	for {
		up, err := s.runOnce(ctx)
		if ctx.Err() != nil {
			s.update(func(st *api.ServiceStatus) {
				st.State, st.Binding, st.Degraded, st.NextTry = api.ServiceStopped, "", nil, time.Time{}
			})
			return
		}
		delay = nextDelay(s.delay, s.maxDelay, delay, up)
		next := s.now().Add(delay)
		s.update(func(st *api.ServiceStatus) {
			st.State, st.Error, st.Binding, st.Degraded, st.NextTry = api.ServiceFailed, err.Error(), "", nil, next
			st.Restarts++
		})
		// The same failure again is no news: once at Error is enough.
		if msg := err.Error(); msg != lastErr || up > 0 {
			s.log.Error("service stopped; restarting", "err", err, "in", delay, "next_try", next.Format(time.RFC3339))
			lastErr = msg
		} else {
			s.log.Warn("service failed again; restarting", "err", err, "in", delay, "next_try", next.Format(time.RFC3339))
		}
		if !s.sleep(ctx, delay) {
			s.update(func(st *api.ServiceStatus) { st.State, st.NextTry = api.ServiceStopped, time.Time{} })
			return
		}
	}
}

// runOnce plans, binds and runs the service once, and returns how long it
// served (0 if it never said it serves) and why it stopped.
func (s *Supervisor) runOnce(ctx context.Context) (time.Duration, error) {
	s.mu.Lock()
	s.readyAt = time.Time{}
	s.mu.Unlock()
	up := func() time.Duration {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.readyAt.IsZero() {
			return 0
		}
		return s.now().Sub(s.readyAt)
	}
	var needs Needs
	err := s.guard(func() (err error) { needs, err = s.svc.Plan(); return err })
	if err != nil {
		return 0, err
	}
	b, err := Bind(s.steer, s.log, s.svc.Name(), needs)
	if err != nil {
		return 0, err
	}
	defer b.Close()
	defer func() {
		s.mu.Lock()
		s.bound = nil
		s.mu.Unlock()
	}()
	// Bound is not running: the service still opens its sockets and
	// devices in Run, and says when it serves (Binding.Ready). Until then
	// it stays starting, or failed while it restarts.
	b.onReady = func() {
		s.update(func(st *api.ServiceStatus) {
			st.State, st.Binding, st.Degraded, st.NextTry = api.ServiceRunning, b.String(), b.Reasons(), time.Time{}
			if len(st.Degraded) > 0 {
				st.State = api.ServiceDegraded
			}
		})
		s.mu.Lock()
		s.readyAt, s.bound = s.now(), b
		s.mu.Unlock()
		s.log.Info("service running", "on", b.String())
	}
	err = s.guard(func() error { return s.svc.Run(ctx, b) })
	if err == nil && ctx.Err() == nil {
		err = errors.New("returned before it was stopped")
	}
	if err != nil && ctx.Err() == nil {
		return up(), fmt.Errorf("run: %w", err)
	}
	return up(), err
}

// guard calls f, the service's Plan or Run, and turns a panic on its
// goroutine into an error, so that one service's bug fails that service,
// which restarts with the usual backoff, and not lovelockd with every other
// service. The stack goes to the log. A panic on a goroutine the service
// started itself still ends lovelockd: Go cannot recover it from here.
func (s *Supervisor) guard(f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("service panicked: a bug, please report it with this stack", "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("panicked: %v (a bug: the stack is in lovelockd's log)", p)
		}
	}()
	return f()
}

// Recheck re-evaluates a serving service's reasons to be degraded
// (Binding.Recheck): a degraded service whose reasons have all gone (an
// operator attached the steering program in XDP) is running, and a running
// one with a reason back (an operator detached it) is degraded. lovelockd
// calls it as it checks its health.
func (s *Supervisor) Recheck() {
	s.mu.Lock()
	b := s.bound
	s.mu.Unlock()
	if b == nil || !b.Recheck() {
		return
	}
	left := b.Reasons()
	var was, now api.ServiceState
	s.update(func(st *api.ServiceStatus) {
		if s.bound != b { // that run has ended meanwhile
			return
		}
		was = st.State
		st.Degraded, st.State = left, api.ServiceRunning
		if len(left) > 0 {
			st.State = api.ServiceDegraded
		}
		now = st.State
	})
	switch {
	case now == "":
	case len(left) == 0:
		s.log.Info("service no longer degraded: running as asked", "on", b.String())
	case was == api.ServiceRunning:
		s.log.Error("service degraded", "why", left)
	default:
		s.log.Info("service still degraded, for other reasons", "why", left)
	}
}

func (s *Supervisor) update(f func(*api.ServiceStatus)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.status.State
	f(&s.status)
	if s.status.State != prev {
		s.status.Since = time.Now()
	}
}
