package messaging

import (
	"net/netip"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging/bundle"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// receiver is the receiving half of the protocol, one per agent worker and
// one per client: it checks every datagram's header, keeps the incoming
// links, sequences bundles (duplicates, gaps, the window), answers probes,
// and builds the credits owed. The agent and the client receive the same
// datagrams and differ only in what they do with an in-order bundle (route
// it, or queue it for the application), in which endpoints are theirs, in
// how a credit reaches the outgoing link it is for, and in an agent's drain;
// those are the rxOwner's. The receiver belongs to one goroutine (the
// worker's, or the client's receive goroutine).
type receiver struct {
	tenant   uint32
	window   int
	maxLinks int
	peerTO   int64
	gapTO    int64 // a gap open longer than this is stale (staleGap)
	roomAt   int64 // a full table has no room to make before this (makeRoom)
	ctr      *counters
	owner    rxOwner
	out      *batch // the owner's batch: probe answers and credits go there

	in   map[linkKey]*inLink
	due  []*inLink // links owing a credit
	slab []byte    // credit datagrams of the current batch
}

// rxOwner is what differs between the receivers of an agent worker and of a
// client.
type rxOwner interface {
	// ours reports whether a datagram addressed to dst is the owner's.
	ours(dst Endpoint) bool
	// admit reports whether bundle seq of l (nil: a link not met yet) may
	// be taken now, in order or held early. A draining agent takes only
	// what completes something it already acknowledged; everything else
	// is refused, left unacknowledged for its sender to send again.
	admit(l *inLink, seq uint32) bool
	// inOrder takes l's next bundle in sequence, validated into item. p is
	// the datagram it arrived in, whose buffer the owner may keep (giving
	// p a new one); nil when the bundle was held out of order, and
	// item.data then owns its bytes.
	inOrder(l *inLink, item rxWork, p *transport.Packet)
	// credit applies a credit (not a probe) for one of the owner's
	// outgoing links at now, raw being the whole datagram.
	credit(h wire.Header, c bundle.Credit, addr netip.AddrPort, raw []byte, now int64)
}

func newReceiver(cfg *Config, maxLinks int, ctr *counters, owner rxOwner, out *batch) *receiver {
	if maxLinks <= 0 {
		maxLinks = 4096
	}
	return &receiver{
		tenant: cfg.Tenant, window: cfg.BuffersPerDest, maxLinks: maxLinks, peerTO: int64(cfg.PeerTimeout),
		gapTO: staleGapTimeouts * int64(cfg.PeerTimeout),
		ctr:   ctr, owner: owner, out: out, in: map[linkKey]*inLink{},
	}
}

// handle processes one received datagram at now and returns its type, or
// 0 when it was dropped before its type mattered.
func (r *receiver) handle(p *transport.Packet, now int64) wire.Type {
	h, payload, err := wire.Decode(p.Data)
	if err != nil {
		r.ctr.drop(dropMalformed, 1)
		return 0
	}
	if h.Tenant != r.tenant {
		r.ctr.drop(dropWrongTenant, 1)
		return 0
	}
	if !r.owner.ours(Endpoint(h.Dst)) {
		r.ctr.drop(dropWrongDest, 1)
		return 0
	}
	switch h.Type {
	case wire.TypeBundle:
		r.onBundle(p, h, payload, now)
	case wire.TypeCredit:
		r.onCredit(h, payload, p.Addr, p.Data, now)
	default:
		r.ctr.drop(dropMalformed, 1)
		return 0
	}
	return h.Type
}

func (r *receiver) onBundle(p *transport.Packet, h wire.Header, payload []byte, now int64) {
	pre, records, err := bundle.ParsePreamble(payload)
	if err != nil {
		r.ctr.drop(dropBadBundle, 1)
		return
	}
	key := linkKey{h.Src, pre.Session}
	l := r.in[key]
	if l == nil {
		if !r.owner.admit(nil, h.Seq) {
			r.ctr.refused.Add(1)
			return
		}
		if len(r.in) >= r.maxLinks && !r.makeRoom(now) {
			r.ctr.drop(dropTooManyLinks, 1)
			return
		}
		l = newInLink(key, h.Dst, p.Addr, r.window, pre.Base, sureStart(h.Seq, pre.Base, h.Flags), now)
		r.in[key] = l
	}
	l.setAddr(p.Addr)
	l.lastSeen = now
	size := wire.HeaderLen + len(payload)
	if l.unsure {
		// Not before the sender confirms where the link starts: this
		// credit asks for the probe that does.
		r.ctr.unconfirmed.Add(1)
		r.creditDue(l)
		return
	}
	v := l.classify(h.Seq)
	if (v == vInOrder || v == vStash) && !r.owner.admit(l, h.Seq) {
		r.ctr.refused.Add(1)
		return
	}
	switch v {
	case vDuplicate:
		r.ctr.duplicates.Add(1)
	case vOutOfWindow:
		r.ctr.drop(dropOutOfWindow, 1)
	case vStash:
		r.ctr.outOfOrder.Add(1)
		if l.held == 0 {
			l.gapSince = now // a gap opens
		}
		l.stash(h.Seq, h.Flags, records, size)
	case vInOrder:
		r.owner.inOrder(l, r.accept(l, h.Flags, records, size, false), p)
		for {
			s, gone, ok := l.unstash()
			if !ok {
				break
			}
			if gone {
				r.owner.inOrder(l, r.passGone(l), nil)
				continue
			}
			r.owner.inOrder(l, r.accept(l, s.flags, s.data, s.size, true), nil)
		}
		if l.held > 0 {
			l.gapSince = now // the gap moved on: a later one is open now
		}
	}
	r.creditDue(l)
}

// accept counts and validates l's next bundle in sequence. owned says the
// records are the link's own copy (held out of order).
func (r *receiver) accept(l *inLink, flags wire.Flags, records []byte, size int, owned bool) rxWork {
	l.next.Add(1)
	r.ctr.bundles.Add(1)
	r.ctr.bytes.Add(uint64(size))
	more := flags&wire.FlagMore != 0
	before, quiet := l.valPending, l.quiet
	l.quiet = false
	info, err := bundle.Validate(records, more, before)
	if err != nil {
		r.ctr.drop(dropBadBundle, 1)
		l.valPending = bundle.Unknown // whatever the sender had pending is lost with it
		return rxWork{reset: true}
	}
	l.valPending = info.Pending
	item := rxWork{r: bundle.NewReader(records, more, before), quiet: quiet}
	if owned {
		item.data = records
	}
	return item
}

// passGone moves l past its next bundle, dropped above a stale gap that
// has since filled: the link goes on behind it (its sender freed it and
// will not send it again). The owner processes the item it returns, which
// only drops a message in progress: a message with a part in the dropped
// bundle is counted there, in stale_gap, and so is a continuation leading
// the next bundle (quiet).
func (r *receiver) passGone(l *inLink) rxWork {
	l.next.Add(1)
	l.valPending = bundle.Unknown
	l.quiet = true
	return rxWork{reset: true}
}

func (r *receiver) onCredit(h wire.Header, payload []byte, addr netip.AddrPort, raw []byte, now int64) {
	c, err := bundle.ParseCredit(payload)
	if err != nil {
		r.ctr.drop(dropBadCredit, 1)
		return
	}
	if h.Flags&wire.FlagAckReq == 0 {
		r.owner.credit(h, c, addr, raw, now)
		return
	}
	// A probe for one of our incoming links: answer with its credit, or,
	// for a link we have not met, with the window a new link gets.
	r.ctr.probes.Add(1)
	if l := r.in[linkKey{h.Src, c.Session}]; l != nil {
		l.setAddr(addr)
		l.onProbe(h.Seq) // moves the link only while nothing of it waits to be processed
		r.creditDue(l)
		return
	}
	var d []byte
	r.slab, d = appendCredit(r.slab, r.tenant, h.Dst, h.Src, h.Seq,
		bundle.Credit{Session: c.Session, Limit: h.Seq + uint32(r.window)})
	r.out.add(transport.Packet{Addr: addr, Data: d}, nil, nil)
}

// creditDue puts l on the list of links owing a credit.
func (r *receiver) creditDue(l *inLink) {
	if !l.creditDue {
		l.creditDue = true
		r.due = append(r.due, l)
	}
}

// credits appends a credit for every link that owes one to the owner's
// batch. The datagrams live in the slab until recycle.
func (r *receiver) credits() {
	for _, l := range r.due {
		l.creditDue = false
		ack, c := l.credit()
		var d []byte
		r.slab, d = appendCredit(r.slab, r.tenant, l.self, l.key.src, ack, c)
		r.out.add(transport.Packet{Addr: l.peer(), Data: d}, nil, nil)
	}
	clear(r.due)
	r.due = r.due[:0]
}

// recycle starts the credit slab over once the owner's batch is sent, or
// in a fresh array when it grew past its usual size.
func (r *receiver) recycle() {
	if cap(r.slab) > 64<<10 {
		r.slab = nil
	} else {
		r.slab = r.slab[:0]
	}
}

// staleGapTimeouts is how many peer timeouts a gap below a bundle held out
// of order may stay open before the receiver gives up on what it holds. A
// live sender resends a hole on every credit that acknowledges a bundle
// above it (at most once per retransmit_timeout/8) and on its
// retransmission timer (at least every 64 retransmit timeouts), and resets
// the link (a new session) once it has heard nothing for peer_timeout,
// which it does soon after its window fills: the receiver grants nothing
// beyond the hole. A gap open for two peer timeouts has outlasted every
// resend (at least three at the smallest peer_timeout allowed, 4
// retransmit timeouts; about 35 at the defaults), with one peer timeout of
// margin for the sender's silence to start: its sender is gone, has reset,
// is hostile (two datagrams, seq 0 and 2, pinned a link for good), or is
// alive but cannot get the hole through, the credits for new bundles it
// sends within its window keeping it on the session (dropGap).
const staleGapTimeouts = 2

// staleGap reports whether l holds bundles above a gap open for longer
// than gapTO.
func (r *receiver) staleGap(l *inLink, now int64) bool {
	return l.held > 0 && now-l.gapSince > r.gapTO
}

// dropGap drops the bundles l holds above a stale gap, counted in
// stale_gap, and marks them gone: they stay acknowledged selectively, and
// the link passes over them once the gap below fills (passGone). A sender
// still on the session freed them on that acknowledgement and never sends
// them again; before, they became a hole it never filled, and the bundles
// behind it waited until it declared its live peer dead. A message in
// progress keeps its state: it may end in the hole. The link can be
// forgotten or evicted like any other.
func (r *receiver) dropGap(l *inLink) {
	r.ctr.drop(dropStaleGap, uint64(l.held))
	for i := range l.ooo {
		if s := &l.ooo[i]; s.used {
			*s = rxSlot{seq: s.seq, gone: true}
			l.gone++
		}
	}
	l.held = 0
}

// settled reports whether l holds nothing: no bundle held early or waiting
// to be processed, no credit owed.
func settled(l *inLink) bool {
	return l.held == 0 && l.next.Load() == l.consumed.Load() && !l.creditDue
}

// forget drops the bundles held above stale gaps, and the incoming links
// that have been silent for 6 peer timeouts and hold nothing.
func (r *receiver) forget(now int64) {
	for k, l := range r.in {
		if r.staleGap(l, now) {
			r.dropGap(l)
		}
		if now-l.lastSeen > 6*r.peerTO && settled(l) {
			delete(r.in, k)
		}
	}
}

// makeRoom is called for a new link when the table is full. It drops the
// bundles held above stale gaps and evicts every link silent for longer
// than peer_timeout that holds nothing, and reports whether that made
// room. Such a link's sender has had everything it sent acknowledged (it
// resends what is not, and each resend refreshes lastSeen) or has reset
// the link, so its state is no longer needed: a sender that comes back
// starts again where its base says (or, met through a resend, after the
// probe that confirms it). Links heard from within peer_timeout are never evicted, however
// many new sessions arrive: a flood of new links (endpoints and sessions
// are not authenticated) cannot push out live ones; it is refused
// (too_many_links). One sweep evicts every evictable link and notes when
// the next one can become evictable at the earliest (always after now),
// and new links are refused without a sweep until then, so a flood costs
// no scan per datagram.
func (r *receiver) makeRoom(now int64) bool {
	if now < r.roomAt {
		return false
	}
	next := int64(1<<63 - 1)
	for k, l := range r.in {
		if r.staleGap(l, now) {
			r.dropGap(l)
		}
		if now-l.lastSeen > r.peerTO && settled(l) {
			delete(r.in, k)
			continue
		}
		at := l.lastSeen + r.peerTO + 1
		if l.held > 0 {
			at = max(at, l.gapSince+r.gapTO+1) // its bundles held go once the gap is stale
		}
		if at <= now {
			// Silent, but bundles wait to be processed or a credit is
			// owed: gone when its owner catches up, a time not known
			// here. Look again later, not on every refused datagram.
			at = now + max(r.peerTO/16, 1)
		}
		next = min(next, at)
	}
	if len(r.in) < r.maxLinks {
		return true
	}
	r.roomAt = next
	return false
}
