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
//
// Errors come back as {"error": "..."} with a 4xx status for bad requests and
// 5xx for failures of the node.
package api

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
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

// Rules that lovelockd installs for its own services (the messaging
// agent's AF_XDP steering) carry a name starting with OwnedRulePrefix and
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

// MessagingRules returns the steering rules lovelockd installs for a
// messaging agent at agent on AF_XDP: for each interface, each worker w
// (eps[w] is its endpoint, messaging.Config.WorkerEndpoints) and each of
// the types bundle and credit, the datagrams to the worker's endpoint go
// to xsk:w. They match the agent's address too, so that traffic the DPU
// routes to another node's agent is left alone, and the tenant, so that
// other tenants' datagrams are not taken. The Lovelock fields imply UDP to
// the data plane's Lovelock port, which the agent's port must be.
func MessagingRules(agent netip.AddrPort, tenant uint32, eps []messaging.Endpoint, ifaces []string) []rules.Rule {
	var out []rules.Rule
	dst := netip.PrefixFrom(agent.Addr().Unmap(), agent.Addr().Unmap().BitLen())
	for _, iface := range ifaces {
		for w, ep := range eps {
			for _, typ := range []wire.Type{wire.TypeBundle, wire.TypeCredit} {
				tenant, typ := tenant, typ
				out = append(out, rules.Rule{
					Name:     fmt.Sprintf("%smsg/%s/w%d/%s", OwnedRulePrefix, iface, w, typ),
					Priority: OwnedPriority,
					Match: rules.Match{
						Iface: iface, Dst: dst, Type: &typ, Tenant: &tenant,
						Rank: &rules.RankRange{Lo: uint32(ep), Hi: uint32(ep)},
					},
					Action: rules.XSK(uint32(w)),
				})
			}
		}
	}
	return out
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
}

// Service is what the daemon offers through the API.
type Service interface {
	Status() (Status, error)
	Attachments() ([]attach.Attachment, error)
	Attach(attach.Attachment) (Attached, error)
	Detach(iface string, hook attach.Hook) error
	Rules() (rules.Set, error)
	ApplyRules(rules.Set) (Applied, error)
	AddRule(rules.Rule) (Applied, error)
	DeleteRule(name string) (Applied, error)
	Stats() (Stats, error)
	// MsgStats reports the messaging agent's counters; a NotFoundError
	// when the node runs no agent.
	MsgStats() (messaging.Stats, error)
}

// BadRequestError marks errors caused by the request (reported as 400).
type BadRequestError struct{ Err error }

func (e *BadRequestError) Error() string { return e.Err.Error() }
func (e *BadRequestError) Unwrap() error { return e.Err }

// NotFoundError marks requests for things that do not exist (reported as 404).
type NotFoundError struct{ Err error }

func (e *NotFoundError) Error() string { return e.Err.Error() }
func (e *NotFoundError) Unwrap() error { return e.Err }
