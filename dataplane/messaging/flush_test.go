package messaging

import (
	"context"
	"sync"
	"testing"
	"time"
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
