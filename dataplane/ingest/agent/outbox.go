package agent

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"

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
	wake    chan struct{}

	sent, errs *atomic.Uint64
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
	o.mu.Unlock()
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
		o.log.Debug("send", "to", o.name, "addr", out[n].Addr, "err", err)
		if errors.Is(err, transport.ErrClosed) {
			break
		}
		out = out[n+1:]
	}
	clear(batch) // drop the references to sent data
	return batch
}
