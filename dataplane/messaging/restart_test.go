package messaging

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging/bundle"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/memnet"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// TestClientRestart: a client process that stops and starts again on the
// same address gets a new session; the agent meets it as a new link, and
// traffic both ways continues exactly once.
func TestClientRestart(t *testing.T) {
	tc := startCluster(t, spec{mode: ModeHost, nodes: 1, clientsPerNode: 2, ranksPerClient: 1, handler: true})
	r0, r1 := tc.cfg.Nodes[0].Clients[0].Ranks[0].Lo, tc.cfg.Nodes[0].Clients[1].Ranks[0].Lo
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	round := func(c0, c1 *Client, s0, s1 *sink, base uint32) {
		t.Helper()
		for i := range uint32(100) {
			if err := c0.Send(r1, payload(0, base+i, r1, 50)); err != nil {
				t.Fatal(err)
			}
			if err := c1.Send(r0, payload(1, base+i, r0, 50)); err != nil {
				t.Fatal(err)
			}
		}
		if err := c0.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c1.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		waitCount(t, []*sink{s0}, 100, 5*time.Second)
		waitCount(t, []*sink{s1}, 100, 5*time.Second)
		s0.mu.Lock()
		s1.mu.Lock()
		defer s0.mu.Unlock()
		defer s1.mu.Unlock()
		for i := range uint32(100) {
			if s1.got[msgID{0, base + i}] != 1 || s0.got[msgID{1, base + i}] != 1 {
				t.Fatalf("round %d: message %d not delivered exactly once", base, i)
			}
		}
	}
	round(tc.clients[0][0], tc.clients[0][1], tc.sinks[0][0], tc.sinks[0][1], 0)

	addr := tc.clients[0][0].Addr()
	if err := tc.clients[0][0].Close(); err != nil {
		t.Fatal(err)
	}
	tr, err := udp.Listen(addr, udp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s0 := &sink{got: map[msgID]int{}}
	ranks := tc.cfg.Nodes[0].Clients[0].Ranks
	c0, err := NewClient(tc.cfg, "node0", "c0", ClientOptions{Transport: tr, Handler: func(r uint32, p []byte) { s0.add(ranks, r, p) }})
	if err != nil {
		t.Fatal(err)
	}
	tc.clients[0][0] = c0
	tc.sinks[0][1].count.Store(0)
	round(c0, tc.clients[0][1], s0, tc.sinks[0][1], 1000)
	tc.noDrops(t)
}

// TestDeadPeer: when a client dies, the agent's link to it stops being
// answered; after PeerTimeout the agent drops what it holds for it
// (counted), and the traffic that waited behind it on the blocklist flows
// again.
func TestDeadPeer(t *testing.T) {
	tc := startCluster(t, spec{mode: ModeHost, nodes: 1, clientsPerNode: 3, ranksPerClient: 1, handler: true,
		tune: func(c *Config) {
			c.TransferSize = 512
			c.BuffersPerDest = 2
			c.RetransmitTimeout = Duration(10 * time.Millisecond)
			c.PeerTimeout = Duration(200 * time.Millisecond)
		}})
	if err := tc.clients[0][2].Close(); err != nil {
		t.Fatal(err)
	}
	live, dead := tc.cfg.Nodes[0].Clients[1].Ranks[0].Lo, tc.cfg.Nodes[0].Clients[2].Ranks[0].Lo
	src := tc.clients[0][0]
	const n = 300
	for i := range uint32(n) {
		if err := src.Send(live, payload(0, i, live, 100)); err != nil {
			t.Fatal(err)
		}
		if err := src.Send(dead, payload(0, n+i, dead, 100)); err != nil {
			t.Fatal(err)
		}
	}
	waitCount(t, tc.sinks[0][1:2], n, 20*time.Second)
	st := tc.agents[0].Stats()
	d, _ := st.Dest("node0/c2")
	if st.Drops.DeadPeer == 0 || d.PeerResets == 0 {
		t.Errorf("dead-peer drops %d, resets %d: want both > 0", st.Drops.DeadPeer, d.PeerResets)
	}
	if d.PeerResets > uint64(tc.cfg.Workers) {
		t.Errorf("%d resets by %d workers: once dead, a peer should cost no further timeouts", d.PeerResets, tc.cfg.Workers)
	}
	t.Logf("dropped %d messages for the dead client in %d resets", st.Drops.DeadPeer, d.PeerResets)

	// The client comes back: the agent's probes find it, and messages flow
	// to it again.
	tr, err := udp.Listen(tc.cfg.Nodes[0].Clients[2].Addr, udp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	back := &sink{got: map[msgID]int{}}
	c2, err := NewClient(tc.cfg, "node0", "c2", ClientOptions{Transport: tr, Handler: func(r uint32, p []byte) {
		back.add(tc.cfg.Nodes[0].Clients[2].Ranks, r, p)
	}})
	if err != nil {
		t.Fatal(err)
	}
	tc.clients[0][2] = c2
	eventually(t, 5*time.Second, "the agent finds the restarted client", func() bool {
		d, _ := tc.agents[0].Stats().Dest("node0/c2")
		return !d.PeerDead
	})
	for i := range uint32(50) {
		if err := src.Send(dead, payload(1, i, dead, 100)); err != nil {
			t.Fatal(err)
		}
	}
	waitCount(t, []*sink{back}, 50, 5*time.Second)
}

// TestAgentRestart restarts both agents of a DPU-mode cluster while
// messages, many of them fragmented, flow both ways: every message
// arrives exactly once. Each stopping agent drains (AgentOptions.Drain):
// it forwards what it acknowledged and waits for its next hops'
// acknowledgements, and leaves new bundles unacknowledged for its
// successor, which the senders' retransmissions reach.
func TestAgentRestart(t *testing.T) {
	tc := startCluster(t, spec{mode: ModeDPU, nodes: 2, clientsPerNode: 1, ranksPerClient: 2, handler: true,
		drain: 2 * time.Second,
		tune: func(c *Config) {
			c.TransferSize = 1024
			c.RetransmitTimeout = Duration(5 * time.Millisecond)
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const count = 3000
	sent := newLevel()
	errc := make(chan error, 2)
	for n := range 2 {
		go func() {
			c := tc.clients[n][0]
			peer := tc.cfg.Nodes[1-n].Clients[0].Ranks.All()
			for i := range uint32(count) {
				rank := peer[i%uint32(len(peer))]
				if err := c.SendContext(ctx, rank, payload(uint32(n), i, rank, 16+int(i*37%3000))); err != nil {
					errc <- err
					return
				}
				sent.add(1)
				if i%100 == 99 {
					time.Sleep(2 * time.Millisecond) // spread the traffic over the restarts
				}
			}
			errc <- c.Flush(ctx)
		}()
	}
	for _, at := range []struct {
		sent int64
		node int
	}{{count / 2, 0}, {count, 1}, {3 * count / 2, 0}} {
		sent.wait(ctx, at.sent)
		start := time.Now()
		tc.restartAgent(at.node)
		t.Logf("agent %d restarted after %d messages sent, in %v", at.node, at.sent, time.Since(start).Round(time.Millisecond))
	}
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	cs, sinks := tc.all()
	defer func() {
		if t.Failed() {
			for _, c := range cs {
				t.Logf("client %s: %+v %+v", c.Stats().Node, c.Stats().Received, c.Stats().Drops)
			}
			for _, a := range tc.agents {
				t.Logf("agent %s: %+v %+v", a.Stats().Node, a.Stats().Received, a.Stats().Drops)
			}
		}
	}()
	arrived(sinks, 2*count, 10*time.Second) // what is missing is reported below
	for n, s := range sinks {
		s.mu.Lock()
		for i := range uint32(count) {
			if got := s.got[msgID{uint32(1 - n), i}]; got != 1 {
				t.Errorf("node %d: message %d arrived %d times", n, i, got)
			}
		}
		if len(s.bad) > 0 {
			t.Errorf("node %d: %v", n, s.bad)
		}
		s.mu.Unlock()
	}
	tc.noDrops(t)
}

// TestStaleBaseHandshake: a receiver restarted with a sender's link in
// flight may meet the link through a bundle whose base is stale (its
// previous life acknowledged more, the credit still on its way). It takes
// nothing until the sender confirms its base: its credit is one behind
// the base it was told, the sender answers a credit behind its base with a
// probe carrying its base, and the probe starts the link there. Without
// this, the new receiver took bundles its previous life had routed
// (duplicates), or waited forever for bundles the sender had freed (a
// sender stuck with a full window, or messages lost at the end of a drain).
func TestStaleBaseHandshake(t *testing.T) {
	const window = 8
	ctr := &counters{}
	out := newOutLink("peer", netip.MustParseAddrPort("127.0.0.1:9"), 7, AgentEndpoint(0, 0), AgentEndpoint(1, 0), 256, window, ctr)
	var pkts batch
	var p progress
	for i := range 6 {
		p = progress{}
		if out.write(1, make([]byte, 200), &p, int64(i), &pkts, func(*outLink) {}) != writeDone {
			t.Fatalf("write %d blocked", i)
		}
		out.close(flushExplicit, int64(i), &pkts)
	}
	if out.nextSeq != 6 {
		t.Fatalf("nextSeq %d, want 6", out.nextSeq)
	}
	// The old receiver acknowledged 0..3; a retransmission of 2 with base 2
	// (sent before that credit arrived) introduces the link to its
	// successor.
	now := int64(time.Second)
	if !out.onCredit(4, bundle.Credit{Session: out.session, Limit: 4 + window}, now, int64(time.Millisecond), &pkts) {
		t.Fatal("credit refused")
	}
	if !sureStart(0, 0, 0) || sureStart(2, 2, wire.FlagRetransmit) || sureStart(3, 2, 0) {
		t.Fatal("sureStart")
	}
	in := newInLink(linkKey{uint32(out.hdr.Src), out.session}, out.hdr.Dst, netip.AddrPort{}, window, 2, false, 0)
	if !in.unsure {
		t.Fatal("a link met through a retransmission starts unsure")
	}
	ack, c := in.credit()
	if ack != 1 {
		t.Fatalf("unsure credit acks %d, want one behind the base (1)", ack)
	}
	pkts.reset()
	probes := out.st.probes.Load()
	if !out.onCredit(ack, c, now+int64(time.Millisecond), int64(time.Millisecond), &pkts) {
		t.Fatal("credit of the link's session refused")
	}
	pkts.send(&gate{}, ctr) // a probe counts once the transport took it
	if out.st.probes.Load() != probes+1 || pkts.len() != 1 {
		t.Fatalf("a credit behind the base: %d probes, %d datagrams; want a probe", out.st.probes.Load()-probes, pkts.len())
	}
	h, _, err := wire.Decode(pkts.pkts[0].Data)
	if err != nil || h.Type != wire.TypeCredit || h.Flags&wire.FlagAckReq == 0 || h.Seq != 4 {
		t.Fatalf("probe %+v %v: want an ack request with Seq 4", h, err)
	}
	if !in.onProbe(h.Seq) || in.unsure || in.next.Load() != 4 || in.consumed.Load() != 4 {
		t.Fatalf("after the probe: unsure %v next %d consumed %d, want a sure link at 4", in.unsure, in.next.Load(), in.consumed.Load())
	}
	if v := in.classify(3); v != vDuplicate {
		t.Fatalf("seq 3 (taken by the previous life): %v, want a duplicate", v)
	}
	if v := in.classify(4); v != vInOrder {
		t.Fatalf("seq 4: %v, want in order", v)
	}

	// A sure link left behind the sender's base, holding bundles out of
	// order, moves on to the probe's base and forgets what lies below.
	in2 := newInLink(linkKey{1, 2}, 3, netip.AddrPort{}, window, 2, true, 0)
	in2.stash(3, 0, []byte{1}, 1)
	in2.stash(5, 0, []byte{1}, 1)
	if !in2.onProbe(4) || in2.next.Load() != 4 || in2.held != 1 || in2.valPending != bundle.Unknown {
		t.Fatalf("behind link after a probe: next %d held %d pending %d", in2.next.Load(), in2.held, in2.valPending)
	}
	if in2.onProbe(2) || in2.next.Load() != 4 {
		t.Fatal("a stale probe moved the link back")
	}
}

// deadPeerRTO is deadPeerCluster's retransmit timeout; its peer timeout
// is eight of them.
const deadPeerRTO = 10 * time.Millisecond

// deadPeerCluster starts a cluster on an in-process network and a clock the
// test advances (nothing sleeps), with one rank per client, small bundles,
// two buffers per destination and short timeouts, so that a peer is
// declared dead within a few clock steps.
func deadPeerCluster(t *testing.T, mode Mode, nodes, clientsPerNode int) (*testCluster, *manualClock) {
	t.Helper()
	mem := memnet.New(memnet.Options{})
	clk := newManualClock()
	clk.quiet = func() bool { return mem.InFlight() == 0 }
	tc := startCluster(t, spec{mode: mode, nodes: nodes, clientsPerNode: clientsPerNode, ranksPerClient: 1, workers: 1,
		mem: mem, clock: clk, handler: true,
		tune: func(c *Config) {
			c.TransferSize = 512
			c.BuffersPerDest = 2
			c.RetransmitTimeout = Duration(deadPeerRTO)
			c.PeerTimeout = Duration(8 * deadPeerRTO)
		}})
	return tc, clk
}

// TestDeadAgent: a client whose agent is killed (no drain, no goodbye) does
// not block silently. Once the agent has not answered for peer_timeout,
// the Send waiting for a buffer and every later Send fail with ErrPeerDead,
// Flush reports the dropped messages, and the client's stats say the next
// hop is dead. When an agent answers on the address again, the client's
// probes find it and messages flow. The test runs on an in-process network
// and a clock it advances: nothing sleeps.
func TestDeadAgent(t *testing.T) {
	tc, clk := deadPeerCluster(t, ModeDPU, 2, 1)
	const rto = deadPeerRTO
	src, dst := tc.clients[0][0], uint32(1) // rank 1 is node1's client
	ctx := context.Background()
	if err := src.Send(dst, payload(0, 0, dst, 100)); err != nil {
		t.Fatal(err)
	}
	if err := src.Flush(ctx); err != nil {
		t.Fatalf("flush with the agent up: %v", err)
	}

	// Kill node0's agent: it stops answering, its address goes silent.
	_ = tc.agents[0].Close()
	<-tc.dones[0]
	errc := make(chan error, 1)
	sent := 0
	go func() {
		for i := range 100 { // 400 bytes: one bundle each; the window is 2
			if err := src.Send(dst, payload(0, uint32(1+i), dst, 400)); err != nil {
				errc <- err
				return
			}
			sent++
		}
		errc <- nil
	}()
	var err error
	clk.advanceUntil(t, rto, 10000, "Send to a dead agent returns", func() bool {
		select {
		case err = <-errc:
			return true
		default:
			return false
		}
	})
	if !errors.Is(err, ErrPeerDead) {
		t.Fatalf("Send to a dead agent after %d messages: %v, want ErrPeerDead", sent, err)
	}
	t.Logf("after %d messages: %v", sent, err)
	if err := src.Send(dst, payload(0, 999, dst, 10)); !errors.Is(err, ErrPeerDead) {
		t.Errorf("Send while the agent is dead: %v, want ErrPeerDead", err)
	}
	if err := src.TrySend(dst, payload(0, 999, dst, 10)); !errors.Is(err, ErrPeerDead) {
		t.Errorf("TrySend while the agent is dead: %v, want ErrPeerDead", err)
	}
	if err := src.Flush(ctx); !errors.Is(err, ErrPeerDead) {
		t.Errorf("Flush while the agent is dead: %v, want ErrPeerDead", err)
	}
	st := src.Stats()
	d, _ := st.Dest("node0")
	if !d.PeerDead || d.PeerResets == 0 || st.Drops.DeadPeer == 0 {
		t.Errorf("stats: peer_dead %v, peer_resets %d, dead_peer drops %d: want true and > 0", d.PeerDead, d.PeerResets, st.Drops.DeadPeer)
	}

	// A new agent answers on the address: the client's probes find it.
	tc.restartAgent(0)
	clk.advanceUntil(t, rto, 10000, "the client finds the agent again", func() bool {
		d, _ := src.Stats().Dest("node0")
		return !d.PeerDead
	})
	before := tc.sinks[1][0].count.Load()
	if err := src.Send(dst, payload(1, 0, dst, 100)); err != nil {
		t.Fatalf("Send after the agent came back: %v", err)
	}
	if err := src.Flush(ctx); err != nil {
		t.Fatalf("Flush after the agent came back: %v", err)
	}
	clk.advanceUntil(t, rto, 10000, "the message after the restart arrives", func() bool {
		return tc.sinks[1][0].count.Load() > before
	})
}

// TestHopDeadOnEveryShard: a client's shards each keep their own link to
// the agent. When one declares the agent dead, the others' links to it are
// declared dead at once rather than a peer timeout later, and a Flush
// returns ErrPeerDead without waiting for time to pass (the clock stands
// still while it waits). Their messages count as dropped, once each, when
// the question whether the agent took them is given up (it never answers).
func TestHopDeadOnEveryShard(t *testing.T) {
	tc, clk := deadPeerCluster(t, ModeDPU, 2, 1)
	const rto = deadPeerRTO
	src, dst := tc.clients[0][0], uint32(1)
	if len(src.shards) != 2 {
		t.Fatalf("%d sender shards, want 2", len(src.shards))
	}
	_ = tc.agents[0].Close()
	<-tc.dones[0]
	// sendOn sends one message on shard i: the other is held, so the
	// client picks i.
	sendOn := func(i int) {
		t.Helper()
		other := src.shards[1-i]
		other.mu.Lock()
		err := src.Send(dst, payload(0, uint32(i), dst, 100))
		other.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // Flush sends the bundle and returns at once
		if err := src.Flush(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("flush of shard %d's message: %v, want it to wait for the silent agent", i, err)
		}
	}
	sendOn(0)
	for range 5 {
		clk.step(rto) // shard 1's link falls silent half a peer timeout later
	}
	sendOn(1)
	before := src.Stats().Drops.DeadPeer
	clk.advanceUntil(t, rto, 1000, "the client declares the agent dead", func() bool {
		d, _ := src.Stats().Dest("node0")
		return d.PeerDead
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := src.Flush(ctx); !errors.Is(err, ErrPeerDead) {
		t.Fatalf("Flush once one shard declared the agent dead: %v, want ErrPeerDead at once", err)
	}
	// The count waits for the agent's answer, given up after
	// gaveUpTimeouts peer timeouts of silence.
	clk.advanceUntil(t, rto, 1000, "the client gives up asking the dead agent", func() bool {
		return src.Stats().Drops.DeadPeer-before >= 2
	})
	if d := src.Stats().Drops.DeadPeer - before; d != 2 {
		t.Errorf("dead_peer drops grew by %d, want 2 (one message per shard)", d)
	}
}

// TestDeadClientNotDelivered: once an agent has declared a local client
// dead, the messages it drops for that client's ranks count as dead_peer
// drops only, not also as delivered (handed to the client's send buffers).
func TestDeadClientNotDelivered(t *testing.T) {
	tc, clk := deadPeerCluster(t, ModeHost, 1, 2)
	const rto = deadPeerRTO
	src, a := tc.clients[0][0], tc.agents[0]
	dead := tc.cfg.Nodes[0].Clients[1].Ranks[0].Lo
	if err := tc.clients[0][1].Close(); err != nil {
		t.Fatal(err)
	}
	// A message keeps the agent's link to the closed client busy until
	// peer_timeout passes without an answer.
	if err := src.Send(dead, payload(0, 0, dead, 100)); err != nil {
		t.Fatal(err)
	}
	clk.advanceUntil(t, rto, 1000, "the agent declares the closed client dead", func() bool {
		d, _ := a.Stats().Dest("node0/c1")
		return d.PeerDead
	})
	before := a.Stats()
	const k = 50
	for i := range uint32(k) {
		if err := src.Send(dead, payload(0, 1+i, dead, 20)); err != nil {
			t.Fatal(err)
		}
	}
	if err := src.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	clk.advanceUntil(t, rto, 1000, "the agent routes the messages", func() bool {
		return a.Stats().Received.Messages >= before.Received.Messages+k
	})
	after := a.Stats()
	if d := after.Received.Delivered - before.Received.Delivered; d != 0 {
		t.Errorf("%d of %d messages for the dead client counted as delivered, want 0", d, k)
	}
	if d := after.Drops.DeadPeer - before.Drops.DeadPeer; d != k {
		t.Errorf("dead_peer drops grew by %d, want %d", d, k)
	}
}

// TestResetCountsAckedHead: a fragmented message whose head bundle was
// acknowledged, its rest still held, is counted as a dead_peer drop when
// the peer is declared dead (no buffer held counts it), and the writer that
// comes back to it learns it was dropped.
func TestResetCountsAckedHead(t *testing.T) {
	const window, rto, peerTO = 2, int64(time.Millisecond), int64(100 * time.Millisecond)
	ctr := &counters{}
	out := newOutLink("peer", netip.MustParseAddrPort("127.0.0.1:9"), 7, AgentEndpoint(0, 0), AgentEndpoint(1, 0), 256, window, ctr)
	var pkts batch
	var p progress
	// 1000 bytes over 256-byte bundles: the head and a continuation take
	// the window's two buffers, the rest waits.
	if r := out.write(1, make([]byte, 1000), &p, 0, &pkts, func(*outLink) {}); r != writeWait {
		t.Fatalf("write: %v, want to wait for a buffer", r)
	}
	if out.nextSeq != 2 {
		t.Fatalf("%d bundles sent, want 2", out.nextSeq)
	}
	if !out.onCredit(1, bundle.Credit{Session: out.session, Limit: 1 + window}, 1, rto, &pkts) || out.freed != 1 {
		t.Fatalf("credit acking the head freed %d buffers, want 1", out.freed)
	}
	if _, reset := out.maintain(1+peerTO, rto, peerTO, &pkts); !reset {
		t.Fatal("no reset after peer_timeout of silence")
	}
	if n := ctr.drops[dropDeadPeer].Load(); n != 1 {
		t.Errorf("dead_peer drops %d, want 1: the message whose head was acknowledged", n)
	}
	if r := out.write(1, make([]byte, 1000), &p, 2+peerTO, &pkts, func(*outLink) {}); r != writeDropped {
		t.Errorf("the writer coming back: %v, want dropped", r)
	}
	if n := ctr.drops[dropDeadPeer].Load(); n != 1 {
		t.Errorf("dead_peer drops %d after the writer came back, want still 1", n)
	}
}

// rxTestOwner is an rxOwner that takes every datagram, admits bundles
// unless draining, and counts the bundles it gets in order.
type rxTestOwner struct {
	draining bool
	taken    int
}

func (o *rxTestOwner) ours(Endpoint) bool         { return true }
func (o *rxTestOwner) admit(*inLink, uint32) bool { return !o.draining }
func (o *rxTestOwner) inOrder(l *inLink, _ rxWork, _ *transport.Packet) {
	o.taken++
	l.consumed.Add(1)
}
func (o *rxTestOwner) credit(wire.Header, bundle.Credit, netip.AddrPort, []byte, int64) {}

// TestUnconfirmedNotDraining: bundles a receiver refuses on a link it met
// in mid-stream, until the sender's probe confirms where the link starts,
// are counted as unconfirmed, on any receiver; refused counts only the
// bundles a draining agent leaves unacknowledged.
func TestUnconfirmedNotDraining(t *testing.T) {
	const window = 8
	out := newOutLink("peer", netip.MustParseAddrPort("127.0.0.1:9"), 7, AgentEndpoint(0, 0), AgentEndpoint(1, 0), 256, window, &counters{})
	var pkts batch
	for i := range 3 {
		var p progress
		if out.write(1, make([]byte, 200), &p, int64(i), &pkts, func(*outLink) {}) != writeDone {
			t.Fatalf("write %d blocked", i)
		}
		out.close(flushExplicit, int64(i), &pkts)
	}
	cfg := Defaults()
	cfg.Tenant, cfg.BuffersPerDest = 7, window
	ctr, owner := &counters{}, &rxTestOwner{}
	var credits batch
	r := newReceiver(&cfg, 0, ctr, owner, &credits)

	// Seq 1 with base 0 introduces the link: unsure, refused until a probe.
	r.handle(&pkts.pkts[1], 1)
	if owner.taken != 0 || ctr.unconfirmed.Load() != 1 || ctr.refused.Load() != 0 {
		t.Fatalf("bundle on an unsure link: taken %d, unconfirmed %d, refused %d; want 0, 1, 0",
			owner.taken, ctr.unconfirmed.Load(), ctr.refused.Load())
	}
	var probe batch
	out.probe(2, &probe)
	r.handle(&probe.pkts[0], 2)
	r.handle(&pkts.pkts[0], 3)
	r.handle(&pkts.pkts[1], 3)
	if owner.taken != 2 {
		t.Fatalf("after the probe confirmed the base: %d bundles taken, want 2", owner.taken)
	}

	// A draining owner refuses the next bundle: refused, not unconfirmed.
	owner.draining = true
	r.handle(&pkts.pkts[2], 4)
	if owner.taken != 2 || ctr.refused.Load() != 1 || ctr.unconfirmed.Load() != 1 {
		t.Fatalf("bundle refused while draining: taken %d, refused %d, unconfirmed %d; want 2, 1, 1",
			owner.taken, ctr.refused.Load(), ctr.unconfirmed.Load())
	}
}
