// Package service is the frame lovelockd's services plug into. A service
// (messaging, far memory, accelerator ingest) says what it needs from the
// node's data plane — AF_XDP sockets on which interfaces, and steering rules
// of its own that send its traffic to them — and runs on what it was given.
// One piece of code, Bind, turns those needs into sockets registered with
// the steering program and reserved rules merged with the operator's, and
// undoes it; the daemon and the benches both use it, so no service wires
// itself by hand. Supervisor runs a service under lovelockd: plan, bind,
// run, unbind, and start again after a failure, reporting each step.
//
// A new service is its own package implementing Service plus one line in
// lovelockd's list of services (appliance/daemon) and its config section.
package service

import (
	"context"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
)

// Service is one of lovelockd's services.
type Service interface {
	// Name names the service in logs, the API (/v1/services/NAME),
	// metrics and its reserved rules (lovelockd:<prefix>/...). It is
	// fixed for the life of the service.
	Name() string

	// Interfaces are the interfaces whose traffic the service takes
	// through AF_XDP sockets, from lovelockd's config; lovelockd attaches
	// the steering program in XDP to each at start. Empty when the
	// service runs on kernel sockets only.
	Interfaces() []string

	// Plan says what to bind before each run. It reads the service's
	// configuration and any file it names, which may change between runs
	// (an operator fixing a cluster file), so an error here is retried.
	Plan() (Needs, error)

	// Run runs the service on b until ctx ends, drains what it
	// acknowledged, and returns. A nil error before ctx ends counts as a
	// failure too: a service runs until it is stopped. Run calls b.Ready
	// once it has opened what it serves on and is about to serve: until
	// then the service is reported starting (or failed, restarting), not
	// running.
	Run(ctx context.Context, b *Binding) error

	// Stats returns the service's counters as a JSON-encodable value, or
	// nil while it does not run.
	Stats() any

	// A Service exports its metrics: Collect reads its counters at scrape
	// time and sends nothing while it does not run.
	prometheus.Collector
}

// Needs is what a service asks for before it runs.
type Needs struct {
	// XDP asks for AF_XDP sockets; nil means the service opens kernel
	// sockets of its own.
	XDP *XDPNeeds
	// Rules are the service's reserved steering rules, installed with
	// the priority and name prefix lovelockd reserves (api.OwnedPriority,
	// api.OwnedRulePrefix) above the operator's set for as long as the
	// service is bound. Their actions refer to the sockets of XDP: xsk:w
	// is worker w's socket on the rule's interface.
	Rules []rules.Rule
}

// XDPNeeds asks for one xdp.Group per worker: worker w gets an AF_XDP
// socket on queue w of every interface and socket w of a kernel UDP
// SO_REUSEPORT group on Addr, which receives what XDP passes to the stack
// and sends what no AF_XDP socket can.
type XDPNeeds struct {
	Interfaces []string
	// Addr is where the service receives: an IPv4 address on the node and
	// the steering program's Lovelock port, which the XDP program parses.
	Addr    netip.AddrPort
	Workers int
	// Kernel configures the kernel sockets (buffers; Steer must pick
	// socket w for worker w's datagrams, as the rules do).
	Kernel udp.Options
	// MultiBuffer binds the AF_XDP sockets with XDP_USE_SG and registers
	// them as taking multi-buffer frames: datagrams up to the MTU on the
	// AF_XDP path (xdp.GroupOptions.MultiBuffer).
	MultiBuffer bool
}
