package messaging

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging/bundle"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// ClientOptions are a client's run-time inputs besides its Config.
type ClientOptions struct {
	// Transport is the client's socket, receiving on its configured
	// address; nil opens a kernel UDP socket there. The client owns it and
	// closes it on Close.
	Transport transport.Transport
	// Handler, when set, receives every message on the client's delivery
	// goroutine, one at a time, with the destination rank (one of the
	// client's) and the payload, which is valid only during the call.
	// Recv is then unavailable. The handler may call Send, but should use
	// TrySend, or hand the work to another goroutine, where waiting for a
	// send buffer could close a cycle of waits between processes.
	Handler func(rank uint32, payload []byte)
	// Logger receives the client's few messages; nil discards them.
	Logger *slog.Logger
	// MaxLinks bounds the incoming links the client tracks (0: 4096).
	MaxLinks int
	// Clock is the time source of the client's timers; nil is the system
	// clock. Tests advance one by hand instead of sleeping.
	Clock Clock
}

// Message is a received message.
type Message struct {
	// Rank is the destination rank, one of the client's.
	Rank uint32
	// Payload is the message, owned by the caller.
	Payload []byte
}

// Client is the messaging library of one application process: it sends
// messages to ranks, aggregated into bundles towards the node's agent (or,
// in ModeNone, towards each destination client), and receives the messages
// for its own ranks. Send and TrySend may be called from many goroutines at
// once: each takes one of several independent sender shards, so they do not
// contend on one lock.
type Client struct {
	cfg   Config
	node  int
	idx   int
	tr    transport.Transport
	tsize int
	table *rankTable
	hops  []hop
	// hopDead says, by hop, that a shard declared the next hop dead and no
	// shard has heard from it since: Send fails fast on every shard.
	hopDead []atomic.Bool
	mine    Ranks
	shards  []*shard
	pool    sync.Pool // of *shard: a goroutine tends to get the shard its P used last
	rr      atomic.Uint32
	handler func(uint32, []byte)
	log     *slog.Logger
	clk     clock

	// The receive goroutine's own state.
	recv   *receiver // incoming links, sequencing, credits
	rx     []transport.Packet
	out    []transport.Packet
	rxSize int
	bufs   sync.Pool // of receive buffers handed to the delivery queue

	q     deliveryQueue
	rlock chan struct{} // the consumer lock (Recv or the handler goroutine), usable with a context
	rcur  *delivery     // the bundle being consumed

	ctr    counters
	kick   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool
	once   sync.Once
}

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
	out      []transport.Packet
	lastSend int64
	waitCh   chan struct{}  // closed and replaced when buffers free up
	dirtyF   func(*outLink) // s.addDirty, bound once
}

// delivery is a bundle waiting for the consumer.
type delivery struct {
	l    *inLink
	item rxWork
	buf  *[]byte // the receive buffer it lives in, returned when consumed
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

// NewClient starts the client named client on node: it validates cfg,
// builds the next-hop table, opens (or takes) its transport and starts its
// receive, delivery and timer goroutines, which run until Close.
func NewClient(cfg Config, node, client string, opts ClientOptions) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n, ci, err := cfg.ClientIndex(node, client)
	if err != nil {
		return nil, err
	}
	spec := cfg.Nodes[n].Clients[ci]
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tr := opts.Transport
	if tr == nil {
		if tr, err = udp.Listen(spec.Addr, udp.Options{ReadBuffer: cfg.SocketBuffer, WriteBuffer: cfg.SocketBuffer}); err != nil {
			return nil, fmt.Errorf("messaging: client %s/%s: %w", node, client, err)
		}
	}
	tsize := min(cfg.TransferSize, tr.MaxPayload())
	if tsize < MinTransferSize {
		_ = tr.Close()
		return nil, fmt.Errorf("messaging: client %s/%s: transport carries %d-byte datagrams, bundles need %d", node, client, tsize, MinTransferSize)
	}
	c := &Client{
		cfg: cfg, node: n, idx: ci, tr: tr, tsize: tsize, mine: spec.Ranks, handler: opts.Handler, log: log,
		clk:  newClock(opts.Clock),
		kick: make(chan struct{}, 1), rlock: make(chan struct{}, 1),
	}
	c.recv = newReceiver(&c.cfg, opts.MaxLinks, &c.ctr, c, &c.out)
	c.q.notify = make(chan struct{}, 1)
	if cfg.Mode.HasAgent() {
		c.hops = []hop{{name: cfg.Nodes[n].Name, addr: cfg.Nodes[n].Agent, node: n, client: -1}}
		c.table = newRankTable(cfg, func(int, int) int32 { return 0 })
	} else {
		first := make([]int32, len(cfg.Nodes))
		for m, nd := range cfg.Nodes {
			first[m] = int32(len(c.hops))
			for k, cl := range nd.Clients {
				c.hops = append(c.hops, hop{name: nd.Name + "/" + cl.Name, addr: cl.Addr, node: m, client: k, isClient: true})
			}
		}
		c.table = newRankTable(cfg, func(node, client int) int32 { return first[node] + int32(client) })
	}
	c.hopDead = make([]atomic.Bool, len(c.hops))
	nshards := cfg.SenderShards
	if nshards == 0 {
		nshards = min(runtime.GOMAXPROCS(0), MaxShards)
	}
	for s := range nshards {
		sh := &shard{
			c: c, idx: s, self: ClientEndpoint(n, ci, s),
			links: make([]*outLink, len(c.hops)), byPeer: map[uint32]*outLink{},
			waitCh: make(chan struct{}),
		}
		sh.dirtyF = sh.addDirty
		c.shards = append(c.shards, sh)
	}
	c.rxSize = max(cfg.TransferSize, 2048)
	c.bufs.New = func() any { b := make([]byte, c.rxSize); return &b }
	c.rx = make([]transport.Packet, batchSize)
	for i := range c.rx {
		c.rx[i].Data = make([]byte, c.rxSize)
	}
	// The goroutines run until Close cancels their context.
	ctx, cancel := context.WithCancel(context.Background())
	c.ctx, c.cancel = ctx, cancel
	c.wg.Add(2)
	go c.receive(ctx)
	go c.timers(ctx)
	if c.handler != nil {
		c.wg.Add(1)
		go c.deliver(ctx)
	}
	log.Info("messaging: client ready", "node", node, "client", client, "addr", tr.LocalAddr(), "mode", cfg.Mode,
		"shards", nshards, "transfer_size", tsize)
	return c, nil
}

func (c *Client) clock() int64 { return c.clk.now() }

// Addr returns the address the client receives on.
func (c *Client) Addr() netip.AddrPort { return c.tr.LocalAddr() }

// Ranks returns the ranks the client receives for.
func (c *Client) Ranks() Ranks { return c.mine }

// TransferSize returns the bundle size in use.
func (c *Client) TransferSize() int { return c.tsize }

// link returns the shard's link to hop h, creating it on first use.
func (s *shard) link(h int32) *outLink {
	if l := s.links[h]; l != nil {
		return l
	}
	c := s.c
	hp := c.hops[h]
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
	if len(s.out) == 0 {
		return
	}
	_, _ = transport.SendAll(s.c.tr, s.out, func(transport.Packet, error) { s.c.ctr.drop(dropSendErrors, 1) })
	clear(s.out)
	s.out = s.out[:0]
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
		ok := l.write(rank, payload, &p, now, &s.out, s.dirtyF)
		s.send()
		if ok {
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
// returns nil, every message sent before it has left this process. It
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

// Close sends what the buffers hold (without waiting for
// acknowledgements: call Flush first for that), stops the client's
// goroutines and closes its transport. Blocked Send and Recv calls return
// ErrClosed; a Handler call in progress is waited for. It is safe to call
// more than once.
func (c *Client) Close() error {
	var err error
	c.once.Do(func() {
		c.closed.Store(true)
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
		c.cancel()
		err = c.tr.Close()
		c.wg.Wait()
	})
	return err
}

// Stats returns the client's counters.
func (c *Client) Stats() Stats {
	s := Stats{
		Role: "client", Node: c.cfg.Nodes[c.node].Name, Client: c.cfg.Nodes[c.node].Clients[c.idx].Name,
		Mode: c.cfg.Mode, Workers: len(c.shards), TransferSize: c.tsize,
	}
	for h, hp := range c.hops {
		d := DestStats{Name: hp.name, Addr: hp.addr.String()}
		used := false
		for _, sh := range c.shards {
			sh.mu.Lock()
			l := sh.links[h]
			sh.mu.Unlock()
			if l != nil {
				used = true
				d.add(l.st.snapshot())
			}
		}
		if !used {
			continue
		}
		d.PeerDead = d.PeerDead || c.hopDead[h].Load()
		if d.Bundles > 0 {
			d.AvgBundleBytes = float64(d.Bytes) / float64(d.Bundles)
		}
		s.Destinations = append(s.Destinations, d)
	}
	c.ctr.addTo(&s.Received, &s.Drops)
	return s
}

// timers is the goroutine that closes buffers on their flush timeout and
// when a shard goes idle, and runs the links' retransmission timers.
func (c *Client) timers(ctx context.Context) {
	defer c.wg.Done()
	ft, idle := int64(c.cfg.FlushTimeout), int64(c.cfg.IdleTimeout)
	rto, peerTO := int64(c.cfg.RetransmitTimeout), int64(c.cfg.PeerTimeout)
	t := alarm{k: c.clk, f: c.kickTimers}
	defer t.cancel()
	nextMaint := int64(0)
	for {
		now := c.clock()
		next := int64(1<<63 - 1)
		maint := now >= nextMaint
		if maint {
			nextMaint = now + rto/4
		}
		for _, s := range c.shards {
			s.mu.Lock()
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
					if reset {
						c.hopDead[l.hop].Store(true)
						woke = true
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

// receive is the goroutine that reads the socket: bundles into the
// delivery queue (in sequence, per link), credits to the shards.
func (c *Client) receive(ctx context.Context) {
	defer c.wg.Done()
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
		if len(c.out) > 0 {
			_, _ = transport.SendAll(c.tr, c.out, func(transport.Packet, error) { c.ctr.drop(dropSendErrors, 1) })
			clear(c.out)
			c.out = c.out[:0]
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
	if c.hopDead[l.hop].Load() {
		c.hopDead[l.hop].Store(false) // the peer answers again
	}
	s.send()
	l.settle()
	if l.freed > 0 || !l.busy() {
		s.wake()
	}
}

// next returns the next message for the consumer, waiting for one until
// ctx is done or the client closes. The consumer lock must be held. The
// data is valid until the next call.
func (c *Client) next(ctx context.Context) (rxMsg, error) {
	for {
		if d := c.rcur; d != nil {
			m, ok := d.l.nextMessage(&d.item, c.cfg.MaxMessageSize, &c.ctr)
			if ok {
				if !c.mine.Contains(m.rank) {
					c.ctr.drop(dropUnknownRank, 1)
					continue
				}
				c.ctr.messages.Add(1)
				c.ctr.delivered.Add(1)
				return m, nil
			}
			c.consumed(d)
			c.rcur = nil
		}
		if d := c.q.pop(); d != nil {
			c.rcur = d
			continue
		}
		select {
		case <-c.q.notify:
		case <-ctx.Done():
			return rxMsg{}, ctx.Err()
		case <-c.ctx.Done():
			return rxMsg{}, ErrClosed
		}
	}
}

// consumed returns a processed bundle's buffer and, once half the window
// has been consumed since the last credit told the sender, sends one: a
// sender that used its whole window is then never left waiting for the
// retransmission timer.
func (c *Client) consumed(d *delivery) {
	l := d.l
	if d.buf != nil {
		c.bufs.Put(d.buf)
	}
	consumed := l.consumed.Add(1)
	if consumed-l.advertised.Load() >= max(1, l.window/2) {
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
// until one arrives, ctx is done, or the client closes. It is unavailable
// (ErrMode) when the client has a Handler. Concurrent calls each get
// different messages.
func (c *Client) Recv(ctx context.Context) (Message, error) {
	if c.handler != nil {
		return Message{}, fmt.Errorf("messaging: Recv on a client with a Handler: %w", ErrMode)
	}
	select {
	case c.rlock <- struct{}{}:
	case <-ctx.Done():
		return Message{}, ctx.Err()
	case <-c.ctx.Done():
		return Message{}, ErrClosed
	}
	defer func() { <-c.rlock }()
	m, err := c.next(ctx)
	if err != nil {
		return Message{}, err
	}
	return Message{Rank: m.rank, Payload: append([]byte(nil), m.data...)}, nil
}

// deliver is the goroutine that calls the Handler.
func (c *Client) deliver(ctx context.Context) {
	defer c.wg.Done()
	for {
		m, err := c.next(ctx)
		if err != nil {
			return
		}
		c.handler(m.rank, m.data)
	}
}
