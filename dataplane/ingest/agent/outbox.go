package agent

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
)

// outbox sends datagrams from one goroutine, in batches: whatever the
// agent queued while the last Send ran goes out in the next one (one
// sendmmsg on kernel UDP, one TX ring refill on AF_XDP). Results and
// doorbells are queued from under the agent's lock and from copy
// goroutines; none of them waits for the system call.
type outbox struct {
	tr   transport.Transport
	log  *slog.Logger
	name string

	mu      sync.Mutex
	pending []transport.Packet
	// ctrls are control messages, encoded at the flush: those to one
	// address that speaks version 2 go out batched.
	ctrls []ctrlMsg
	wake  chan struct{}

	sent, errs *atomic.Uint64

	// The flush's, reused.
	spare  []ctrlMsg
	groups []ctrlGroup
	free   [][]ingest.Ctrl
}

func newOutbox(tr transport.Transport, name string, log *slog.Logger, sent, errs *atomic.Uint64) *outbox {
	return &outbox{tr: tr, name: name, log: log, wake: make(chan struct{}, 1), sent: sent, errs: errs}
}

// push queues pkts; their Data must not change afterwards.
func (o *outbox) push(pkts ...transport.Packet) {
	o.mu.Lock()
	o.pending = append(o.pending, pkts...)
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// ctrlMsg is a queued control message.
type ctrlMsg struct {
	to    netip.AddrPort
	batch bool // the peer takes batches (version 2)
	c     ingest.Ctrl
}

// pushCtrl queues a control message to to; batch says whether to may get
// it in a batch with others.
func (o *outbox) pushCtrl(to netip.AddrPort, c *ingest.Ctrl, batch bool) {
	o.mu.Lock()
	o.ctrls = append(o.ctrls, ctrlMsg{to: to, batch: batch, c: *c})
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// run sends until ctx ends, then sends what is queued.
func (o *outbox) run(ctx context.Context) {
	var batch []transport.Packet
	for {
		select {
		case <-ctx.Done():
			o.flush(batch[:0])
			return
		case <-o.wake:
		}
		batch = o.flush(batch[:0])
	}
}

func (o *outbox) flush(batch []transport.Packet) []transport.Packet {
	o.mu.Lock()
	batch, o.pending = o.pending, batch
	ctrls := o.ctrls
	o.ctrls = o.spare[:0]
	o.mu.Unlock()
	batch = o.encode(batch, ctrls)
	clear(ctrls)
	o.spare = ctrls
	out := batch
	for len(out) > 0 {
		n, err := o.tr.Send(out)
		if o.sent != nil {
			o.sent.Add(uint64(n))
		}
		if err == nil {
			break
		}
		o.errs.Add(1)
		if errors.Is(err, transport.ErrClosed) || n >= len(out) {
			// Closed, or every datagram went and the error names none
			// (transport.SendAll takes it so too): nothing to skip.
			o.log.Debug("send", "to", o.name, "err", err)
			break
		}
		o.log.Debug("send", "to", o.name, "addr", out[n].Addr, "err", err)
		out = out[n+1:]
	}
	clear(batch) // drop the references to sent data
	return batch
}

// encode appends the datagrams of ctrls to pkts: the messages to one
// address that takes batches share datagrams, as many as fit, in the
// order they were queued; a message that may not be batched goes alone,
// after those queued to its address before it.
func (o *outbox) encode(pkts []transport.Packet, ctrls []ctrlMsg) []transport.Packet {
	if len(ctrls) == 0 {
		return pkts
	}
	groups := o.groups[:0]
	send := func(to netip.AddrPort, cs []ingest.Ctrl, batch bool) {
		for rest := cs; len(rest) > 0; {
			b, n := ingest.AppendCtrls(make([]byte, 0, 64+48*len(rest)), rest, o.tr.MaxPayload(), batch)
			pkts = append(pkts, transport.Packet{Addr: to, Data: b})
			rest = rest[n:]
		}
	}
	for _, m := range ctrls {
		g := -1
		for i := range groups {
			if groups[i].to == m.to {
				g = i
				break
			}
		}
		if m.batch {
			if g < 0 {
				groups = append(groups, ctrlGroup{to: m.to, cs: o.takeCtrls()})
				g = len(groups) - 1
			}
			groups[g].cs = append(groups[g].cs, m.c)
			continue
		}
		if g >= 0 {
			send(m.to, groups[g].cs, true)
			groups[g].cs = groups[g].cs[:0]
		}
		send(m.to, []ingest.Ctrl{m.c}, false)
	}
	for _, g := range groups {
		send(g.to, g.cs, true)
		clear(g.cs)
		o.free = append(o.free, g.cs[:0])
	}
	clear(groups)
	o.groups = groups[:0]
	return pkts
}

// ctrlGroup is the batchable messages to one address in a flush.
type ctrlGroup struct {
	to netip.AddrPort
	cs []ingest.Ctrl
}

func (o *outbox) takeCtrls() []ingest.Ctrl {
	if n := len(o.free); n > 0 {
		cs := o.free[n-1]
		o.free = o.free[:n-1]
		return cs
	}
	return nil
}
