package messaging

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestBackpressure: a receiver that does not read makes the whole path
// fill up and then the senders wait, with a bounded number of messages in
// between; when it reads again everything arrives exactly once. Nothing is
// dropped and nothing deadlocks.
func TestBackpressure(t *testing.T) {
	const senders, perSender, size = 4, 1500, 256
	tc := startCluster(t, spec{mode: ModeDPU, nodes: 2, clientsPerNode: 2, ranksPerClient: 2,
		tune: func(c *Config) {
			c.TransferSize = 1024 // 3 messages a bundle
			c.BuffersPerDest = 2
		}})
	recv := tc.clients[1][0]
	ranks := recv.Ranks().All()
	var sent atomic.Int64
	var wg sync.WaitGroup
	for g := range senders {
		src := tc.clients[0][g%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perSender {
				r := ranks[i%len(ranks)]
				if err := src.Send(r, payload(uint32(g), uint32(i), r, size)); err != nil {
					t.Error(err)
					return
				}
				sent.Add(1)
			}
		}()
	}

	// Nobody reads: the senders must stall.
	var last int64
	deadline := time.Now().Add(10 * time.Second)
	for {
		time.Sleep(100 * time.Millisecond)
		now := sent.Load()
		if now == last {
			break
		}
		last = now
		if time.Now().After(deadline) {
			t.Fatalf("senders never stalled: %d sent", now)
		}
	}
	// Each of the 8 links on the way holds at most 2 bundles at the
	// sender and 2 at the receiver (3 messages each), plus what the
	// agents and the senders are in the middle of.
	if last >= senders*perSender || last > 400 {
		t.Fatalf("%d of %d messages were accepted with nobody reading", last, senders*perSender)
	}
	// TrySend goes to whichever shard is free; once that one is full too
	// it reports ErrWouldBlock instead of waiting.
	extra := 0
	for ; extra < 100; extra++ {
		err := tc.clients[0][0].TrySend(ranks[0], payload(senders, uint32(extra), ranks[0], size))
		if errors.Is(err, ErrWouldBlock) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if extra == 100 {
		t.Errorf("TrySend never reported ErrWouldBlock while the path was stalled")
	}
	var blocked uint64
	for _, row := range tc.clients[:1] {
		for _, c := range row {
			blocked += c.Stats().Sent().Blocked
		}
	}
	var agentBlocked uint64
	for _, a := range tc.agents {
		agentBlocked += a.Stats().Sent().Blocked
	}
	if blocked == 0 || agentBlocked == 0 {
		t.Errorf("blocked counters: senders %d, agents %d; want both > 0", blocked, agentBlocked)
	}
	t.Logf("stalled at %d messages; senders blocked %d times, agents' blocklists %d times", last, blocked, agentBlocked)

	// Read everything.
	sk := tc.sinks[1][0]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rwg sync.WaitGroup
	rwg.Add(1)
	go recvInto(ctx, recv, sk, &rwg)
	wg.Wait()
	waitCount(t, []*sink{sk}, int64(senders*perSender+extra), 20*time.Second)
	cancel()
	rwg.Wait()
	sk.mu.Lock()
	defer sk.mu.Unlock()
	for _, b := range sk.bad {
		t.Error(b)
	}
	for g := range senders + 1 {
		n := perSender
		if g == senders {
			n = extra
		}
		for i := range n {
			if c := sk.got[msgID{uint32(g), uint32(i)}]; c != 1 {
				t.Fatalf("message %d/%d arrived %d times", g, i, c)
			}
		}
	}
	tc.noDrops(t)
}

// TestSlowHandler: a receiver whose handler is slow keeps up at its own
// pace; the sender waits, nothing is lost.
func TestSlowHandler(t *testing.T) {
	var handled atomic.Int64
	tc := startCluster(t, spec{mode: ModeHost, nodes: 2, clientsPerNode: 1, ranksPerClient: 1, handler: true,
		tune: func(c *Config) {
			c.TransferSize = 512
			c.BuffersPerDest = 1
		},
		slow: func(node, client int) {
			if node == 1 && handled.Add(1)%50 == 0 {
				time.Sleep(time.Millisecond)
			}
		}})
	src := tc.clients[0][0]
	rank := tc.cfg.Nodes[1].Clients[0].Ranks[0].Lo
	const n = 3000
	start := time.Now()
	for i := range n {
		if err := src.Send(rank, payload(0, uint32(i), rank, 100)); err != nil {
			t.Fatal(err)
		}
	}
	sendTime := time.Since(start)
	waitCount(t, tc.sinks[1], n, 20*time.Second)
	t.Logf("sending took %v, delivery %v; sender blocked %d times", sendTime, time.Since(start), src.Stats().Sent().Blocked)
	if src.Stats().Sent().Blocked == 0 {
		t.Errorf("the sender never waited")
	}
	sk := tc.sinks[1][0]
	sk.mu.Lock()
	for i := range n {
		if c := sk.got[msgID{0, uint32(i)}]; c != 1 {
			t.Errorf("message %d arrived %d times", i, c)
		}
	}
	sk.mu.Unlock()
	tc.noDrops(t)
}

// TestHandlerReplies: a handler that answers every request with Send (a
// request/response pattern across agents) neither deadlocks nor loses a
// message while both directions are loaded.
func TestHandlerReplies(t *testing.T) {
	const n = 2000
	replies := newLevel()
	cfg := func(c *Config) {
		c.TransferSize = 1024
		c.BuffersPerDest = 2
	}
	tc := startCluster(t, spec{mode: ModeDPU, nodes: 2, clientsPerNode: 1, ranksPerClient: 1, tune: cfg})
	// Rebuild the two clients with handlers: node1 answers, node0 counts.
	for _, row := range tc.clients {
		_ = row[0].Close()
	}
	reqRank, repRank := tc.cfg.Nodes[1].Clients[0].Ranks[0].Lo, tc.cfg.Nodes[0].Clients[0].Ranks[0].Lo
	var srv atomic.Pointer[Client]
	server, err := NewClient(tc.cfg, "node1", "c0", ClientOptions{Handler: func(_ uint32, p []byte) {
		if err := srv.Load().Send(repRank, p); err != nil && !errors.Is(err, ErrClosed) {
			t.Error(err)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	srv.Store(server)
	client, err := NewClient(tc.cfg, "node0", "c0", ClientOptions{Handler: func(uint32, []byte) { replies.add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	tc.clients[1][0], tc.clients[0][0] = server, client
	for i := range n {
		if err := client.Send(reqRank, payload(0, uint32(i), reqRank, 200)); err != nil {
			t.Fatal(err)
		}
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer wcancel()
	if !replies.wait(wctx, n) {
		t.Fatalf("%d of %d replies", replies.load(), n)
	}
	tc.noDrops(t)
}
