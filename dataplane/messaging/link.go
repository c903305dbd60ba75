package messaging

import (
	"encoding/binary"
	"errors"
	"math/bits"
	"math/rand/v2"
	"net/netip"
	"sync/atomic"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging/bundle"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// A link is one direction between two endpoints: an outLink at the sender,
// an inLink at the receiver. Bundles carry the link's sequence numbers;
// credits come back with the cumulative acknowledgement, a selective
// acknowledgement of what arrived out of order, and the window limit. A
// link's state has one owner at a time (an agent worker, or a client shard
// under its lock), so none of it is locked here.

// seqDiff is a - b in sequence space (modulo 2^32).
func seqDiff(a, b uint32) int32 { return int32(a - b) }

// newSession returns a random non-zero session number.
func newSession() uint32 {
	for {
		if s := rand.Uint32(); s != 0 {
			return s
		}
	}
}

// txBuf is one send buffer: a bundle datagram being filled, flushed and
// waiting for credit, or in flight until acknowledged.
type txBuf struct {
	b      []byte // the datagram: Overhead bytes reserved, then records
	msgs   int    // messages that begin here
	first  int64  // when the first record went in
	more   bool   // ends with an unfinished message: FlagMore
	seq    uint32
	sentAt int64
	sends  int
	taken  bool // the transport took a transmission: later ones count as retransmits
}

// batch is an owner's datagrams for its next Send (an agent worker's, a
// client shard's, a client's receive goroutine's), each with what it
// carries, so that the sent counters count what the transport took and not
// what was only queued.
type batch struct {
	pkts []transport.Packet
	of   []batchItem // by datagram
}

// batchItem says what a datagram of a batch is: a bundle (buf) or a probe
// (no buf) of the link st counts, or a credit (neither).
type batchItem struct {
	st  *destCounters
	buf *txBuf
}

func (b *batch) add(p transport.Packet, st *destCounters, buf *txBuf) {
	b.pkts = append(b.pkts, p)
	b.of = append(b.of, batchItem{st: st, buf: buf})
}

func (b *batch) len() int { return len(b.pkts) }

// reset empties the batch, keeping its arrays.
func (b *batch) reset() {
	clear(b.pkts)
	clear(b.of)
	b.pkts, b.of = b.pkts[:0], b.of[:0]
}

// send hands the batch to tr, datagram by datagram as Send reports them
// taken (sendmmsg's count, the AF_XDP ring's). A bundle the transport took
// counts in its link's bundles, messages and bytes the first time, in its
// retransmits after; a probe in its probes. Every datagram it refused, and
// every one left when it closed, counts in ctr's send_errors: sent and
// send_errors partition what was attempted. The datagrams stay in b until
// reset.
func (b *batch) send(tr transport.Transport, ctr *counters) {
	for i := 0; i < len(b.pkts); {
		n, err := tr.Send(b.pkts[i:])
		n = min(max(n, 0), len(b.pkts)-i)
		for j := i; j < i+n; j++ {
			b.of[j].taken(len(b.pkts[j].Data))
		}
		if i += n; i == len(b.pkts) {
			return
		}
		if err == nil || errors.Is(err, transport.ErrClosed) {
			ctr.drop(dropSendErrors, uint64(len(b.pkts)-i)) // it takes none of the rest
			return
		}
		ctr.drop(dropSendErrors, 1) // b.pkts[i]; the rest may go
		i++
	}
}

// taken counts a datagram of size bytes the transport took.
func (it batchItem) taken(size int) {
	switch {
	case it.buf != nil && !it.buf.taken:
		it.buf.taken = true
		it.st.bundles.Add(1)
		it.st.bytes.Add(uint64(size))
		it.st.messages.Add(uint64(it.buf.msgs))
	case it.buf != nil:
		it.st.retransmits.Add(1)
		it.st.retransBytes.Add(uint64(size))
	case it.st != nil:
		it.st.probes.Add(1)
	}
}

// progress is how far a message has been written into a link.
type progress struct {
	done    int    // payload bytes written
	started bool   // the head (or whole record) is written
	epoch   uint32 // the link's epoch when the message started
}

// outLink is the sending end of a link: the send buffers for one next hop
// and the sliding window over them.
type outLink struct {
	name string
	addr netip.AddrPort
	hdr  wire.Header // Type, Tenant, Src, Dst set; Seq and Flags per bundle

	tsize  int    // datagram limit (transfer size)
	room   int    // record bytes of an empty bundle
	window uint32 // send buffers, and the receive window assumed at start

	nbufs    int // buffers allocated so far (lazily, up to window)
	free     []*txBuf
	cur      *txBuf
	ready    []*txBuf // flushed, waiting for the window: a FIFO from ready[rhead]
	rhead    int
	inflight []*txBuf // indexed by seq & mask; nil when free or acknowledged
	mask     uint32   // len(inflight) - 1

	session       uint32
	epoch         uint32 // bumped on reset: messages half-written into an old stream are dropped
	nextSeq, base uint32 // next to assign; oldest unacknowledged
	limit         uint32 // may send seq < limit
	fragOwner     *progress
	fragHead      *txBuf   // the buffer holding fragOwner's head, until it is acknowledged
	limbo         []*txBuf // freed, but maybe still in the owner's unsent batch
	lastHeard     int64    // last credit, or when the link last became busy
	lastProbe     int64
	dirty         bool // on the owner's flush list
	probeBuf      []byte
	st            destCounters
	isClientHop   bool
	hop           int       // the owner's index of the next hop
	dead          bool      // the peer stopped answering: drop, and probe until it answers
	ctr           *counters // the owner's, for the messages a dead peer costs
	freed         int       // buffers freed by the last credit
	gaveUp        []*gaveUp // sessions a reset gave up, whose fate the receiver is asked (giveup.go)
	loc           *localOut // set on a client's local link: bundles go to its delivery queue (local.go)
}

func newOutLink(name string, addr netip.AddrPort, tenant uint32, src, dst Endpoint, tsize, window int, ctr *counters) *outLink {
	l := &outLink{
		name: name, addr: addr, ctr: ctr,
		hdr:    wire.Header{Version: wire.Version, Type: wire.TypeBundle, Tenant: tenant, Src: uint32(src), Dst: uint32(dst)},
		tsize:  tsize,
		room:   tsize - bundle.Overhead,
		window: uint32(window),
	}
	l.inflight = make([]*txBuf, slots(window))
	l.mask = uint32(len(l.inflight) - 1)
	l.session = newSession()
	l.limit = l.window
	return l
}

// slots returns the number of sequence slots for a window: the power of two
// at or above it. It divides 2^32, so seqs less than a window apart never
// share a slot, across the wrap too (with seq % 3, 2^32-1 and 0 did).
func slots(window int) int { return 1 << bits.Len(uint(window-1)) }

// busy reports whether bundles wait for the peer: in flight or for credit.
func (l *outLink) busy() bool { return l.base != l.nextSeq || l.waiting() > 0 }

// waiting returns the number of flushed bundles waiting for the window.
func (l *outLink) waiting() int { return len(l.ready) - l.rhead }

// timed reports whether the link needs its timers: it is busy, its peer
// is dead and being probed, or a session it gave up is being asked about.
func (l *outLink) timed() bool { return l.dead || l.busy() || len(l.gaveUp) > 0 }

// takeBuf returns a free send buffer, allocating up to the window, or nil.
func (l *outLink) takeBuf() *txBuf {
	if n := len(l.free); n > 0 {
		b := l.free[n-1]
		l.free = l.free[:n-1]
		return b
	}
	if l.nbufs < int(l.window) {
		l.nbufs++
		return &txBuf{b: make([]byte, bundle.Overhead, l.tsize)}
	}
	return nil
}

func (l *outLink) release(b *txBuf) {
	b.b = b.b[:bundle.Overhead]
	b.msgs, b.more, b.sends, b.first, b.taken = 0, false, 0, 0, false
	l.free = append(l.free, b)
}

// retire frees an acknowledged (or abandoned) buffer. One transmitted at
// now may still sit in the owner's batch of datagrams not yet handed to the
// transport: it waits in limbo until the owner calls settle after sending,
// so that no new message overwrites it first.
func (l *outLink) retire(b *txBuf, now int64) {
	if b == l.fragHead {
		l.fragHead = nil // the head was acknowledged: no buffer left counts the message, reset must
	}
	if b.sentAt == now {
		l.limbo = append(l.limbo, b)
		return
	}
	l.release(b)
	l.freed++
}

// settle frees the buffers in limbo; the owner calls it once its batch is
// sent. It returns how many it freed.
func (l *outLink) settle() int {
	n := len(l.limbo)
	for _, b := range l.limbo {
		l.release(b)
	}
	clear(l.limbo)
	l.limbo = l.limbo[:0]
	l.freed += n
	return n
}

// appendFast appends a whole record to the buffer being filled when it
// fits there and the link is in the plain filling state (a buffer with
// records, no fragmented message in progress), and reports whether it did.
// One check covers the record's bounds: the buffer's capacity is tsize.
func (l *outLink) appendFast(rank uint32, payload []byte) bool {
	c := l.cur
	if c == nil || l.fragOwner != nil {
		return false
	}
	n := len(c.b)
	end := n + bundle.RecordHeaderLen + len(payload)
	if n == bundle.Overhead || end > l.tsize || end > cap(c.b) {
		return false
	}
	b := c.b[:end]
	binary.BigEndian.PutUint32(b[n:], uint32(len(payload)))
	binary.BigEndian.PutUint32(b[n+4:], rank)
	copy(b[n+bundle.RecordHeaderLen:], payload)
	c.b = b
	c.msgs++
	return true
}

// writeResult is what write did with a message.
type writeResult uint8

const (
	writeDone    writeResult = iota // all of it is in the send buffers
	writeDropped                    // dropped (dead peer, or reset since it began) and counted
	writeWait                       // it must wait for a free buffer
)

// write appends message (rank, payload) from p onwards: writeDone when the
// whole message is written, writeDropped when it was dropped because the
// peer is dead or the link was reset since it began, writeWait when it must
// wait for a free buffer; p records how far it got. Full buffers are closed
// and sent within the window (appended to out); newDirty is called when a
// buffer receives its first record.
func (l *outLink) write(rank uint32, payload []byte, p *progress, now int64, out *batch, newDirty func(*outLink)) writeResult {
	if p.started && p.epoch != l.epoch {
		return writeDropped // the stream it began in is gone (peer reset): counted there
	}
	if l.dead {
		l.ctr.drop(dropDeadPeer, 1)
		return writeDropped
	}
	if l.fragOwner != nil && l.fragOwner != p {
		return writeWait
	}
	for {
		if l.cur == nil {
			if l.cur = l.takeBuf(); l.cur == nil {
				return writeWait
			}
		}
		c := l.cur
		empty := len(c.b) == bundle.Overhead
		b, n, more := bundle.AppendMessage(c.b, l.tsize, l.room, rank, payload, p.done)
		if n < 0 {
			if empty {
				return writeDropped // cannot happen (an empty bundle takes any part); never spin
			}
			l.close(flushFull, now, out) // start over in an empty buffer
			continue
		}
		c.b = b
		if empty {
			c.first = now
			if !l.dirty {
				l.dirty = true
				newDirty(l)
			}
		}
		if !p.started {
			p.started, p.epoch = true, l.epoch
			c.msgs++
			if more {
				l.fragHead = c
			}
		}
		p.done += n
		if more {
			c.more = true
			l.fragOwner = p
			l.close(flushFull, now, out)
			continue
		}
		if l.fragOwner == p {
			l.fragOwner, l.fragHead = nil, nil
		}
		return writeDone
	}
}

// close moves the buffer being filled, if it holds anything, to the ready
// queue and sends what the window allows.
func (l *outLink) close(why flushReason, now int64, out *batch) {
	c := l.cur
	if c == nil || len(c.b) == bundle.Overhead {
		return
	}
	l.cur = nil
	if !l.busy() {
		l.lastHeard = now // the peer's silence counts from now
	}
	l.ready = append(l.ready, c)
	l.st.flushes[why].Add(1)
	l.pump(now, out)
}

// unsent returns the messages that wait for the window: those that begin
// in a waiting bundle, and a fragmented message whose head went out in an
// earlier bundle while its rest waits.
func (l *outLink) unsent() int {
	n := 0
	for i, b := range l.ready[l.rhead:] {
		n += b.msgs
		if i == 0 && len(b.b) >= bundle.Overhead+bundle.RecordHeaderLen &&
			binary.BigEndian.Uint32(b.b[bundle.Overhead+4:]) == bundle.ContinuationRank {
			n++
		}
	}
	return n
}

// pump sends ready bundles while the window is open.
func (l *outLink) pump(now int64, out *batch) {
	if l.loc != nil {
		l.pumpLocal()
		return
	}
	for l.waiting() > 0 && seqDiff(l.nextSeq, l.limit) < 0 && l.nextSeq-l.base < l.window {
		b := l.ready[l.rhead]
		l.ready[l.rhead] = nil
		l.rhead++
		b.seq = l.nextSeq
		l.nextSeq++
		l.inflight[b.seq&l.mask] = b
		l.transmit(b, now, out)
	}
	if l.waiting() == 0 {
		l.ready, l.rhead = l.ready[:0], 0 // keep the array: no allocation per bundle
	}
}

// transmit (re)writes the bundle's header and preamble and queues it. It
// is counted (bundles, or retransmits) once the transport takes it
// (batch.send).
func (l *outLink) transmit(b *txBuf, now int64, out *batch) {
	h := l.hdr
	h.Seq = b.seq
	h.Length = uint32(len(b.b) - wire.HeaderLen)
	if b.more {
		h.Flags |= wire.FlagMore
	}
	if b.sends > 0 {
		h.Flags |= wire.FlagRetransmit
	}
	// AppendTo on b.b[:0] writes the header in place (the capacity is
	// there); it writes Length 0 for the nil payload, so set it after.
	_ = h.AppendTo(b.b[:0], nil)
	binary.BigEndian.PutUint32(b.b[wire.OffsetLength:], h.Length)
	bundle.Preamble{Session: l.session, Base: l.base}.Put(b.b[wire.HeaderLen:])
	b.sentAt = now
	b.sends++
	out.add(transport.Packet{Addr: l.addr, Data: b.b}, &l.st, b)
}

// onCredit applies a credit from the peer: frees what it acknowledges,
// retransmits holes it reveals, opens the window and sends. A credit of a
// session given up answers the sender's question about it (answered). It
// returns false for a credit of another session (stale). l.freed says how
// many buffers it freed.
func (l *outLink) onCredit(ack uint32, c bundle.Credit, now, rto int64, out *batch) bool {
	l.freed = 0
	if c.Session != l.session {
		return l.answered(ack, c)
	}
	l.lastHeard = now
	if l.dead { // a probe was answered: the peer is back
		l.dead = false
		l.st.dead.Store(false)
	}
	if seqDiff(ack, l.base) < 0 && now-l.lastProbe >= rto/8 {
		// The receiver is behind what we know was acknowledged: a new
		// life of it met this link through a bundle whose base was stale
		// (an acknowledgement of its previous life was still on its way
		// to us), or it asks to confirm where the link starts. Tell it
		// our base; a probe sent here follows every credit we took.
		l.probe(now, out)
	}
	if seqDiff(ack, l.base) > 0 && seqDiff(ack, l.nextSeq) <= 0 {
		for l.base != ack {
			// Only the bundle the ack covers, as for a SACK: a slot never
			// holds another, but retiring one unacked would lose it.
			if b := l.inflight[l.base&l.mask]; b != nil && b.seq == l.base {
				l.inflight[l.base&l.mask] = nil
				l.retire(b, now)
			}
			l.base++
		}
	}
	if c.SACK != 0 && l.base == ack {
		top := ack
		for s := c.SACK; s != 0; s &= s - 1 {
			q := ack + 1 + uint32(bits.TrailingZeros64(s))
			if seqDiff(q, l.nextSeq) >= 0 {
				break
			}
			if b := l.inflight[q&l.mask]; b != nil && b.seq == q {
				l.inflight[q&l.mask] = nil
				l.retire(b, now)
			}
			top = q
		}
		// Everything below the highest selectively acknowledged bundle
		// that is still unacknowledged is a hole: send it again now, at
		// most once per eighth of the retransmit timeout.
		for q := ack; q != top; q++ {
			if b := l.inflight[q&l.mask]; b != nil && now-b.sentAt >= rto/8 {
				l.transmit(b, now, out)
			}
		}
	}
	if seqDiff(c.Limit, l.limit) > 0 {
		l.limit = c.Limit
	}
	l.pump(now, out)
	return true
}

// maintain runs the link's timers: retransmission of bundles whose
// acknowledgement is overdue (backing off per try), probes while the window
// is closed with nothing in flight, and the dead-peer reset; for a dead
// peer, a probe every eighth of peerTimeout to notice its return; and the
// questions about sessions given up. It returns whether the link still
// needs its timers and whether it was reset (freeing its buffers).
func (l *outLink) maintain(now, rto, peerTimeout int64, out *batch) (timed, reset bool) {
	if len(l.gaveUp) > 0 {
		l.askGaveUp(now, rto, peerTimeout, out)
	}
	if l.dead {
		if now-l.lastProbe >= max(rto, peerTimeout/8) {
			l.probe(now, out)
		}
		return true, false
	}
	if !l.busy() {
		return len(l.gaveUp) > 0, false
	}
	if now-l.lastHeard >= peerTimeout {
		l.declareDead(now)
		return true, true
	}
	for q := l.base; q != l.nextSeq; q++ {
		b := l.inflight[q&l.mask]
		if b == nil {
			continue
		}
		if now-b.sentAt >= rto<<min(b.sends-1, 6) {
			l.transmit(b, now, out)
		}
	}
	if l.base == l.nextSeq && l.waiting() > 0 && now-l.lastHeard >= rto && now-l.lastProbe >= rto {
		l.probe(now, out) // the window is closed and the credit that opens it is overdue
	}
	return true, false
}

// declareDead drops what the link holds (reset) and probes the peer from
// now on until it answers.
func (l *outLink) declareDead(now int64) {
	l.reset(now)
	l.dead = true
	l.st.dead.Store(true)
}

// probe asks the receiver for a fresh credit: a credit datagram with
// FlagAckReq whose Seq is our base.
func (l *outLink) probe(now int64, out *batch) {
	h := l.hdr
	h.Type, h.Flags, h.Seq = wire.TypeCredit, wire.FlagAckReq, l.base
	p := bundle.Credit{Session: l.session}.AppendTo(make([]byte, 0, bundle.CreditLen))
	l.probeBuf = h.AppendTo(l.probeBuf[:0], p)
	l.lastProbe = now
	out.add(transport.Packet{Addr: l.addr, Data: l.probeBuf}, &l.st, nil) // counted once the transport takes it
}

// reset declares the peer dead: every buffered message is dropped, and
// the link starts a new session. What is lost for certain is counted at
// once; the messages the receiver may have taken or hold are counted once
// it says it has neither (giveUp).
func (l *outLink) reset(now int64) {
	drop, g := l.giveUp(now)
	if g != nil {
		l.gaveUp = append(l.gaveUp, g)
	}
	for _, b := range l.ready[l.rhead:] {
		l.release(b)
	}
	// Buffers in flight may sit in the caller's unsent batch (sent at now).
	clear(l.ready)
	l.ready, l.rhead = l.ready[:0], 0
	for i, b := range l.inflight {
		if b != nil {
			l.retire(b, now)
			l.inflight[i] = nil
		}
	}
	if l.cur != nil {
		l.release(l.cur)
		l.cur = nil
	}
	l.ctr.drop(dropDeadPeer, drop)
	l.st.resets.Add(1)
	l.session = newSession()
	l.epoch++
	l.nextSeq, l.base, l.limit = 0, 0, l.window
	l.fragOwner, l.fragHead = nil, nil
}

// linkKey identifies an incoming link: the sender's endpoint and session.
type linkKey struct {
	src, session uint32
}

// rxSlot holds a bundle that arrived ahead of a gap, or marks one dropped
// above a stale gap (gone).
type rxSlot struct {
	seq   uint32
	flags wire.Flags
	data  []byte // the records region, copied
	size  int    // datagram bytes, for the counters
	used  bool
	// gone: dropped above a stale gap and counted there. It stays
	// acknowledged selectively, since its sender may have freed it on an
	// earlier credit and will never send it again, and the link moves past
	// it once the gap below fills.
	gone bool
}

// verdict is what the receiver does with a bundle's sequence number.
type verdict uint8

const (
	vInOrder verdict = iota
	vStash
	vDuplicate
	vOutOfWindow
)

// inLink is the receiving end of a link: sequence tracking, the bundles
// held out of order, and what the credits say. Next and consumed are atomic
// because a client's delivery goroutine reads next and writes consumed
// while its receive goroutine does the rest.
type inLink struct {
	key    linkKey
	self   uint32                         // the endpoint the sender addressed (credits' Src)
	addr   atomic.Pointer[netip.AddrPort] // where credits go: the sender's latest source address
	window uint32

	next     atomic.Uint32 // all seq below arrived
	consumed atomic.Uint32 // all seq below processed; the window is [consumed, consumed+window)
	ooo      []rxSlot      // by seq & mask
	mask     uint32        // len(ooo) - 1
	held     int           // slots in use
	gone     int           // slots marking bundles dropped above a stale gap
	// quiet: the last bundle passed over was gone, so a continuation
	// leading the next one belongs to a message counted in stale_gap: it
	// is dropped as an orphan but not counted again.
	quiet bool

	valPending uint32 // fragmentation state after the last bundle validated
	// unsure: the link was met in the middle of the sender's stream, and
	// the base its bundle carried may be stale (a previous life of this
	// receiver may have acknowledged more, its credit still on the way).
	// No bundle is taken until a probe, which the sender sends in answer
	// to a credit behind its base, confirms where the link starts.
	unsure    bool
	lastSeen  int64
	gapSince  int64 // when the gap below the bundles held opened, or last moved on
	creditDue bool  // on the owner's credit list

	// Message processing: an agent routes, a client delivers. Only the
	// processing side touches these.
	work     []rxWork // in-order bundles not yet fully processed
	cur      rxMsg    // the message being routed or delivered
	partial  []byte   // a fragmented message being reassembled
	partRank uint32
	partWant uint32
	skip     bool // discarding the rest of an oversized message
	blocked  bool // on the agent's blocklist

	// advertised is consumed as of the last credit sent: a client's
	// consumer sends one when it has consumed half a window beyond it.
	advertised atomic.Uint32
}

// rxWork is an in-order bundle awaiting processing.
type rxWork struct {
	r     bundle.Reader
	data  []byte // owned bytes, when not processed in place
	buf   []byte // an agent worker's receive buffer the bundle kept (data), to give back when done
	reset bool   // a malformed or gone bundle: drop any partial message, nothing else
	quiet bool   // a leading orphan continuation is counted elsewhere (inLink.quiet)
}

// rxMsg is a message being routed or delivered.
type rxMsg struct {
	rank        uint32
	data        []byte
	off         int // offset of the record in its bundle (to rebase data on copy)
	fromPartial bool
	active      bool
	waited      bool // counted as blocked once
	p           progress
}

// newInLink starts tracking a link at base, the sender's base in the bundle
// that introduced it. sure says that base is certainly current: the bundle
// was seq base sent for the first time, so nothing beyond base can have
// been acknowledged to anyone; otherwise the link starts unsure.
func newInLink(key linkKey, self uint32, addr netip.AddrPort, window int, base uint32, sure bool, now int64) *inLink {
	l := &inLink{key: key, self: self, window: uint32(window), ooo: make([]rxSlot, slots(window)), lastSeen: now, unsure: !sure}
	l.mask = uint32(len(l.ooo) - 1)
	l.setAddr(addr)
	l.next.Store(base)
	l.consumed.Store(base)
	l.advertised.Store(base)
	if base != 0 {
		// The sender has been sending before we met it: its stream may
		// be in the middle of a fragmented message.
		l.valPending = bundle.Unknown
	}
	return l
}

// sureStart reports whether a bundle that introduces a link shows the
// sender's current base: it is the base itself, sent for the first time.
func sureStart(seq, base uint32, flags wire.Flags) bool {
	return seq == base && flags&wire.FlagRetransmit == 0
}

// onProbe applies a probe's Seq, the sender's base when it sent the probe:
// an unsure link starts there, and a link behind it (everything below was
// acknowledged by a previous life of this receiver) moves on to it, once
// nothing of it waits for processing. It reports whether it moved the link.
// Only the receiving side calls it, with the link's processing idle.
func (l *inLink) onProbe(seq uint32) bool {
	next := l.next.Load()
	if seqDiff(seq, next) < 0 || next != l.consumed.Load() {
		return false
	}
	l.unsure = false
	if seq == next {
		return false
	}
	for i := range l.ooo {
		s := &l.ooo[i]
		switch {
		case s.used && seqDiff(s.seq, seq) < 0:
			s.used, s.data = false, nil
			l.held--
		case s.gone && seqDiff(s.seq, seq) < 0:
			s.gone = false
			l.gone--
		}
	}
	l.next.Store(seq)
	l.consumed.Store(seq)
	l.advertised.Store(seq)
	l.valPending = bundle.Unknown
	return true
}

// unfinished reports whether the last bundle validated ends inside a
// fragmented message whose rest is still to come.
func (l *inLink) unfinished() bool {
	return l.valPending != 0 && l.valPending != bundle.Unknown
}

// setAddr records the sender's source address, which a client's consumer
// reads concurrently.
func (l *inLink) setAddr(a netip.AddrPort) {
	if p := l.addr.Load(); p == nil || *p != a {
		l.addr.Store(&a)
	}
}

// peer returns where credits go.
func (l *inLink) peer() netip.AddrPort { return *l.addr.Load() }

// classify decides what to do with seq.
func (l *inLink) classify(seq uint32) verdict {
	next := l.next.Load()
	d := seqDiff(seq, next)
	switch {
	case d < 0:
		return vDuplicate
	case seq-l.consumed.Load() >= l.window:
		return vOutOfWindow
	case d == 0:
		return vInOrder
	case (l.ooo[seq&l.mask].used || l.ooo[seq&l.mask].gone) && l.ooo[seq&l.mask].seq == seq:
		return vDuplicate // a gone bundle is counted dropped: taking it now would count it twice
	}
	return vStash
}

// stash keeps a copy of an early bundle.
func (l *inLink) stash(seq uint32, flags wire.Flags, records []byte, size int) {
	s := &l.ooo[seq&l.mask]
	*s = rxSlot{seq: seq, flags: flags, data: append(s.data[:0], records...), size: size, used: true}
	l.held++
}

// unstash returns the bundle for the next expected seq, if held, or
// reports that it is gone (dropped above a stale gap). The returned data
// stays valid until the slot is reused, which needs the window to move
// past it, so callers must be done with it (or copy it) before they
// consume it.
func (l *inLink) unstash() (slot rxSlot, gone, ok bool) {
	next := l.next.Load()
	s := &l.ooo[next&l.mask]
	if s.seq != next || !s.used && !s.gone {
		return rxSlot{}, false, false
	}
	if s.gone {
		s.gone = false
		l.gone--
		return rxSlot{}, true, true
	}
	slot = *s
	s.used = false
	s.data = nil // the caller owns the bytes now
	l.held--
	return slot, false, true
}

// nextMessage reads item on to the next complete message for l: a whole
// record, or the last piece of a fragmented one, reassembled in l.partial.
// It drops (and counts) oversized messages and orphan continuations, and a
// reset item discards the partial message. Only l's processing side calls
// it.
func (l *inLink) nextMessage(item *rxWork, maxMsg int, ctr *counters) (rxMsg, bool) {
	if item.reset {
		l.partial, l.skip = l.partial[:0], false
		item.reset = false
		return rxMsg{}, false
	}
	for {
		rec, ok := item.r.Next()
		if !ok {
			return rxMsg{}, false
		}
		switch rec.Kind {
		case bundle.Whole:
			return rxMsg{rank: rec.Rank, data: rec.Data, off: rec.Offset, active: true}, true
		case bundle.Head:
			if int64(rec.Size) > int64(maxMsg) {
				ctr.drop(dropOversize, 1)
				l.skip = true
				continue
			}
			l.skip = false
			l.partial = append(l.partial[:0], rec.Data...)
			l.partRank, l.partWant = rec.Rank, rec.Size
		case bundle.Continuation:
			if rec.Orphan {
				if !item.quiet {
					ctr.drop(dropOrphans, 1)
				}
				continue
			}
			if l.skip {
				l.skip = item.r.Pending() != 0
				continue
			}
			l.partial = append(l.partial, rec.Data...)
			if uint32(len(l.partial)) == l.partWant {
				return rxMsg{rank: l.partRank, data: l.partial, fromPartial: true, active: true}, true
			}
		}
	}
}

// credit builds the credit for this link's current state.
func (l *inLink) credit() (ack uint32, c bundle.Credit) {
	ack = l.next.Load()
	consumed := l.consumed.Load()
	l.advertised.Store(consumed)
	c = bundle.Credit{Session: l.key.session, Limit: consumed + l.window}
	if l.unsure {
		// One behind the base we were told: the sender answers a credit
		// behind its base with a probe, which confirms where we start.
		return ack - 1, c
	}
	if l.held > 0 || l.gone > 0 {
		for i := uint32(0); i < 64 && i+1 < l.window; i++ {
			q := ack + 1 + i
			if s := &l.ooo[q&l.mask]; (s.used || s.gone) && s.seq == q {
				c.SACK |= 1 << i
			}
		}
	}
	return ack, c
}

// appendCredit appends a credit datagram for l to slab and returns the
// extended slab and the datagram.
func appendCredit(slab []byte, tenant uint32, self, peer uint32, ack uint32, c bundle.Credit) ([]byte, []byte) {
	start := len(slab)
	var p [bundle.CreditLen]byte
	h := wire.Header{Version: wire.Version, Type: wire.TypeCredit, Tenant: tenant, Src: self, Dst: peer, Seq: ack}
	slab = h.AppendTo(slab, c.AppendTo(p[:0]))
	return slab, slab[start:len(slab):len(slab)]
}

// creditLen is the size of a credit datagram.
const creditLen = wire.HeaderLen + bundle.CreditLen
