package messaging

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging/bundle"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// delivery is a bundle waiting for the consumer: received, or from a
// local link (lb set).
type delivery struct {
	l    *inLink
	item rxWork
	buf  *[]byte  // the receive buffer it lives in, returned when consumed
	lo   *outLink // the local link whose buffer lb is, returned when consumed
	lb   *txBuf
}

// deliveryQueue is the FIFO between the receive goroutine and the
// consumer. Its length is bounded by the windows the client grants, so the
// receive goroutine never waits on it.
type deliveryQueue struct {
	mu     sync.Mutex
	items  []*delivery
	notify chan struct{}
}

func (q *deliveryQueue) push(d *delivery) {
	q.mu.Lock()
	q.items = append(q.items, d)
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// empty reports whether the queue holds nothing.
func (q *deliveryQueue) empty() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) == 0
}

func (q *deliveryQueue) pop() *delivery {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return nil
	}
	d := q.items[0]
	q.items[0] = nil
	q.items = q.items[1:]
	if len(q.items) == 0 {
		q.items = q.items[:0:0]
	}
	return d
}

// receive is the goroutine that reads the socket: bundles into the
// delivery queue (in sequence, per link), credits to the shards.
func (c *Client) receive(ctx context.Context) {
	defer c.wg.Done()
	defer close(c.rxDone) // nothing pushes a received bundle any more
	for {
		n, err := c.tr.Recv(ctx, c.rx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, transport.ErrClosed) {
				return
			}
			c.log.Error("messaging: client receive", "err", err)
			select {
			case <-time.After(10 * time.Millisecond): // a persistent error must not spin
			case <-ctx.Done():
				return
			}
			continue
		}
		now := c.clock()
		for i := range n {
			c.recv.handle(&c.rx[i], now)
		}
		c.recv.credits()
		if c.out.len() > 0 {
			c.out.send(c.tr, &c.ctr)
			c.out.reset()
		}
		c.recv.recycle()
	}
}

// ours implements rxOwner: datagrams for any of the client's shards.
func (c *Client) ours(dst Endpoint) bool {
	return dst.IsClient() && dst.Node() == c.node && dst.Client() == c.idx
}

// admit implements rxOwner: a client takes every bundle in its window.
func (c *Client) admit(*inLink, uint32) bool { return true }

// inOrder implements rxOwner: it queues the bundle for the consumer. A
// bundle that arrived in order keeps the receive buffer it came in, and the
// socket gets a fresh one.
func (c *Client) inOrder(l *inLink, item rxWork, p *transport.Packet) {
	d := &delivery{l: l, item: item}
	if p != nil {
		bp := c.bufs.Get().(*[]byte)
		*bp, p.Data = p.Data[:cap(p.Data)], (*bp)[:cap(*bp)]
		d.buf = bp
	}
	c.q.push(d)
}

// credit implements rxOwner: it applies a credit to the link of the shard
// it is for, under the shard's lock.
func (c *Client) credit(h wire.Header, cr bundle.Credit, _ netip.AddrPort, _ []byte, now int64) {
	c.ctr.credits.Add(1)
	sh := Endpoint(h.Dst).Shard()
	if sh >= len(c.shards) {
		c.ctr.drop(dropStaleCredit, 1)
		return
	}
	s := c.shards[sh]
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.byPeer[h.Src]
	if l == nil || !l.onCredit(h.Seq, cr, now, int64(c.cfg.RetransmitTimeout), &s.out) {
		c.ctr.drop(dropStaleCredit, 1)
		return
	}
	if !l.dead && c.hopDead[l.hop].Load() {
		c.hopDead[l.hop].Store(false) // the peer answers again (not just about a session given up)
	}
	s.send()
	l.settle()
	if l.freed > 0 || !l.busy() {
		s.wake()
	}
}

// next returns the next message for the consumer, waiting for one until
// ctx is done or the client has closed and its queue is empty: after Close,
// what was queued (the local bundles Close flushed, and received bundles,
// which the sender counts as delivered once acknowledged) is still
// returned, and ErrClosed only once the receive goroutine has stopped
// pushing and nothing is left. The consumer lock must be held. The data is
// valid until the next call.
func (c *Client) next(ctx context.Context) (rxMsg, error) {
	for {
		if d := c.rcur; d != nil {
			// A whole record behind a whole record, the usual case, is
			// read in place; everything else (the first record,
			// fragments, resets) goes through nextMessage.
			if r := &d.item.r; !d.item.reset {
				if rank, size, ok := r.PeekWhole(); ok && c.mine.Contains(rank) {
					at := r.Offset() + bundle.RecordHeaderLen
					r.SkipWhole(size)
					c.rcount++
					return rxMsg{rank: rank, data: r.Bytes()[at : at+int(size) : at+int(size)], active: true}, nil
				}
			}
			m, ok := d.l.nextMessage(&d.item, c.cfg.MaxMessageSize, &c.ctr)
			if ok {
				if !c.mine.Contains(m.rank) {
					c.ctr.drop(dropUnknownRank, 1)
					continue
				}
				c.rcount++ // added to the counters per bundle, not per message
				return m, nil
			}
			c.countDelivered(d.lb != nil)
			c.consumed(d)
			c.rcur = nil
		}
		if d := c.q.pop(); d != nil {
			if d.lb != nil {
				startLocal(d)
			}
			c.rcur = d
			continue
		}
		select {
		case <-c.q.notify:
		case <-ctx.Done():
			return rxMsg{}, ctx.Err()
		case <-c.rxDone:
			// Not the client's context: the receive goroutine may
			// still push a bundle after Close cancels it.
			if !c.q.empty() {
				continue
			}
			return rxMsg{}, ErrClosed
		}
	}
}

// countDelivered adds the messages the consumer took from its current
// bundle and has not counted to the counters: the handler's goroutine
// calls it once it finishes a bundle, two atomic adds a bundle rather than
// a message; Recv per message, so that a message returned counts at once
// and one still queued never does. local says the bundle came from a
// local link. The consumer lock must be held.
func (c *Client) countDelivered(local bool) {
	if c.rcount > 0 {
		c.ctr.messages.Add(c.rcount)
		c.ctr.delivered.Add(c.rcount)
		if local {
			c.ctr.local.Add(c.rcount)
		}
		c.rcount = 0
	}
}

// consumed returns a processed bundle's buffer and, once half the window
// has been consumed since the last credit told the sender, sends one: a
// sender that used its whole window is then never left waiting for the
// retransmission timer.
func (c *Client) consumed(d *delivery) {
	if d.lb != nil {
		c.returnLocal(d)
		return
	}
	l := d.l
	if d.buf != nil {
		c.bufs.Put(d.buf)
	}
	consumed := l.consumed.Add(1)
	// A credit after Close began would only meet the closed transport.
	if consumed-l.advertised.Load() >= max(1, l.window/2) && c.ctx.Err() == nil {
		l.advertised.Store(consumed)
		ack := l.next.Load()
		var p [creditLen]byte
		_, data := appendCredit(p[:0], c.cfg.Tenant, l.self, l.key.src, ack,
			bundle.Credit{Session: l.key.session, Limit: consumed + l.window})
		_, _ = transport.SendAll(c.tr, []transport.Packet{{Addr: l.peer(), Data: data}}, func(transport.Packet, error) {
			c.ctr.drop(dropSendErrors, 1)
		})
	}
}

// Recv returns the next message for one of the client's ranks, waiting
// until one arrives, ctx is done, or the client has closed with nothing
// left to return (ErrClosed). After Close, Recv goes on returning, in
// order, every message that was queued: those received (the client
// acknowledged their bundles, so their senders count them delivered), those
// for the client's own ranks that Close flushed, and the rest of a bundle
// partly read; messages never read stay queued, and Stats does not count
// them delivered. It is unavailable (ErrMode) when the client has a
// Handler. Concurrent calls each get different messages.
func (c *Client) Recv(ctx context.Context) (Message, error) {
	if c.handler != nil {
		return Message{}, fmt.Errorf("messaging: Recv on a client with a Handler: %w", ErrMode)
	}
	// Not the client's context: a Recv that holds the lock returns once
	// the queue is empty after Close, and then this one gets ErrClosed.
	select {
	case c.rlock <- struct{}{}:
	case <-ctx.Done():
		return Message{}, ctx.Err()
	}
	defer func() { <-c.rlock }()
	m, err := c.next(ctx)
	if err != nil {
		return Message{}, err
	}
	// Counted as it is returned, not when its bundle is finished, which
	// may be never: Recv already costs a copy and a lock per message.
	c.countDelivered(c.rcur.lb != nil)
	return Message{Rank: m.rank, Payload: append([]byte(nil), m.data...)}, nil
}

// deliver is the goroutine that calls the Handler. It stops once the
// client has closed and the queue is empty, not on the client's context:
// everything queued at Close is handed to the handler.
func (c *Client) deliver() {
	defer c.wg.Done()
	for {
		m, err := c.next(context.Background())
		if err != nil {
			return
		}
		c.handler(m.rank, m.data)
	}
}
