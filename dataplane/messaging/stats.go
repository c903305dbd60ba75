package messaging

import (
	"sync/atomic"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
)

// Stats is a snapshot of an agent's or a client's counters, summed over its
// workers or shards. It is what `lovelock msg stats` shows; the JSON names
// are its -o json field names.
type Stats struct {
	// Role is "agent" or "client".
	Role string `json:"role"`
	// Node and Client name the owner (Client is empty for an agent).
	Node   string `json:"node"`
	Client string `json:"client,omitempty"`
	Mode   Mode   `json:"mode"`
	// Workers is an agent's worker count, or a client's sender shards.
	Workers int `json:"workers"`
	// TransferSize is the bundle size in use: the configured one lowered
	// to the transport's MaxPayload.
	TransferSize int `json:"transfer_size"`
	// Destinations has one entry per next hop, in next-hop table order.
	Destinations []DestStats `json:"destinations"`
	// Local counts a client's messages to its own ranks, which it
	// delivers in memory, not through a next hop: bundles handed to its
	// delivery queue, their messages and record bytes (no headers), flush
	// reasons, and Blocked (a Send that waited for the consumer to give a
	// buffer back). It is in neither Destinations nor Sent. Zero for an
	// agent.
	Local DestStats `json:"local,omitzero"`
	// Received counts what arrived.
	Received RecvStats `json:"received"`
	// Drops counts every message or datagram dropped, by reason.
	Drops DropStats `json:"drops"`
	// Transport counts the datagrams of an agent's transports by worker
	// and path, where the transports keep counters of their own (AF_XDP on
	// a DPU). The agent leaves it empty; lovelockd fills it in.
	Transport []PathStats `json:"transport,omitempty"`
	// TransportDegraded says, one line each, where lovelockd bound the
	// agent's transport short of its configuration (e.g. multi-buffer
	// AF_XDP refused by the driver: single-buffer sockets).
	TransportDegraded []string `json:"transport_degraded,omitempty"`
}

// PathStats count one agent worker's datagrams on one path: an AF_XDP
// socket, or the worker's kernel UDP socket beside them.
type PathStats = transport.PathStats

// DestStats counts what was sent to one next hop.
type DestStats struct {
	// Name is the next hop: a node's agent ("node1") or a client
	// ("node1/c0").
	Name string `json:"name"`
	Addr string `json:"addr"`
	// Bytes, Messages and Bundles count bundles the transport took
	// (sendmmsg, or the AF_XDP ring), each once, the first time it took it:
	// their datagram bytes (headers included), the messages that begin in
	// them, and the bundles. A datagram the transport refused counts in
	// Drops.SendErrors instead.
	Bytes    uint64 `json:"bytes"`
	Messages uint64 `json:"messages"`
	Bundles  uint64 `json:"bundles"`
	// AvgBundleBytes is Bytes / Bundles.
	AvgBundleBytes float64 `json:"avg_bundle_bytes"`
	// Flushes counts why bundles were closed.
	Flushes FlushCounts `json:"flushes"`
	// Retransmits counts bundles the transport took again, RetransmitBytes
	// their bytes.
	Retransmits     uint64 `json:"retransmits"`
	RetransmitBytes uint64 `json:"retransmit_bytes"`
	// Blocked counts the times a message found no free send buffer and
	// had to wait: on an agent's blocklist, or in a client's Send.
	Blocked uint64 `json:"blocked"`
	// Probes counts credit probes the transport took: while the
	// receiver's window stayed closed with nothing in flight, to a dead
	// next hop until it answers, to confirm the link's base to a
	// receiver whose credit acked less than it (one met in mid-stream
	// after a restart), and to ask about a session given up.
	Probes uint64 `json:"probes"`
	// PeerResets counts declarations that the next hop is dead.
	PeerResets uint64 `json:"peer_resets"`
	// PeerDead says the next hop is dead now: it stopped answering for
	// peer_timeout (for at least one agent worker or client shard), and
	// until it answers a probe, messages for it are dropped (agent) or
	// refused with ErrPeerDead (client).
	PeerDead bool `json:"peer_dead"`
}

// FlushCounts counts bundles by the reason they were sent.
type FlushCounts struct {
	// Full: the next message did not fit.
	Full uint64 `json:"full"`
	// Timeout: the bundle's flush timeout passed.
	Timeout uint64 `json:"timeout"`
	// Idle: the agent worker or client shard went idle.
	Idle uint64 `json:"idle"`
	// Explicit: Flush or shutdown.
	Explicit uint64 `json:"explicit"`
}

// RecvStats counts what an agent or client received.
type RecvStats struct {
	// Bundles, Messages and Bytes count bundles accepted in sequence,
	// the messages they complete, and their datagram bytes.
	Bundles  uint64 `json:"bundles"`
	Messages uint64 `json:"messages"`
	Bytes    uint64 `json:"bytes"`
	// Duplicates counts bundles that arrived again (acknowledged, not
	// processed twice); OutOfOrder those held until a gap filled.
	Duplicates uint64 `json:"duplicates"`
	OutOfOrder uint64 `json:"out_of_order"`
	// Credits counts credit datagrams received, Probes the probes.
	Credits uint64 `json:"credits"`
	Probes  uint64 `json:"probes"`
	// Delivered counts messages handed to the application (clients) or to
	// a local client's send buffers (agents).
	Delivered uint64 `json:"delivered"`
	// Local counts the messages of Messages and Delivered that a client
	// sent to its own ranks (Stats.Local): they were never on the network,
	// so they are in no received bundle or byte.
	Local uint64 `json:"local"`
	// Misdirected counts credits that reached the wrong agent worker and
	// were passed to the right one (one its full mailbox could not take
	// is counted in Drops.Mailbox instead).
	Misdirected uint64 `json:"misdirected"`
	// Refused counts bundles an agent left unacknowledged while it
	// drained before stopping (AgentOptions.Drain): their senders send
	// them again, to the agent's next run. Nothing is lost.
	Refused uint64 `json:"refused"`
	// Unconfirmed counts bundles an agent or client left unacknowledged
	// on a link it met in mid-stream (after its own or the sender's
	// restart), until the sender's probe confirmed where the link starts:
	// their senders send them again. Nothing is lost.
	Unconfirmed uint64 `json:"unconfirmed"`
}

// DropStats counts drops by reason. Messages are counted where a message
// is dropped, datagrams where a whole datagram is.
type DropStats struct {
	// Malformed: datagrams that fail the Lovelock header checks
	// (wire.Decode: truncated, bad version, bad length, unknown type) or
	// have a type messaging does not use.
	Malformed uint64 `json:"malformed"`
	// BadBundle: bundles whose preamble or records are invalid (all their
	// messages are dropped; the bundle is still acknowledged).
	BadBundle uint64 `json:"bad_bundle"`
	// BadCredit: credits with an invalid payload.
	BadCredit uint64 `json:"bad_credit"`
	// UnknownRank: messages for a rank the cluster does not have, or that
	// reached a client that does not serve it.
	UnknownRank uint64 `json:"unknown_rank"`
	// WrongTenant: datagrams of another tenant.
	WrongTenant uint64 `json:"wrong_tenant"`
	// WrongDest: datagrams whose destination endpoint is not here.
	WrongDest uint64 `json:"wrong_dest"`
	// OutOfWindow: bundles beyond the receive window granted.
	OutOfWindow uint64 `json:"out_of_window"`
	// Oversize: messages larger than max_message_size.
	Oversize uint64 `json:"oversize"`
	// Orphans: continuations of messages whose head this receiver never
	// saw (it started in the middle of a sender's stream).
	Orphans uint64 `json:"orphans"`
	// TooManyLinks: bundles from a new link when the receiver already
	// tracks its maximum of links.
	TooManyLinks uint64 `json:"too_many_links"`
	// StaleGap: bundles held out of order above a gap that stayed open
	// for two peer timeouts (its sender is gone, has reset the link, is
	// hostile, or cannot get the hole through), dropped so that the link
	// can be forgotten. A message with a part in one is lost with it, and
	// not counted again as an orphan.
	StaleGap uint64 `json:"stale_gap"`
	// DeadPeer: messages dropped because their next hop stopped answering
	// for peer_timeout: at once, those never sent and those of the oldest
	// bundle in flight; those in flight above it once the receiver, asked,
	// says it neither took nor holds them (a message it holds a part of
	// counts in its StaleGap when it drops it, not here).
	DeadPeer uint64 `json:"dead_peer"`
	// StaleCredit: credits for a link that no longer exists (an earlier
	// session).
	StaleCredit uint64 `json:"stale_credit"`
	// SendErrors: datagrams the transport refused, or did not take
	// because it closed. With the sent counters (DestStats), they
	// partition the datagrams attempted.
	SendErrors uint64 `json:"send_errors"`
	// Mailbox: credits lost between agent workers (the mailbox was full).
	Mailbox uint64 `json:"mailbox"`
	// Closed: messages a client's Close could not send, their bundles
	// waiting for the receiver's window (Flush before Close waits for it).
	Closed uint64 `json:"closed"`
}

// Total returns the sum of every drop counter but StaleCredit, which is
// harmless.
func (d DropStats) Total() uint64 {
	return d.Malformed + d.BadBundle + d.BadCredit + d.UnknownRank + d.WrongTenant + d.WrongDest +
		d.OutOfWindow + d.Oversize + d.Orphans + d.TooManyLinks + d.StaleGap + d.DeadPeer + d.SendErrors + d.Mailbox + d.Closed
}

// Dest returns the destination named name and whether there is one.
func (s Stats) Dest(name string) (DestStats, bool) {
	for _, d := range s.Destinations {
		if d.Name == name {
			return d, true
		}
	}
	return DestStats{}, false
}

// Sent returns the destinations' counters summed.
func (s Stats) Sent() DestStats {
	var t DestStats
	t.Name = "total"
	for _, d := range s.Destinations {
		t.add(d)
	}
	if t.Bundles > 0 {
		t.AvgBundleBytes = float64(t.Bytes) / float64(t.Bundles)
	}
	return t
}

func (t *DestStats) add(d DestStats) {
	t.Bytes += d.Bytes
	t.Messages += d.Messages
	t.Bundles += d.Bundles
	t.Flushes.Full += d.Flushes.Full
	t.Flushes.Timeout += d.Flushes.Timeout
	t.Flushes.Idle += d.Flushes.Idle
	t.Flushes.Explicit += d.Flushes.Explicit
	t.Retransmits += d.Retransmits
	t.RetransmitBytes += d.RetransmitBytes
	t.Blocked += d.Blocked
	t.Probes += d.Probes
	t.PeerResets += d.PeerResets
	t.PeerDead = t.PeerDead || d.PeerDead
}

// flushReason is why a bundle was closed.
type flushReason uint8

const (
	flushFull flushReason = iota
	flushTimeout
	flushIdle
	flushExplicit
	numFlushReasons
)

// destCounters are one link's send counters. The link's owner (a worker, or
// a shard under its lock) writes them; Stats reads them at any time.
type destCounters struct {
	bytes, messages, bundles  atomic.Uint64
	retransmits, retransBytes atomic.Uint64
	blocked, probes, resets   atomic.Uint64
	flushes                   [numFlushReasons]atomic.Uint64
	dead                      atomic.Bool // mirrors outLink.dead for Stats
}

func (c *destCounters) snapshot() DestStats {
	return DestStats{
		Bytes:    c.bytes.Load(),
		Messages: c.messages.Load(),
		Bundles:  c.bundles.Load(),
		Flushes: FlushCounts{
			Full:     c.flushes[flushFull].Load(),
			Timeout:  c.flushes[flushTimeout].Load(),
			Idle:     c.flushes[flushIdle].Load(),
			Explicit: c.flushes[flushExplicit].Load(),
		},
		Retransmits:     c.retransmits.Load(),
		RetransmitBytes: c.retransBytes.Load(),
		Blocked:         c.blocked.Load(),
		Probes:          c.probes.Load(),
		PeerResets:      c.resets.Load(),
		PeerDead:        c.dead.Load(),
	}
}

// dropReason indexes counters.drops.
type dropReason uint8

const (
	dropMalformed dropReason = iota
	dropBadBundle
	dropBadCredit
	dropUnknownRank
	dropWrongTenant
	dropWrongDest
	dropOutOfWindow
	dropOversize
	dropOrphans
	dropTooManyLinks
	dropDeadPeer
	dropStaleCredit
	dropSendErrors
	dropMailbox
	dropClosed
	dropStaleGap
	numDropReasons
)

// counters are one worker's or client's receive and drop counters, written
// by their owner with atomic adds and read by Stats.
type counters struct {
	bundles, messages, bytes atomic.Uint64
	duplicates, outOfOrder   atomic.Uint64
	credits, probes          atomic.Uint64
	delivered, misdirected   atomic.Uint64
	refused, unconfirmed     atomic.Uint64
	local                    atomic.Uint64
	drops                    [numDropReasons]atomic.Uint64
}

func (c *counters) drop(r dropReason, n uint64) { c.drops[r].Add(n) }

// addTo adds c into the snapshot parts.
func (c *counters) addTo(r *RecvStats, d *DropStats) {
	r.Bundles += c.bundles.Load()
	r.Messages += c.messages.Load()
	r.Bytes += c.bytes.Load()
	r.Duplicates += c.duplicates.Load()
	r.OutOfOrder += c.outOfOrder.Load()
	r.Credits += c.credits.Load()
	r.Probes += c.probes.Load()
	r.Delivered += c.delivered.Load()
	r.Misdirected += c.misdirected.Load()
	r.Refused += c.refused.Load()
	r.Unconfirmed += c.unconfirmed.Load()
	r.Local += c.local.Load()
	for i, f := range []*uint64{
		&d.Malformed, &d.BadBundle, &d.BadCredit, &d.UnknownRank, &d.WrongTenant, &d.WrongDest,
		&d.OutOfWindow, &d.Oversize, &d.Orphans, &d.TooManyLinks, &d.DeadPeer, &d.StaleCredit,
		&d.SendErrors, &d.Mailbox, &d.Closed, &d.StaleGap,
	} {
		*f += c.drops[i].Load()
	}
}
