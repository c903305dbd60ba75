package messaging

import (
	"fmt"
	"strings"
)

// flushAll closes every buffer being filled: a draining worker does not
// wait for flush timeouts.
func (w *worker) flushAll() {
	for _, l := range w.links {
		l.close(flushExplicit, w.now, &w.out)
	}
}

// drained reports whether a draining worker is done: nothing waits to be
// routed or completed, and every bundle it sent was acknowledged (or its
// peer is dead, which drops what it held). Bundles held above a stale gap
// (receiver.staleGap) wait for nothing that will come: they are dropped,
// not waited for, and so is the rest of a message in progress below them.
func (w *worker) drained() bool {
	if len(w.blocked) > 0 || len(w.mailbox) > 0 {
		return false
	}
	for _, l := range w.recv.in {
		if w.recv.staleGap(l, w.now) {
			w.recv.dropGap(l)
		}
		if drainWaits(l) {
			return false
		}
	}
	for _, l := range w.links {
		if l.busy() && !l.dead {
			return false
		}
	}
	return true
}

// drainState says what a draining worker still waits for.
func (w *worker) drainState() string {
	var parts []string
	if len(w.blocked) > 0 {
		parts = append(parts, fmt.Sprintf("%d links on the blocklist", len(w.blocked)))
	}
	for k, l := range w.recv.in {
		if drainWaits(l) {
			parts = append(parts, fmt.Sprintf("from %v/%x: %d bundles to route, %d held out of order, message in progress %v, fragment pending %v",
				Endpoint(k.src), k.session, len(l.work), l.held, l.cur.active, l.unfinished()))
		}
	}
	for _, l := range w.links {
		if l.busy() && !l.dead {
			parts = append(parts, fmt.Sprintf("to %s: %d unacknowledged, %d waiting for credit (limit %d, next %d)",
				l.name, l.nextSeq-l.base, l.waiting(), l.limit, l.nextSeq))
		}
	}
	return strings.Join(parts, "; ")
}

// drainWaits reports whether a draining worker waits for l: bundles to
// route, bundles held above a gap, or the rest of a fragmented message,
// unless a gap below went stale (gone: it waits for nothing sure to come).
func drainWaits(l *inLink) bool {
	return len(l.work) > 0 || l.held > 0 || l.cur.active || l.unfinished() && l.gone == 0
}

// drainTakes reports whether a draining worker takes bundle seq of l: only
// when it completes something already acknowledged, so that the agent's
// next run never starts a link in the middle of a message.
func (w *worker) drainTakes(l *inLink, seq uint32) bool {
	if seq == l.next.Load() && l.unfinished() {
		return true // the rest of a fragmented message
	}
	for i := range l.ooo {
		if s := &l.ooo[i]; (s.used || s.gone) && seqDiff(s.seq, seq) > 0 {
			return true // a gap below a bundle held out of order, or acknowledged and dropped
		}
	}
	return false
}

// shutdown sends what the buffers hold as far as the windows allow.
func (w *worker) shutdown() {
	w.now = w.clock()
	for _, l := range w.links {
		l.close(flushExplicit, w.now, &w.out)
		l.dropGaveUp() // no one asks any more
	}
	w.finish()
}
