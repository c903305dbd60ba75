package daemon

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lovelock-dpu/lovelock/appliance/service"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/rules"
)

// slowService is bound at once but opens what it serves on only when the
// test says (setup), as ingest_host opening its GPUs does.
type slowService struct {
	entered, setup, ready chan struct{}
}

func (s *slowService) Name() string                 { return "slow" }
func (s *slowService) Interfaces() []string         { return nil }
func (s *slowService) Plan() (service.Needs, error) { return service.Needs{}, nil }
func (s *slowService) Run(ctx context.Context, b *service.Binding) error {
	close(s.entered)
	select {
	case <-s.setup:
	case <-ctx.Done():
		return nil
	}
	b.Ready()
	close(s.ready)
	<-ctx.Done()
	return nil
}
func (s *slowService) Stats() any                       { return nil }
func (s *slowService) Describe(chan<- *prometheus.Desc) {}
func (s *slowService) Collect(chan<- prometheus.Metric) {}

// noSteering serves services on kernel sockets only.
type noSteering struct{}

func (noSteering) Port() uint16                                   { return 61440 }
func (noSteering) XDPAttached(string) (bool, error)               { return false, nil }
func (noSteering) SetXSK(int, uint32, int) error                  { return nil }
func (noSteering) SetXSKMultiBuffer(int, uint32, int) error       { return nil }
func (noSteering) ClearXSK(int, uint32) error                     { return nil }
func (noSteering) Reserve(string, []rules.Rule) ([]string, error) { return nil, nil }

// TestServicesHealthStarting: a service that is bound but still setting
// up keeps the node starting, not ready; once it says it serves, the node
// is.
func TestServicesHealthStarting(t *testing.T) {
	svc := &slowService{entered: make(chan struct{}), setup: make(chan struct{}), ready: make(chan struct{})}
	sup := service.NewSupervisor(svc, noSteering{}, slog.Default(), time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { sup.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	<-svc.entered
	fails, starting := servicesHealth([]*service.Supervisor{sup})
	if !starting || len(fails) != 0 || sup.Status().State != api.ServiceStarting {
		t.Errorf("setting up: starting %v, failures %v, state %s; want starting and no failure", starting, fails, sup.Status().State)
	}
	close(svc.setup)
	<-svc.ready
	fails, starting = servicesHealth([]*service.Supervisor{sup})
	if starting || len(fails) != 0 || sup.Status().State != api.ServiceRunning {
		t.Errorf("ready: starting %v, failures %v, state %s; want running", starting, fails, sup.Status().State)
	}
}
