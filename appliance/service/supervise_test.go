package service

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/xdp"
)

// fakeService fails its first plans, then runs until it is stopped and
// says so on running. With setup set, each run first says so on entered
// and waits on setup before it is ready, as a service opening its
// sockets would.
type fakeService struct {
	failPlans int32
	plans     atomic.Int32
	entered   chan struct{}
	setup     chan struct{}
	running   chan struct{}
	runErr    error
	bound     *Binding
}

func (f *fakeService) Name() string         { return "fake" }
func (f *fakeService) Interfaces() []string { return nil }
func (f *fakeService) Plan() (Needs, error) {
	if f.plans.Add(1) <= f.failPlans {
		return Needs{}, errors.New("cluster file: no such file")
	}
	return Needs{Rules: []rules.Rule{reservedRule("fake/x")}}, nil
}
func (f *fakeService) Run(ctx context.Context, b *Binding) error {
	f.bound = b
	// say sends on c unless the run is stopped first.
	say := func(c chan struct{}) bool {
		select {
		case c <- struct{}{}:
			return true
		case <-ctx.Done():
			return false
		}
	}
	if f.setup != nil {
		if !say(f.entered) {
			return nil
		}
		select {
		case <-f.setup:
		case <-ctx.Done():
			return nil
		}
	}
	if f.runErr != nil {
		say(f.running)
		return f.runErr
	}
	b.Ready()
	say(f.running)
	<-ctx.Done()
	return nil
}
func (f *fakeService) Stats() any                       { return nil }
func (f *fakeService) Describe(chan<- *prometheus.Desc) {}
func (f *fakeService) Collect(chan<- prometheus.Metric) {}

// TestSupervisor: a plan that fails is retried and reported, a running
// service is reported running with its binding, and a stopped one as
// stopped with its rules removed.
func TestSupervisor(t *testing.T) {
	svc := &fakeService{failPlans: 2, running: make(chan struct{}, 1)}
	st := &fakeSteering{port: 61440}
	sup := NewSupervisor(svc, st, slog.Default(), time.Millisecond)
	if s := sup.Status(); s.Name != "fake" || s.State != api.ServiceStarting {
		t.Errorf("before Run: %+v", s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { sup.Run(ctx); close(done) }()
	<-svc.running
	s := sup.Status()
	if s.State != api.ServiceRunning || s.Restarts != 2 || s.Error != "cluster file: no such file" || s.Binding != "kernel sockets" {
		t.Errorf("running: %+v", s)
	}
	if len(st.reserved["fake"]) != 1 {
		t.Errorf("reserved %v while running", st.reserved)
	}
	cancel()
	<-done
	if s := sup.Status(); s.State != api.ServiceStopped || s.Binding != "" {
		t.Errorf("stopped: %+v", s)
	}
	if len(st.reserved) != 0 {
		t.Errorf("reserved %v after stop", st.reserved)
	}
}

// TestSupervisorRunFails: a run that returns is a failure, reported with
// its cause, and the service is started again.
func TestSupervisorRunFails(t *testing.T) {
	svc := &fakeService{running: make(chan struct{}), runErr: errors.New("agent: bind: address in use")}
	sup := NewSupervisor(svc, &fakeSteering{port: 61440}, slog.Default(), time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { sup.Run(ctx); close(done) }()
	<-svc.running
	<-svc.running // started again
	<-svc.running
	s := sup.Status()
	cancel()
	<-done
	if s.Restarts < 2 || s.Error != "run: agent: bind: address in use" {
		t.Errorf("status after failed runs: %+v", s)
	}
}

// panicService panics in Plan or Run, once each, then runs.
type panicService struct {
	fakeService
	plans, runs atomic.Int32
}

func (p *panicService) Plan() (Needs, error) {
	if p.plans.Add(1) == 1 {
		panic("plan: nil map")
	}
	return p.fakeService.Plan()
}

func (p *panicService) Run(ctx context.Context, b *Binding) error {
	if p.runs.Add(1) == 1 {
		_ = at(nil, 3) // a bug: a runtime error
	}
	return p.fakeService.Run(ctx, b)
}

func at(s []int, i int) int { return s[i] }

// TestSupervisorPanic: a service whose Plan or Run panics fails, with
// the panic as its error, and is restarted like any failed run; the
// process (lovelockd, every other service) goes on, and the failed run's
// reserved rules are removed.
func TestSupervisorPanic(t *testing.T) {
	svc := &panicService{fakeService: fakeService{running: make(chan struct{}, 1)}}
	st := &fakeSteering{port: 61440}
	sup := NewSupervisor(svc, st, slog.Default(), time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { sup.Run(ctx); close(done) }()
	<-svc.running
	s := sup.Status()
	cancel()
	<-done
	if s.State != api.ServiceRunning || s.Restarts != 2 || !strings.HasPrefix(s.Error, "run: panicked: runtime error: index out of range [3]") {
		t.Errorf("after a panic in Plan and one in Run: %+v; want running, 2 restarts, the run's panic as the last error", s)
	}
	if len(st.reserved) != 0 {
		t.Errorf("reserved %v after stop", st.reserved)
	}
}

// TestSupervisorStartingUntilReady: a service bound but still opening its
// sockets is starting, not running, until it says it is ready; on later
// runs it keeps its failed state until then.
func TestSupervisorStartingUntilReady(t *testing.T) {
	svc := &fakeService{entered: make(chan struct{}), setup: make(chan struct{}), running: make(chan struct{})}
	sup := NewSupervisor(svc, &fakeSteering{port: 61440}, slog.Default(), time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { sup.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	<-svc.entered
	if s := sup.Status(); s.State != api.ServiceStarting || s.Binding != "" {
		t.Errorf("bound, setting up: %+v; want starting", s)
	}
	svc.setup <- struct{}{}
	<-svc.running
	if s := sup.Status(); s.State != api.ServiceRunning || s.Binding != "kernel sockets" {
		t.Errorf("ready: %+v; want running", s)
	}

	// A service that fails at start every time never shows running.
	svc2 := &fakeService{entered: make(chan struct{}), setup: make(chan struct{}), running: make(chan struct{}), runErr: errors.New("listen: address in use")}
	sup2 := NewSupervisor(svc2, &fakeSteering{port: 61440}, slog.Default(), time.Millisecond)
	done2 := make(chan struct{})
	go func() { sup2.Run(ctx); close(done2) }()
	defer func() { cancel(); <-done2 }()
	for i := 0; i < 3; i++ {
		<-svc2.entered
		if s := sup2.Status(); s.State == api.ServiceRunning || (i > 0 && s.State != api.ServiceFailed) {
			t.Errorf("run %d, setting up: %+v; want starting, then failed", i, s)
		}
		svc2.setup <- struct{}{}
		<-svc2.running
	}
}

// TestNextDelay: the waits double from the configured one up to the cap,
// and start again from it after a run that served for long enough.
func TestNextDelay(t *testing.T) {
	var got []time.Duration
	d := time.Duration(0)
	for range 8 {
		d = nextDelay(time.Second, MaxRestartDelay, d, 0)
		got = append(got, d)
	}
	want := []time.Duration{1, 2, 4, 8, 16, 30, 30, 30}
	for i := range want {
		want[i] *= time.Second
	}
	if !slices.Equal(got, want) {
		t.Fatalf("waits after failures in a row: %v, want %v", got, want)
	}
	for _, c := range []struct {
		prev, up, want time.Duration
	}{
		{time.Second, 9 * time.Second, 2 * time.Second}, // short run: still backing off
		{time.Second, 10 * time.Second, time.Second},    // served ten waits: recovered
		{30 * time.Second, 59 * time.Second, 30 * time.Second},
		{30 * time.Second, time.Minute, time.Second}, // a minute is always enough
		{20 * time.Second, 0, 30 * time.Second},      // capped
	} {
		if got := nextDelay(time.Second, MaxRestartDelay, c.prev, c.up); got != c.want {
			t.Errorf("after a wait of %v and a run serving %v: %v, want %v", c.prev, c.up, got, c.want)
		}
	}
	if got := nextDelay(time.Minute, time.Minute, time.Minute, 0); got != time.Minute {
		t.Errorf("configured delay above the cap: %v, want it kept", got)
	}
}

// scriptedService fails every run; the runs listed in serve first say
// they serve and keep serving for that long on the supervisor's clock.
type scriptedService struct {
	fakeService
	runs  int
	serve map[int]time.Duration
	clock *fakeClock
}

func (f *scriptedService) Run(ctx context.Context, b *Binding) error {
	f.runs++
	if d, ok := f.serve[f.runs]; ok {
		b.Ready()
		f.clock.advance(d)
	}
	return errors.New("no GPU")
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestSupervisorBackoff: a service failing at every start is restarted
// after waits that double up to the cap, each one reported as the next
// try; a run that served for a while starts the waits over.
func TestSupervisorBackoff(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)}
	svc := &scriptedService{serve: map[int]time.Duration{8: 2 * time.Minute}, clock: clock}
	sup := NewSupervisor(svc, &fakeSteering{port: 61440}, slog.New(slog.DiscardHandler), time.Second)
	sup.now = clock.now
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var waits []time.Duration
	sup.sleep = func(ctx context.Context, d time.Duration) bool {
		waits = append(waits, d)
		if st := sup.Status(); st.State != api.ServiceFailed || !st.NextTry.Equal(clock.now().Add(d)) {
			t.Errorf("waiting %v: %+v; want failed, next try in %v", d, st, d)
		}
		clock.advance(d)
		if len(waits) == 10 {
			cancel()
			return false
		}
		return true
	}
	sup.Run(ctx)
	want := []time.Duration{1, 2, 4, 8, 16, 30, 30, 1, 2, 4}
	for i := range want {
		want[i] *= time.Second
	}
	if !slices.Equal(waits, want) {
		t.Errorf("waits %v, want %v", waits, want)
	}
	if st := sup.Status(); st.State != api.ServiceStopped || !st.NextTry.IsZero() || st.Restarts != 10 {
		t.Errorf("stopped: %+v", st)
	}
}

// xdpService asks for AF_XDP sockets on p0 and runs until it is stopped.
type xdpService struct{ fakeService }

func (f *xdpService) Plan() (Needs, error) {
	return Needs{XDP: &XDPNeeds{Interfaces: []string{"p0"}, Addr: netip.MustParseAddrPort("10.77.0.1:61440"), Workers: 1}}, nil
}

// lateXDP is a steering program that an operator attaches in XDP on p0
// after the service bound.
type lateXDP struct {
	fakeSteering
	attached atomic.Bool
}

func (l *lateXDP) XDPAttached(string) (bool, error) { return l.attached.Load(), nil }

// TestSupervisorRecheck: a service degraded because the steering program
// was not in XDP on its interface runs as asked once it is: Recheck finds
// the cause gone. Before that it stays degraded. Detached again, it is
// degraded again, and running once more after the next attach.
func TestSupervisorRecheck(t *testing.T) {
	openGroups = func(xdp.GroupOptions, int, udp.Options) ([]*xdp.Group, error) { return nil, nil }
	t.Cleanup(func() { openGroups = xdp.OpenGroups })
	svc := &xdpService{fakeService{running: make(chan struct{})}}
	st := &lateXDP{fakeSteering: fakeSteering{port: 61440}}
	sup := NewSupervisor(svc, st, slog.New(slog.DiscardHandler), time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { sup.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	<-svc.running
	s := sup.Status()
	if s.State != api.ServiceDegraded || len(s.Degraded) != 1 || !strings.Contains(s.Degraded[0], "no steering program in XDP on p0") {
		t.Fatalf("bound without XDP: %+v; want degraded, saying so", s)
	}
	sup.Recheck()
	if s := sup.Status(); s.State != api.ServiceDegraded || len(s.Degraded) != 1 {
		t.Errorf("rechecked, still no XDP: %+v; want degraded", s)
	}
	st.attached.Store(true) // lovelock iface attach p0
	sup.Recheck()
	if s := sup.Status(); s.State != api.ServiceRunning || len(s.Degraded) != 0 {
		t.Errorf("rechecked after the attach: %+v; want running", s)
	}
	if r := svc.bound.Reasons(); len(r) != 0 || len(svc.bound.Degraded) != 1 {
		t.Errorf("binding's reasons %q, as bound %q; want none left, one at bind", r, svc.bound.Degraded)
	}
	sup.Recheck()
	if s := sup.Status(); s.State != api.ServiceRunning {
		t.Errorf("rechecked again, XDP still there: %+v; want running", s)
	}
	st.attached.Store(false) // lovelock iface detach p0
	sup.Recheck()
	if s := sup.Status(); s.State != api.ServiceDegraded || len(s.Degraded) != 1 || !strings.Contains(s.Degraded[0], "no steering program in XDP on p0") ||
		!strings.Contains(s.Degraded[0], "lovelock iface attach p0") {
		t.Errorf("rechecked after the detach: %+v; want degraded, saying so and how to fix it", s)
	}
	st.attached.Store(true)
	sup.Recheck()
	if s := sup.Status(); s.State != api.ServiceRunning || len(s.Degraded) != 0 {
		t.Errorf("rechecked after attaching again: %+v; want running", s)
	}
}

// TestSupervisorRecheckRunningAtBind: a service bound with the steering
// program in XDP is running, and degraded once an operator detaches it.
func TestSupervisorRecheckRunningAtBind(t *testing.T) {
	openGroups = func(xdp.GroupOptions, int, udp.Options) ([]*xdp.Group, error) { return nil, nil }
	t.Cleanup(func() { openGroups = xdp.OpenGroups })
	svc := &xdpService{fakeService{running: make(chan struct{})}}
	st := &lateXDP{fakeSteering: fakeSteering{port: 61440}}
	st.attached.Store(true)
	sup := NewSupervisor(svc, st, slog.New(slog.DiscardHandler), time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { sup.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	<-svc.running
	if s := sup.Status(); s.State != api.ServiceRunning || len(s.Degraded) != 0 {
		t.Fatalf("bound with XDP: %+v; want running", s)
	}
	st.attached.Store(false)
	sup.Recheck()
	if s := sup.Status(); s.State != api.ServiceDegraded || len(s.Degraded) != 1 || !strings.Contains(s.Degraded[0], "no steering program in XDP on p0") {
		t.Errorf("rechecked after the detach: %+v; want degraded, saying so", s)
	}
	if len(svc.bound.Degraded) != 0 {
		t.Errorf("binding's Degraded %q; want none: it was bound as asked", svc.bound.Degraded)
	}
}
