package messaging

import (
	"context"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging/bundle"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// fakeBundle builds a bundle datagram by hand.
func fakeBundle(tenant, src, dst, seq uint32, flags wire.Flags, session, base uint32, records []byte) []byte {
	p := make([]byte, bundle.PreambleLen, bundle.PreambleLen+len(records))
	bundle.Preamble{Session: session, Base: base}.Put(p)
	p = append(p, records...)
	h := wire.Header{Version: wire.Version, Type: wire.TypeBundle, Flags: flags, Tenant: tenant, Src: src, Dst: dst, Seq: seq}
	return h.AppendTo(nil, p)
}

func fakeCredit(tenant, src, dst, ack uint32, flags wire.Flags, payload []byte) []byte {
	h := wire.Header{Version: wire.Version, Type: wire.TypeCredit, Flags: flags, Tenant: tenant, Src: src, Dst: dst, Seq: ack}
	return h.AppendTo(nil, payload)
}

// TestMalformedAndUnknown: every kind of bad datagram and every message
// for an unknown rank is dropped and counted under its reason, the valid
// messages next to them are delivered, and normal traffic running through
// a flood of junk arrives exactly once.
func TestMalformedAndUnknown(t *testing.T) {
	tc := startCluster(t, spec{mode: ModeHost, nodes: 2, clientsPerNode: 2, ranksPerClient: 2, handler: true})
	raw, err := udp.Listen(netip.MustParseAddrPort("127.0.0.1:0"), udp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	agent, client := tc.agents[0], tc.clients[0][0]
	ten := tc.cfg.Tenant
	aDst := uint32(AgentEndpoint(0, 0))
	cDst := uint32(ClientEndpoint(0, 0, 0))
	src := uint32(ClientEndpoint(9, 9, 0))         // nobody's
	good := tc.cfg.Nodes[1].Clients[0].Ranks[0].Lo // a rank behind the other agent
	mine := client.Ranks()[0].Lo
	other := tc.cfg.Nodes[0].Clients[1].Ranks[0].Lo
	goodMsg := payload(5000, 1, good, 40)

	send := func(to netip.AddrPort, dgrams ...[]byte) {
		t.Helper()
		var pkts []transport.Packet
		for _, d := range dgrams {
			pkts = append(pkts, transport.Packet{Addr: to, Data: d})
		}
		if _, err := raw.Send(pkts); err != nil {
			t.Fatal(err)
		}
	}
	junk := make([]byte, 100)
	for i := range junk {
		junk[i] = byte(i * 7)
	}
	unknownType := fakeBundle(ten, src, aDst, 0, 0, 1, 0, nil)
	unknownType[wire.OffsetType] = 0x7f
	memRead := fakeBundle(ten, src, aDst, 0, 0, 1, 0, nil)
	memRead[wire.OffsetType] = byte(wire.TypeMemRead)
	overrun := append(bundle.AppendRecord(nil, good, []byte("ok")), 0, 0, 0, 50, 0, 0, 0, 1, 'x')
	send(agent.Addr(),
		junk,        // malformed
		junk[:10],   // malformed (truncated)
		unknownType, // malformed
		memRead,     // malformed: not a messaging type
		fakeBundle(ten+1, src, aDst, 0, 0, 2, 0, bundle.AppendRecord(nil, good, []byte("x"))),                           // wrong tenant
		fakeBundle(ten, src, uint32(AgentEndpoint(5, 0)), 0, 0, 3, 0, nil),                                              // wrong destination
		fakeBundle(ten, src, cDst, 0, 0, 4, 0, nil),                                                                     // a client endpoint at an agent
		wire.Header{Version: 1, Type: wire.TypeBundle, Tenant: ten, Src: src, Dst: aDst}.AppendTo(nil, []byte{1, 2, 3}), // short preamble
		fakeBundle(ten, src, aDst, 0, 0, 0, 0, nil),                                                                     // session 0
		fakeBundle(ten, src, aDst, 0, 0, 5, 0, overrun),                                                                 // bad records
		fakeBundle(ten, src, aDst, 0, 0, 6, 0, bundle.AppendContinuation(nil, []byte("orphan"))),                        // continuation without head
		fakeBundle(ten, src, aDst, 0, wire.FlagMore, 7, 0, bundle.AppendRecord(nil, good, nil)),                         // more flag, nothing pending
		fakeBundle(ten, src, aDst, 0, 0, 8, 0, nil),                                                                     // starts link 8 (empty)
		fakeBundle(ten, src, aDst, 100, 0, 8, 0, bundle.AppendRecord(nil, good, nil)),                                   // beyond the window
		// Unknown ranks beside a good message: only they are dropped.
		fakeBundle(ten, src, aDst, 0, 0, 9, 0, cat(
			bundle.AppendRecord(nil, 999999, []byte("nobody")), bundle.AppendRecord(nil, good, goodMsg),
			bundle.AppendRecord(nil, bundle.ContinuationRank-1, nil))),
		// An oversized fragmented message.
		fakeBundle(ten, src, aDst, 0, wire.FlagMore, 10, 0, bundle.AppendHead(nil, good, 1<<30, []byte("big"))),
		fakeCredit(ten, src, aDst, 0, 0, []byte{1, 2, 3}),                                       // short credit
		fakeCredit(ten, src, aDst, 0, 0, bundle.Credit{Session: 12345, Limit: 8}.AppendTo(nil)), // stale credit
	)
	send(client.Addr(),
		junk,
		fakeBundle(ten, src, aDst, 0, 0, 1, 0, nil), // an agent endpoint at a client
		fakeBundle(ten, src, cDst, 0, 0, 2, 0, cat(
			bundle.AppendRecord(nil, other, []byte("not mine")), bundle.AppendRecord(nil, mine, payload(5001, 1, mine, 30)))),
	)
	deadline := time.Now().Add(5 * time.Second)
	want := DropStats{Malformed: 4, WrongTenant: 1, WrongDest: 2, BadBundle: 5, OutOfWindow: 1, UnknownRank: 2, Oversize: 1, BadCredit: 1, StaleCredit: 1}
	wantClient := DropStats{Malformed: 1, WrongDest: 1, UnknownRank: 1}
	for {
		got, gotClient := agent.Stats().Drops, client.Stats().Drops
		if got == want && gotClient == wantClient && tc.sinks[1][0].count.Load() == 1 && tc.sinks[0][0].count.Load() == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent drops\n got %+v\nwant %+v\nclient drops\n got %+v\nwant %+v\ndelivered %d and %d, want 1 and 1",
				got, want, gotClient, wantClient, tc.sinks[1][0].count.Load(), tc.sinks[0][0].count.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, sk := range []*sink{tc.sinks[1][0], tc.sinks[0][0]} {
		sk.mu.Lock()
		if len(sk.bad) > 0 {
			t.Errorf("bad delivery: %v", sk.bad)
		}
		sk.got = map[msgID]int{}
		sk.count.Store(0)
		sk.mu.Unlock()
	}
	// Sending to an unknown rank is an error at the client, and counted.
	if err := client.Send(999999, []byte("x")); err == nil {
		t.Error("Send to an unknown rank succeeded")
	}
	if d := client.Stats().Drops.UnknownRank; d != 2 {
		t.Errorf("client unknown-rank drops %d, want 2", d)
	}

	// Real traffic through a flood of junk at every agent and client.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	cs, _ := tc.all()
	targets := []netip.AddrPort{}
	for _, a := range tc.agents {
		targets = append(targets, a.Addr())
	}
	for _, c := range cs {
		targets = append(targets, c.Addr())
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(1, 1))
		for ctx.Err() == nil {
			var pkts []transport.Packet
			for _, to := range targets {
				d := make([]byte, 24+rng.IntN(200))
				for i := range d {
					d[i] = byte(rng.Uint32())
				}
				if rng.IntN(2) == 0 { // a plausible header over garbage records
					wire.Header{Version: 1, Type: wire.TypeBundle, Tenant: ten, Src: rng.Uint32(), Dst: aDst, Seq: rng.Uint32N(4)}.AppendTo(d[:0], d[24:])
				}
				pkts = append(pkts, transport.Packet{Addr: to, Data: d})
			}
			_, _ = transport.SendAll(raw, pkts, nil)
			time.Sleep(200 * time.Microsecond)
		}
	}()
	exchange(t, tc, 600, 2, 3000, 11)
	cancel()
	wg.Wait()
	var total uint64
	for _, a := range tc.agents {
		total += a.Stats().Drops.Total()
	}
	for _, c := range cs {
		total += c.Stats().Drops.Total()
	}
	t.Logf("%d junk datagrams or messages dropped", total)
}

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}
