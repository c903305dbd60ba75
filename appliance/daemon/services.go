package daemon

import (
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/lovelock-dpu/lovelock/appliance/service"
	"github.com/lovelock-dpu/lovelock/appliance/service/ingestservice"
	"github.com/lovelock-dpu/lovelock/appliance/service/memservice"
	"github.com/lovelock-dpu/lovelock/appliance/service/msgservice"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
)

// services returns the services cfg asks lovelockd to run. A new service
// is one more line here (and its section in config.Config).
func services(d *Daemon) []service.Service {
	var out []service.Service
	if c := d.cfg.Messaging; c != nil {
		out = append(out, msgservice.New(*c, d.log))
	}
	if c := d.cfg.MemoryServer; c != nil {
		out = append(out, memservice.NewServer(*c, d.log))
	}
	if c := d.cfg.FarMemory; c != nil {
		out = append(out, memservice.NewAgent(*c, d.cfg.Port, d.log))
	}
	if c := d.cfg.FarMemoryHost; c != nil {
		out = append(out, memservice.NewHost(*c, d.log))
	}
	if c := d.cfg.Ingest; c != nil {
		out = append(out, ingestservice.New(*c, d.cfg.Port, d.cfg.Socket, d.log))
	}
	if c := d.cfg.IngestHost; c != nil {
		out = append(out, ingestservice.NewHost(*c, d.log))
	}
	return out
}

// steering is the daemon's data plane as the service frame sees it: the
// services' reserved rules are merged with the operator's set at every
// swap (see owned.go).
type steering struct{ d *Daemon }

func (s steering) Port() uint16 { return s.d.cfg.Port }

func (s steering) XDPAttached(iface string) (bool, error) {
	s.d.mu.Lock()
	att, err := s.d.node.Attachments()
	s.d.mu.Unlock()
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(att, func(a attach.Attachment) bool { return a.Iface == iface && a.Hook == attach.HookXDP }), nil
}

func (s steering) SetXSK(ifindex int, queue uint32, fd int) error {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	return s.d.node.Steer.SetXSK(ifindex, queue, fd)
}

func (s steering) SetXSKMultiBuffer(ifindex int, queue uint32, fd int) error {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	return s.d.node.Steer.SetXSKMultiBuffer(ifindex, queue, fd)
}

func (s steering) ClearXSK(ifindex int, queue uint32) error {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	return s.d.node.Steer.ClearXSK(ifindex, queue)
}

// Reserve makes rs the named service's rules and swaps in the operator's
// set followed by every service's; the reserved rules change only if the
// swap succeeds.
func (s steering) Reserve(name string, rs []rules.Rule) ([]string, error) {
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	next := map[string][]rules.Rule{}
	for k, v := range d.reserved {
		next[k] = v
	}
	if rs == nil {
		delete(next, name)
	} else {
		next[name] = rs
	}
	warnings, err := d.reinstall(service.Merge(next))
	if err != nil {
		return nil, err
	}
	d.reserved = next
	return append(warnings, shadowed(d.state.Rules, rs, d.cfg.Port)...), nil
}

// supervisor returns the supervisor of the named service, nil if this node
// does not run it.
func (d *Daemon) supervisor(name string) *service.Supervisor {
	for _, s := range d.supervisors {
		if s.Service().Name() == name {
			return s
		}
	}
	return nil
}

// Services implements api.Service.
func (d *Daemon) Services() ([]api.ServiceStatus, error) {
	out := []api.ServiceStatus{}
	for _, s := range d.supervisors {
		out = append(out, s.Status())
	}
	return out, nil
}

// ServiceStats implements api.Service.
func (d *Daemon) ServiceStats(name string) (any, error) {
	s := d.supervisor(name)
	if s == nil {
		return nil, &api.NotFoundError{Err: fmt.Errorf("this node runs no %s service (see lovelockd's config; 'lovelock services' lists what runs)", name)}
	}
	if st := s.Service().Stats(); st != nil {
		return st, nil
	}
	return nil, notRunning(s)
}

// ServiceHandler implements api.Service: a service that has calls of its
// own implements http.Handler.
func (d *Daemon) ServiceHandler(name string) http.Handler {
	s := d.supervisor(name)
	if s == nil {
		return nil
	}
	h, _ := s.Service().(http.Handler)
	return h
}

// notRunning says why a configured service has no stats.
func notRunning(s *service.Supervisor) error {
	st := s.Status()
	if st.Error != "" {
		return fmt.Errorf("the %s service is not running (%s): %s", st.Name, st.State, st.Error)
	}
	return fmt.Errorf("the %s service is not running (%s; see lovelockd's log)", st.Name, st.State)
}

// MsgStats implements api.Service.
func (d *Daemon) MsgStats() (messaging.Stats, error) {
	s := d.supervisor(msgservice.Name)
	if s == nil {
		return messaging.Stats{}, &api.NotFoundError{Err: errors.New("this node runs no messaging agent (see 'messaging' in lovelockd's config)")}
	}
	st, ok := s.Service().(*msgservice.Service).AgentStats()
	if !ok {
		return messaging.Stats{}, notRunning(s)
	}
	return st, nil
}

var _ service.Steering = steering{}
