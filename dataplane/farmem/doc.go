// Package farmem owns Lovelock's far-memory service, the design of the SODA
// paper (disaggregated memory with SmartNIC offloading): the memory-node
// server that owns regions and answers page reads and writes (Server), the
// DPU agent that keeps region metadata, batches concurrent host requests per
// memory node and forwards them asynchronously (Agent), the host client
// library with its explicit region handle (Client, Region), the protocol
// between them, its configuration (Config) and counters (ServerStats,
// AgentStats, ClientStats).
//
// Every datagram is UDP to the Lovelock port with the Lovelock header
// (dataplane/wire) of type mem-read, mem-write (requests) or mem-reply
// (replies, and a memory node's notices that it freed a region the DPU
// agent caches), followed by this package's payload: an 8-byte preamble
// and one or more records, each a request or a reply, or a fragment of
// one. Chunks (64 KiB by default) span several datagrams; every hop
// reassembles them with bounded memory. Requests carry IDs: requesters retransmit on timeout with
// backoff and a bounded number of tries, responders answer duplicates from a
// small reply cache, so loss, reordering and duplication on either link never
// turn into a hang or wrong data. docs/farmem.md describes the formats, the
// protocol, durability and the knobs.
//
// All three run over transport.Transport, so that kernel UDP, AF_XDP or,
// later, RDMA verbs carry them; none of them opens a socket except through
// dataplane/transport/udp when it is given an address instead of
// transports.
package farmem

import "errors"

// Sentinel errors. Errors a server reports travel as a Status and come back
// to the caller wrapping the matching sentinel.
var (
	// ErrClosed: the client, region, agent or server was closed.
	ErrClosed = errors.New("farmem: closed")
	// ErrUnknownRegion: no region with that ID (or it was freed).
	ErrUnknownRegion = errors.New("farmem: unknown region")
	// ErrOutOfRange: an offset or size past the end of the region.
	ErrOutOfRange = errors.New("farmem: offset or size out of range")
	// ErrWrongTenant: the region belongs to another tenant.
	ErrWrongTenant = errors.New("farmem: region belongs to another tenant")
	// ErrWriterBusy: the region already has a writer.
	ErrWriterBusy = errors.New("farmem: region already has a writer")
	// ErrNotWriter: a write or writer operation without a valid writer
	// lease (never granted, released, expired, or lost to a server restart).
	ErrNotWriter = errors.New("farmem: no valid writer lease")
	// ErrLeaseLost: a writer's lease lapsed (its client could not renew it
	// for a TTL) and another writer was granted the region since, so it
	// may have written: the handle's writes that were not acknowledged
	// are not applied, and every later write and Sync through the handle
	// fails with it. Errors wrapping it also wrap ErrWriterBusy (the
	// memory node's answer to the handle's try to take the lease back).
	ErrLeaseLost = errors.New("farmem: writer lease lost to another writer")
	// ErrReadOnly: a writer asked for on a region created read-only.
	ErrReadOnly = errors.New("farmem: region is read-only")
	// ErrNoSpace: the server's capacity would be exceeded.
	ErrNoSpace = errors.New("farmem: server full")
	// ErrBadRequest: a malformed or oversize request.
	ErrBadRequest = errors.New("farmem: bad request")
	// ErrIO: the server failed to read or write its backing store.
	ErrIO = errors.New("farmem: server i/o error")
	// ErrUnavailable: the request got no answer after every try, or the
	// agent could not reach the region's memory node.
	ErrUnavailable = errors.New("farmem: no answer")
	// ErrNoServer: the agent knows no memory node for the region.
	ErrNoServer = errors.New("farmem: no memory node for region")
)

// Lost reports whether err says that a region's bytes cannot be had, or
// written, by asking again: the region is unknown to every memory node (it
// was freed), belongs to another tenant, the request is malformed or out of
// its range, or the writer lost its lease to another writer
// (ErrLeaseLost). An unreachable node (ErrUnavailable, ErrNoServer) or its
// failing disk (ErrIO) may come back, and is not lost.
func Lost(err error) bool {
	for _, e := range []error{ErrUnknownRegion, ErrWrongTenant, ErrOutOfRange, ErrBadRequest, ErrLeaseLost} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
