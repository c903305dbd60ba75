// Package client is accelerator ingest's client library: it sends an
// inference input to a DPU's ingest agent over the Lovelock protocol (input
// fragments, type 0x20) and returns the result (result fragments, 0x21),
// repairing loss the way the protocol says, by sending the request again
// after a timeout. It owns the client half of that protocol and the load
// generator that `lovelock infer` and the benchmarks drive; it knows nothing
// of how the DPU places or runs a request.
//
// One Client serves any number of concurrent Infer calls over one
// transport: a single receive goroutine hands each result fragment to the
// call whose request ID it carries.
package client

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// Defaults of Options.
const (
	DefaultTimeout    = 100 * time.Millisecond
	DefaultMaxTimeout = 2 * time.Second
	DefaultRetries    = 5
	DefaultBackoff    = 10 * time.Millisecond
	// DefaultMaxOutput bounds the output a result may announce, so that a
	// stray datagram cannot make the client allocate 4 GiB.
	DefaultMaxOutput = 256 << 20
	// sendBatch is how many datagrams go to the transport per Send: the
	// udp transport's sendmmsg batch.
	sendBatch = 64
	recvBatch = 64
)

// Options configure a Client. The zero value is usable.
type Options struct {
	// Tenant goes into every input's Lovelock header; the DPU refuses
	// models the tenant was not granted (ingest.StatusNotGranted).
	Tenant uint32
	// Timeout is the initial retransmission timeout: with no complete
	// result this long after the request was sent, the client sends it
	// again and doubles the timeout, up to MaxTimeout. It should exceed
	// the model's run time: a retransmission of a request the DPU is
	// still running costs datagrams, not a second run. 0: DefaultTimeout.
	Timeout    time.Duration
	MaxTimeout time.Duration // 0: DefaultMaxTimeout
	// Retries bounds both the retransmissions of one request that gets
	// no answer (then Infer fails with ErrTimeout) and the new attempts
	// after a retryable status (overloaded, host-unavailable). 0:
	// DefaultRetries; negative: none.
	Retries int
	// Backoff is the wait before a new attempt after a retryable status,
	// doubled each time up to MaxTimeout. 0: DefaultBackoff.
	Backoff time.Duration
	// MaxOutput is the largest result accepted; 0: DefaultMaxOutput. A
	// larger one fails the call at once with ErrOutputTooLarge.
	MaxOutput int
	// Logger receives debug lines about retransmissions and ignored
	// datagrams; nil discards them.
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxTimeout <= 0 {
		o.MaxTimeout = DefaultMaxTimeout
	}
	o.MaxTimeout = max(o.MaxTimeout, o.Timeout)
	switch {
	case o.Retries == 0:
		o.Retries = DefaultRetries
	case o.Retries < 0:
		o.Retries = 0
	}
	if o.Backoff <= 0 {
		o.Backoff = DefaultBackoff
	}
	if o.MaxOutput <= 0 {
		o.MaxOutput = DefaultMaxOutput
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Errors that Infer wraps besides *ingest.Error (the DPU's verdict) and the
// context's errors.
var (
	// ErrClosed: the client was closed, or its transport was, before the
	// result came.
	ErrClosed = errors.New("ingest client closed")
	// ErrTimeout: no complete result came back after Retries
	// retransmissions.
	ErrTimeout = errors.New("no result from the DPU")
	// ErrInvalid: the request cannot be sent (no model, a model name too
	// long, an empty input, or one too large for the protocol).
	ErrInvalid = errors.New("invalid request")
	// ErrOutputTooLarge: the DPU's result is larger than
	// Options.MaxOutput.
	ErrOutputTooLarge = errors.New("result larger than MaxOutput")
)

// Client sends inference requests to one DPU. It is safe for concurrent
// use.
type Client struct {
	tr   transport.Transport
	dpu  netip.AddrPort
	opts Options
	log  *slog.Logger

	base uint64        // random base of the request IDs
	seq  atomic.Uint64 // request IDs are base + seq

	mu    sync.Mutex
	calls map[uint64]*call

	closed    chan struct{} // closed by shutdown: Infer calls give up
	closeOnce sync.Once
	cancel    context.CancelFunc
	stopped   chan struct{} // closed when the receive goroutine has returned

	st counters
}

// New returns a client that sends to the ingest agent at dpu over tr and
// starts its receive goroutine. The caller keeps owning tr: Close stops the
// client but leaves tr open, and closing tr makes the client's calls fail
// with ErrClosed.
func New(tr transport.Transport, dpu netip.AddrPort, opts Options) (*Client, error) {
	if !dpu.IsValid() {
		return nil, fmt.Errorf("ingest client: DPU address %v: %w", dpu, transport.ErrAddr)
	}
	if tr.MaxPayload() <= wire.HeaderLen+ingest.ResultHeaderLen {
		return nil, fmt.Errorf("ingest client: transport carries %d-byte datagrams, too few for a result", tr.MaxPayload())
	}
	opts = opts.withDefaults()
	c := &Client{
		tr: tr, dpu: dpu, opts: opts, log: opts.Logger,
		base:    rand.Uint64(),
		calls:   map[uint64]*call{},
		closed:  make(chan struct{}),
		stopped: make(chan struct{}),
		st:      counters{errors: map[string]uint64{}},
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go c.run(ctx)
	return c, nil
}

// Close stops the receive goroutine; Infer calls in progress and later ones
// fail with ErrClosed. It does not close the transport. It is safe to call
// more than once.
func (c *Client) Close() error {
	c.shutdown()
	<-c.stopped
	return nil
}

func (c *Client) shutdown() {
	c.closeOnce.Do(func() {
		close(c.closed)
		c.cancel()
	})
}

// DPU returns the address requests go to.
func (c *Client) DPU() netip.AddrPort { return c.dpu }

// Infer sends input to model and waits for the result.
//
// deadline, when positive, is the request's deadline from now; ctx's
// deadline, when earlier, replaces it. The DPU receives it as a budget: it
// refuses (ingest.StatusDeadline) a request it cannot start in time, but a
// result that completes late still comes back, and Infer returns it; the
// caller compares Result timing with its deadline. ctx bounds the wait.
//
// The error is an *ingest.Error carrying the DPU's status (after Retries
// new attempts for a retryable one), or wraps ErrTimeout, ErrClosed,
// ErrInvalid or ctx's error.
func (c *Client) Infer(ctx context.Context, model string, input []byte, deadline time.Duration) (*ingest.Result, error) {
	c.st.requests.Add(1)
	res, err := c.infer(ctx, model, input, deadline)
	if err != nil {
		c.st.countError(err)
	} else {
		c.st.ok.Add(1)
	}
	return res, err
}

func (c *Client) infer(ctx context.Context, model string, input []byte, deadline time.Duration) (*ingest.Result, error) {
	frag := ingest.MaxFragment(c.tr.MaxPayload(), model)
	switch {
	case len(model) == 0 || len(model) > ingest.MaxModelName:
		return nil, fmt.Errorf("ingest client: model name %q: want 1..%d bytes: %w", model, ingest.MaxModelName, ErrInvalid)
	case len(input) == 0:
		return nil, fmt.Errorf("ingest client: empty input: %w", ErrInvalid)
	case uint64(len(input)) > math.MaxUint32:
		return nil, fmt.Errorf("ingest client: input of %d bytes, the protocol carries < 4 GiB: %w", len(input), ErrInvalid)
	case frag <= 0:
		return nil, fmt.Errorf("ingest client: %d-byte datagrams leave no room for input: %w", c.tr.MaxPayload(), ErrInvalid)
	case frag < ingest.MinFragment && len(input) > frag:
		// The DPU refuses fragments this small (ingest.MinFragment).
		return nil, fmt.Errorf("ingest client: %d-byte datagrams carry %d input bytes each with model %s, the DPU takes fragments of %d at least: "+
			"send over a path with a larger MTU (any IP path's 576 bytes will do): %w", c.tr.MaxPayload(), frag, model, ingest.MinFragment, ErrInvalid)
	}
	var due time.Time
	if deadline > 0 {
		due = time.Now().Add(deadline)
	}
	if d, ok := ctx.Deadline(); ok && (due.IsZero() || d.Before(due)) {
		due = d
	}
	pkts := c.packets(model, input, frag)
	backoff := c.opts.Backoff
	for attempt := 0; ; attempt++ {
		if !due.IsZero() && !time.Now().Before(due) {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("ingest client: %w", err)
			}
			return nil, ingest.Errorf(ingest.StatusDeadline, "deadline passed before attempt %d could be sent", attempt+1)
		}
		res, err := c.attempt(ctx, pkts, due)
		var ie *ingest.Error
		if !errors.As(err, &ie) || !ie.Status.Retryable() || attempt >= c.opts.Retries {
			return res, err
		}
		c.st.statusRetries.Add(1)
		c.log.Debug("ingest client: retrying", "status", ie.Status, "attempt", attempt+1, "backoff", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("ingest client: waiting to retry after %v: %w", ie, ctx.Err())
		case <-c.closed:
			t.Stop()
			return nil, fmt.Errorf("ingest client: %w", ErrClosed)
		}
		backoff = min(2*backoff, c.opts.MaxTimeout)
	}
}

// Where the ID and the budget sit in an input datagram: the Lovelock
// header, then the input header of proto.go (ID at 0, budget at 16). The
// client writes each datagram once and patches these two fields for every
// attempt and retransmission; TestPatchOffsets holds them to proto.go.
const (
	offID     = wire.HeaderLen + 0
	offBudget = wire.HeaderLen + 16
)

// packets cuts input into datagrams for the DPU, all in one allocation.
// Their ID and budget are set per attempt.
func (c *Client) packets(model string, input []byte, frag int) []transport.Packet {
	n := (len(input) + frag - 1) / frag
	per := wire.HeaderLen + ingest.InputHeaderLen + len(model)
	slab := make([]byte, 0, n*per+len(input))
	pkts := make([]transport.Packet, 0, n)
	for off := 0; off < len(input); off += frag {
		end := min(off+frag, len(input))
		start := len(slab)
		slab = ingest.AppendInput(slab, c.opts.Tenant, &ingest.Input{
			Total: uint32(len(input)), Offset: uint32(off), Model: model, Data: input[off:end]})
		pkts = append(pkts, transport.Packet{Addr: c.dpu, Data: slab[start:len(slab):len(slab)]})
	}
	return pkts
}

// budgetUs is the deadline budget to send at now: the µs left until due,
// rounded up so that a live deadline never reads as 0 (none), and at least
// 1 once due has passed, so that a DPU hearing of the request only now
// refuses it.
func budgetUs(due, now time.Time) uint32 {
	if due.IsZero() {
		return 0
	}
	d := due.Sub(now)
	if d <= 0 {
		return 1
	}
	us := (d + time.Microsecond - 1) / time.Microsecond
	if us > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(us)
}

func setBudget(pkts []transport.Packet, due time.Time) {
	b := budgetUs(due, time.Now())
	for _, p := range pkts {
		binary.BigEndian.PutUint32(p.Data[offBudget:], b)
	}
}

// attempt sends pkts under a new request ID and waits for its result,
// retransmitting on timeout.
func (c *Client) attempt(ctx context.Context, pkts []transport.Packet, due time.Time) (*ingest.Result, error) {
	select {
	case <-c.closed:
		return nil, fmt.Errorf("ingest client: %w", ErrClosed)
	default:
	}
	id := c.base + c.seq.Add(1)
	k := &call{id: id, max: uint64(c.opts.MaxOutput), done: make(chan struct{})}
	c.mu.Lock()
	c.calls[id] = k
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.calls, id)
		c.mu.Unlock()
	}()
	for _, p := range pkts {
		binary.BigEndian.PutUint64(p.Data[offID:], id)
	}
	c.st.attempts.Add(1)
	setBudget(pkts, due)
	if err := c.send(pkts); err != nil {
		return nil, err
	}
	sent := time.Now()
	rto := c.opts.Timeout
	timer := time.NewTimer(rto)
	defer timer.Stop()
	askedOnce := false // a lone fragment was sent to ask for the rest of a result
	for tries := 0; ; {
		select {
		case <-k.done:
			return k.result()
		case <-ctx.Done():
			return nil, fmt.Errorf("ingest client: request %016x: %w", id, ctx.Err())
		case <-c.closed:
			return nil, fmt.Errorf("ingest client: request %016x: %w", id, ErrClosed)
		case <-timer.C:
		}
		if tries >= c.opts.Retries {
			return nil, fmt.Errorf("ingest client: request %016x: %d transmissions in %v: %w", id, tries+1, time.Since(sent).Round(time.Millisecond), ErrTimeout)
		}
		tries++
		c.st.retransmissions.Add(1)
		// Part of the result came: the DPU has the whole input and will
		// answer again from memory on any fragment, so one (the last, the
		// shortest) is enough to ask, once. If that brings nothing, the DPU
		// may have dropped its kept result (its TTL or budget), and takes
		// the lone fragment for a new request: send the whole input again.
		resend := pkts
		if k.started() && !askedOnce {
			resend, askedOnce = pkts[len(pkts)-1:], true
		}
		c.log.Debug("ingest client: retransmitting", "id", fmt.Sprintf("%016x", id), "try", tries, "rto", rto, "datagrams", len(resend))
		setBudget(pkts, due)
		if err := c.send(resend); err != nil {
			return nil, err
		}
		rto = min(2*rto, c.opts.MaxTimeout)
		timer.Reset(rto)
	}
}

// send hands pkts to the transport in batches. A datagram the transport
// refuses counts as lost (the timeout repairs it); only a closed transport
// is an error.
func (c *Client) send(pkts []transport.Packet) error {
	for len(pkts) > 0 {
		b := pkts[:min(sendBatch, len(pkts))]
		pkts = pkts[len(b):]
		n, err := transport.SendAll(c.tr, b, func(p transport.Packet, err error) {
			c.st.sendErrors.Add(1)
			c.log.Debug("ingest client: send", "err", err)
		})
		c.st.txDatagrams.Add(uint64(n))
		for _, p := range b[:n] {
			c.st.txBytes.Add(uint64(len(p.Data)))
		}
		if err != nil {
			return fmt.Errorf("ingest client: send: %w: %w", ErrClosed, err)
		}
	}
	return nil
}

// run is the receive goroutine: it hands each result fragment to its call
// until ctx is cancelled or the transport closes.
func (c *Client) run(ctx context.Context) {
	defer close(c.stopped)
	bufs := make([]transport.Packet, recvBatch)
	for i := range bufs {
		bufs[i].Data = make([]byte, c.tr.MaxPayload())
	}
	for {
		for i := range bufs {
			bufs[i].Data = bufs[i].Data[:cap(bufs[i].Data)]
		}
		n, err := c.tr.Recv(ctx, bufs)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, transport.ErrClosed) {
				c.log.Debug("ingest client: transport closed", "err", err)
				c.shutdown()
				return
			}
			// A transient error (an ICMP error surfacing as
			// ECONNREFUSED): note it, pause briefly so a persistent
			// one cannot spin, and go on.
			c.st.recvErrors.Add(1)
			c.log.Debug("ingest client: receive", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Millisecond):
			}
			continue
		}
		for _, p := range bufs[:n] {
			c.handle(p.Addr, p.Data)
		}
	}
}

// handle takes one datagram received from from.
func (c *Client) handle(from netip.AddrPort, b []byte) {
	c.st.rxDatagrams.Add(1)
	c.st.rxBytes.Add(uint64(len(b)))
	h, payload, err := wire.Decode(b)
	if err != nil {
		c.st.malformed.Add(1)
		c.log.Debug("ingest client: malformed datagram", "err", err)
		return
	}
	if h.Type != wire.TypeIngestResult || h.Tenant != c.opts.Tenant {
		c.st.ignored.Add(1)
		return
	}
	r, err := ingest.DecodeResult(payload)
	if err != nil {
		c.st.malformed.Add(1)
		c.log.Debug("ingest client: malformed result", "err", err)
		return
	}
	if !sameAddr(from, c.dpu) {
		// Only the DPU the request went to answers it: anyone else who
		// guessed the tenant and an ID would choose the caller's result.
		c.st.foreign.Add(1)
		c.log.Debug("ingest client: result from another address than the DPU's refused", "from", from, "dpu", c.dpu, "id", fmt.Sprintf("%016x", r.ID))
		return
	}
	c.mu.Lock()
	k := c.calls[r.ID]
	c.mu.Unlock()
	if k == nil {
		c.st.stale.Add(1) // a late copy of a result already returned, or not ours
		return
	}
	switch k.add(&r) {
	case fragNew:
	case fragDone:
		c.st.results.Add(1)
	case fragDup:
		c.st.duplicates.Add(1)
	case fragBad:
		c.st.malformed.Add(1)
		c.log.Debug("ingest client: result fragment disagrees with the first", "id", fmt.Sprintf("%016x", r.ID))
	}
}

// sameAddr compares addresses as the transports report them, an IPv4
// address whether written plain or IPv4-mapped.
func sameAddr(a, b netip.AddrPort) bool {
	return a.Port() == b.Port() && a.Addr().Unmap() == b.Addr().Unmap()
}

// call is one attempt waiting for its result.
type call struct {
	id   uint64
	max  uint64
	done chan struct{}

	mu       sync.Mutex
	got      bool // a first fragment arrived
	finished bool
	err      error // the call failed here (a result over max), not at the DPU
	status   ingest.Status
	text     string
	gpu      uint8
	queued   uint32
	device   uint32
	total    uint32
	out      []byte
	have     spans
}

type fragVerdict int

const (
	fragNew  fragVerdict = iota // new bytes, result not complete yet
	fragDone                    // the result is complete
	fragDup                     // nothing new
	fragBad                     // disagrees with the first fragment
)

func (k *call) started() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.got
}

func (k *call) add(r *ingest.ResultFragment) fragVerdict {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.finished {
		return fragDup
	}
	if !k.got {
		if r.Status == ingest.StatusOK && uint64(r.Total) > k.max {
			// Every retransmission would bring the same answer: fail now,
			// naming what to change.
			k.err = fmt.Errorf("ingest client: request %016x: the DPU's result is %d bytes, over MaxOutput %d: raise Options.MaxOutput: %w",
				k.id, r.Total, k.max, ErrOutputTooLarge)
			k.finished = true
			close(k.done)
			return fragDone
		}
		k.got = true
		k.status, k.text, k.gpu, k.queued, k.device, k.total = r.Status, r.Text, r.GPU, r.QueuedUs, r.DeviceUs, r.Total
		if r.Status == ingest.StatusOK {
			k.out = make([]byte, r.Total)
		}
	} else if r.Status != k.status || r.Total != k.total {
		return fragBad
	}
	if k.status == ingest.StatusOK {
		copy(k.out[r.Offset:], r.Data)
		if k.have.add(uint64(r.Offset), uint64(r.Offset)+uint64(len(r.Data))) == 0 && k.total > 0 {
			return fragDup
		}
		if k.have.covered < uint64(k.total) {
			return fragNew
		}
	}
	k.finished = true
	close(k.done)
	return fragDone
}

// result returns the finished call's result or error.
func (k *call) result() (*ingest.Result, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.err != nil {
		return nil, k.err
	}
	if k.status != ingest.StatusOK {
		return nil, &ingest.Error{Status: k.status, Msg: k.text}
	}
	return &ingest.Result{
		Output: k.out, GPU: int(k.gpu), Slice: k.text,
		Queued: time.Duration(k.queued) * time.Microsecond,
		Device: time.Duration(k.device) * time.Microsecond,
	}, nil
}

// Stats are a client's counters since New.
type Stats struct {
	// Requests counts Infer calls; OK those that returned a result;
	// Errors the others by cause: a status name (ingest.Status.String)
	// for the DPU's verdicts, or timeout, closed, canceled, invalid,
	// output-too-large.
	Requests uint64            `json:"requests"`
	OK       uint64            `json:"ok"`
	Errors   map[string]uint64 `json:"errors,omitempty"`
	// Attempts counts request IDs sent: Requests plus StatusRetries (new
	// attempts after a retryable status), less calls refused before
	// sending.
	Attempts      uint64 `json:"attempts"`
	StatusRetries uint64 `json:"status_retries"`
	// Retransmissions counts timeouts on which a request (or, with part
	// of its result in, one fragment of it) was sent again.
	Retransmissions uint64 `json:"retransmissions"`
	// Results counts complete results received, successes and failures.
	Results uint64 `json:"results"`
	// Duplicates counts result fragments that brought nothing new;
	// Stale those for no request in progress (a late copy of an answer
	// already returned); Foreign results refused because they came from
	// another address than the DPU's (a forgery, or a DPU that answers
	// from another address than the one it was sent to); Malformed
	// datagrams that did not decode, or disagreed with the result's first
	// fragment; Ignored valid datagrams of another type or tenant.
	Duplicates uint64 `json:"duplicates"`
	Stale      uint64 `json:"stale"`
	Foreign    uint64 `json:"foreign"`
	Malformed  uint64 `json:"malformed"`
	Ignored    uint64 `json:"ignored"`
	// Datagrams and bytes (UDP payload) through the transport, and the
	// datagrams it refused to send or errors it gave receiving.
	TxDatagrams uint64 `json:"tx_datagrams"`
	TxBytes     uint64 `json:"tx_bytes"`
	RxDatagrams uint64 `json:"rx_datagrams"`
	RxBytes     uint64 `json:"rx_bytes"`
	SendErrors  uint64 `json:"send_errors"`
	RecvErrors  uint64 `json:"recv_errors"`
}

// Stats returns a snapshot of the counters.
func (c *Client) Stats() Stats {
	s := &c.st
	out := Stats{
		Requests: s.requests.Load(), OK: s.ok.Load(), Attempts: s.attempts.Load(), StatusRetries: s.statusRetries.Load(),
		Retransmissions: s.retransmissions.Load(), Results: s.results.Load(), Duplicates: s.duplicates.Load(),
		Stale: s.stale.Load(), Foreign: s.foreign.Load(), Malformed: s.malformed.Load(), Ignored: s.ignored.Load(),
		TxDatagrams: s.txDatagrams.Load(), TxBytes: s.txBytes.Load(), RxDatagrams: s.rxDatagrams.Load(), RxBytes: s.rxBytes.Load(),
		SendErrors: s.sendErrors.Load(), RecvErrors: s.recvErrors.Load(),
	}
	s.mu.Lock()
	if len(s.errors) > 0 {
		out.Errors = make(map[string]uint64, len(s.errors))
		for k, v := range s.errors {
			out.Errors[k] = v
		}
	}
	s.mu.Unlock()
	return out
}

type counters struct {
	requests, ok, attempts, statusRetries, retransmissions, results atomic.Uint64
	duplicates, stale, foreign, malformed, ignored                  atomic.Uint64
	txDatagrams, txBytes, rxDatagrams, rxBytes                      atomic.Uint64
	sendErrors, recvErrors                                          atomic.Uint64

	mu     sync.Mutex
	errors map[string]uint64
}

func (s *counters) countError(err error) {
	k := Cause(err)
	s.mu.Lock()
	s.errors[k]++
	s.mu.Unlock()
}

// Cause names an Infer error's cause as Stats and Report count it: the
// status name of an *ingest.Error, "timeout", "closed", "canceled",
// "deadline" (ctx's deadline, as the DPU's status reads), "invalid",
// "output-too-large", or "internal"; "ok" for nil.
func Cause(err error) string {
	var ie *ingest.Error
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &ie):
		return ie.Status.String()
	case errors.Is(err, ErrTimeout):
		return "timeout"
	case errors.Is(err, ErrClosed):
		return "closed"
	case errors.Is(err, ErrInvalid):
		return "invalid"
	case errors.Is(err, ErrOutputTooLarge):
		return "output-too-large"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return ingest.StatusOf(err).String()
}
