package messaging

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging/bundle"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/memnet"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// TestLoneMessageFlushTimeout: a single message, with idle flushing out of
// the way, is delivered once the flush timeouts of the client and the
// agents on its path have passed, and not much later.
func TestLoneMessageFlushTimeout(t *testing.T) {
	const ft = 20 * time.Millisecond
	for _, mode := range []Mode{ModeNone, ModeHost} {
		t.Run(string(mode), func(t *testing.T) {
			tc := startCluster(t, spec{mode: mode, nodes: 2, clientsPerNode: 1, ranksPerClient: 1, handler: true,
				tune: func(c *Config) {
					c.FlushTimeout = Duration(ft)
					c.IdleTimeout = Duration(time.Minute)
				}})
			src, dst := tc.clients[0][0], tc.sinks[1][0]
			rank := tc.cfg.Nodes[1].Clients[0].Ranks[0].Lo
			start := time.Now()
			if err := src.Send(rank, payload(1, 1, rank, 100)); err != nil {
				t.Fatal(err)
			}
			waitCount(t, []*sink{dst}, 1, 10*time.Second)
			el := time.Since(start)
			hops := 1 // client → client
			if mode.HasAgent() {
				hops = 3 // client → agent → agent → client
			}
			if el < time.Duration(hops)*ft*9/10 || el > time.Duration(hops)*ft+500*time.Millisecond {
				t.Errorf("lone message over %d flush timeouts of %v took %v", hops, ft, el)
			}
			st := src.Stats()
			if f := st.Sent().Flushes; f.Timeout != 1 || f.Idle != 0 || f.Full != 0 {
				t.Errorf("client flushes %+v, want one timeout", f)
			}
			for _, a := range tc.agents {
				if f := a.Stats().Sent().Flushes; f.Timeout != 1 || f.Idle != 0 {
					t.Errorf("agent flushes %+v, want one timeout", f)
				}
			}
			t.Logf("delivered after %v (%d hops of %v)", el, hops, ft)
		})
	}
}

// TestIdleFlush: with a flush timeout of a minute, idleness alone empties
// every buffer of every client and agent: messages to every rank arrive
// promptly, every flush is an idle flush, and nothing is left buffered.
func TestIdleFlush(t *testing.T) {
	tc := startCluster(t, spec{mode: ModeDPU, nodes: 3, clientsPerNode: 2, ranksPerClient: 2, handler: true,
		tune: func(c *Config) {
			c.FlushTimeout = Duration(time.Minute)
			c.IdleTimeout = Duration(5 * time.Millisecond)
		}})
	clients, sinks := tc.all()
	ranks := tc.ranks()
	start := time.Now()
	n := 0
	for i, c := range clients {
		for j, r := range ranks {
			if err := c.Send(r, payload(uint32(i), uint32(j), r, 64)); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	waitCount(t, sinks, int64(n), 10*time.Second)
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("idle flushing took %v", el)
	}
	for _, c := range clients {
		f := c.Stats().Sent().Flushes
		if f.Idle == 0 || f.Timeout != 0 {
			t.Errorf("client flushes %+v, want idle ones only", f)
		}
		// Its messages to its own ranks are flushed the same way.
		if f := c.Stats().Local.Flushes; f.Idle == 0 || f.Timeout != 0 {
			t.Errorf("client local flushes %+v, want idle ones only", f)
		}
	}
	for _, a := range tc.agents {
		f := a.Stats().Sent().Flushes
		if f.Idle == 0 || f.Timeout != 0 {
			t.Errorf("agent flushes %+v, want idle ones only", f)
		}
	}
	// Nothing stays behind: stop the agents (their shutdown would flush
	// explicitly) and look at their buffers.
	tc.cancel()
	tc.agentWG.Wait()
	for _, a := range tc.agents {
		if f := a.Stats().Sent().Flushes; f.Explicit != 0 {
			t.Errorf("agent %s still held messages at shutdown: %+v", a.Stats().Node, f)
		}
		for _, w := range a.workers {
			for _, l := range w.links {
				if l.cur != nil && len(l.cur.b) > 32 || l.waiting() > 0 {
					t.Errorf("agent worker %d: link %s still holds a bundle", w.idx, l.name)
				}
			}
		}
	}
}

// TestFlush: Flush sends partial buffers at once and returns when the
// next hop has acknowledged them.
func TestFlush(t *testing.T) {
	tc := startCluster(t, spec{mode: ModeHost, nodes: 1, clientsPerNode: 2, ranksPerClient: 1, handler: true,
		tune: func(c *Config) {
			c.FlushTimeout = Duration(time.Minute)
			c.IdleTimeout = Duration(time.Minute)
		}})
	src := tc.clients[0][0]
	rank := tc.cfg.Nodes[0].Clients[1].Ranks[0].Lo
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				if err := src.Send(rank, payload(uint32(g), uint32(i), rank, 32)); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := src.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	st := src.Stats().Sent()
	if st.Messages != 200 || st.Flushes.Explicit == 0 {
		t.Fatalf("after Flush: %d messages sent, flushes %+v", st.Messages, st.Flushes)
	}
	// The agent holds them until its own timeouts (a minute) or shutdown:
	// stopping it flushes explicitly, and they arrive.
	tc.cancel()
	tc.agentWG.Wait()
	waitCount(t, tc.sinks[0][1:], 200, 5*time.Second)
	if f := tc.agents[0].Stats().Sent().Flushes; f.Explicit == 0 {
		t.Errorf("agent flushes %+v, want an explicit one at shutdown", f)
	}
}

// TestCloseCountsUnsent: Close does not wait for a receiver's window. The
// messages whose bundles still wait for it are dropped, counted (closed)
// and reported in Close's error, although every Send returned nil.
func TestCloseCountsUnsent(t *testing.T) {
	const window = 4
	mem := memnet.New(memnet.Options{})
	self, err := mem.Listen(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	peer, err := mem.Listen(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Defaults()
	cfg.Mode, cfg.Tenant, cfg.SenderShards = ModeNone, 7, 1
	cfg.TransferSize, cfg.BuffersPerDest = 512, window
	cfg.Nodes = []Node{{Name: "node0", Clients: []ClientSpec{
		{Name: "c0", Addr: self.LocalAddr(), Ranks: Range(0, 0)},
		{Name: "c1", Addr: peer.LocalAddr(), Ranks: Range(1, 1)},
	}}}
	c, err := NewClient(cfg, "node0", "c0", ClientOptions{Transport: self})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// The peer acknowledges every bundle and answers every probe, but its
	// window never moves past the first one.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := map[uint32]bool{} // the bundles (one message each) that arrived
	done := make(chan struct{})
	go func() {
		defer close(done)
		pkts := make([]transport.Packet, 8)
		for i := range pkts {
			pkts[i].Data = make([]byte, 2048)
		}
		next := uint32(0)
		for {
			n, err := peer.Recv(ctx, pkts)
			if err != nil {
				return
			}
			var out []transport.Packet
			for _, p := range pkts[:n] {
				h, payload, err := wire.Decode(p.Data)
				if err != nil {
					continue
				}
				var session uint32
				if h.Type == wire.TypeBundle {
					pre, _, err := bundle.ParsePreamble(payload)
					if err != nil {
						continue
					}
					session, got[h.Seq] = pre.Session, true
					for got[next] {
						next++
					}
				} else if cr, err := bundle.ParseCredit(payload); err == nil {
					session = cr.Session // a probe
				}
				hdr := wire.Header{Version: wire.Version, Type: wire.TypeCredit, Tenant: 7, Src: h.Dst, Dst: h.Src, Seq: next}
				credit := bundle.Credit{Session: session, Limit: window}.AppendTo(nil)
				out = append(out, transport.Packet{Addr: p.Addr, Data: hdr.AppendTo(nil, credit)})
			}
			_, _ = peer.Send(out)
		}
	}()

	// 400-byte messages fill a bundle each: the first window goes out and
	// is acknowledged, the second waits for a window that stays closed.
	const n = 2 * window
	for i := range uint32(n) {
		if err := c.SendContext(ctx, 1, payload(0, i, 1, 400)); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	err = c.Close()
	cancel()
	<-done
	lost := uint64(n - len(got))
	if lost == 0 {
		t.Fatalf("the peer received all %d messages: the test does not hold bundles back", n)
	}
	want := fmt.Sprintf("messaging: close: %d messages not sent", lost)
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "Flush") {
		t.Errorf("Close: %v, want an error saying %q and to call Flush", err, want)
	}
	if d := c.Stats().Drops.Closed; d != lost {
		t.Errorf("drops.closed %d, want %d (the messages the peer never received)", d, lost)
	}
}

// TestSentCountsTaken: a next hop's sent counters (bundles, messages,
// bytes, retransmits, probes) count what the transport took, and
// send_errors what it refused, on clients and agents alike. While a
// client's or an agent's transport refuses their bundles, nothing counts
// as sent to that next hop; once it takes them, each bundle counts once,
// and sent and send_errors partition what was attempted.
func TestSentCountsTaken(t *testing.T) {
	const n = 10
	type owner struct{ node, client int } // client -1: the node's agent
	gates := map[owner][]*gate{}
	tc := startCluster(t, spec{mode: ModeDPU, nodes: 2, clientsPerNode: 1, ranksPerClient: 1, workers: 1, handler: true,
		mem: memnet.New(memnet.Options{}),
		wrap: func(node, c int, tr transport.Transport) transport.Transport {
			g := &gate{Transport: tr}
			gates[owner{node, c}] = append(gates[owner{node, c}], g)
			return g
		}})
	shut := func(o owner, on bool) {
		for _, g := range gates[o] {
			g.shut.Store(on)
		}
	}
	src, agent1 := tc.clients[0][0], tc.agents[1]
	rank := tc.cfg.Nodes[1].Clients[0].Ranks[0].Lo

	// The client's transport refuses its bundles: Flush hands the bundle
	// over, the retransmission timer tries again, nothing is taken.
	shut(owner{0, 0}, true)
	for i := range uint32(n) {
		if err := src.Send(rank, payload(0, i, rank, 100)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Millisecond)
	err := src.Flush(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Flush with every bundle refused: %v, want the deadline", err)
	}
	st := src.Stats()
	if d, _ := st.Dest("node0"); d.Bundles != 0 || d.Messages != 0 || d.Bytes != 0 || d.Retransmits != 0 || st.Drops.SendErrors == 0 {
		t.Errorf("client, every bundle refused: sent %d bundles, %d messages, %d bytes, %d retransmits; %d send errors; want nothing sent, send errors",
			d.Bundles, d.Messages, d.Bytes, d.Retransmits, st.Drops.SendErrors)
	}

	// The client's bundle goes through; the receiving agent's transport
	// refuses the bundles for its client.
	shut(owner{1, -1}, true)
	shut(owner{0, 0}, false)
	eventually(t, 10*time.Second, "agent node1 refusing a bundle for its client", func() bool {
		return agent1.Stats().Drops.SendErrors > 0
	})
	st = agent1.Stats()
	if d, _ := st.Dest("node1/c0"); d.Bundles != 0 || d.Messages != 0 || d.Bytes != 0 || d.Retransmits != 0 {
		t.Errorf("agent node1, every bundle to its client refused: sent %d bundles, %d messages, %d bytes, %d retransmits; want nothing",
			d.Bundles, d.Messages, d.Bytes, d.Retransmits)
	}

	shut(owner{1, -1}, false)
	waitCount(t, tc.sinks[1], n, 10*time.Second)
	for o, gs := range gates {
		var st Stats
		if o.client < 0 {
			st = tc.agents[o.node].Stats()
		} else {
			st = tc.clients[o.node][o.client].Stats()
		}
		name := fmt.Sprintf("%s/%s", st.Node, st.Role)
		var took, bytes, probes, refused uint64
		var s DestStats
		eventually(t, 10*time.Second, name+"'s counters agreeing with its transport", func() bool {
			took, bytes, probes, refused = 0, 0, 0, 0
			for _, g := range gs {
				b, by, p, r := g.counts()
				took, bytes, probes, refused = took+b, bytes+by, probes+p, refused+r
			}
			if o.client < 0 {
				st = tc.agents[o.node].Stats()
			} else {
				st = tc.clients[o.node][o.client].Stats()
			}
			s = st.Sent()
			return s.Bundles+s.Retransmits == took && s.Bytes+s.RetransmitBytes == bytes && s.Probes == probes &&
				st.Drops.SendErrors == refused
		})
		t.Logf("%s: sent %d bundles, %d retransmits, %d probes; %d send errors", name, s.Bundles, s.Retransmits, s.Probes, st.Drops.SendErrors)
	}
	if d, _ := src.Stats().Dest("node0"); d.Messages != n || d.Bundles == 0 {
		t.Errorf("client: %d messages in %d bundles sent, want %d messages", d.Messages, d.Bundles, n)
	}
	if d, _ := agent1.Stats().Dest("node1/c0"); d.Messages != n || d.Bundles == 0 {
		t.Errorf("agent node1: %d messages in %d bundles sent to its client, want %d messages", d.Messages, d.Bundles, n)
	}
}
