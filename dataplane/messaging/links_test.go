package messaging

import (
	"net/netip"
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
)

// TestStaleGapLinks: a peer that sends seq 0 and seq 2 of a session and
// nothing more (a crashed or hostile sender) no longer pins an incoming
// link for good. Once the gap below seq 2 has stayed open for two peer
// timeouts, the bundle held above it is dropped (stale_gap), drain stops
// waiting for it, and a new session (a peer restarting) finds room in a
// full table by evicting links silent for a peer timeout; links heard from
// within it are never evicted. Before, forget kept every link holding a
// bundle out of order: 64 of 64 links stayed, and every new session was
// refused (too_many_links) for good.
func TestStaleGapLinks(t *testing.T) {
	const maxLinks = 64
	cfg := Defaults()
	cfg.Tenant = 7
	peerTO := int64(cfg.PeerTimeout)
	ctr, owner := &counters{}, &rxTestOwner{}
	var out batch
	r := newReceiver(&cfg, maxLinks, ctr, owner, &out)
	addr := netip.MustParseAddrPort("10.0.0.9:4000")
	send := func(src, session, seq uint32, now int64) {
		p := transport.Packet{Addr: addr, Data: fakeBundle(7, src, 1, seq, 0, session, 0, nil)}
		r.handle(&p, now)
		r.credits()
		out.reset()
		r.recycle()
	}

	// 64 fake sessions, each seq 0 then seq 2: the table is full, each
	// link holding one bundle above a gap.
	const t0 = int64(1)
	for s := uint32(1); s <= maxLinks; s++ {
		send(12345, s, 0, t0)
		send(12345, s, 2, t0)
	}
	if len(r.in) != maxLinks || owner.taken != maxLinks || ctr.outOfOrder.Load() != maxLinks {
		t.Fatalf("setup: %d links, %d taken, %d out of order; want %d each", len(r.in), owner.taken, ctr.outOfOrder.Load(), maxLinks)
	}

	// Within a peer timeout the links are live: a new session is refused,
	// nothing is evicted, nothing dropped.
	send(999, 4242, 0, t0+peerTO/2)
	if got := ctr.drops[dropTooManyLinks].Load(); got != 1 || len(r.in) != maxLinks {
		t.Fatalf("new session while every link is live: too_many_links %d, %d links; want 1, %d", got, len(r.in), maxLinks)
	}
	if got := ctr.drops[dropStaleGap].Load(); got != 0 {
		t.Fatalf("stale_gap %d before any gap was stale", got)
	}

	// A draining agent still waits for a gap that is not stale yet.
	w := &worker{recv: r, draining: true, now: t0 + peerTO}
	if w.drained() {
		t.Fatal("drained with gaps open for one peer timeout")
	}

	// Past two peer timeouts the gaps are stale: drain no longer waits,
	// and the held bundles are dropped and counted.
	w.now = t0 + staleGapTimeouts*peerTO + 1
	if !w.drained() {
		t.Fatalf("not drained with only stale gaps left: %s", w.drainState())
	}
	if got := ctr.drops[dropStaleGap].Load(); got != maxLinks {
		t.Fatalf("stale_gap %d, want %d", got, maxLinks)
	}
	var st Stats
	ctr.addTo(&st.Received, &st.Drops)
	if st.Drops.StaleGap != maxLinks || st.Drops.Total() != maxLinks+1 {
		t.Fatalf("Stats: stale_gap %d, total %d; want %d, %d", st.Drops.StaleGap, st.Drops.Total(), maxLinks, maxLinks+1)
	}

	// A new session (a peer restarting) evicts the links silent for a
	// peer timeout instead of being refused: all of them, in one sweep.
	send(999, 4343, 0, w.now)
	if owner.taken != maxLinks+1 || ctr.drops[dropTooManyLinks].Load() != 1 || len(r.in) != 1 {
		t.Fatalf("new session after the stale gaps: taken %d, too_many_links %d, %d links; want %d, 1, 1",
			owner.taken, ctr.drops[dropTooManyLinks].Load(), len(r.in), maxLinks+1)
	}

	// The same with links that hold nothing: the new session waits only
	// until they have been silent for a peer timeout.
	t1 := w.now
	for s := uint32(1); s < maxLinks; s++ {
		send(12345, 1000+s, 0, t1)
	}
	send(999, 4444, 0, t1+peerTO)
	if ctr.drops[dropTooManyLinks].Load() != 2 || len(r.in) != maxLinks {
		t.Fatalf("new session while every link is live: too_many_links %d, %d links; want 2, %d",
			ctr.drops[dropTooManyLinks].Load(), len(r.in), maxLinks)
	}
	send(999, 4444, 0, t1+peerTO+1)
	if ctr.drops[dropTooManyLinks].Load() != 2 || len(r.in) != 1 || owner.taken != 2*maxLinks+1 {
		t.Fatalf("new session after a peer timeout of silence: too_many_links %d, %d links, taken %d; want 2, 1, %d",
			ctr.drops[dropTooManyLinks].Load(), len(r.in), owner.taken, 2*maxLinks+1)
	}
}

// TestStaleGapFilled: a gap that fills before it is stale loses nothing,
// and a gap that moves on (the hole filled, a later one open) counts its
// age from when it moved.
func TestStaleGapFilled(t *testing.T) {
	cfg := Defaults()
	cfg.Tenant = 7
	peerTO := int64(cfg.PeerTimeout)
	gapTO := staleGapTimeouts * peerTO
	ctr, owner := &counters{}, &rxTestOwner{}
	var out batch
	r := newReceiver(&cfg, 0, ctr, owner, &out)
	addr := netip.MustParseAddrPort("10.0.0.9:4000")
	send := func(seq uint32, now int64) {
		p := transport.Packet{Addr: addr, Data: fakeBundle(7, 5, 1, seq, 0, 77, 0, nil)}
		r.handle(&p, now)
		r.credits()
		out.reset()
		r.recycle()
	}
	send(0, 1)
	send(2, 1)
	send(4, 1)
	send(1, gapTO) // seq 1 and 2 taken; the gap at 3 opens now
	r.forget(gapTO + gapTO/2)
	send(3, gapTO+gapTO/2)
	if owner.taken != 5 || ctr.drops[dropStaleGap].Load() != 0 {
		t.Fatalf("taken %d, stale_gap %d; want 5, 0", owner.taken, ctr.drops[dropStaleGap].Load())
	}
}

// TestFullTableRefusesWithoutSweep: a sweep of a full table that makes no
// room notes a time in the future before which new links are refused
// without another sweep, also when the links it keeps have been silent for
// a peer timeout but hold something: bundles above a gap not stale yet
// (kept until the gap is), bundles not processed yet (looked at again a
// sixteenth of a peer timeout later). Before, such a link made the next
// sweep time lastSeen+peerTO+1, already past, so every refused datagram
// swept the whole table again (116 µs each with 4096 links).
func TestFullTableRefusesWithoutSweep(t *testing.T) {
	const maxLinks = 64
	cfg := Defaults()
	cfg.Tenant = 7
	peerTO := int64(cfg.PeerTimeout)
	gapTO := staleGapTimeouts * peerTO
	ctr, owner := &counters{}, &rxTestOwner{}
	var out batch
	r := newReceiver(&cfg, maxLinks, ctr, owner, &out)
	addr := netip.MustParseAddrPort("10.0.0.9:4000")
	send := func(src, session, seq uint32, now int64) {
		p := transport.Packet{Addr: addr, Data: fakeBundle(7, src, 1, seq, 0, session, 0, nil)}
		r.handle(&p, now)
		r.credits()
		out.reset()
		r.recycle()
	}

	// TestStaleGapLinks' table: 64 links, each holding seq 2 above a gap.
	const t0 = int64(1)
	for s := uint32(1); s <= maxLinks; s++ {
		send(12345, s, 0, t0)
		send(12345, s, 2, t0)
	}
	// Silent for a peer timeout, the gaps not stale: refused, and the
	// next sweep waits until the gaps are.
	now := t0 + peerTO + 2
	send(999, 4242, 0, now)
	if got := ctr.drops[dropTooManyLinks].Load(); got != 1 || len(r.in) != maxLinks {
		t.Fatalf("new session with the gaps young: too_many_links %d, %d links; want 1, %d", got, len(r.in), maxLinks)
	}
	if r.roomAt <= now || r.roomAt > t0+gapTO+1 {
		t.Fatalf("next sweep at now%+d, want after now and by the gaps' going stale (now%+d)", r.roomAt-now, t0+gapTO+1-now)
	}
	send(999, 4243, 0, now+1)
	if got := ctr.drops[dropTooManyLinks].Load(); got != 2 || len(r.in) != maxLinks || ctr.drops[dropStaleGap].Load() != 0 {
		t.Fatalf("second new session: too_many_links %d, %d links, stale_gap %d; want 2, %d, 0",
			got, len(r.in), ctr.drops[dropStaleGap].Load(), maxLinks)
	}
	// Once the gaps are stale the table makes room.
	send(999, 4244, 0, r.roomAt)
	if ctr.drops[dropTooManyLinks].Load() != 2 || len(r.in) != 1 || ctr.drops[dropStaleGap].Load() != maxLinks {
		t.Fatalf("new session once the gaps are stale: too_many_links %d, %d links, stale_gap %d; want 2, 1, %d",
			ctr.drops[dropTooManyLinks].Load(), len(r.in), ctr.drops[dropStaleGap].Load(), maxLinks)
	}

	// Links silent for a peer timeout whose bundles wait to be processed:
	// refused, and swept again a while later, not at once.
	t1 := r.roomAt
	for s := uint32(1); s < maxLinks; s++ {
		send(12345, 1000+s, 0, t1)
	}
	for _, l := range r.in {
		l.consumed.Add(^uint32(0)) // not processed yet
	}
	now = t1 + peerTO + 2
	send(999, 4545, 0, now)
	if got := ctr.drops[dropTooManyLinks].Load(); got != 3 || len(r.in) != maxLinks {
		t.Fatalf("new session with bundles unprocessed: too_many_links %d, %d links; want 3, %d", got, len(r.in), maxLinks)
	}
	if r.roomAt <= now {
		t.Fatalf("next sweep at now%+d with bundles unprocessed, want after now", r.roomAt-now)
	}
	for _, l := range r.in {
		l.consumed.Store(l.next.Load())
	}
	send(999, 4545, 0, r.roomAt)
	if ctr.drops[dropTooManyLinks].Load() != 3 || len(r.in) != 1 {
		t.Fatalf("new session once the bundles are processed: too_many_links %d, %d links; want 3, 1",
			ctr.drops[dropTooManyLinks].Load(), len(r.in))
	}
}
