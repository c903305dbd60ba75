package messaging

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging/bundle"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/memnet"
)

// localEnv is a cluster for the local-delivery tests: two nodes with one
// client of one rank each (rank n on node n), on memnet, one sender shard
// (a goroutine's sends go down one link, in order), 512-byte bundles and 2
// buffers per destination (a local link of 4 bundles). Its handler records
// every message per rank in arrival order and, while held, waits before
// each message. With manual set, the clock moves only when the test
// advances it: no flush timer fires by itself.
type localEnv struct {
	tc      *testCluster
	clk     *manualClock
	hold    atomic.Pointer[chan struct{}] // while set, the handler waits for it to close
	entered chan struct{}                 // signalled when a held handler starts waiting
	count   *level

	mu  sync.Mutex
	got [2][][]byte // by rank
}

const (
	localTSize = 512
	localBufs  = 2
)

func newLocalEnv(t *testing.T, mode Mode, manual bool) *localEnv {
	t.Helper()
	e := &localEnv{entered: make(chan struct{}, 1), count: newLevel()}
	sp := spec{mode: mode, nodes: 2, clientsPerNode: 1, ranksPerClient: 1, workers: 1, handler: true,
		mem: memnet.New(memnet.Options{}),
		tune: func(c *Config) {
			c.TransferSize = localTSize
			c.BuffersPerDest = localBufs
			c.SenderShards = 1
			c.MaxMessageSize = 8 << 10
		},
		onMsg: func(rank uint32, p []byte) {
			if ch := e.hold.Load(); ch != nil {
				select {
				case e.entered <- struct{}{}:
				default:
				}
				<-*ch
			}
			e.mu.Lock()
			e.got[rank] = append(e.got[rank], bytes.Clone(p))
			e.mu.Unlock()
			e.count.add(1)
		}}
	if manual {
		e.clk = newManualClock()
		sp.clock = e.clk
	}
	e.tc = startCluster(t, sp)
	return e
}

// held makes the handler wait from its next message on; the returned
// function releases it, as the test's cleanup does (before the cluster
// stops, which waits for the handler) if the test fails first.
func (e *localEnv) held(t *testing.T) (release func()) {
	ch := make(chan struct{})
	e.hold.Store(&ch)
	var once sync.Once
	release = func() {
		once.Do(func() {
			e.hold.Store(nil)
			close(ch)
		})
	}
	t.Cleanup(release)
	return release
}

// waitEntered waits until the held handler has a message.
func (e *localEnv) waitEntered(t *testing.T) {
	t.Helper()
	select {
	case <-e.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the held handler got no message")
	}
}

// waitFor waits until n messages were handled in all.
func (e *localEnv) waitFor(t *testing.T, n int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if !e.count.wait(ctx, n) {
		t.Fatalf("%d of %d messages handled", e.count.load(), n)
	}
}

// checkInOrder checks that rank received exactly the messages payload(0,
// i, rank, sizes[i]) for i in order.
func (e *localEnv) checkInOrder(t *testing.T, rank uint32, sizes []int) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	got := e.got[rank]
	if len(got) != len(sizes) {
		t.Fatalf("rank %d: %d messages, want %d", rank, len(got), len(sizes))
	}
	for i, size := range sizes {
		if want := payload(0, uint32(i), rank, size); !bytes.Equal(got[i], want) {
			seq := uint32(0xffffffff)
			if len(got[i]) >= 8 {
				seq = binary.BigEndian.Uint32(got[i][4:])
			}
			t.Fatalf("rank %d: message %d is %d bytes, seq %d; want message %d, %d bytes", rank, i, len(got[i]), seq, i, size)
		}
	}
}

// checkLocalCounts checks the sender's (node 0's) counters once every
// message was handled: local messages sent and delivered in memory, remote
// ones through the next hop, nothing dropped. The consumer counts a
// bundle's messages delivered once it has finished the bundle, just after
// the handler returns from its last message: they are waited for.
func checkLocalCounts(t *testing.T, c *Client, local, remote uint64) {
	t.Helper()
	eventually(t, 10*time.Second, "the last local bundle counted delivered", func() bool { return c.Stats().Received.Delivered >= local })
	st := c.Stats()
	if st.Local.Messages != local || st.Received.Local != local || st.Received.Delivered != local || st.Received.Messages != local {
		t.Errorf("local: %d sent, %d received locally, %d delivered, %d received in all; want %d each",
			st.Local.Messages, st.Received.Local, st.Received.Delivered, st.Received.Messages, local)
	}
	if st.Received.Bundles != 0 {
		t.Errorf("%d bundles came from the network, want none: every message for the client's rank is local", st.Received.Bundles)
	}
	if sent := st.Sent().Messages; sent != remote {
		t.Errorf("%d messages sent to next hops, want %d", sent, remote)
	}
	if st.Drops.Total() != 0 {
		t.Errorf("drops: %+v", st.Drops)
	}
}

// perLocalBundle is how many messages of size bytes a bundle holds.
func perLocalBundle(size int) int {
	return (localTSize - bundle.Overhead) / (bundle.RecordHeaderLen + size)
}

// fillLocal TrySends size-byte messages to rank 0 until ErrWouldBlock and
// returns their sizes.
func fillLocal(t *testing.T, c *Client, size int) []int {
	t.Helper()
	var sizes []int
	for i := range 10000 {
		err := c.TrySend(0, payload(0, uint32(i), 0, size))
		if errors.Is(err, ErrWouldBlock) {
			return sizes
		}
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, size)
	}
	t.Fatal("TrySend never reported ErrWouldBlock while the handler was held")
	return nil
}

// TestLocalDelivery: messages a client sends to its own ranks are delivered
// in memory, on its delivery goroutine, with the guarantees of the network
// path: order per link, messages larger than a bundle, back-pressure from a
// slow handler (TrySend: ErrWouldBlock, Send waits), Flush, Close without
// loss, and counters that add up. Before, they went out as datagrams (to
// itself in ModeNone, through the agent otherwise): the sender received
// them as bundles, and they counted as sent to the next hop.
func TestLocalDelivery(t *testing.T) {
	const small = 100
	tests := []struct {
		name   string
		manual bool
		run    func(t *testing.T, e *localEnv)
	}{
		{"order and large messages beside remote ones", false, func(t *testing.T, e *localEnv) {
			src := e.tc.clients[0][0]
			var local, remote []int
			for i := range 300 {
				size := []int{1, 16, small, 200, 3*localTSize + 7, 40, 1200}[i%7]
				rank := uint32(i % 3 % 2) // two of every three to rank 0, the client's own
				seq := len(local)
				if rank == 1 {
					seq = len(remote)
				}
				if err := src.Send(rank, payload(0, uint32(seq), rank, size)); err != nil {
					t.Fatal(err)
				}
				if rank == 0 {
					local = append(local, size)
				} else {
					remote = append(remote, size)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := src.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			e.waitFor(t, int64(len(local)+len(remote)))
			e.checkInOrder(t, 0, local)
			e.checkInOrder(t, 1, remote)
			checkLocalCounts(t, src, uint64(len(local)), uint64(len(remote)))
			st := src.Stats()
			if f := st.Local.Flushes; f.Full == 0 || st.Local.Bundles == 0 {
				t.Errorf("local: %d bundles, flushes %+v; want full ones", st.Local.Bundles, f)
			}
		}},
		{"slow handler: TrySend would block, Send waits", true, func(t *testing.T, e *localEnv) {
			src := e.tc.clients[0][0]
			release := e.held(t)
			sizes := fillLocal(t, src, small)
			// The handler holds the first bundle's first message, so every
			// buffer of the local link is out: exactly a window of bundles.
			if want := localWindowFactor * localBufs * perLocalBundle(small); len(sizes) != want {
				t.Errorf("%d messages taken before ErrWouldBlock, want %d (%d bundles)", len(sizes), want, localWindowFactor*localBufs)
			}
			e.waitEntered(t)
			done := make(chan error, 1)
			go func() { done <- src.Send(0, payload(0, uint32(len(sizes)), 0, small)) }()
			eventually(t, 10*time.Second, "a Send waiting for a local buffer", func() bool { return src.Stats().Local.Blocked == 1 })
			select {
			case err := <-done:
				t.Fatalf("Send returned %v while every local buffer was held", err)
			default:
			}
			release()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			sizes = append(sizes, small)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := src.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			e.waitFor(t, int64(len(sizes)))
			e.checkInOrder(t, 0, sizes)
			checkLocalCounts(t, src, uint64(len(sizes)), 0)
		}},
		{"Flush hands partial bundles over without waiting for the handler; idle flush", true, func(t *testing.T, e *localEnv) {
			src := e.tc.clients[0][0]
			release := e.held(t)
			sizes := []int{small, small, small}
			for i, size := range sizes {
				if err := src.Send(0, payload(0, uint32(i), 0, size)); err != nil {
					t.Fatal(err)
				}
			}
			if st := src.Stats().Local; st.Bundles != 0 {
				t.Fatalf("%d local bundles before Flush with the clock stopped, want 0", st.Bundles)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := src.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if st := src.Stats().Local; st.Bundles != 1 || st.Flushes.Explicit != 1 || st.Messages != 3 {
				t.Errorf("after Flush: %d local bundles of %d messages, flushes %+v; want one explicit bundle of 3", st.Bundles, st.Messages, st.Flushes)
			}
			e.waitEntered(t) // the handler has the first message, and holds it
			release()
			e.waitFor(t, 3)
			if err := src.Send(0, payload(0, 3, 0, small)); err != nil {
				t.Fatal(err)
			}
			sizes = append(sizes, small)
			e.clk.advanceUntil(t, time.Duration(e.tc.cfg.IdleTimeout), 100, "an idle flush of the local link", func() bool { return e.count.load() == 4 })
			e.checkInOrder(t, 0, sizes)
			if f := src.Stats().Local.Flushes; f.Idle != 1 {
				t.Errorf("local flushes %+v, want one idle", f)
			}
			checkLocalCounts(t, src, 4, 0)
		}},
		{"Close delivers what is queued", true, func(t *testing.T, e *localEnv) {
			src := e.tc.clients[0][0]
			release := e.held(t)
			sizes := fillLocal(t, src, small)
			e.waitEntered(t)
			closed := make(chan error, 1)
			go func() { closed <- src.Close() }()
			release()
			if err := <-closed; err != nil {
				t.Fatalf("Close: %v", err)
			}
			// Close waited for the handler: everything is there now.
			if n := e.count.load(); n != int64(len(sizes)) {
				t.Fatalf("%d of %d local messages handled when Close returned", n, len(sizes))
			}
			e.checkInOrder(t, 0, sizes)
			checkLocalCounts(t, src, uint64(len(sizes)), 0)
		}},
	}
	for _, tt := range tests {
		for _, mode := range []Mode{ModeNone, ModeHost, ModeDPU} {
			t.Run(fmt.Sprintf("%s/%s", tt.name, mode), func(t *testing.T) {
				tt.run(t, newLocalEnv(t, mode, tt.manual))
			})
		}
	}
}

// TestLocalRecv: without a Handler, Recv returns local messages in order,
// a message larger than a bundle among them, none of them through the
// network.
func TestLocalRecv(t *testing.T) {
	tc := startCluster(t, spec{mode: ModeNone, nodes: 1, clientsPerNode: 1, ranksPerClient: 2, mem: memnet.New(memnet.Options{}),
		tune: func(c *Config) { c.TransferSize = localTSize; c.SenderShards = 1 }})
	c := tc.clients[0][0]
	sizes := []int{10, 3 * localTSize, 20}
	for i, size := range sizes {
		if err := c.Send(uint32(i%2), payload(0, uint32(i), uint32(i%2), size)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for i, size := range sizes {
		m, err := c.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if want := payload(0, uint32(i), uint32(i%2), size); m.Rank != uint32(i%2) || !bytes.Equal(m.Payload, want) {
			t.Fatalf("message %d: rank %d, %d bytes; want rank %d, %d bytes", i, m.Rank, len(m.Payload), i%2, size)
		}
	}
	// Recv counts a message delivered as it returns it, although the
	// last bundle is not finished.
	if st := c.Stats(); st.Local.Messages != 3 || st.Received.Delivered != 3 || st.Received.Local != 3 ||
		st.Received.Bundles != 0 || st.Sent().Messages != 0 || st.Drops.Total() != 0 {
		t.Errorf("local: %d messages sent, %d delivered (%d local), %d bundles from the network, %d messages to next hops, drops %+v; "+
			"want 3, 3 (3), 0, 0, none",
			st.Local.Messages, st.Received.Delivered, st.Received.Local, st.Received.Bundles, st.Sent().Messages, st.Drops)
	}
}

// TestSendAfterCloseFlushed: a Send that passed the closed check before
// Close began, and gets its shard only after Close set closed, returns
// ErrClosed and writes nothing. Close flushes each shard under its lock
// after setting closed, so the Send would otherwise write into a buffer
// that Close may already have flushed and counted: a message accepted
// (nil) and never sent or counted.
func TestSendAfterCloseFlushed(t *testing.T) {
	tc := startCluster(t, spec{mode: ModeNone, nodes: 1, clientsPerNode: 1, ranksPerClient: 2, mem: memnet.New(memnet.Options{}),
		tune: func(c *Config) { c.TransferSize = localTSize; c.SenderShards = 1 }})
	c := tc.clients[0][0]
	s := c.shards[0]
	s.mu.Lock()
	errc := make(chan error, 1)
	go func() { errc <- c.Send(0, []byte("late")) }()
	// Wait until the Send waits for the shard, past its first check.
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 1<<20)
	for !strings.Contains(string(buf[:runtime.Stack(buf, true)]), "messaging.(*Client).pick") {
		if time.Now().After(deadline) {
			s.mu.Unlock()
			t.Fatal("the Send never reached pick")
		}
		runtime.Gosched()
	}
	c.closed.Store(true) // Close's first step, then it waits for the shard
	s.mu.Unlock()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("Send after closed was set: %v, want ErrClosed", err)
	}
	for _, l := range s.links {
		if l != nil && l.cur != nil && l.cur.msgs != 0 {
			t.Errorf("the Send wrote %d message(s) after closed was set", l.cur.msgs)
		}
	}
}
