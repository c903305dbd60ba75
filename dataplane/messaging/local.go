package messaging

import (
	"net/netip"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging/bundle"
)

// Local delivery: a message for one of the client's own ranks never goes
// through the network (in ModeNone a datagram to itself, with an agent a
// round trip through it). Each shard has a local link, an outLink like the
// others, whose buffers are packed by the same Send fast path and closed
// by the same rules (full, flush timeout, idle, Flush, Close), but whose
// pump hands each closed bundle, in order, to the client's delivery queue
// instead of the transport. The consumer reads it in place like a received
// bundle, on the same delivery goroutine, and gives the buffer back to the
// link when done: the buffers in the queue are the link's window, so a
// slow consumer makes Send wait (TrySend: ErrWouldBlock) as a closed credit
// window does. The link is never in flight, so it has no timers, no
// sequence numbers and no dead peer, and Flush has nothing to wait for once
// its bundles are queued.

// localHopName names the local hop in Stats.Local.
const localHopName = "local"

// localWindowFactor scales buffers_per_dest for a local link: as many
// bundles as a remote link holds in its send buffers and in the receiver's
// window together.
const localWindowFactor = 2

// localOut is the part of an outLink that only a local link has.
type localOut struct {
	c  *Client
	s  *shard
	in *inLink // the consumer's state of this stream: a message larger than a bundle
	// spare holds deliveries the consumer gave back with their buffers,
	// reused so that a local bundle costs no allocation.
	spare []*delivery
}

// newLocalLink returns a new local link of shard s.
func (s *shard) newLocalLink() *outLink {
	c := s.c
	l := newOutLink(localHopName, netip.AddrPort{}, c.cfg.Tenant, s.self, s.self, c.tsize, localWindowFactor*c.cfg.BuffersPerDest, &c.ctr)
	l.loc = &localOut{c: c, s: s, in: &inLink{}}
	return l
}

// pumpLocal hands the ready bundles of a local link to the delivery queue,
// in order, and counts them sent. The shard's lock is held.
func (l *outLink) pumpLocal() {
	lo := l.loc
	for _, b := range l.ready[l.rhead:] {
		l.st.bundles.Add(1)
		l.st.bytes.Add(uint64(len(b.b) - bundle.Overhead))
		l.st.messages.Add(uint64(b.msgs))
		var d *delivery
		if n := len(lo.spare); n > 0 {
			d, lo.spare = lo.spare[n-1], lo.spare[:n-1]
		} else {
			d = &delivery{}
		}
		d.l, d.lo, d.lb = lo.in, l, b
		lo.c.q.push(d)
	}
	clear(l.ready)
	l.ready, l.rhead = l.ready[:0], 0
}

// startLocal points a local delivery's reader at its bundle, in the
// fragmentation state the stream's previous bundle left. The consumer lock
// is held.
func startLocal(d *delivery) {
	d.item = rxWork{r: bundle.NewReader(d.lb.b[bundle.Overhead:], d.lb.more, d.l.valPending)}
}

// returnLocal gives a consumed local bundle's buffer back to its link and
// wakes the shard's waiting senders (a Send waiting for a buffer, a Flush
// waiting for a buffer being filled to be flushed and taken).
func (c *Client) returnLocal(d *delivery) {
	d.l.valPending = d.item.r.Pending()
	l := d.lo
	s := l.loc.s
	s.mu.Lock()
	l.release(d.lb)
	*d = delivery{}
	l.loc.spare = append(l.loc.spare, d)
	s.wake()
	s.mu.Unlock()
}
