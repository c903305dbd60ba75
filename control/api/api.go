// Package api is lovelockd's local API: JSON over HTTP on a unix socket that
// only root can open. It owns the request and reply types, the server-side
// routing onto a Service, and the client the CLI uses.
//
//	GET    /v1/status                   Status
//	GET    /v1/ifaces                   []attach.Attachment
//	POST   /v1/ifaces                   attach.Attachment -> Attached
//	DELETE /v1/ifaces/{iface}/{hook}    detach
//	GET    /v1/rules                    rules.Set
//	PUT    /v1/rules                    rules.Set (whole set, atomic) -> Applied
//	POST   /v1/rules                    rules.Rule (add one)          -> Applied
//	DELETE /v1/rules/{name}             delete one                    -> Applied
//	GET    /v1/stats                    Stats
//	GET    /v1/msg/stats                messaging.Stats of the routing agent
//	GET    /v1/services                 []ServiceStatus
//	GET    /v1/services/{name}/stats    the service's own stats
//	*      /v1/services/{name}/...      the service's own calls (ServiceHandler)
//
// Errors come back as {"error": "..."} with a 4xx status for bad requests and
// 5xx for failures of the node.
package api

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
)

// DefaultSocket is where lovelockd listens.
const DefaultSocket = "/run/lovelock/lovelockd.sock"

// Status describes the daemon and its data plane.
type Status struct {
	Version     string              `json:"version"`
	PinDir      string              `json:"pin_dir"`
	Port        uint16              `json:"port"`
	Loaded      bool                `json:"loaded"` // false: adopted pins at start
	Started     time.Time           `json:"started"`
	Attachments []attach.Attachment `json:"attachments"`
	Rules       int                 `json:"rules"`
	// RulesPending says that Rules counts a rule set that is not
	// installed: it did not go live (the "rules" failure says why, and
	// what the data plane runs meanwhile: the set it had, or none on a
	// fresh one) and goes live once it can. Its rules count nothing
	// until then (Stats reports them at zero, but for a rule the running
	// set has under the same name and ID).
	RulesPending bool `json:"rules_pending,omitempty"`

	// Health is HealthOK only when everything lovelockd was asked to run
	// runs: each attachment on its live interface, the rule set installed,
	// each service running. Failures says what does not, and why.
	Health   Health              `json:"health,omitempty"`
	Links    []attach.LinkStatus `json:"links,omitempty"`
	Failures []Failure           `json:"failures,omitempty"`
	// Services are the services' states, as GET /v1/services reports them.
	Services []ServiceStatus `json:"services,omitempty"`
}

// Health sums up a node: whether it runs as asked.
type Health string

// Health values.
const (
	HealthOK       Health = "ok"       // everything asked for runs
	HealthStarting Health = "starting" // nothing failed, but a service is still starting
	HealthDegraded Health = "degraded" // something asked for does not run: see Failures
)

// Failure is one thing lovelockd was asked to run that does not run.
type Failure struct {
	// What failed: "attachment pf0hpf xdp", "rules", "service messaging".
	What string `json:"what"`
	// Cause says why, and what lovelockd does about it.
	Cause string `json:"cause"`
	// Since is when lovelockd first saw it (zero when it cannot tell).
	Since time.Time `json:"since,omitzero"`
}

// Attached answers an attach.
type Attached struct {
	Adopted bool `json:"adopted"` // already attached: nothing changed
}

// Applied answers a rule change.
type Applied struct {
	Rules int `json:"rules"` // rules now live, lovelockd's own included
	// Owned is how many of them lovelockd installed for its own services
	// (see OwnedRulePrefix).
	Owned int `json:"owned,omitempty"`
	// Warnings are things the operator should know about the set, such as
	// rules that also match traffic lovelockd's own rules take first.
	Warnings []string `json:"warnings,omitempty"`
}

// Rules that lovelockd installs for its own services (appliance/service:
// steering their traffic to their AF_XDP sockets) carry a name starting with OwnedRulePrefix and
// a priority of OwnedPriority or more. They are merged with the operator's
// set whenever a set is applied, listed and counted like other rules, and
// not part of the operator's set: a set sent to ApplyRules or AddRule may
// not use the prefix or the priority band (a rule identical to a live
// owned one, as 'lovelock rules -o json' lists it, is ignored), and
// DeleteRule refuses them.
const (
	OwnedRulePrefix        = "lovelockd:"
	OwnedPriority   uint32 = 4_000_000_000
)

// IsOwned reports whether a rule name is one of lovelockd's own.
func IsOwned(name string) bool { return strings.HasPrefix(name, OwnedRulePrefix) }

// ServiceState is where one of lovelockd's services stands.
type ServiceState string

// Service states.
const (
	ServiceStarting ServiceState = "starting" // planning and binding its first run
	ServiceRunning  ServiceState = "running"  // bound as it asked, running
	ServiceDegraded ServiceState = "degraded" // running, but bound short of what it asked (Degraded says how)
	ServiceFailed   ServiceState = "failed"   // stopped by an error (Error), restarting
	ServiceStopped  ServiceState = "stopped"  // stopped with lovelockd
)

// ServiceStatus describes one of lovelockd's services.
type ServiceStatus struct {
	Name  string       `json:"name"`
	State ServiceState `json:"state"`
	// Since is when it entered State.
	Since time.Time `json:"since"`
	// Binding says what it runs on ("kernel sockets", or its AF_XDP
	// sockets), while it runs.
	Binding string `json:"binding,omitempty"`
	// Degraded says what is bound short of what the service asked for.
	Degraded []string `json:"degraded,omitempty"`
	// Error is why it last failed (kept while it runs again after it);
	// Restarts how often it was started again after a failure.
	Error    string `json:"error,omitempty"`
	Restarts int    `json:"restarts"`
	// NextTry is when a failed service is started again; zero unless it
	// is failed. The waits double with each failure in a row.
	NextTry time.Time `json:"next_try,omitzero"`
}

// MemCreate asks a memory server for a region
// (POST /v1/services/memserver/regions): Size bytes, zero-filled, or a
// copy of the file Preload on the memory node (Size 0: the file's size).
type MemCreate struct {
	Tenant   uint32 `json:"tenant"`
	Size     uint64 `json:"size"`
	Writable bool   `json:"writable"`
	Preload  string `json:"preload,omitempty"`
}

// MemHostStats are a far-memory host agent's counters
// (GET /v1/services/memhost/stats): the mappings it serves and its client's
// traffic to the DPU's agent.
type MemHostStats struct {
	Agent    string             `json:"agent"`
	Socket   string             `json:"socket"`
	Mappings int64              `json:"mappings"`
	Client   farmem.ClientStats `json:"client"`
}

// Counter is packets and bytes.
type Counter = bpf.Counter

// RuleStat is one rule's counters.
type RuleStat struct {
	Name     string  `json:"name"`
	ID       uint32  `json:"id"`
	Priority uint32  `json:"priority"`
	Action   string  `json:"action"`
	Counter  Counter `json:"counter"`
}

// Stats are the data plane's counters at Time.
type Stats struct {
	Time time.Time `json:"time"`
	// Verdicts by name (rx, pass, drop, redirect, xsk, malformed, ...).
	Verdicts map[string]Counter `json:"verdicts"`
	// Rules in rule set order; Default counts packets no rule matched.
	Rules   []RuleStat `json:"rules"`
	Default Counter    `json:"default"`
	// RulesPending says that Rules is a set that is not installed yet
	// (Status.RulesPending): its rules count nothing, whatever they show.
	RulesPending bool `json:"rules_pending,omitempty"`
	// Interfaces are the verdict counters again, per interface a steering
	// hook ran on (XDP and TC ingress: the arrival interface; TC egress:
	// the one the packet leaves by): interface name to counter name (as in
	// Verdicts) to counter. Names are resolved in lovelockd's network
	// namespace; an ifindex with no interface now (deleted, or its counts
	// from before a re-creation) is "if<N>", and every ifindex from
	// bpf.IfaceOther up is counted together under IfaceOther. Interfaces
	// that counted nothing are left out. Summed over interfaces, each
	// counter is Verdicts' (but after an upgrade from a build without
	// per-interface counters, which count from the upgrade on).
	Interfaces map[string]map[string]Counter `json:"interfaces,omitempty"`
}

// IfaceOther names, in Stats.Interfaces, the counters shared by every
// ifindex from bpf.IfaceOther up.
const IfaceOther = "(other)"

// IfaceUnknown names, in Stats.Interfaces, the counters of an ifindex with
// no interface now.
func IfaceUnknown(ifindex uint32) string { return fmt.Sprintf("if%d", ifindex) }

// Service is what the daemon offers through the API.
type Service interface {
	Status() (Status, error)
	Attachments() ([]attach.Attachment, error)
	Attach(attach.Attachment) (Attached, error)
	Detach(iface string, hook attach.Hook) error
	Rules() (rules.Set, error)
	ApplyRules(rules.Set) (Applied, error)
	// CheckRules checks a set as ApplyRules would, merged with lovelockd's
	// own rules on this node's interfaces, and changes nothing.
	CheckRules(rules.Set) (Applied, error)
	AddRule(rules.Rule) (Applied, error)
	DeleteRule(name string) (Applied, error)
	Stats() (Stats, error)
	// MsgStats reports the messaging agent's counters; a NotFoundError
	// when the node runs no agent.
	MsgStats() (messaging.Stats, error)
	// Services reports each service lovelockd runs.
	Services() ([]ServiceStatus, error)
	// ServiceStats reports the named service's counters (its own JSON
	// shape); a NotFoundError when the node does not run it.
	ServiceStats(name string) (any, error)
	// ServiceHandler returns the named service's own API, served under
	// /v1/services/NAME/ (nil: none).
	ServiceHandler(name string) http.Handler
}

// BadRequestError marks errors caused by the request (reported as 400).
type BadRequestError struct{ Err error }

func (e *BadRequestError) Error() string { return e.Err.Error() }
func (e *BadRequestError) Unwrap() error { return e.Err }

// NotFoundError marks requests for things that do not exist (reported as 404).
type NotFoundError struct{ Err error }

func (e *NotFoundError) Error() string { return e.Err.Error() }
func (e *NotFoundError) Unwrap() error { return e.Err }
