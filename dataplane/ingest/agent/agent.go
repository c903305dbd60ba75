// Package agent is the DPU's side of accelerator ingest (Conspirator): it
// receives clients' inputs, reassembles and validates them in DPU memory,
// asks the MIG scheduler (package sched) for a slice, writes the bytes
// straight into that slice's buffer on the GPU host, rings the host's
// doorbell, and returns the output when the host says it is ready. Two
// front ends feed it: the Lovelock protocol on its client transport (this
// package) and anything that calls Infer (the KServe v2 gRPC server).
//
// One mutex guards the agent's state (requests, the host's registration,
// the pools' schedulers); copies into and out of the host's buffers run
// outside it, in a goroutine per placed request.
package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/hostagent"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/sched"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// Agent is a DPU's ingest agent.
type Agent struct {
	cfg    Config
	models map[string]*modelState
	start  time.Time

	mu       sync.Mutex
	host     *host
	fetching uint64 // epoch whose layout is being fetched
	reqs     map[reqKey]*request
	bySeq    map[uint64]*request
	results  map[reqKey]*doneResult
	resultQ  []*doneResult // results in expiry order
	// resultBytes is what the kept results hold, at most
	// Config.ResultBytes: the oldest go first beyond it.
	resultBytes int
	// nextSeq numbers requests from a random base: the host agent answers
	// a doorbell from memory by request number, and outlives a restart
	// of this agent, so numbers counted from 0 would repeat old ones.
	nextSeq uint64
	bufUsed int
	// held are the requests answered (given up on) that still hold their
	// slot: the write into it or the host's run on it may go on.
	held int

	stats counters
	lat   latencies

	// refusedFrom are the sources whose refused control datagrams were
	// logged, so each is logged once however often it sends; only the
	// host receive loop touches it. Bounded by maxRefusedSources.
	refusedFrom map[netip.Addr]bool

	toClients, toHost *outbox

	// adopts are the registrations being fetched and mapped: Run waits
	// for them, so that none installs a host after it returned.
	adopts sync.WaitGroup
}

type modelState struct {
	cfg      ModelConfig
	info     ingest.ModelInfo
	builtin  *model.Model  // nil for a model the host attaches
	duration time.Duration // EWMA of device time, the scheduler's estimate
}

// reqKey names a request: the client's address and its ID. Requests from
// Infer have no address and the agent's own ID.
type reqKey struct {
	addr netip.AddrPort
	id   uint64
}

type reqState int

const (
	receiving reqState = iota
	queued             // waiting for a slice
	writing            // placed; input being copied to the slot
	running            // doorbell rung
)

type request struct {
	key     reqKey
	seq     uint64
	tenant  uint32
	model   *modelState
	pool    *pool
	host    *host
	state   reqState
	arrived time.Time
	placed  time.Time
	// deadline is zero for none.
	deadline time.Time

	buf   []byte // the input, in DPU memory until written to the slot
	inLen int    // its length, once written
	have  ranges
	last  time.Time // last fragment

	gpu, slot int
	sliceName string
	rungAt    time.Time
	rings     int

	// done is set for requests from Infer; UDP requests answer their key's
	// address.
	done chan *outcome
	// answered: the client has its answer, counted in the stats. Before
	// the request ends only when Infer's caller gave up while the input
	// was written or the model ran, or its doorbells went unanswered
	// (abandonLocked): the request keeps its slice until that ends (the
	// write, the host's answer, a new registration, the host's loss),
	// then ends without a second answer.
	answered bool
}

type outcome struct {
	res *ingest.Result
	err error
}

// doneResult is a finished request kept to answer retransmissions.
type doneResult struct {
	key     reqKey
	tenant  uint32
	frags   [][]byte // encoded result datagrams
	bytes   int
	expires time.Time
}

// New returns an agent; Run starts it.
func New(cfg Config) (*Agent, error) {
	if cfg.Clients == nil || cfg.Host == nil {
		return nil, errors.New("ingest agent: need a client transport and a host control transport")
	}
	if cfg.Importer == nil {
		return nil, errors.New("ingest agent: no importer for the host's buffers")
	}
	if err := cfg.hostRequired(); err != nil {
		return nil, err
	}
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, models: map[string]*modelState{}, start: time.Now(), refusedFrom: map[netip.Addr]bool{},
		reqs: map[reqKey]*request{}, bySeq: map[uint64]*request{}, results: map[reqKey]*doneResult{}, nextSeq: rand.Uint64()}
	for _, m := range cfg.Models {
		ms := &modelState{cfg: m, info: modelInfo(m), duration: m.Duration}
		ms.builtin, _ = model.Builtin(m.Name)
		a.models[m.Name] = ms
	}
	a.lat.init(4096)
	a.toClients = newOutbox(cfg.Clients, "clients", cfg.Logger, &a.stats.resultDatagrams, &a.stats.sendErrors)
	a.toHost = newOutbox(cfg.Host, "host", cfg.Logger, nil, &a.stats.sendErrors)
	return a, nil
}

// Run serves until ctx ends; requests still open then fail as
// host-unavailable, and a registration still being mapped is dropped
// before Run returns. The transports are the caller's to close.
func (a *Agent) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	senders, stopSenders := context.WithCancel(context.Background())
	var swg sync.WaitGroup
	swg.Add(2)
	go func() { defer swg.Done(); a.toClients.run(senders) }()
	go func() { defer swg.Done(); a.toHost.run(senders) }()
	defer func() { stopSenders(); swg.Wait() }()
	wg.Add(3)
	go func() { defer wg.Done(); errc <- a.receiveClients(ctx) }()
	go func() { defer wg.Done(); errc <- a.receiveHost(ctx) }()
	go func() { defer wg.Done(); a.timers(ctx) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		cancel()
	}
	wg.Wait()
	// The host loop has returned, so no adopt starts after this.
	a.adopts.Wait()
	a.mu.Lock()
	for _, r := range a.reqs {
		a.failLocked(r, ingest.Errorf(ingest.StatusHostUnavailable, "the DPU ingest agent stopped: send the request again"))
	}
	h := a.host
	a.host = nil
	a.mu.Unlock()
	if h != nil {
		h.unmap()
	}
	if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
		return nil
	}
	return err
}

func (a *Agent) now() time.Duration { return time.Since(a.start) }

// receiveClients reads inputs from clients.
func (a *Agent) receiveClients(ctx context.Context) error {
	pkts := makePackets(32, a.cfg.Clients.MaxPayload())
	for {
		resetPackets(pkts)
		n, err := a.cfg.Clients.Recv(ctx, pkts)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("ingest agent: receive from clients: %w", err)
		}
		now := time.Now()
		a.mu.Lock()
		var out []transport.Packet
		for _, p := range pkts[:n] {
			out = a.inputLocked(now, p.Addr, p.Data, out)
		}
		a.mu.Unlock()
		if len(out) > 0 {
			a.toClients.push(out...)
		}
	}
}

func makePackets(n, size int) []transport.Packet {
	pkts := make([]transport.Packet, n)
	for i := range pkts {
		pkts[i].Data = make([]byte, size)
	}
	return pkts
}

func resetPackets(pkts []transport.Packet) {
	for i := range pkts {
		pkts[i].Data = pkts[i].Data[:cap(pkts[i].Data)]
	}
}

// inputLocked takes one input datagram; replies go to out.
func (a *Agent) inputLocked(now time.Time, from netip.AddrPort, b []byte, out []transport.Packet) []transport.Packet {
	h, payload, err := wire.Decode(b)
	if err != nil || h.Type != wire.TypeIngestInput {
		a.stats.malformed.Add(1)
		return out
	}
	in, err := ingest.DecodeInput(payload)
	if err != nil {
		a.stats.malformed.Add(1)
		return out
	}
	a.stats.fragments.Add(1)
	a.stats.bytesIn.Add(uint64(len(in.Data)))
	key := reqKey{addr: from, id: in.ID}
	if d, ok := a.results[key]; ok {
		// A retransmission of a request already answered: the answer was
		// lost. Send it again; run nothing.
		a.stats.resent.Add(1)
		for _, f := range d.frags {
			out = append(out, transport.Packet{Addr: from, Data: f})
		}
		return out
	}
	r, ok := a.reqs[key]
	if err := fragmentCheck(in); err != nil {
		// Fragments this small are no client's: refuse the request
		// before holding anything for it. One whose input is complete
		// (queued, or running) is not refused: the fragment is a
		// duplicate, counted below.
		if ok && r.state == receiving {
			a.stats.fragmentRefusals.Add(1)
			a.failLocked(r, err)
			return out
		}
		if !ok {
			a.stats.fragmentRefusals.Add(1)
			a.countRefusal(err)
			return a.refuseLocked(now, key, h.Tenant, err, out)
		}
	}
	if !ok {
		r, err = a.openLocked(now, key, h.Tenant, in)
		if err != nil {
			a.countRefusal(err)
			return a.refuseLocked(now, key, h.Tenant, err, out)
		}
	}
	if r.state != receiving {
		a.stats.duplicates.Add(1)
		return out
	}
	if in.Total != uint32(len(r.buf)) || in.Model != r.model.cfg.Name || h.Tenant != r.tenant {
		a.stats.malformed.Add(1)
		return out
	}
	if !r.have.add(int(in.Offset), int(in.Offset)+len(in.Data)) {
		a.stats.duplicates.Add(1)
		return out
	}
	if len(r.have) > maxInputIntervals {
		a.stats.fragmentRefusals.Add(1)
		a.failLocked(r, ingest.Errorf(ingest.StatusBadRequest, "input arrives in more than %d separate pieces at once: send its fragments in order", maxInputIntervals))
		return out
	}
	copy(r.buf[in.Offset:], in.Data)
	r.last = now
	if r.have.covers(len(r.buf)) {
		a.stats.received.Add(1)
		if err := a.arriveLocked(now, r); err != nil {
			a.failLocked(r, err)
		}
	}
	return out
}

// maxInputIntervals bounds the separate pieces (runs of received bytes
// with holes between them) of one input being reassembled. Fragments sent
// in order, with the holes loss and reordering leave, stay far below it;
// a client that scatters them on purpose is refused, so that no request
// costs the agent, under its lock, more than a small bounded amount per
// fragment.
const maxInputIntervals = 1024

// fragmentCheck refuses a fragment shorter than ingest.MinFragment that
// does not end its input.
func fragmentCheck(in ingest.Input) error {
	if len(in.Data) < ingest.MinFragment && uint64(in.Offset)+uint64(len(in.Data)) != uint64(in.Total) {
		return ingest.Errorf(ingest.StatusBadRequest, "fragment of %d bytes at offset %d of %d: every fragment but the input's last must carry at least %d bytes (use datagrams of at least %d bytes)",
			len(in.Data), in.Offset, in.Total, ingest.MinFragment, ingest.MinFragment+wire.HeaderLen+ingest.InputHeaderLen+len(in.Model))
	}
	return nil
}

// openLocked validates a new request and gives it a buffer.
func (a *Agent) openLocked(now time.Time, key reqKey, tenant uint32, in ingest.Input) (*request, error) {
	m, pl, err := a.admitLocked(tenant, in.Model, int(in.Total))
	if err != nil {
		return nil, err
	}
	if a.bufUsed+int(in.Total) > a.cfg.BufferBytes {
		return nil, ingest.Errorf(ingest.StatusOverloaded, "the DPU holds %d of %d bytes of inputs: retry shortly", a.bufUsed, a.cfg.BufferBytes)
	}
	a.bufUsed += int(in.Total)
	r := &request{key: key, tenant: tenant, model: m, pool: pl, host: a.host, arrived: now, last: now, buf: make([]byte, in.Total)}
	if in.BudgetUs > 0 {
		r.deadline = now.Add(time.Duration(in.BudgetUs) * time.Microsecond)
	}
	a.nextSeq++
	r.seq = a.nextSeq
	a.reqs[key] = r
	a.bySeq[r.seq] = r
	return r, nil
}

// admitLocked checks a request's model, grant and size against the
// configuration and the registered host.
func (a *Agent) admitLocked(tenant uint32, mdl string, size int) (*modelState, *pool, error) {
	m, ok := a.models[mdl]
	if !ok {
		return nil, nil, ingest.Errorf(ingest.StatusUnknownModel, "this DPU serves no model %q (it serves %v)", mdl, a.modelNames())
	}
	poolName, err := a.cfg.tenantGrant(tenant, mdl)
	if err != nil {
		return nil, nil, err
	}
	h := a.host
	if h == nil {
		return nil, nil, ingest.Errorf(ingest.StatusHostUnavailable, "no GPU host is registered with this DPU: start the host agent (ingest_host on the GPU host)")
	}
	if !h.models[mdl] {
		return nil, nil, ingest.Errorf(ingest.StatusUnknownModel, "the GPU host does not run model %q (it runs %v)", mdl, h.layout.Models)
	}
	pl := h.pools[poolName]
	if m.builtin != nil {
		if err := m.builtin.Check(size); err != nil {
			return nil, nil, ingest.Errorf(ingest.StatusBadRequest, "%v", err)
		}
	}
	if max := a.maxInput(m, h); size > max {
		return nil, nil, ingest.Errorf(ingest.StatusTooLarge, "input of %d bytes: model %s takes at most %d", size, mdl, max)
	}
	return m, pl, nil
}

func (a *Agent) maxInput(m *modelState, h *host) int {
	max := h.slotIn(0)
	if m.cfg.MaxInput > 0 && m.cfg.MaxInput < max {
		max = m.cfg.MaxInput
	}
	return max
}

func (a *Agent) modelNames() []string {
	var out []string
	for _, m := range a.cfg.Models {
		out = append(out, m.Name)
	}
	return out
}

// refuseLocked answers a request that was refused before it was opened,
// and remembers the answer so its other fragments get the same one.
func (a *Agent) refuseLocked(now time.Time, key reqKey, tenant uint32, err error, out []transport.Packet) []transport.Packet {
	frags := a.encodeResult(tenant, key.id, nil, err)
	a.rememberLocked(now, key, tenant, frags)
	for _, f := range frags {
		out = append(out, transport.Packet{Addr: key.addr, Data: f})
	}
	return out
}

// arriveLocked hands a whole input to its pool's scheduler.
func (a *Agent) arriveLocked(now time.Time, r *request) error {
	if !r.deadline.IsZero() && now.After(r.deadline) {
		return ingest.Errorf(ingest.StatusDeadline, "deadline passed %v before the input was complete", now.Sub(r.deadline).Round(time.Microsecond))
	}
	if r.host != a.host || r.pool == nil {
		return ingest.Errorf(ingest.StatusHostUnavailable, "the GPU host re-registered while the input arrived: send it again")
	}
	if r.pool.queued >= a.cfg.QueueLimit {
		return ingest.Errorf(ingest.StatusOverloaded, "%d requests wait for a slice in pool %s: retry shortly", r.pool.queued, r.pool.name)
	}
	sr := &sched.Request{ID: r.seq, Compute: r.model.cfg.Compute, MemGB: r.model.cfg.MemGB, Profile: r.model.cfg.Profile,
		Arrival: now.Sub(a.start), Duration: r.model.duration}
	if !r.deadline.IsZero() {
		sr.Deadline = r.deadline.Sub(a.start)
	}
	r.state = queued
	r.pool.queued++
	t0 := time.Now()
	errs, err := r.pool.disp.Arrive(now.Sub(a.start), []*sched.Request{sr}, a.placer(r.pool))
	a.stats.decisionNs.Add(uint64(time.Since(t0)))
	a.stats.decisions.Add(1)
	if err != nil || (len(errs) > 0 && errs[0] != nil) {
		if r.state == queued {
			r.pool.queued--
			r.state = receiving
		}
	}
	if err != nil {
		return ingest.Errorf(ingest.StatusInternal, "scheduler: %v", err)
	}
	if len(errs) > 0 && errs[0] != nil {
		return ingest.Errorf(ingest.StatusTooLarge, "no GPU slice in pool %s fits model %s: %v", r.pool.name, r.model.cfg.Name, errs[0])
	}
	return nil
}

// placer returns the callback through which pl's scheduler reports
// placements. It runs inside the scheduler's call, which must not be
// re-entered, so anything that would call the scheduler again (giving a
// slice back) runs afterwards, in a goroutine of its own.
func (a *Agent) placer(pl *pool) func(sched.Placed) {
	return func(p sched.Placed) { a.placedLocked(pl, p) }
}

// placedLocked starts the copy of a request that got a slice.
func (a *Agent) placedLocked(pl *pool, p sched.Placed) {
	r, ok := a.bySeq[p.Request.ID]
	if !ok || r.state != queued || r.pool != pl {
		// Gone meanwhile: give the slice back.
		go func() {
			a.mu.Lock()
			defer a.mu.Unlock()
			if a.host != nil && a.host.pools[pl.name] == pl {
				pl.disp.Complete(a.now(), p.Request.ID, a.placer(pl))
			}
		}()
		return
	}
	r.pool.queued--
	r.state = writing
	r.placed = time.Now()
	r.gpu = r.pool.gpus[p.Assignment.GPU]
	r.slot = p.Assignment.Placement.Start
	if !r.deadline.IsZero() && r.placed.After(r.deadline) {
		err := ingest.Errorf(ingest.StatusDeadline, "deadline passed while waiting %v for a slice", r.placed.Sub(r.arrived).Round(time.Microsecond))
		go func() {
			a.mu.Lock()
			defer a.mu.Unlock()
			a.failLocked(r, err)
		}()
		return
	}
	slice := fmt.Sprintf("%s@%d", p.Assignment.Profile, p.Assignment.Placement.Start)
	go a.write(r, slice)
}

// releaseLocked gives a request's slice back to its pool's scheduler,
// which may place waiting requests on it.
func (a *Agent) releaseLocked(r *request) {
	pl := r.pool
	if pl == nil || a.host == nil || pl != a.host.pools[pl.name] {
		return // the pool went with an old registration
	}
	if err := pl.disp.Complete(a.now(), r.seq, a.placer(pl)); err != nil {
		a.cfg.Logger.Debug("release slice", "seq", r.seq, "err", err)
	}
}

// write copies the input into the slot and rings the doorbell.
func (a *Agent) write(r *request, slice string) {
	err := r.host.write(r.gpu, r.slot, r.buf)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.bySeq[r.seq] != r || r.state != writing {
		return
	}
	if r.answered {
		// The caller is gone: free the slot, ring nothing.
		a.finishLocked(r, nil, nil)
		return
	}
	if err != nil {
		a.failLocked(r, err)
		return
	}
	a.stats.bytesToDevice.Add(uint64(len(r.buf)))
	a.bufUsed -= len(r.buf)
	// The input lives in the slot now: DPU memory goes back with it.
	r.inLen, r.buf = len(r.buf), nil
	r.state = running
	r.sliceName = slice
	a.ringLocked(r)
}

func (a *Agent) ringLocked(r *request) {
	r.rungAt = time.Now()
	r.rings++
	c := ingest.Ctrl{Op: ingest.OpDoorbell, Epoch: r.host.epoch, Request: r.seq, GPU: uint8(r.gpu), Slot: uint8(r.slot),
		Length: uint32(r.inLen), Tenant: uint16(r.tenant), Text: r.model.cfg.Name}
	if r.answered {
		// Given up: the ring is only to learn when the slot is free, and
		// must not start a run the host has no record of (an older host
		// ignores the flag and runs it).
		c.Flags = ingest.FlagGivenUp
	}
	a.toHost.pushCtrl(r.host.addr, &c, r.host.version >= 2)
	a.stats.doorbells.Add(1)
}

// sendHost queues a message to the host that goes alone (register-ack).
func (a *Agent) sendHost(to netip.AddrPort, c *ingest.Ctrl) {
	c.Version = ingest.CtrlVersion
	a.toHost.pushCtrl(to, c, false)
}

// receiveHost reads registrations and completions from the host agent.
func (a *Agent) receiveHost(ctx context.Context) error {
	pkts := makePackets(16, a.cfg.Host.MaxPayload())
	for {
		resetPackets(pkts)
		n, err := a.cfg.Host.Recv(ctx, pkts)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("ingest agent: receive from the host: %w", err)
		}
		for _, p := range pkts[:n] {
			a.control(ctx, p.Addr, p.Data)
		}
	}
}

func (a *Agent) control(ctx context.Context, from netip.AddrPort, b []byte) {
	if !a.cfg.HostPeer.Contains(from.Addr().Unmap()) {
		// Not the GPU host: whatever it says (a registration, a
		// completion) is not heard, and it gets no answer.
		a.refuseHost(from, "control datagram from outside host_peer ignored; if this is the GPU host's agent, set host_peer (lovelockd's ingest section) to its address or prefix",
			"host_peer", a.cfg.HostPeer)
		return
	}
	h, payload, err := wire.Decode(b)
	if err != nil || h.Type != wire.TypeIngestCtrl {
		a.stats.malformed.Add(1)
		return
	}
	cs, err := ingest.DecodeCtrls(payload, nil)
	if err != nil {
		a.stats.malformed.Add(1)
		return
	}
	for _, c := range cs {
		a.controlOne(ctx, from, c)
	}
}

func (a *Agent) controlOne(ctx context.Context, from netip.AddrPort, c ingest.Ctrl) {
	switch c.Op {
	case ingest.OpRegister:
		a.register(ctx, from, c)
	case ingest.OpComplete:
		a.complete(c)
	case ingest.OpRunning:
		a.mu.Lock()
		if r, ok := a.bySeq[c.Request]; ok && r.state == running && r.host.epoch == c.Epoch {
			r.rings = 1 // alive: the retry budget starts again
		}
		a.mu.Unlock()
	default:
		a.stats.malformed.Add(1)
	}
}

// register answers a host's heartbeat, and maps a new epoch's buffers.
func (a *Agent) register(ctx context.Context, from netip.AddrPort, c ingest.Ctrl) {
	a.mu.Lock()
	if a.host != nil && a.host.epoch == c.Epoch {
		a.host.lastSeen = time.Now()
		a.host.addr = from
		a.host.version = c.Version
		a.mu.Unlock()
		a.sendHost(from, &ingest.Ctrl{Op: ingest.OpRegisterAck, Epoch: c.Epoch})
		return
	}
	if a.fetching == c.Epoch {
		a.mu.Unlock()
		return
	}
	if !a.cfg.socketAllowed(c.Text) {
		// Dialing it would let the sender point the agent at any unix
		// socket of this machine.
		a.mu.Unlock()
		a.refuseHost(from, "GPU host registration ignored: its handle socket is not allowed by host_socket; if this host is legitimate, set host_socket (lovelockd's ingest section) to its ingest_host socket, or that socket's directory ending in /",
			"socket", c.Text, "host_socket", a.cfg.HostSocket)
		a.sendHost(from, &ingest.Ctrl{Op: ingest.OpRegisterAck, Epoch: c.Epoch, Status: ingest.StatusNotGranted,
			Text: fmt.Sprintf("the DPU only dials handle sockets its host_socket allows (%s): make this host's ingest_host socket and the DPU's host_socket agree", a.cfg.HostSocket)})
		return
	}
	a.fetching = c.Epoch
	a.mu.Unlock()
	a.adopts.Go(func() { a.adopt(ctx, from, c) })
}

// maxRefusedSources bounds the sources whose refusals are logged one by
// one; beyond it only the counter tells, so that a sender cycling source
// addresses cannot grow the agent's memory or flood its log.
const maxRefusedSources = 256

// refuseHost counts a control datagram refused and logs why, once per
// source address.
func (a *Agent) refuseHost(from netip.AddrPort, msg string, args ...any) {
	a.stats.hostRefused.Add(1)
	src := from.Addr().Unmap()
	if a.refusedFrom[src] || len(a.refusedFrom) > maxRefusedSources {
		return
	}
	a.refusedFrom[src] = true
	if len(a.refusedFrom) > maxRefusedSources {
		a.cfg.Logger.Warn("control datagrams refused from many sources; no more are logged one by one (see host_refused in lovelock ingest stats)", "sources", maxRefusedSources)
		return
	}
	a.cfg.Logger.Warn(msg, append([]any{"from", from, "note", "logged once per source; lovelock ingest stats counts every one as host_refused"}, args...)...)
}

// adopt fetches and maps a new registration, then swaps it in: requests
// on the old one's slots fail as host-unavailable (clients send them
// again); requests still waiting for a slice move to the new schedulers.
func (a *Agent) adopt(ctx context.Context, from netip.AddrPort, c ingest.Ctrl) {
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	l, hs, err := hostagent.FetchLayout(fctx, c.Text, c.Epoch)
	cancel()
	var h *host
	if err == nil {
		h, err = newHost(&a.cfg, l, hs, from, c.Text)
	}
	if err == nil {
		h.version = c.Version
	}
	a.mu.Lock()
	a.fetching = 0
	if err == nil && ctx.Err() != nil {
		// Run is returning: a host installed now would keep its buffers
		// mapped and take requests nobody serves.
		a.mu.Unlock()
		h.unmap()
		return
	}
	if err != nil {
		a.mu.Unlock()
		a.stats.registerFailed.Add(1)
		a.cfg.Logger.Warn("GPU host registration failed", "host", from, "epoch", fmt.Sprintf("%016x", c.Epoch), "err", err)
		a.sendHost(from, &ingest.Ctrl{Op: ingest.OpRegisterAck, Epoch: c.Epoch, Status: ingest.StatusInternal, Text: err.Error()})
		return
	}
	h.lastSeen = time.Now()
	old := a.host
	a.host = h
	a.stats.registrations.Add(1)
	var requeue []*request
	for _, r := range a.reqs {
		switch r.state {
		case writing, running:
			a.failLocked(r, ingest.Errorf(ingest.StatusHostUnavailable, "the GPU host agent restarted while the request ran: send it again"))
		case queued:
			r.pool.disp.Withdraw(r.seq)
			r.pool.queued--
			requeue = append(requeue, r)
		case receiving:
			r.host = h
			r.pool = h.pools[r.pool.name]
		}
	}
	now := time.Now()
	for _, r := range requeue {
		r.host, r.pool = h, h.pools[r.pool.name]
		r.state = receiving
		if err := a.arriveLocked(now, r); err != nil {
			a.failLocked(r, err)
		}
	}
	a.mu.Unlock()
	if old != nil {
		old.unmap()
		a.cfg.Logger.Info("GPU host re-registered; old buffers dropped", "old_epoch", fmt.Sprintf("%016x", old.epoch), "epoch", fmt.Sprintf("%016x", h.epoch))
	} else {
		a.cfg.Logger.Info("GPU host registered", "host", from, "epoch", fmt.Sprintf("%016x", h.epoch), "gpus", len(l.GPUs))
	}
	a.sendHost(from, &ingest.Ctrl{Op: ingest.OpRegisterAck, Epoch: c.Epoch})
}

// complete takes the host's word that a request's output is ready.
func (a *Agent) complete(c ingest.Ctrl) {
	a.mu.Lock()
	r, ok := a.bySeq[c.Request]
	if !ok || r.state != running || r.host.epoch != c.Epoch {
		a.mu.Unlock()
		a.stats.staleCompletions.Add(1)
		return
	}
	if int(c.GPU) != r.gpu || int(c.Slot) != r.slot {
		// Not this request's run: reading the slot would hand another
		// request's output to this one. The doorbell is rung again.
		a.mu.Unlock()
		a.stats.protocolErrors.Add(1)
		a.cfg.Logger.Warn("GPU host completed a request on another slot than it was placed on; reply ignored",
			"seq", c.Request, "placed", fmt.Sprintf("%d/%d", r.gpu, r.slot), "reply", fmt.Sprintf("%d/%d", c.GPU, c.Slot))
		return
	}
	if c.Status == ingest.StatusReleased {
		// The host ran nothing for this request and never will: its slot
		// is free, and there is no output to read.
		defer a.mu.Unlock()
		if !r.answered {
			// Only a given-up request's doorbell asks for a release.
			a.stats.protocolErrors.Add(1)
			a.failLocked(r, ingest.Errorf(ingest.StatusHostUnavailable, "the GPU host released the request without running it: send it again"))
			return
		}
		a.stats.heldReleased.Add(1)
		a.finishLocked(r, nil, nil)
		return
	}
	a.mu.Unlock()
	var res *ingest.Result
	var err error
	if c.Status != ingest.StatusOK {
		err = &ingest.Error{Status: c.Status, Msg: c.Text}
	} else if int(c.Length) > r.host.slotOut(r.gpu) {
		err = ingest.Errorf(ingest.StatusInternal, "the host reports %d output bytes in a %d-byte buffer", c.Length, r.host.slotOut(r.gpu))
	} else if b := r.model.builtin; b != nil && int(c.Length) != b.OutputSize(r.inLen) {
		// Not what the model's metadata promises: a front end could not
		// deliver it, so it is no result.
		err = ingest.Errorf(ingest.StatusInternal, "the host reports %d output bytes; model %s gives %d for an input of %d: check the GPU host agent's version",
			c.Length, b.Name, b.OutputSize(r.inLen), r.inLen)
	} else {
		out := make([]byte, c.Length)
		if err = r.host.read(r.gpu, r.slot, out); err == nil {
			res = &ingest.Result{Output: out, GPU: r.gpu, Slice: r.sliceName, Queued: r.placed.Sub(r.arrived), Device: time.Duration(c.DeviceUs) * time.Microsecond}
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.bySeq[r.seq] != r || r.state != running {
		return // failed meanwhile (host re-registered)
	}
	if err != nil {
		a.failLocked(r, err)
		return
	}
	// Only a completed run measures the model: a refusal ran nothing.
	d := time.Duration(c.DeviceUs) * time.Microsecond
	r.model.duration = (7*r.model.duration + d) / 8
	a.stats.bytesFromDevice.Add(uint64(len(res.Output))) // only bytes read
	a.finishLocked(r, res, nil)
}

// failLocked ends a request with err.
func (a *Agent) failLocked(r *request, err error) {
	a.finishLocked(r, nil, err)
}

// abandonLocked answers a request's caller with err now, but leaves the
// request holding its slice: its input is still being copied into the
// slot, or the host may run on it, and a request placed there meanwhile
// would race with either. The write's end, the host's answer for it, a
// new registration or the host's loss ends it.
func (a *Agent) abandonLocked(r *request, err error) {
	if a.bySeq[r.seq] != r || r.answered {
		return
	}
	a.answerLocked(r, nil, err)
	a.held++
	if r.key.addr.IsValid() {
		// The client's ID is free again: a retransmission after its
		// kept answer expired is a new request, not a duplicate of this.
		// Infer's keys are {id: seq} too, so this one meets none.
		delete(a.reqs, r.key)
		r.key = reqKey{id: r.seq}
		a.reqs[r.key] = r
	}
}

// holdLocked gives up on a request whose doorbells went unanswered: its
// client is answered with err, but its slot stays held, since the host
// may still run the model on it.
func (a *Agent) holdLocked(r *request, err error) {
	a.cfg.Logger.Warn("GPU host did not answer for a request; its client was answered, its slot is held until the host answers, re-registers or is declared lost",
		"seq", r.seq, "slot", fmt.Sprintf("%d/%d", r.gpu, r.slot), "doorbells", r.rings)
	a.abandonLocked(r, err)
}

// finishLocked ends a request: its slice goes back to the scheduler, the
// answer to its client. A request is finished once: a second call (a
// timer and a goroutine racing) neither answers nor counts again.
func (a *Agent) finishLocked(r *request, res *ingest.Result, err error) {
	if a.bySeq[r.seq] != r {
		return
	}
	delete(a.bySeq, r.seq)
	delete(a.reqs, r.key)
	if r.answered { // abandonLocked answered it and held its slot
		a.held--
	}
	switch r.state {
	case receiving, queued, writing:
		a.bufUsed -= len(r.buf)
	}
	if r.state == queued && r.pool != nil {
		r.pool.disp.Withdraw(r.seq)
		r.pool.queued--
	}
	if r.state == writing || r.state == running {
		a.releaseLocked(r)
	}
	if !r.answered { // else abandonLocked answered it
		a.answerLocked(r, res, err)
	}
}

// answerLocked counts a request's outcome and answers its client, once.
func (a *Agent) answerLocked(r *request, res *ingest.Result, err error) {
	r.answered = true
	now := time.Now()
	if err == nil {
		a.stats.completed.Add(1)
		a.lat.add(now.Sub(r.arrived))
		if !r.deadline.IsZero() && now.After(r.deadline) {
			a.stats.lateResults.Add(1)
		}
	} else {
		a.countRefusal(err)
	}
	if r.done != nil {
		r.done <- &outcome{res: res, err: err}
		return
	}
	frags := a.encodeResult(r.tenant, r.key.id, res, err)
	a.rememberLocked(now, r.key, r.tenant, frags)
	out := make([]transport.Packet, 0, len(frags))
	for _, f := range frags {
		out = append(out, transport.Packet{Addr: r.key.addr, Data: f})
	}
	a.toClients.push(out...)
}

// encodeResult cuts a result (or error) into datagrams.
func (a *Agent) encodeResult(tenant uint32, id uint64, res *ingest.Result, err error) [][]byte {
	f := ingest.ResultFragment{ID: id}
	var data []byte
	if err != nil {
		f.Status, f.Text = ingest.StatusOf(err), errText(err)
	} else {
		f.GPU, f.Text = uint8(res.GPU), res.Slice
		f.QueuedUs, f.DeviceUs = uint32(res.Queued.Microseconds()), uint32(res.Device.Microseconds())
		data = res.Output
		f.Total = uint32(len(data))
	}
	step := ingest.MaxResultFragment(a.cfg.Clients.MaxPayload(), f.Text)
	var frags [][]byte
	for off := 0; ; off += step {
		end := min(off+step, len(data))
		f.Offset, f.Data = uint32(off), data[off:end]
		frags = append(frags, ingest.AppendResult(nil, tenant, &f))
		if end >= len(data) {
			return frags
		}
	}
}

func errText(err error) string {
	var e *ingest.Error
	if errors.As(err, &e) {
		return e.Msg
	}
	return err.Error()
}

// rememberLocked keeps a result for retransmissions until it expires or
// the kept results exceed their byte budget, oldest first. A client whose
// result was forgotten and lost gets its request run again.
func (a *Agent) rememberLocked(now time.Time, key reqKey, tenant uint32, frags [][]byte) {
	d := &doneResult{key: key, tenant: tenant, frags: frags, expires: now.Add(a.cfg.ResultTTL)}
	for _, f := range frags {
		d.bytes += len(f)
	}
	a.forgetLocked(a.results[key])
	a.results[key] = d
	a.resultQ = append(a.resultQ, d)
	a.resultBytes += d.bytes
	for a.resultBytes > a.cfg.ResultBytes && len(a.resultQ) > 0 {
		a.forgetLocked(a.resultQ[0])
		a.resultQ = a.resultQ[1:]
		a.stats.resultsForgotten.Add(1)
	}
}

// forgetLocked drops d if it is still the kept result of its key.
func (a *Agent) forgetLocked(d *doneResult) {
	if d != nil && a.results[d.key] == d {
		delete(a.results, d.key)
		a.resultBytes -= d.bytes
	}
}

// Infer implements ingest.Submitter: a whole request from a front end
// that received it itself (the gRPC server).
func (a *Agent) Infer(ctx context.Context, req *ingest.Request) (*ingest.Result, error) {
	now := time.Now()
	a.mu.Lock()
	a.stats.inferCalls.Add(1) // a request, not a datagram: not a fragment
	a.stats.bytesIn.Add(uint64(len(req.Input)))
	m, pl, err := a.admitLocked(req.Tenant, req.Model, len(req.Input))
	if err == nil && a.bufUsed+len(req.Input) > a.cfg.BufferBytes {
		err = ingest.Errorf(ingest.StatusOverloaded, "the DPU holds %d of %d bytes of inputs: retry shortly", a.bufUsed, a.cfg.BufferBytes)
	}
	if err != nil {
		a.countRefusal(err)
		a.mu.Unlock()
		return nil, err
	}
	a.nextSeq++
	r := &request{key: reqKey{id: a.nextSeq}, seq: a.nextSeq, tenant: req.Tenant, model: m, pool: pl, host: a.host,
		arrived: now, last: now, buf: append([]byte(nil), req.Input...), deadline: req.Deadline, done: make(chan *outcome, 1)}
	if dl, ok := ctx.Deadline(); ok && (r.deadline.IsZero() || dl.Before(r.deadline)) {
		r.deadline = dl
	}
	a.bufUsed += len(r.buf)
	a.reqs[r.key] = r
	a.bySeq[r.seq] = r
	a.stats.received.Add(1)
	if err := a.arriveLocked(now, r); err != nil {
		a.failLocked(r, err)
	}
	a.mu.Unlock()
	select {
	case o := <-r.done:
		return o.res, o.err
	case <-ctx.Done():
		a.mu.Lock()
		if a.bySeq[r.seq] == r {
			var err error = ingest.Errorf(ingest.StatusDeadline, "the caller gave up: %v", ctx.Err())
			if errors.Is(ctx.Err(), context.Canceled) {
				// The caller went away: no deadline passed, and the
				// front end tells a cancel by context.Canceled.
				err = fmt.Errorf("the caller cancelled the request: %w", ctx.Err())
			}
			if r.state == writing || r.state == running {
				a.abandonLocked(r, err)
			} else {
				a.failLocked(r, err)
			}
		}
		a.mu.Unlock()
		o := <-r.done
		if o.err == nil {
			return o.res, nil
		}
		return nil, o.err
	}
}

var _ ingest.Submitter = (*Agent)(nil)
