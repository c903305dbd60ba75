package messaging

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging/bundle"
)

// shard is one independent send path: its own links (send buffers and
// windows) towards every next hop, under its own lock.
type shard struct {
	mu       sync.Mutex
	c        *Client
	idx      int
	self     Endpoint
	links    []*outLink // by hop, created on first use
	byPeer   map[uint32]*outLink
	dirty    []*outLink
	out      batch
	lastSend int64          // the time of the last Send the timer goroutine knows of
	sends    uint64         // Sends so far; the fast path counts, it reads no clock
	seen     uint64         // sends when the timer goroutine last looked
	waitCh   chan struct{}  // closed and replaced when buffers free up
	dirtyF   func(*outLink) // s.addDirty, bound once
}

// link returns the shard's link to hop h, creating it on first use.
func (s *shard) link(h int32) *outLink {
	if l := s.links[h]; l != nil {
		return l
	}
	c := s.c
	hp := c.hops[h]
	if hp.local {
		l := s.newLocalLink()
		l.hop = int(h)
		s.links[h] = l
		return l
	}
	var dst Endpoint
	if hp.isClient {
		dst = ClientEndpoint(hp.node, hp.client, 0)
	} else {
		dst = AgentEndpoint(c.node, (c.idx+s.idx)%c.cfg.Workers)
	}
	l := newOutLink(hp.name, hp.addr, c.cfg.Tenant, s.self, dst, c.tsize, c.cfg.BuffersPerDest, &c.ctr)
	l.hop = int(h)
	s.links[h] = l
	s.byPeer[uint32(dst)] = l
	return l
}

// addDirty puts a link whose buffer got its first record on the flush list
// and wakes the timer goroutine.
func (s *shard) addDirty(l *outLink) {
	s.dirty = append(s.dirty, l)
	s.c.kickTimers()
}

// send hands the shard's queued datagrams to the transport. The shard's
// lock is held: the buffers must not change until the kernel has them.
func (s *shard) send() {
	if s.out.len() == 0 {
		return
	}
	s.out.send(s.c.tr, &s.c.ctr)
	s.out.reset()
}

// wake wakes the goroutines waiting for this shard's buffers.
func (s *shard) wake() {
	close(s.waitCh)
	s.waitCh = make(chan struct{})
}

// pick locks and returns a shard: the one this goroutine's processor used
// last if it is free, else the first free one, else waits for one.
func (c *Client) pick() *shard {
	if s, ok := c.pool.Get().(*shard); ok && s.mu.TryLock() {
		return s
	}
	n := uint32(len(c.shards))
	start := c.rr.Add(1)
	for i := range n {
		if s := c.shards[(start+i)%n]; s.mu.TryLock() {
			return s
		}
	}
	s := c.shards[start%n]
	s.mu.Lock()
	return s
}

func (c *Client) put(s *shard) {
	s.mu.Unlock()
	c.pool.Put(s)
}

// Send queues payload for rank and returns without waiting for the
// network; the payload is copied, so the caller may reuse it at once. It
// waits only when every send buffer towards the destination is in flight
// (the receiver is slower than the sender) until one is acknowledged, and
// returns ErrClosed if the client closes meanwhile. It returns an error
// wrapping ErrUnknownRank for a rank the cluster lacks, ErrTooLarge for
// a payload above Config.MaxMessageSize, and ErrPeerDead when the next hop
// towards rank has stopped answering (Config.PeerTimeout), before or while
// Send waited: the message is not sent.
func (c *Client) Send(rank uint32, payload []byte) error {
	return c.SendContext(context.Background(), rank, payload)
}

// SendContext is Send with a context that bounds the wait for a send
// buffer. A message larger than one bundle whose first fragments went out
// is finished regardless of ctx, since its remaining fragments cannot be
// taken back.
func (c *Client) SendContext(ctx context.Context, rank uint32, payload []byte) error {
	return c.send(ctx, rank, payload, false)
}

// TrySend is Send that never waits: if the message cannot be buffered at
// once (for a message larger than a bundle: all of it), it writes nothing
// and returns ErrWouldBlock.
func (c *Client) TrySend(rank uint32, payload []byte) error {
	return c.send(context.Background(), rank, payload, true)
}

func (c *Client) send(ctx context.Context, rank uint32, payload []byte, try bool) error {
	if c.closed.Load() {
		return ErrClosed
	}
	if len(payload) > c.cfg.MaxMessageSize {
		return fmt.Errorf("messaging: %d-byte message, max_message_size is %d: %w", len(payload), c.cfg.MaxMessageSize, ErrTooLarge)
	}
	h := c.table.lookup(rank)
	if h < 0 {
		c.ctr.drop(dropUnknownRank, 1)
		return fmt.Errorf("messaging: send to rank %d: %w", rank, ErrUnknownRank)
	}
	s := c.pick()
	if c.closed.Load() {
		// Checked again under the shard's lock: Close sets closed and then
		// flushes each shard under this lock, so a Send that gets the
		// shard after that flush would write where nothing sends or
		// counts it, and return nil.
		c.put(s)
		return ErrClosed
	}
	// The fast path: a message that fits the buffer being filled towards
	// its next hop goes in with one bounds check for the whole record, no
	// clock read (the timer goroutine dates the shard's sends, see
	// timers), no allocation and no call that could fragment or flush.
	if l := s.links[h]; l != nil && !l.dead && !c.hopDead[h].Load() && l.appendFast(rank, payload) {
		s.sends++
		c.put(s)
		return nil
	}
	return c.sendSlow(ctx, s, h, rank, payload, try)
}

// sendSlow writes a message that does not fit the current buffer, or meets
// a link in any state but filling: a new buffer, fragmentation, a closed
// window, a dead peer. s is locked and is unlocked on return. Its progress
// escapes to the heap (a fragmented message's owner is a pointer to it),
// so it lives here, off the fast path: one allocation per bundle, not per
// message.
func (c *Client) sendSlow(ctx context.Context, s *shard, h int32, rank uint32, payload []byte, try bool) error {
	var p progress
	waited := false
	for {
		l := s.link(h)
		if l.dead || c.hopDead[h].Load() || p.started && p.epoch != l.epoch {
			// The next hop stopped answering: nothing more is written
			// to it, and what was (the start of this message too) is
			// dropped and counted where the link was reset.
			if !p.started {
				c.ctr.drop(dropDeadPeer, 1)
			}
			c.put(s)
			return c.deadErr(l, fmt.Sprintf("send to rank %d", rank))
		}
		if try && !l.roomFor(len(payload)) {
			c.put(s)
			return ErrWouldBlock
		}
		now := c.clock()
		s.lastSend = now
		s.sends++
		s.seen = s.sends
		// A dead peer and a reset are handled above, under the same lock:
		// write does not drop here.
		res := l.write(rank, payload, &p, now, &s.out, s.dirtyF)
		s.send()
		if res != writeWait {
			c.put(s)
			return nil
		}
		if !waited {
			waited = true
			l.st.blocked.Add(1)
		}
		ch := s.waitCh
		s.mu.Unlock()
		var done <-chan struct{}
		if !p.started {
			done = ctx.Done()
		}
		select {
		case <-ch:
		case <-done:
			c.pool.Put(s)
			return ctx.Err()
		case <-c.ctx.Done():
			c.pool.Put(s)
			return ErrClosed
		}
		s.mu.Lock()
		if !p.started && c.closed.Load() {
			c.put(s) // as in send: Close may have flushed this shard already
			return ErrClosed
		}
	}
}

// roomFor reports whether a message of n payload bytes can be written now
// without waiting for a buffer.
func (l *outLink) roomFor(n int) bool {
	if l.fragOwner != nil {
		return false
	}
	avail := len(l.free) + int(l.window) - l.nbufs
	need := bundle.RecordHeaderLen + n
	if l.cur != nil {
		if need <= l.tsize-len(l.cur.b) {
			return true
		}
		if need <= l.room {
			return avail >= 1 // moves whole to a fresh buffer
		}
		need -= l.tsize - len(l.cur.b) - bundle.RecordHeaderLen // the head fills the current one
	} else if need <= l.room {
		return avail >= 1
	}
	per := l.room - bundle.RecordHeaderLen
	return avail >= (need+per-1)/per
}

// deadErr is the error for an operation that met the dead next hop of l.
func (c *Client) deadErr(l *outLink, op string) error {
	return fmt.Errorf("messaging: %s: next hop %s (%v) did not answer for %v: %w", op, l.name, l.addr, c.cfg.PeerTimeout, ErrPeerDead)
}

// peerTrouble returns the number of peer resets of the client's links so
// far, and a link whose peer is dead now (or nil). The shards' locks must
// not be held.
func (c *Client) peerTrouble() (resets uint64, dead *outLink) {
	for _, s := range c.shards {
		s.mu.Lock()
		for _, l := range s.links {
			if l == nil {
				continue
			}
			resets += l.st.resets.Load()
			if (l.dead || c.hopDead[l.hop].Load()) && dead == nil {
				dead = l
			}
		}
		s.mu.Unlock()
	}
	return resets, dead
}

func (c *Client) kickTimers() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Flush sends every buffered message and waits until the next hops have
// acknowledged all of them, ctx is done, or the client closes. After Flush
// returns nil, every message sent before it has left this process, or, for
// one of the client's own ranks, is in its delivery queue: as a receiving
// client acknowledges a bundle once it has queued it, Flush does not wait
// for the handler. It
// returns an error wrapping ErrPeerDead when a next hop is dead, or was
// declared dead while Flush waited: the messages held for it were dropped.
func (c *Client) Flush(ctx context.Context) error {
	if c.closed.Load() {
		return ErrClosed
	}
	resets, _ := c.peerTrouble()
	for _, s := range c.shards {
		s.mu.Lock()
		now := c.clock()
		for _, l := range s.links {
			if l != nil {
				l.close(flushExplicit, now, &s.out)
			}
		}
		s.send()
		s.mu.Unlock()
	}
	c.kickTimers()
	for {
		var wait chan struct{}
		for _, s := range c.shards {
			s.mu.Lock()
			for _, l := range s.links {
				if l != nil && (l.busy() || l.cur != nil && len(l.cur.b) > bundle.Overhead) {
					wait = s.waitCh
					break
				}
			}
			s.mu.Unlock()
			if wait != nil {
				break
			}
		}
		if wait == nil {
			if now, dead := c.peerTrouble(); dead != nil {
				return c.deadErr(dead, "flush")
			} else if now != resets {
				return fmt.Errorf("messaging: flush: a next hop was declared dead meanwhile and answered again; messages for it were dropped: %w", ErrPeerDead)
			}
			return nil
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		case <-c.ctx.Done():
			return ErrClosed
		}
	}
}

// timers is the goroutine that closes buffers on their flush timeout and
// when a shard goes idle, and runs the links' retransmission timers.
func (c *Client) timers(ctx context.Context) {
	defer c.twg.Done()
	ft, idle := int64(c.cfg.FlushTimeout), int64(c.cfg.IdleTimeout)
	rto, peerTO := int64(c.cfg.RetransmitTimeout), int64(c.cfg.PeerTimeout)
	t := alarm{k: c.clk, f: c.kickTimers}
	defer t.cancel()
	nextMaint := int64(0)
	again := false // a link was declared dead: look at the others at once
	for {
		now := c.clock()
		next := int64(1<<63 - 1)
		maint := again || now >= nextMaint
		again = false
		if maint {
			nextMaint = now + rto/4
		}
		for _, s := range c.shards {
			s.mu.Lock()
			if s.sends != s.seen {
				// Sends on the fast path since the last look: the last
				// of them was no later than now. An idle flush therefore
				// comes at most one idle timeout late, after a burst.
				s.seen, s.lastSend = s.sends, now
			}
			keep := s.dirty[:0]
			for _, l := range s.dirty {
				switch {
				case l.cur == nil || len(l.cur.b) == bundle.Overhead:
					l.dirty = false
				case now-s.lastSend >= idle:
					l.dirty = false
					l.close(flushIdle, now, &s.out)
				case now-l.cur.first >= ft:
					l.dirty = false
					l.close(flushTimeout, now, &s.out)
				default:
					keep = append(keep, l)
					next = min(next, l.cur.first+ft, s.lastSend+idle)
				}
			}
			clear(s.dirty[len(keep):])
			s.dirty = keep
			woke := false
			for _, l := range s.links {
				if l == nil || !l.timed() {
					continue
				}
				if maint {
					_, reset := l.maintain(now, rto, peerTO, &s.out)
					if !reset && !l.dead && l.busy() && c.hopDead[l.hop].Load() {
						// Another shard declared this next hop dead: it is
						// one peer, so this link's messages are dropped now,
						// not a peer timeout later (Flush waits on them).
						l.declareDead(now)
						reset = true
					}
					if reset {
						c.hopDead[l.hop].Store(true)
						woke, again = true, true
					}
				}
				if len(l.limbo) > 0 {
					s.send()
					l.settle()
				}
				if l.timed() {
					next = min(next, nextMaint)
				}
			}
			s.send()
			if woke {
				s.wake()
			}
			s.mu.Unlock()
		}
		if again {
			continue
		}
		wait := time.Duration(next - c.clock())
		if next == 1<<63-1 {
			wait = time.Hour
		}
		t.set(max(wait, 0))
		select {
		case <-c.kick: // the alarm, or a buffer that got its first record
		case <-ctx.Done():
			return
		}
	}
}
