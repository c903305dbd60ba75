package messaging

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging/bundle"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// msgOwner is an rxOwner that processes each bundle as an agent or a
// client does (whole messages, reassembled), counting each message by its
// payload.
type msgOwner struct {
	rxTestOwner
	got   map[string]int
	order []string
	ctr   *counters
}

func (o *msgOwner) inOrder(l *inLink, item rxWork, _ *transport.Packet) {
	for {
		m, ok := l.nextMessage(&item, 1<<20, o.ctr)
		if !ok {
			break
		}
		o.got[string(m.data)]++
		o.order = append(o.order, string(m.data))
	}
	l.consumed.Add(1)
}

// linkSim drives an outLink and a receiver back to back, as TestWindowWrap
// does, on a time the test steps by hand, with a rule that loses datagrams
// either way: the sender's bundles and probes (toRecv), the receiver's
// credits (not toRecv). Each write closes its bundle: a message short
// enough is one bundle, "message N" for the Nth written. The receiver
// sweeps its links (forget) every gcEvery, as an agent worker does.
type linkSim struct {
	t           *testing.T
	cfg         Config
	rto, peerTO int64
	out         *outLink
	r           *receiver
	owner       *msgOwner
	sctr, rctr  *counters
	pkts, creds batch
	now, nextGC int64
	written     int
	sent        []string // the payloads written, in order
	lose        func(now int64, toRecv bool, h wire.Header) bool
}

func newLinkSim(t *testing.T, window int, rto, peerTO int64) *linkSim {
	t.Helper()
	cfg := Defaults()
	cfg.Tenant, cfg.BuffersPerDest = 7, window
	cfg.RetransmitTimeout, cfg.PeerTimeout = Duration(rto), Duration(peerTO)
	s := &linkSim{t: t, cfg: cfg, rto: rto, peerTO: peerTO, sctr: &counters{}, rctr: &counters{}, now: 1}
	s.owner = &msgOwner{got: map[string]int{}, ctr: s.rctr}
	s.out = newOutLink("peer", netip.MustParseAddrPort("127.0.0.1:9"), 7, AgentEndpoint(0, 0), AgentEndpoint(1, 0), 256, window, s.sctr)
	s.r = newReceiver(&cfg, 0, s.rctr, s.owner, &s.creds)
	s.nextGC = s.now + gcEvery
	return s
}

// write writes n messages, one bundle each, and carries what they send.
func (s *linkSim) write(n int) { s.writeSized(n, 0) }

// writeSized writes n messages of size bytes (at least their name's), each
// closing its last bundle, and carries what they send.
func (s *linkSim) writeSized(n, size int) {
	s.t.Helper()
	for range n {
		m := fmt.Sprintf("message %d", s.written)
		m += strings.Repeat(".", max(size-len(m), 0))
		var p progress
		if s.out.write(1, []byte(m), &p, s.now, &s.pkts, func(*outLink) {}) != writeDone {
			s.t.Fatalf("message %d: not written whole", s.written)
		}
		s.out.close(flushExplicit, s.now, &s.pkts)
		s.written++
		s.sent = append(s.sent, m)
		s.exchange()
	}
}

// exchange carries datagrams both ways, through the loss rule, until
// nothing moves.
func (s *linkSim) exchange() {
	s.t.Helper()
	for s.pkts.len() > 0 {
		for i, d := range s.pkts.pkts {
			s.pkts.of[i].taken(len(d.Data))
			h, _, err := wire.Decode(d.Data)
			if err != nil {
				s.t.Fatal(err)
			}
			if s.lose == nil || !s.lose(s.now, true, h) {
				s.r.handle(&d, s.now)
			}
		}
		s.pkts.reset()
		s.out.settle()
		s.r.credits()
		for _, d := range s.creds.pkts {
			h, payload, err := wire.Decode(d.Data)
			if err != nil {
				s.t.Fatal(err)
			}
			if s.lose != nil && s.lose(s.now, false, h) {
				continue
			}
			c, err := bundle.ParseCredit(payload)
			if err != nil {
				s.t.Fatal(err)
			}
			if !s.out.onCredit(h.Seq, c, s.now, s.rto, &s.pkts) {
				s.sctr.drop(dropStaleCredit, 1)
			}
		}
		s.creds.reset()
		s.r.recycle()
	}
	s.out.settle()
}

// restartReceiver replaces the receiver with a new life that knows no link
// and counts afresh, and returns the old life's counters.
func (s *linkSim) restartReceiver() *counters {
	old := s.rctr
	s.rctr = &counters{}
	s.owner = &msgOwner{got: s.owner.got, ctr: s.rctr}
	s.r = newReceiver(&s.cfg, 0, s.rctr, s.owner, &s.creds)
	return old
}

// run steps the time by rto/4 up to end, running the sender's timers and
// the receiver's sweep, and calls each (if not nil) after every step.
func (s *linkSim) run(end int64, each func()) {
	for s.now+s.rto/4 <= end {
		s.now += s.rto / 4
		if s.now >= s.nextGC {
			s.nextGC = s.now + gcEvery
			s.r.forget(s.now)
		}
		s.out.maintain(s.now, s.rto, s.peerTO, &s.pkts)
		s.exchange()
		if each != nil {
			each()
		}
	}
}

// taken returns the messages taken once, and those taken more often.
func (s *linkSim) taken() (once int, more []int) {
	for i, m := range s.sent {
		switch s.owner.got[m] {
		case 0:
		case 1:
			once++
		default:
			more = append(more, i)
		}
	}
	return once, more
}

// waiting returns what the receiver holds out of order, and how many
// bundles the sender has sent that are not acknowledged.
func (s *linkSim) waiting() (held, unacked int) {
	for _, l := range s.r.in {
		held += l.held
	}
	return held, int(s.out.nextSeq - s.out.base)
}

func (s *linkSim) String() string {
	once, _ := s.taken()
	held, unacked := s.waiting()
	return fmt.Sprintf("at %.2f peer timeouts: %d written, %d taken, %d held, %d unacknowledged, dead_peer %d, stale_gap %d, resets %d",
		float64(s.now)/float64(s.peerTO), s.written, once, held, unacked,
		s.sctr.drops[dropDeadPeer].Load(), s.rctr.drops[dropStaleGap].Load(), s.out.st.resets.Load())
}

// TestStaleGapSenderAlive: a live sender whose every send of one bundle
// (seq 3) is lost for longer than two peer timeouts, while its other
// bundles and the receiver's credits pass, keeps its session: each new
// bundle it sends within the window is held above the gap and
// acknowledged selectively, and the sender, hearing those credits, neither
// declares the receiver dead nor sends the held bundles again. The gap
// goes stale and the receiver drops what it holds (stale_gap). Once seq 3
// gets through, the link goes on at once: the receiver moves past the
// bundles it dropped, takes what it held above them, and nothing waits.
// Before, the dropped bundles were a hole the sender never filled (it had
// freed them on their selective acknowledgement): the bundles behind it
// were neither taken nor dropped until the sender, its window full and
// nothing answered, declared its live peer dead a peer timeout later
// (window 8: one bundle held from 3.2 to 4.2 peer timeouts, then a reset,
// then dropped too; window 64: 23 bundles).
func TestStaleGapSenderAlive(t *testing.T) {
	for _, tc := range []struct {
		name     string
		window   int
		every    int64 // a new message every this many peer timeouts/100
		lostTill int64 // seq 3 is lost until this many peer timeouts/100
	}{
		{"window8", 8, 40, 320},
		{"window4", 4, 90, 250},
		{"window64", 64, 8, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const rto, peerTO = int64(10 * time.Millisecond), int64(10 * time.Second)
			s := newLinkSim(t, tc.window, rto, peerTO)
			lostTill := tc.lostTill * peerTO / 100
			s.lose = func(now int64, toRecv bool, h wire.Header) bool {
				return toRecv && h.Type == wire.TypeBundle && h.Seq == 3 && now < lostTill
			}
			s.write(4)
			// Within the window, one message every so often: the credits
			// for them keep the sender from declaring its peer dead.
			next := s.now
			s.run(lostTill, func() {
				if s.now >= next && s.out.nextSeq-s.out.base < s.out.window {
					s.write(1)
					next = s.now + tc.every*peerTO/100
				}
			})
			if s.rctr.drops[dropStaleGap].Load() == 0 || s.out.st.resets.Load() != 0 {
				t.Fatalf("setup: %v; want bundles dropped at a stale gap, the sender still on its session", s)
			}
			// Seq 3 gets through on its next retransmission (at most 64
			// retransmit timeouts away): then nothing may wait.
			s.run(s.now+100*rto, nil)
			if held, unacked := s.waiting(); held != 0 || unacked != 0 {
				t.Errorf("%d retransmit timeouts after seq 3 got through: %v; want nothing held or unacknowledged", 100, s)
			}
			s.write(1)
			s.run(s.now+peerTO+peerTO/2, nil)
			once, more := s.taken()
			stale := s.rctr.drops[dropStaleGap].Load()
			if len(more) > 0 || uint64(once)+stale != uint64(s.written) {
				t.Errorf("%v: %d taken once + %d in stale_gap, want %d (messages taken more than once: %v)", s, once, stale, s.written, more)
			}
			if s.out.st.resets.Load() != 0 || s.sctr.drops[dropDeadPeer].Load() != 0 {
				t.Errorf("%v; want no reset, no dead_peer: the peer answered throughout", s)
			}
			t.Log(s)
		})
	}
}

// TestStaleGapPassGone: what a receiver does with the bundles it dropped
// above a stale gap (gone) when the gap's hole turns up after all, sent by
// a sender still on the session. Bundles: 0 A; 1 the head of B; 2 (the
// hole) the rest of B and C; 3 the head of D; 4 more of D; 5 the rest of D
// and E. 1, 3 and 4 arrive; the gap below 3 goes stale, 3 and 4 are dropped
// (stale_gap 2) but stay acknowledged selectively, and the sender, which
// freed them on that acknowledgement, resends only 2. A resend of 3 is a
// duplicate. 5 arrives and is held; then 2: B ends there and is taken, the
// link passes over 3 and 4, and takes 5, whose leading piece of D (counted
// with 3 and 4) is dropped without counting an orphan, and E. Before, 5
// stayed held behind 3 and 4 for good, and B's rest was an orphan (B lost
// and counted in orphans).
func TestStaleGapPassGone(t *testing.T) {
	cfg := Defaults()
	cfg.Tenant = 7
	gapTO := staleGapTimeouts * int64(cfg.PeerTimeout)
	ctr := &counters{}
	owner := &msgOwner{got: map[string]int{}, ctr: ctr}
	var out batch
	r := newReceiver(&cfg, 0, ctr, owner, &out)
	addr := netip.MustParseAddrPort("10.0.0.9:4000")
	var lastAck uint32
	var lastSACK uint64
	send := func(seq uint32, flags wire.Flags, records []byte, now int64) {
		p := transport.Packet{Addr: addr, Data: fakeBundle(7, 5, 1, seq, flags, 77, 0, records)}
		r.handle(&p, now)
		r.credits()
		for _, d := range out.pkts {
			h, payload, _ := wire.Decode(d.Data)
			c, err := bundle.ParseCredit(payload)
			if err != nil {
				t.Fatal(err)
			}
			lastAck, lastSACK = h.Seq, c.SACK
		}
		out.reset()
		r.recycle()
	}
	bundles := [][]byte{
		bundle.AppendRecord(nil, 1, []byte("A")),
		bundle.AppendHead(nil, 1, 6, []byte("BB")),
		bundle.AppendRecord(bundle.AppendContinuation(nil, []byte("BBBB")), 1, []byte("C")),
		bundle.AppendHead(nil, 1, 6, []byte("DD")),
		bundle.AppendContinuation(nil, []byte("DD")),
		bundle.AppendRecord(bundle.AppendContinuation(nil, []byte("DD")), 1, []byte("E")),
	}
	more := []wire.Flags{0, wire.FlagMore, 0, wire.FlagMore, wire.FlagMore, 0}
	for _, seq := range []uint32{0, 1, 3, 4} {
		send(seq, more[seq], bundles[seq], 1)
	}
	r.forget(1 + gapTO + 1)
	if got := ctr.drops[dropStaleGap].Load(); got != 2 {
		t.Fatalf("stale_gap %d after the gap went stale, want 2", got)
	}
	send(3, more[3]|wire.FlagRetransmit, bundles[3], 2+gapTO)
	if lastAck != 2 || lastSACK != 0b11 || ctr.duplicates.Load() != 1 {
		t.Errorf("credit after a resend of a dropped bundle: ack %d, SACK %b, %d duplicates; want 2, 11 (3 and 4 stay acknowledged), 1",
			lastAck, lastSACK, ctr.duplicates.Load())
	}
	send(5, more[5], bundles[5], 3+gapTO)
	send(2, more[2]|wire.FlagRetransmit, bundles[2], 4+gapTO)
	if want := []string{"A", "BBBBBB", "C", "E"}; !slices.Equal(owner.order, want) || lastAck != 6 || lastSACK != 0 {
		t.Errorf("taken %q, ack %d, SACK %b; want %q, 6, 0", owner.order, lastAck, lastSACK, want)
	}
	if o, s := ctr.drops[dropOrphans].Load(), ctr.drops[dropStaleGap].Load(); o != 0 || s != 2 {
		t.Errorf("orphans %d, stale_gap %d; want 0 (D is counted with the bundles dropped), 2", o, s)
	}
	for _, l := range r.in {
		if !settled(l) || l.gone != 0 {
			t.Errorf("link not settled: held %d, gone %d, next %d, consumed %d", l.held, l.gone, l.next.Load(), l.consumed.Load())
		}
	}
}

// TestLossCountedOnce: a sender that hears nothing from its peer for
// peer_timeout gives up the session (a reset) while the receiver may hold
// bundles of it above a gap, which it drops and counts itself (stale_gap)
// two peer timeouts after the gap opened, or may have taken bundles whose
// credits were lost. Each bundle the sender had in flight is counted by
// one end only. The sender counts at once what never left; for the bundles
// in flight, the oldest included, it asks the receiver with a probe of the
// old session once the peer answers, and counts in dead_peer only the
// messages the receiver neither took nor holds (or dropped). Here one
// message goes through (seq 0, its credit heard), then a window's worth
// (seqs 1 to 8, or 1 alone) goes out, one bundle of it (the hole) is lost,
// and a partition (everything lost both ways, the credits of those sends
// too unless the row says they were heard) follows; it heals at 3 peer
// timeouts, after the gap went stale, unless the row says otherwise. What
// a receiver's earlier life took is counted though taken ("receiver
// restarted"). A partition that outlasts the sender's questions
// (gaveUpTimeouts) leaves it counting everything, as before ("healed too
// late").
// Before, the sender counted everything it had in flight: every bundle the
// receiver held was counted on both ends (window 8, one message a bundle,
// the hole first: dead_peer 8 and stale_gap 7 for 8 messages lost), and so
// was every bundle it took. Then it still counted its oldest bundle in
// flight at once, taken or not: taken, its credits lost, it was counted
// though taken ("oldest taken, credits lost", "all taken, credits lost":
// dead_peer 1 for nothing lost; "taken and held, credits lost": 2 for 1).
func TestLossCountedOnce(t *testing.T) {
	for _, tc := range []struct {
		name        string
		size, n     int    // n messages of size bytes: 300 takes two bundles
		hole        uint32 // every send of this seq is lost until the partition heals (0: none; seq 0 goes before it)
		creditsLost bool   // the credits of the first sends are lost too
		restart     bool   // the receiver restarts during the partition
		heal        int64  // the partition heals after this many peer timeouts/100 (0: 300)
		taken       int    // of the n messages
		dead, stale uint64
	}{
		{"held, credits lost", 0, 8, 1, true, false, 0, 0, 1, 7},
		{"taken and held, credits lost", 0, 8, 4, true, false, 0, 3, 1, 4},
		{"oldest taken, credits lost", 0, 1, 0, true, false, 0, 1, 0, 0},
		{"oldest lost", 0, 1, 1, true, false, 0, 0, 1, 0},
		{"all taken, credits lost", 0, 8, 0, true, false, 0, 8, 0, 0},
		{"fragmented across the gap", 300, 4, 1, true, false, 0, 0, 0, 7},
		{"healed before the gap went stale", 0, 8, 1, true, false, 150, 0, 1, 7},
		{"held, credits heard", 0, 8, 1, false, false, 0, 0, 1, 7},
		{"receiver restarted", 0, 8, 4, true, true, 0, 3, 8, 0},
		{"healed too late", 0, 8, 1, true, false, 800, 0, 8, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const rto, peerTO = int64(10 * time.Millisecond), int64(10 * time.Second)
			const start = 2
			heal := 3 * peerTO
			if tc.heal > 0 {
				heal = tc.heal * peerTO / 100
			}
			s := newLinkSim(t, 8, rto, peerTO)
			s.lose = func(now int64, toRecv bool, h wire.Header) bool {
				switch {
				case now < start || now >= heal:
					return false
				case toRecv && h.Type == wire.TypeBundle && h.Seq == tc.hole, now > start:
					return true
				}
				return !toRecv && tc.creditsLost
			}
			s.write(1)
			s.now = start
			s.writeSized(tc.n, tc.size)
			var old *counters
			s.run(heal, func() {
				if tc.restart && old == nil && s.now >= 3*peerTO/2 {
					old = s.restartReceiver()
				}
			})
			if s.out.st.resets.Load() != 1 {
				t.Fatalf("setup: %v; want the session given up once", s)
			}
			s.run(max(heal, 3*peerTO)+peerTO, nil)
			once, more := s.taken()
			once-- // the first message
			stale := s.rctr.drops[dropStaleGap].Load()
			if old != nil {
				stale += old.drops[dropStaleGap].Load()
			}
			if dead := s.sctr.drops[dropDeadPeer].Load(); once != tc.taken || len(more) > 0 || dead != tc.dead || stale != tc.stale {
				t.Errorf("%v (stale_gap %d over the receiver's lives): taken %d, taken again %v, dead_peer %d, stale_gap %d; want %d, none, %d, %d",
					s, stale, once, more, dead, stale, tc.taken, tc.dead, tc.stale)
			}
			// The link goes on in its new session.
			s.write(2)
			s.run(s.now+peerTO/10, nil)
			if now, _ := s.taken(); now != 1+once+2 {
				t.Errorf("%v: %d of the 2 messages after the partition taken", s, now-1-once)
			}
		})
	}
}

// TestGiveUpSorts: what a reset counts at once and what it asks the
// receiver about, message by message, over 256-byte bundles (a 300-byte
// message takes two): a message that touches a bundle freed on a selective
// acknowledgement is the receiver's, one with a part in flight (the oldest
// bundle included) waits for the answer, unless its rest was never sent and
// no part of it can be held above a gap; the rest is counted at once.
// Before, a message in the oldest bundle in flight alone was counted at
// once, and so as lost when the answer's ack said it was taken ("whole
// messages in flight", "the rest of a message taken before").
func TestGiveUpSorts(t *testing.T) {
	for _, tc := range []struct {
		name      string
		window    int
		sizes     []int // messages written, each closing its last bundle
		ack       uint32
		sack      uint64 // the credit before the reset (ack 0 and sack 0: none)
		certain   uint64
		spans     []lostSpan
		ansAck    uint32 // an answer: ansAck, ansSACK
		ansSACK   uint64
		ansCounts uint64
	}{
		{name: "whole messages in flight", window: 8, sizes: []int{10, 10, 10},
			spans:  []lostSpan{{0, 0, 1, false}, {1, 1, 1, false}, {2, 2, 1, false}},
			ansAck: 2, ansCounts: 1},
		{name: "the rest of a message taken before", window: 8, sizes: []int{300}, ack: 1,
			spans:  []lostSpan{{1, 1, 1, false}},
			ansAck: 2, ansCounts: 0},
		{name: "the rest of a message taken before, not taken", window: 8, sizes: []int{300}, ack: 1,
			spans:  []lostSpan{{1, 1, 1, false}},
			ansAck: 1, ansCounts: 1},
		{name: "a message from the oldest bundle on", window: 8, sizes: []int{300},
			spans:  []lostSpan{{0, 1, 1, false}},
			ansAck: 1, ansCounts: 1},
		{name: "a message across a bundle the receiver holds", window: 8, sizes: []int{100, 300, 100}, sack: 0b1,
			spans:  []lostSpan{{0, 0, 1, false}, {3, 3, 1, false}},
			ansAck: 0, ansSACK: 0b111, ansCounts: 1},
		{name: "a message whose rest was never sent", window: 2, sizes: []int{1000},
			spans:  []lostSpan{{0, 1, 1, true}},
			ansAck: 2, ansCounts: 1},
		{name: "the oldest bundle alone, the rest never sent", window: 1, sizes: []int{1000},
			certain: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const rto = int64(time.Millisecond)
			ctr := &counters{}
			out := newOutLink("peer", netip.MustParseAddrPort("127.0.0.1:9"), 7, AgentEndpoint(0, 0), AgentEndpoint(1, 0), 256, tc.window, ctr)
			var pkts batch
			for _, n := range tc.sizes {
				var p progress
				if out.write(1, make([]byte, n), &p, 1, &pkts, func(*outLink) {}) == writeDone {
					out.close(flushExplicit, 1, &pkts)
				}
			}
			if tc.ack != 0 || tc.sack != 0 {
				out.onCredit(tc.ack, bundle.Credit{Session: out.session, Limit: tc.ack + uint32(tc.window), SACK: tc.sack}, 2, rto, &pkts)
			}
			out.settle()
			out.reset(3)
			if got := ctr.drops[dropDeadPeer].Load(); got != tc.certain {
				t.Errorf("dead_peer %d at the reset, want %d", got, tc.certain)
			}
			var spans []lostSpan
			for _, g := range out.gaveUp {
				spans = append(spans, g.spans...)
			}
			if !slices.Equal(spans, tc.spans) {
				t.Fatalf("asked about %+v, want %+v", spans, tc.spans)
			}
			if len(out.gaveUp) > 0 {
				if got := out.gaveUp[0].count(true, tc.ansAck, tc.ansSACK); got != tc.ansCounts {
					t.Errorf("answer ack %d, SACK %b: %d lost, want %d", tc.ansAck, tc.ansSACK, got, tc.ansCounts)
				}
			}
		})
	}
}
