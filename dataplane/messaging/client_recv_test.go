package messaging

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/transport/memnet"
)

// TestRecvAfterClose: a client that delivers through Recv and closes with
// messages still queued (bundles from a remote client, which it has
// acknowledged, and its own local bundles, the last of them flushed by
// Close) keeps returning them from Recv, in order, a partly read bundle
// included, and returns ErrClosed only once the queue is empty. Concurrent
// readers each get different messages. Delivered and Messages count every
// message Recv returned, as it returns it, and nothing it has not. Before,
// Recv could return ErrClosed at once with the messages still queued (the
// consumer lock's select, and next's, took the closed context first), and
// the counters moved a bundle at a time.
func TestRecvAfterClose(t *testing.T) {
	// Both within one window: the remote sender's Flush and the local
	// TrySends must not wait for a Recv. 700 and 600 bytes are larger than
	// a 512-byte bundle.
	remote := []int{40, 700, 30, 50, 100, 16}
	local := []int{20, 40, 600, 18, 300, 16, 64}
	tests := []struct {
		name    string
		before  int // messages read before Close: 2 leaves a bundle partly read
		readers int
	}{
		{name: "none read", before: 0, readers: 1},
		{name: "partly read", before: 2, readers: 1},
		{name: "two readers", before: 0, readers: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tc := startCluster(t, spec{mode: ModeNone, nodes: 2, clientsPerNode: 1, ranksPerClient: 1, workers: 1,
				mem: memnet.New(memnet.Options{}), clock: newManualClock(), // no flush timer: Close flushes the last local bundle
				tune: func(c *Config) {
					c.TransferSize = localTSize
					c.BuffersPerDest = 4
					c.SenderShards = 1
					c.MaxMessageSize = 8 << 10
				}})
			c, peer := tc.clients[0][0], tc.clients[1][0] // ranks 0 and 1
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()

			// want lists the messages in the order Recv returns them: the
			// remote ones were queued (and acknowledged) before the first
			// local bundle was.
			var want [][]byte
			for i, size := range remote {
				p := payload(1, uint32(i), 0, size)
				want = append(want, p)
				if err := peer.Send(0, p); err != nil {
					t.Fatal(err)
				}
			}
			if err := peer.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			for i, size := range local {
				p := payload(0, uint32(i), 0, size)
				want = append(want, p)
				if err := c.TrySend(0, p); err != nil {
					t.Fatalf("local message %d: %v", i, err)
				}
			}

			// check checks that message m is want[i] and that the counters
			// count exactly the i+1 messages returned so far.
			check := func(i int, m Message) {
				t.Helper()
				if m.Rank != 0 || !bytes.Equal(m.Payload, want[i]) {
					t.Errorf("message %d: rank %d, %d bytes, src %d seq %d; want rank 0, %d bytes, %x",
						i, m.Rank, len(m.Payload), id(m.Payload)[0], id(m.Payload)[1], len(want[i]), want[i][:8])
				}
			}
			counts := func(n int) {
				t.Helper()
				st := c.Stats().Received
				nl := uint64(max(0, n-len(remote)))
				if st.Delivered != uint64(n) || st.Messages != uint64(n) || st.Local != nl {
					t.Errorf("after %d messages: delivered %d, messages %d, local %d; want %d, %d, %d",
						n, st.Delivered, st.Messages, st.Local, n, n, nl)
				}
			}
			for i := range tt.before {
				m, err := c.Recv(ctx)
				if err != nil {
					t.Fatal(err)
				}
				check(i, m)
				counts(i + 1)
			}
			if err := c.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			counts(tt.before) // queued is not delivered

			// Each reader reads until ErrClosed; a message's index in want
			// is where the reader found it.
			got := make([][]int, tt.readers)
			errs := make([]error, tt.readers)
			var wg sync.WaitGroup
			for r := range tt.readers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						m, err := c.Recv(ctx)
						if err != nil {
							errs[r] = err
							return
						}
						got[r] = append(got[r], indexOf(want, m.Payload))
						if tt.readers == 1 {
							n := tt.before + len(got[r])
							check(n-1, m)
							counts(n)
						}
					}
				}()
			}
			wg.Wait()
			seen := make([]int, len(want))
			for r := range tt.readers {
				if !errors.Is(errs[r], ErrClosed) {
					t.Errorf("reader %d ended with %v, want ErrClosed", r, errs[r])
				}
				for k, i := range got[r] {
					if i < 0 {
						t.Errorf("reader %d: message %d is none of those sent", r, k)
						continue
					}
					seen[i]++
					if k > 0 && i <= got[r][k-1] {
						t.Errorf("reader %d: message %d after message %d: out of order", r, i, got[r][k-1])
					}
				}
			}
			for i, n := range seen {
				w := 1 // once after Close, or not at all if read before
				if i < tt.before {
					w = 0
				}
				if n != w {
					t.Errorf("message %d (src %d seq %d) returned %d times after Close, want %d", i, id(want[i])[0], id(want[i])[1], n, w)
				}
			}
			counts(len(want))
			if _, err := c.Recv(ctx); !errors.Is(err, ErrClosed) {
				t.Errorf("Recv after the queue emptied: %v, want ErrClosed", err)
			}
			if st := c.Stats(); st.Drops.Total() != 0 || st.Local.Messages != uint64(len(local)) {
				t.Errorf("drops %+v, %d local messages sent; want none, %d", st.Drops, st.Local.Messages, len(local))
			}
		})
	}
}

// id returns the sender and sequence number a payload carries.
func id(p []byte) [2]uint32 {
	if len(p) < 8 {
		return [2]uint32{0xffffffff, 0xffffffff}
	}
	return [2]uint32{binary.BigEndian.Uint32(p), binary.BigEndian.Uint32(p[4:])}
}

// indexOf returns the index of p in ps, -1 if it is not there.
func indexOf(ps [][]byte, p []byte) int {
	for i, q := range ps {
		if bytes.Equal(q, p) {
			return i
		}
	}
	return -1
}
