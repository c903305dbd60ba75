// Package messaging owns Lovelock's fire-and-forget messaging service, the
// design of the Buddy paper (communication offloading on DPUs): the client
// library that host processes link (Client: non-blocking Send of small
// messages to application ranks, Flush, Recv or a handler), the routing
// agent that runs on each node's DPU or host (Agent), the protocol between
// them, and the service's configuration (Config) and counters (Stats).
//
// Messages are aggregated at every hop. A client packs the messages it is
// given into bundles, one set of send buffers per destination, and sends a
// bundle when it is full, when its flush timeout passes, or when the client
// goes idle. The agent routes every message of the bundles it receives by a
// next-hop table computed at start (rank → node → agent address, or a local
// client), appends it to a per-next-hop, per-worker send buffer, and flushes
// those buffers by the same rules. In ModeNone there is no agent and clients
// bundle straight to each other.
//
// Every datagram is UDP to the Lovelock port with the Lovelock header
// (dataplane/wire): bundles (wire.TypeBundle) carry a per-link sequence
// number and credits (wire.TypeCredit) flow back. The payload formats are
// package bundle's. Each link is a sliding window of at most
// Config.BuffersPerDest bundles: a receiver grants room only for bundles it
// has processed, so a slow receiver makes its senders wait rather than lose
// messages (on an agent, routing that finds no free send buffer parks the
// rest of the bundle on a blocklist, drained as credits return), lost
// bundles are sent again, and every drop that remains is counted.
//
// An agent's workers share no lock on their hot path: each owns its socket
// (an AF_XDP queue on a DPU, a SO_REUSEPORT socket with kernel UDP), its
// incoming links and its own send buffers towards every next hop.
// docs/messaging.md describes the formats, the protocol and the knobs.
package messaging

import "errors"

// Sentinel errors.
var (
	// ErrClosed: the client or agent was closed.
	ErrClosed = errors.New("messaging: closed")
	// ErrUnknownRank: Send to a rank the cluster config does not have.
	ErrUnknownRank = errors.New("unknown rank")
	// ErrUnknownNode: a node or client name the cluster config lacks.
	ErrUnknownNode = errors.New("unknown node or client")
	// ErrWouldBlock: TrySend found no free send buffer.
	ErrWouldBlock = errors.New("messaging: no free send buffer")
	// ErrTooLarge: a message above Config.MaxMessageSize.
	ErrTooLarge = errors.New("message too large")
	// ErrPeerDead: a client's next hop (its agent, or in ModeNone the
	// destination client) did not answer for Config.PeerTimeout. The
	// messages the client held for it are dropped (Stats: dead_peer), and
	// Send refuses new ones until the peer answers a probe again.
	ErrPeerDead = errors.New("messaging: next hop declared dead")
	// ErrMode: an agent asked for in ModeNone, or a client without its
	// agent's address.
	ErrMode = errors.New("messaging: wrong mode")
)
