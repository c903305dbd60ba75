// Package clienttest is a stand-in DPU ingest agent for the tests of the
// client and of the commands built on it, as net/http/httptest is for HTTP
// clients: it reassembles input fragments, answers each request once with
// the built-in models' CPU references (or with what a test's handler says)
// and answers a retransmitted request again from its memory, as the
// protocol in dataplane/ingest/proto.go requires of the real agent. It
// places nothing and runs no device; nothing outside tests uses it.
package clienttest

import (
	"context"
	"errors"
	"net/netip"
	"sync"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// Request is a reassembled request as the handler sees it.
type Request struct {
	From   netip.AddrPort
	ID     uint64
	Tenant uint32
	Model  string
	// BudgetUs is the budget of the first fragment the DPU heard of.
	BudgetUs uint32
	Input    []byte
}

// Answer is what the DPU sends back for a request.
type Answer struct {
	Status ingest.Status
	// Text is the slice name on success, the message on failure.
	Text               string
	Output             []byte
	GPU                uint8
	QueuedUs, DeviceUs uint32
}

// Sent describes one result fragment about to be sent, for Options.Drop.
type Sent struct {
	ID uint64
	// Answer counts the times this request was answered before (0: the
	// first answer); Fragment and Fragments place the fragment in it.
	Answer              int
	Fragment, Fragments int
}

// Options configure a DPU. The zero value runs the built-in models.
type Options struct {
	// Handle answers a reassembled request; nil runs Reference.
	Handle func(*Request) Answer
	// Drop, when it returns true, drops a result fragment instead of
	// sending it, as a lossy link would.
	Drop func(Sent) bool
	// OnInput is called for every input fragment received, before it is
	// handled.
	OnInput func(from netip.AddrPort, in *ingest.Input)
	// Forget drops each answer from memory once sent, as a DPU whose kept
	// results expired: a retransmission is then a new request.
	Forget bool
}

// Reference answers with the built-in model's CPU reference: the output
// and slice "ref@0" for an accepted input, StatusUnknownModel or
// StatusBadRequest otherwise.
func Reference(r *Request) Answer {
	m, err := model.Builtin(r.Model)
	if err != nil || m.Reference == nil {
		return Answer{Status: ingest.StatusUnknownModel, Text: "no model " + r.Model}
	}
	if err := m.Check(len(r.Input)); err != nil {
		return Answer{Status: ingest.StatusBadRequest, Text: err.Error()}
	}
	out := make([]byte, m.OutputSize(len(r.Input)))
	out = out[:m.Reference(r.Input, out)]
	return Answer{Status: ingest.StatusOK, Text: "ref@0", Output: out, QueuedUs: 1, DeviceUs: 2}
}

// Counters count what a DPU did.
type Counters struct {
	// Fragments counts input fragments received; Duplicates those it had
	// already; Malformed datagrams it could not decode.
	Fragments, Duplicates, Malformed uint64
	// Executions counts handler calls: one per request, however often it
	// was sent. Answers counts answers sent, repeats included.
	Executions, Answers uint64
}

// DPU is the stand-in agent, serving one transport.
type DPU struct {
	tr   transport.Transport
	opts Options

	mu      sync.Mutex
	ctr     Counters
	partial map[key]*partial
	done    map[key]*done
	execs   map[key]int

	cancel  context.CancelFunc
	stopped chan struct{}
}

type key struct {
	from netip.AddrPort
	id   uint64
}

type partial struct {
	tenant uint32
	model  string
	budget uint32
	buf    []byte
	have   []bool // per byte: simple and enough for tests
	left   int
}

type done struct {
	tenant  uint32
	answer  Answer
	answers int
}

// Start serves tr until Close; the caller keeps owning tr.
func Start(tr transport.Transport, opts Options) *DPU {
	if opts.Handle == nil {
		opts.Handle = Reference
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &DPU{tr: tr, opts: opts, partial: map[key]*partial{}, done: map[key]*done{}, execs: map[key]int{},
		cancel: cancel, stopped: make(chan struct{})}
	go d.run(ctx)
	return d
}

// Addr returns the address the DPU serves.
func (d *DPU) Addr() netip.AddrPort { return d.tr.LocalAddr() }

// Close stops serving; it does not close the transport.
func (d *DPU) Close() {
	d.cancel()
	<-d.stopped
}

// Counters returns what the DPU did so far.
func (d *DPU) Counters() Counters {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ctr
}

// MaxExecutions returns the most times any one request was executed: 1
// when retransmissions never ran a model twice, 0 when nothing ran.
func (d *DPU) MaxExecutions() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := 0
	for _, n := range d.execs {
		m = max(m, n)
	}
	return m
}

func (d *DPU) run(ctx context.Context) {
	defer close(d.stopped)
	bufs := make([]transport.Packet, 64)
	for i := range bufs {
		bufs[i].Data = make([]byte, d.tr.MaxPayload())
	}
	for {
		for i := range bufs {
			bufs[i].Data = bufs[i].Data[:cap(bufs[i].Data)]
		}
		n, err := d.tr.Recv(ctx, bufs)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, transport.ErrClosed) {
				return
			}
			continue
		}
		// A retransmitted request is answered once per batch, not once
		// per fragment.
		var answer []key
		for _, p := range bufs[:n] {
			if k, ok := d.input(p); ok && !contains(answer, k) {
				answer = append(answer, k)
			}
		}
		for _, k := range answer {
			d.answer(k)
		}
	}
}

func contains(ks []key, k key) bool {
	for _, x := range ks {
		if x == k {
			return true
		}
	}
	return false
}

// input takes one datagram; it returns the request to answer, if any.
func (d *DPU) input(p transport.Packet) (key, bool) {
	h, payload, err := wire.Decode(p.Data)
	if err != nil || h.Type != wire.TypeIngestInput {
		d.count(func(c *Counters) { c.Malformed++ })
		return key{}, false
	}
	in, err := ingest.DecodeInput(payload)
	if err != nil {
		d.count(func(c *Counters) { c.Malformed++ })
		return key{}, false
	}
	if d.opts.OnInput != nil {
		d.opts.OnInput(p.Addr, &in)
	}
	k := key{p.Addr, in.ID}
	d.mu.Lock()
	d.ctr.Fragments++
	if d.done[k] != nil {
		d.ctr.Duplicates++
		d.mu.Unlock()
		return k, true
	}
	pr := d.partial[k]
	if pr == nil {
		pr = &partial{tenant: h.Tenant, model: in.Model, budget: in.BudgetUs, buf: make([]byte, in.Total), have: make([]bool, in.Total), left: int(in.Total)}
		d.partial[k] = pr
	}
	if len(pr.buf) != int(in.Total) {
		d.ctr.Malformed++
		d.mu.Unlock()
		return key{}, false
	}
	fresh := false
	for i, b := range in.Data {
		o := int(in.Offset) + i
		if !pr.have[o] {
			pr.have[o], pr.buf[o] = true, b
			pr.left--
			fresh = true
		}
	}
	if !fresh {
		d.ctr.Duplicates++
	}
	if pr.left > 0 {
		d.mu.Unlock()
		return key{}, false
	}
	delete(d.partial, k)
	d.execs[k]++
	d.ctr.Executions++
	d.mu.Unlock()
	a := d.opts.Handle(&Request{From: k.from, ID: k.id, Tenant: pr.tenant, Model: pr.model, BudgetUs: pr.budget, Input: pr.buf})
	d.mu.Lock()
	d.done[k] = &done{tenant: pr.tenant, answer: a}
	d.mu.Unlock()
	return k, true
}

// answer sends k's answer in fragments.
func (d *DPU) answer(k key) {
	d.mu.Lock()
	dn := d.done[k]
	nth := dn.answers
	dn.answers++
	d.ctr.Answers++
	d.mu.Unlock()
	a := dn.answer
	frag := ingest.MaxResultFragment(d.tr.MaxPayload(), a.Text)
	var chunks [][2]int
	for off := 0; off < len(a.Output); off += frag {
		chunks = append(chunks, [2]int{off, min(off+frag, len(a.Output))})
	}
	if len(chunks) == 0 || a.Status != ingest.StatusOK {
		chunks = [][2]int{{0, 0}}
	}
	var pkts []transport.Packet
	for i, ch := range chunks {
		if d.opts.Drop != nil && d.opts.Drop(Sent{ID: k.id, Answer: nth, Fragment: i, Fragments: len(chunks)}) {
			continue
		}
		r := ingest.ResultFragment{ID: k.id, Offset: uint32(ch[0]), Status: a.Status, GPU: a.GPU,
			QueuedUs: a.QueuedUs, DeviceUs: a.DeviceUs, Text: a.Text}
		if a.Status == ingest.StatusOK {
			r.Total, r.Data = uint32(len(a.Output)), a.Output[ch[0]:ch[1]]
		}
		pkts = append(pkts, transport.Packet{Addr: k.from, Data: ingest.AppendResult(nil, dn.tenant, &r)})
	}
	_, _ = transport.SendAll(d.tr, pkts, nil)
	if d.opts.Forget {
		d.mu.Lock()
		delete(d.done, k)
		d.mu.Unlock()
	}
}

func (d *DPU) count(f func(*Counters)) {
	d.mu.Lock()
	f(&d.ctr)
	d.mu.Unlock()
}
