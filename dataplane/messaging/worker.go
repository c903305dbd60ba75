package messaging

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging/bundle"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// batchSize is the datagrams a worker moves per receive.
const batchSize = 64

// mail is a credit passed between workers.
type mail struct {
	addr netip.AddrPort
	data []byte
}

// worker is one routing thread of an agent. Everything but its counters,
// mailbox and wake pointer belongs to its goroutine alone.
type worker struct {
	a    *Agent
	idx  int
	self Endpoint
	tr   transport.Transport

	links   []*outLink          // by hop
	byPeer  map[uint32]*outLink // by the peer endpoint (a credit's Src)
	recv    *receiver           // incoming links, sequencing, credits
	blocked []*inLink           // the blocklist: links whose bundles wait for a send buffer
	spare   []*inLink
	dirty   []*outLink // links with a buffer being filled

	rx     []transport.Packet
	rxSize int      // the size of a receive buffer
	free   [][]byte // receive buffers back from parked bundles
	out    batch

	now, lastRecv                int64
	nextFlush, nextMaint, nextGC int64
	anyBusy, unblock             bool
	draining                     bool
	ft, idle, rto, peerTO        int64
	msgs, delivered              uint64 // added to ctr once per batch

	ctr      counters
	mailbox  chan mail
	mailFlag atomic.Bool
	wake     atomic.Pointer[context.CancelFunc]
}

func newWorker(a *Agent, idx int, tr transport.Transport, maxLinks int) *worker {
	cfg := a.cfg
	w := &worker{
		a: a, idx: idx, self: AgentEndpoint(a.node, idx), tr: tr,
		byPeer:  map[uint32]*outLink{},
		mailbox: make(chan mail, 1024),
		ft:      int64(cfg.FlushTimeout), idle: int64(cfg.IdleTimeout),
		rto: int64(cfg.RetransmitTimeout), peerTO: int64(cfg.PeerTimeout),
	}
	for _, hp := range a.hops {
		var dst Endpoint
		if hp.isClient {
			dst = ClientEndpoint(a.node, hp.client, 0)
		} else {
			dst = AgentEndpoint(hp.node, idx%cfg.Workers)
		}
		l := newOutLink(hp.name, hp.addr, cfg.Tenant, w.self, dst, a.tsize, cfg.BuffersPerDest, &w.ctr)
		l.isClientHop = hp.isClient
		w.links = append(w.links, l)
		w.byPeer[uint32(dst)] = l
	}
	w.recv = newReceiver(&w.a.cfg, maxLinks, &w.ctr, w, &w.out)
	w.rxSize = max(cfg.TransferSize, 2048)
	w.rx = make([]transport.Packet, batchSize)
	for i := range w.rx {
		w.rx[i].Data = make([]byte, w.rxSize)
	}
	return w
}

func (w *worker) clock() int64 { return w.a.clk.now() }

// doneCtx is a context that is already done: Recv with it only polls.
var doneCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// run is the worker's loop: receive a batch, process it, run the timers,
// send what it produced; block only when nothing is waiting.
func (w *worker) run(ctx context.Context) error {
	w.now = w.clock()
	w.lastRecv = w.now
	for {
		if ctx.Err() != nil {
			if w.draining {
				w.a.log.Warn("messaging: agent worker stopped before it drained", "worker", w.idx, "waiting for", w.drainState())
			}
			if w.draining || w.a.drain <= 0 {
				w.shutdown()
				return nil
			}
			// Go on under a context of our own until the drain is over.
			var cancel context.CancelFunc
			ctx, cancel = w.a.clk.until(context.Background(), w.clock()+int64(w.a.drain))
			defer cancel()
			w.draining = true
		}
		if w.draining {
			w.now = w.clock()
			w.flushAll()
			w.finish()
			if w.drained() {
				w.shutdown()
				return nil
			}
		}
		n, err := w.tr.Recv(doneCtx, w.rx)
		if n == 0 && (err == nil || isCtxErr(err)) {
			w.now = w.clock()
			w.timers()
			w.finish()
			if !w.mailFlag.Load() {
				n, err = w.wait(ctx)
			}
		}
		if err != nil && !isCtxErr(err) {
			if errors.Is(err, transport.ErrClosed) {
				return nil
			}
			return fmt.Errorf("messaging: agent worker %d: %w", w.idx, err)
		}
		w.now = w.clock()
		for i := range n {
			w.handle(&w.rx[i])
		}
		w.drainMail()
		if w.unblock {
			w.drainBlocklist()
		}
		if w.timerDue() {
			w.timers()
		}
		w.finish()
	}
}

// timerDue reports whether a timer of the worker has expired.
func (w *worker) timerDue() bool {
	return len(w.dirty) > 0 && (w.now >= w.nextFlush || w.now-w.lastRecv >= w.idle) ||
		w.anyBusy && w.now >= w.nextMaint ||
		len(w.recv.in) > 0 && w.now >= w.nextGC
}

func isCtxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// wait blocks in Recv until a datagram, the next timer, mail, or the end.
func (w *worker) wait(ctx context.Context) (int, error) {
	var rctx context.Context
	var cancel context.CancelFunc
	if d, ok := w.deadline(); ok {
		rctx, cancel = w.a.clk.until(ctx, d)
	} else {
		rctx, cancel = context.WithCancel(ctx)
	}
	defer cancel()
	w.wake.Store(&cancel)
	defer w.wake.Store(nil)
	if w.mailFlag.Load() {
		return 0, nil // mail arrived before the wake pointer was visible
	}
	return w.tr.Recv(rctx, w.rx)
}

// deadline is when the worker must wake up without input.
func (w *worker) deadline() (int64, bool) {
	d, ok := int64(0), false
	at := func(t int64) {
		if !ok || t < d {
			d, ok = t, true
		}
	}
	if len(w.dirty) > 0 {
		at(w.nextFlush)
		at(w.lastRecv + w.idle)
	}
	if w.anyBusy {
		at(w.nextMaint)
	}
	if len(w.recv.in) > 0 {
		at(w.nextGC)
	}
	return d, ok
}

// handle processes one received datagram.
func (w *worker) handle(p *transport.Packet) {
	if w.recv.handle(p, w.now) == wire.TypeBundle {
		w.lastRecv = w.now
	}
}

// ours implements rxOwner: the worker takes datagrams for any worker of
// its node (a credit for another worker's link is passed on).
func (w *worker) ours(dst Endpoint) bool { return !dst.IsClient() && dst.Node() == w.a.node }

// admit implements rxOwner: a draining worker starts no link and takes only
// the bundles that complete what it already acknowledged.
func (w *worker) admit(l *inLink, seq uint32) bool {
	return !w.draining || l != nil && w.drainTakes(l, seq)
}

// inOrder implements rxOwner: it routes the bundle in place when nothing of
// l waits, or queues it behind what does.
func (w *worker) inOrder(l *inLink, item rxWork, p *transport.Packet) {
	if len(l.work) == 0 {
		if w.runItem(l, &item) {
			w.consume(l)
			return
		}
		w.own(l, &item, p, true)
		l.work = append(l.work, item)
		w.block(l)
		return
	}
	w.own(l, &item, p, false)
	l.work = append(l.work, item)
}

// own makes a queued bundle independent of the next Recv. It keeps the
// receive buffer the bundle came in, p's, and gives p another: the reader
// and the message being routed already point into it, and a parked bundle
// costs no copy. The buffer comes back when the bundle is done (runLink).
// Without a worker's receive buffer (a fuzzed datagram) it copies the
// records and rebases the reader, and the message being routed (curHere:
// it came from this bundle) when it aliases them.
func (w *worker) own(l *inLink, item *rxWork, p *transport.Packet, curHere bool) {
	if item.data != nil || item.reset {
		return
	}
	if p != nil && cap(p.Data) >= w.rxSize {
		item.buf = p.Data[:cap(p.Data)]
		item.data = item.buf
		p.Data = w.rxBuf()
		return
	}
	records := append([]byte(nil), item.r.Bytes()...)
	item.r.Rebase(records)
	item.data = records
	if cur := l.cur; curHere && cur.active && !cur.fromPartial {
		start := cur.off + bundle.RecordHeaderLen
		l.cur.data = records[start : start+len(cur.data)]
	}
}

// consume marks the oldest unprocessed bundle of l processed.
func (w *worker) consume(l *inLink) {
	l.consumed.Add(1)
	w.recv.creditDue(l)
}

// rxBuf returns a receive buffer: one a finished parked bundle gave back,
// or a new one.
func (w *worker) rxBuf() []byte {
	if n := len(w.free); n > 0 {
		b := w.free[n-1]
		w.free[n-1] = nil
		w.free = w.free[:n-1]
		return b
	}
	return make([]byte, w.rxSize)
}

func (w *worker) block(l *inLink) {
	if !l.blocked {
		l.blocked = true
		w.blocked = append(w.blocked, l)
	}
}

// runItem routes the rest of one bundle. It returns false when a message
// found no free send buffer; l.cur then holds it and its progress.
func (w *worker) runItem(l *inLink, item *rxWork) bool {
	for {
		if l.cur.active {
			if !w.route(l, &item.r) {
				return false
			}
			l.cur = rxMsg{}
		}
		m, ok := l.nextMessage(item, w.a.cfg.MaxMessageSize, &w.ctr)
		if !ok {
			return true
		}
		w.msgs++
		l.cur = m
	}
}

// route writes l.cur into the send buffer of its next hop, and after a
// whole record the run of whole records behind it in r that go to the
// same next hop and fit that buffer (routeRun).
func (w *worker) route(l *inLink, r *bundle.Reader) bool {
	m := &l.cur
	h := w.a.table.lookup(m.rank)
	if h < 0 {
		w.ctr.drop(dropUnknownRank, 1)
		return true
	}
	out := w.links[h]
	switch out.write(m.rank, m.data, &m.p, w.now, &w.out, w.markDirty) {
	case writeWait:
		if !m.waited {
			m.waited = true
			out.st.blocked.Add(1)
		}
		return false
	case writeDone:
		if out.isClientHop {
			w.delivered++
		}
	}
	if !m.fromPartial {
		w.routeRun(out, h, r)
	}
	return true
}

// routeRun moves the whole records that follow in r into the buffers
// their next hops are filling, a run of records for one next hop in one
// copy: records have the same bytes in every bundle, so a run needs no
// re-encoding. A run ends at a record for another next hop, and the next
// run goes on into that hop's buffer, as long as it is being filled
// (neither empty, nor fragmenting, nor towards a dead peer) and has room.
// Anything else (a fragment, a full buffer, an unknown rank) is left to
// the record-at-a-time path. It costs a header read and a table lookup per
// message, and one bounds check and one copy per run.
func (w *worker) routeRun(out *outLink, h int32, r *bundle.Reader) {
	for {
		c := out.cur
		if c == nil || out.fragOwner != nil || out.dead || len(c.b) == bundle.Overhead {
			return
		}
		start := r.Offset()
		room := min(out.tsize, cap(c.b)) - len(c.b)
		n, next := 0, int32(-1)
		for {
			rank, size, ok := r.PeekWhole()
			if !ok || r.Offset()-start+bundle.RecordHeaderLen+int(size) > room {
				break
			}
			if hh := w.a.table.lookup(rank); hh != h {
				next = hh
				break
			}
			r.SkipWhole(size)
			n++
		}
		if n > 0 {
			c.b = append(c.b, r.Bytes()[start:r.Offset()]...)
			c.msgs += n
			w.msgs += uint64(n)
			if out.isClientHop {
				w.delivered += uint64(n)
			}
		}
		if next < 0 {
			return
		}
		h, out = next, w.links[next]
	}
}

func (w *worker) markDirty(l *outLink) {
	if len(w.dirty) == 0 || w.now+w.ft < w.nextFlush {
		w.nextFlush = w.now + w.ft
	}
	w.dirty = append(w.dirty, l)
}

// drainBlocklist retries the parked bundles, oldest first.
func (w *worker) drainBlocklist() {
	w.unblock = false
	list := w.blocked
	w.blocked = w.spare[:0]
	for _, l := range list {
		l.blocked = false
		if !w.runLink(l) {
			w.block(l)
		}
	}
	clear(list)
	w.spare = list[:0]
}

// runLink processes l's queued bundles until one blocks.
func (w *worker) runLink(l *inLink) bool {
	for len(l.work) > 0 {
		if !w.runItem(l, &l.work[0]) {
			return false
		}
		if b := l.work[0].buf; b != nil {
			w.free = append(w.free, b)
		}
		l.work[0] = rxWork{}
		l.work = l.work[1:]
		w.consume(l)
	}
	l.work = nil
	return true
}

// credit implements rxOwner: a credit for a link of another worker is
// passed on to it through its mailbox.
func (w *worker) credit(h wire.Header, c bundle.Credit, addr netip.AddrPort, raw []byte, _ int64) {
	if owner := Endpoint(h.Dst).Worker() % len(w.a.workers); owner != w.idx {
		if w.a.workers[owner].post(mail{addr: addr, data: append([]byte(nil), raw...)}, &w.ctr) {
			w.ctr.misdirected.Add(1) // a credit lost to a full mailbox counts there only
		}
		return
	}
	w.ctr.credits.Add(1)
	l := w.byPeer[h.Src]
	if l == nil || !l.onCredit(h.Seq, c, w.now, w.rto, &w.out) {
		w.ctr.drop(dropStaleCredit, 1)
		return
	}
	if l.freed > 0 {
		w.unblock = true
	}
	if l.timed() {
		w.busy()
	}
}

// post hands a credit to this worker from another and wakes it. It
// reports whether the mailbox took it; when full, the credit is dropped and
// counted in from.
func (w *worker) post(m mail, from *counters) bool {
	select {
	case w.mailbox <- m:
		w.mailFlag.Store(true)
		if f := w.wake.Load(); f != nil {
			(*f)()
		}
		return true
	default:
		from.drop(dropMailbox, 1)
		return false
	}
}

func (w *worker) drainMail() {
	if !w.mailFlag.Swap(false) {
		return
	}
	for {
		select {
		case m := <-w.mailbox:
			w.handle(&transport.Packet{Addr: m.addr, Data: m.data})
		default:
			return
		}
	}
}

func (w *worker) busy() {
	if !w.anyBusy {
		w.anyBusy = true
		w.nextMaint = w.now + w.rto/4
	}
}

// gcEvery is how often a worker looks for incoming links to forget.
const gcEvery = int64(time.Second)

// timers closes buffers whose flush timeout passed, all buffers when the
// worker has been idle, runs the links' retransmission timers, and forgets
// incoming links long silent.
func (w *worker) timers() {
	now := w.now
	if len(w.dirty) > 0 && (now >= w.nextFlush || now-w.lastRecv >= w.idle) {
		idle := now-w.lastRecv >= w.idle
		keep := w.dirty[:0]
		next := int64(1<<63 - 1)
		for _, l := range w.dirty {
			switch {
			case l.cur == nil || len(l.cur.b) == bundle.Overhead:
				l.dirty = false
			case idle:
				l.dirty = false
				l.close(flushIdle, now, &w.out)
			case now-l.cur.first >= w.ft:
				l.dirty = false
				l.close(flushTimeout, now, &w.out)
			default:
				keep = append(keep, l)
				next = min(next, l.cur.first+w.ft)
			}
		}
		clear(w.dirty[len(keep):])
		w.dirty = keep
		w.nextFlush = next
	}
	if w.anyBusy && now >= w.nextMaint {
		w.anyBusy = false
		for _, l := range w.links {
			timed, reset := l.maintain(now, w.rto, w.peerTO, &w.out)
			w.anyBusy = w.anyBusy || timed
			w.unblock = w.unblock || reset
		}
		w.nextMaint = now + w.rto/4
		if w.unblock {
			w.drainBlocklist()
		}
	}
	if len(w.recv.in) > 0 && now >= w.nextGC {
		w.nextGC = now + gcEvery
		w.recv.forget(now)
	}
}

// finish sends the credits owed and everything queued for sending, then
// frees the buffers that were waiting for that send and, if that or an
// earlier credit freed any, retries the blocklist (which may queue more).
func (w *worker) finish() {
	for {
		w.flushOut()
		settled := 0
		for _, l := range w.links {
			if len(l.limbo) > 0 {
				settled += l.settle()
			}
		}
		if settled > 0 {
			w.unblock = true
		}
		if !w.unblock || len(w.blocked) == 0 {
			w.unblock = false
			return
		}
		w.drainBlocklist()
	}
}

func (w *worker) flushOut() {
	if w.msgs > 0 {
		w.ctr.messages.Add(w.msgs)
		w.msgs = 0
	}
	if w.delivered > 0 {
		w.ctr.delivered.Add(w.delivered)
		w.delivered = 0
	}
	w.recv.credits()
	if w.out.len() > 0 {
		w.out.send(w.tr, &w.ctr)
		w.out.reset()
		w.busy() // something went out: the next maintenance looks at every link
	}
	w.recv.recycle()
}
