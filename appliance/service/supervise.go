package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/lovelock-dpu/lovelock/control/api"
)

// DefaultRestartDelay spaces the restarts of a failing service.
const DefaultRestartDelay = time.Second

// Supervisor runs one service under lovelockd: plan, bind, run, unbind,
// and again after a failure, until its context ends. Status says at any
// time where it stands.
type Supervisor struct {
	svc   Service
	steer Steering
	log   *slog.Logger
	delay time.Duration

	mu     sync.Mutex
	status api.ServiceStatus
}

// NewSupervisor returns a supervisor of svc bound through steer; delay
// spaces restarts (0: DefaultRestartDelay).
func NewSupervisor(svc Service, steer Steering, log *slog.Logger, delay time.Duration) *Supervisor {
	if delay <= 0 {
		delay = DefaultRestartDelay
	}
	return &Supervisor{svc: svc, steer: steer, log: log.With("service", svc.Name()), delay: delay,
		status: api.ServiceStatus{Name: svc.Name(), State: api.ServiceStarting, Since: time.Now()}}
}

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
	for {
		err := s.runOnce(ctx)
		if ctx.Err() != nil {
			s.update(func(st *api.ServiceStatus) { st.State, st.Binding, st.Degraded = api.ServiceStopped, "", nil })
			return
		}
		s.update(func(st *api.ServiceStatus) {
			st.State, st.Error, st.Binding, st.Degraded = api.ServiceFailed, err.Error(), "", nil
			st.Restarts++
		})
		s.log.Error("service stopped; restarting", "err", err, "in", s.delay)
		select {
		case <-ctx.Done():
			s.update(func(st *api.ServiceStatus) { st.State = api.ServiceStopped })
			return
		case <-time.After(s.delay):
		}
	}
}

func (s *Supervisor) runOnce(ctx context.Context) error {
	needs, err := s.svc.Plan()
	if err != nil {
		return err
	}
	b, err := Bind(s.steer, s.log, s.svc.Name(), needs)
	if err != nil {
		return err
	}
	defer b.Close()
	// Bound is not running: the service still opens its sockets and
	// devices in Run, and says when it serves (Binding.Ready). Until then
	// it stays starting, or failed while it restarts.
	b.onReady = func() {
		s.update(func(st *api.ServiceStatus) {
			st.State, st.Binding, st.Degraded = api.ServiceRunning, b.String(), b.Degraded
			if len(b.Degraded) > 0 {
				st.State = api.ServiceDegraded
			}
		})
		s.log.Info("service running", "on", b.String())
	}
	err = s.svc.Run(ctx, b)
	if err == nil && ctx.Err() == nil {
		err = errors.New("returned before it was stopped")
	}
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("run: %w", err)
	}
	return err
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
