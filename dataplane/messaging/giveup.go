package messaging

import (
	"encoding/binary"
	"slices"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging/bundle"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// A reset gives up the session's bundles. Those in flight may have reached
// the receiver without the credits saying so reaching the sender (the
// silence that made it give up): taken, or, above the oldest, held above a
// gap, which the receiver counts itself (stale_gap) when it drops them.
// Counting them all in dead_peer at the reset counted the held ones on both
// ends and the taken ones as lost. So the sender counts at once only what
// cannot have reached the receiver, and asks the receiver about the rest,
// the oldest bundle in flight included, with probes of the old session: the
// credit that answers says what it took (below the acknowledgement) and
// what it holds or dropped (selectively acknowledged). The client learns of
// the dead peer at the reset all the same; only the count waits.

// gaveUpTimeouts is how many peer timeouts a sender asks about a session
// it gave up before it counts all that is left of it as lost: the receiver
// forgets a link silent for 6 peer timeouts, and a forgotten session's
// answer says nothing was taken.
const gaveUpTimeouts = 6

// gaveUp is a session a reset gave up, with the messages whose fate the
// receiver's answer decides.
type gaveUp struct {
	session uint32
	base    uint32 // the session's base, which its probes carry
	spans   []lostSpan
	at      int64 // when it was given up
	lastAsk int64 // at until the first probe, before which no credit is an answer
	buf     []byte
}

// lostSpan is n messages of a given-up session with parts in bundles lo to
// hi (seqs, inclusive), none of them freed on a selective acknowledgement;
// never says a part of them was never sent.
type lostSpan struct {
	lo, hi uint32
	n      uint64
	never  bool
}

// lost reports whether the span's messages are lost by the receiver's
// answer (ack, sack): not when a part of them is acknowledged selectively
// (held above a gap, or dropped there and counted in stale_gap: a message
// with a part in such a bundle is the receiver's to count), nor when every
// part is below ack (taken).
func (sp lostSpan) lost(ack uint32, sack uint64) bool {
	for q := sp.lo; ; q++ {
		if d := seqDiff(q, ack); d > 0 && d <= 64 && sack&(1<<(d-1)) != 0 {
			return false
		}
		if q == sp.hi {
			break
		}
	}
	return sp.never || seqDiff(sp.hi, ack) >= 0
}

// count returns the messages of g lost by the receiver's answer (ack,
// sack), or all of them without one (answered false).
func (g *gaveUp) count(answered bool, ack uint32, sack uint64) uint64 {
	var n uint64
	for _, sp := range g.spans {
		if !answered || sp.lost(ack, sack) {
			n += sp.n
		}
	}
	return n
}

// part is a bundle of a session being given up, from its base on.
type part struct {
	seq        uint32
	kind       partKind
	msgs       int  // messages that begin in it
	more, lead bool // its last message goes on in the next; it begins with a continuation
}

type partKind uint8

const (
	partBase   partKind = iota // the oldest in flight: the receiver took it or never had it (never held above a gap)
	partFlight                 // in flight above the base: the receiver may have taken or hold it
	partHeld                   // freed on a selective acknowledgement: the receiver holds it, or counted it dropped
	partUnsent                 // never sent
)

func bufPart(b *txBuf, seq uint32, k partKind) part {
	lead := len(b.b) >= bundle.Overhead+bundle.RecordHeaderLen &&
		binary.BigEndian.Uint32(b.b[bundle.Overhead+4:]) == bundle.ContinuationRank
	return part{seq: seq, kind: k, msgs: b.msgs, more: b.more, lead: lead}
}

// spanAcc gathers the parts of messages that a reset gives up.
type spanAcc struct {
	sp     lostSpan
	seqs   bool // sp.lo and sp.hi are set
	flight bool // a part in flight above the base: the receiver's answer decides
	base   bool // a part in the oldest bundle in flight: the answer's ack decides, unless never
	held   bool // a part the receiver holds or counted: its to count
}

func (a *spanAcc) add(p part) {
	switch p.kind {
	case partUnsent:
		a.sp.never = true
		return
	case partBase:
		a.base = true
	case partFlight:
		a.flight = true
	case partHeld:
		a.held = true
	}
	if !a.seqs {
		a.sp.lo, a.seqs = p.seq, true
	}
	a.sp.hi = p.seq
}

// giveUp sorts the messages the link holds as its session is given up at
// now (before reset frees its buffers). It returns how many are lost for
// certain, counted at once, and the session to ask the receiver about, or
// nil. The receiver's messages (a part freed on a selective
// acknowledgement) are counted by neither.
func (l *outLink) giveUp(now int64) (uint64, *gaveUp) {
	var parts []part
	for q := l.base; q != l.nextSeq; q++ {
		switch b := l.inflight[q&l.mask]; {
		case b == nil || b.seq != q:
			parts = append(parts, part{seq: q, kind: partHeld})
		case q == l.base:
			parts = append(parts, bufPart(b, q, partBase))
		default:
			parts = append(parts, bufPart(b, q, partFlight))
		}
	}
	for _, b := range l.ready[l.rhead:] {
		parts = append(parts, bufPart(b, 0, partUnsent))
	}
	if l.cur != nil && len(l.cur.b) > bundle.Overhead {
		parts = append(parts, bufPart(l.cur, 0, partUnsent))
	}

	var certain uint64
	g := &gaveUp{session: l.session, base: l.base, at: now, lastAsk: now}
	finish := func(a *spanAcc) {
		switch {
		case a.held:
		case a.flight, a.base && !a.sp.never:
			// A message in the oldest bundle alone is taken if the
			// answer's ack is past it; one whose rest was never sent is
			// lost whatever the answer (no part of it can be held).
			g.spans = append(g.spans, a.sp)
		default:
			certain += a.sp.n
		}
	}
	var open *spanAcc // the message that goes on in the next part
	afterHeld := false
	for _, p := range parts {
		if p.kind == partHeld {
			if open != nil {
				open.add(p)
			}
			afterHeld = true
			continue
		}
		if p.lead {
			if open == nil {
				// Begun in a bundle freed on a selective acknowledgement
				// (the receiver's), or in one acknowledged (taken).
				open = &spanAcc{sp: lostSpan{n: 1}, held: afterHeld}
			}
			open.add(p)
			if p.msgs == 0 && p.more {
				afterHeld = false
				continue // it goes on
			}
			finish(open)
			open = nil
		} else if open != nil {
			finish(open) // it ended in a bundle freed on a selective acknowledgement
			open = nil
		}
		afterHeld = false
		whole := p.msgs
		if p.more && whole > 0 {
			whole-- // the one that goes on
		}
		if whole > 0 {
			a := spanAcc{sp: lostSpan{n: uint64(whole)}}
			a.add(p)
			finish(&a)
		}
		if p.more && p.msgs > 0 {
			open = &spanAcc{sp: lostSpan{n: 1}}
			open.add(p)
		}
	}
	switch {
	case open != nil:
		open.sp.never = true // its rest was never written
		finish(open)
	case l.fragOwner != nil && l.fragHead == nil && len(parts) == 0:
		certain++ // its head was acknowledged and nothing of it is left
	}
	if len(g.spans) == 0 {
		return certain, nil
	}
	return certain, g
}

// askGaveUp asks the receiver about each session given up, at the pace of
// the probes to a dead peer, and counts all that is left of one not
// answered for gaveUpTimeouts peer timeouts as lost.
func (l *outLink) askGaveUp(now, rto, peerTO int64, out *batch) {
	keep := l.gaveUp[:0]
	for _, g := range l.gaveUp {
		if now-g.at >= gaveUpTimeouts*peerTO {
			l.ctr.drop(dropDeadPeer, g.count(false, 0, 0))
			continue
		}
		if now-g.lastAsk >= max(rto, peerTO/8) {
			h := l.hdr
			h.Type, h.Flags, h.Seq = wire.TypeCredit, wire.FlagAckReq, g.base
			var p [bundle.CreditLen]byte
			g.buf = h.AppendTo(g.buf[:0], bundle.Credit{Session: g.session}.AppendTo(p[:0]))
			g.lastAsk = now
			out.add(transport.Packet{Addr: l.addr, Data: g.buf}, &l.st, nil) // a probe, counted once taken
		}
		keep = append(keep, g)
	}
	clear(l.gaveUp[len(keep):])
	l.gaveUp = keep
}

// answered applies a credit of another session than the link's: the
// receiver's answer to a probe of a session given up, after which the
// messages it neither took nor holds are counted in dead_peer. It reports
// whether it was one; a credit of a given-up session that comes before the
// first probe was sent before the reset and is no answer (stale).
func (l *outLink) answered(ack uint32, c bundle.Credit) bool {
	for i, g := range l.gaveUp {
		if g.session != c.Session {
			continue
		}
		if g.lastAsk == g.at {
			return false
		}
		l.ctr.drop(dropDeadPeer, g.count(true, ack, c.SACK))
		l.gaveUp = slices.Delete(l.gaveUp, i, i+1)
		return true
	}
	return false
}

// dropGaveUp counts all that is left of the sessions given up as lost, for
// an owner that stops asking (a client closing, an agent worker stopping).
func (l *outLink) dropGaveUp() {
	for _, g := range l.gaveUp {
		l.ctr.drop(dropDeadPeer, g.count(false, 0, 0))
	}
	clear(l.gaveUp)
	l.gaveUp = l.gaveUp[:0]
}
