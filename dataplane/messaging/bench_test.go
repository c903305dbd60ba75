package messaging

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkMessages measures delivered messages per second for 16- and
// 64-byte messages: through the client library and a host agent (client →
// agent → client, one node), client to client without an agent (ModeNone),
// and the baseline measured in the same run, one UDP datagram per message
// (sendto, recvfrom). The parent logs each path's rate as a multiple of the
// baseline's.
//
//	go test -run '^$' -bench BenchmarkMessages -benchtime 2000000x ./dataplane/messaging/
func BenchmarkMessages(b *testing.B) {
	rates := map[string]float64{}
	for _, size := range []int{16, 64} {
		for _, path := range []string{"udp-per-message", "client-agent-client", "client-client"} {
			name := fmt.Sprintf("size=%d/%s", size, path)
			b.Run(name, func(b *testing.B) {
				var rate float64
				switch path {
				case "udp-per-message":
					rate = benchUDP(b, size)
				case "client-agent-client":
					rate = benchClient(b, ModeHost, size)
				case "client-client":
					rate = benchClient(b, ModeNone, size)
				}
				rates[name] = rate
			})
		}
	}
	names := make([]string, 0, len(rates))
	for n := range rates {
		names = append(names, n)
	}
	sort.Strings(names)
	b.Logf("%-32s %14s %10s", "path", "msgs/s", "× baseline")
	for _, n := range names {
		var size int
		_, _ = fmt.Sscanf(n, "size=%d/", &size)
		base := rates[fmt.Sprintf("size=%d/udp-per-message", size)]
		if base > 0 {
			b.Logf("%-32s %14.0f %10.1f", n, rates[n], rates[n]/base)
		}
	}
}

// benchUDP sends b.N datagrams of size bytes, one per message, and counts
// what arrives. Loopback drops datagrams when the receiver falls behind;
// the rate counts delivered ones, and the loss is reported.
func benchUDP(b *testing.B, size int) float64 {
	rx, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		b.Fatal(err)
	}
	defer rx.Close()
	_ = rx.SetReadBuffer(4 << 20)
	tx, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Close()
	to := rx.LocalAddr().(*net.UDPAddr).AddrPort()
	var got atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			if _, _, err := rx.ReadFromUDPAddrPort(buf); err != nil {
				return
			}
			got.Add(1)
		}
	}()
	msg := make([]byte, size)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		if _, err := tx.WriteToUDPAddrPort(msg, to); err != nil {
			b.Fatal(err)
		}
	}
	// Wait for the receiver to drain: until all arrived, or nothing more
	// arrives for 50ms.
	last, lastAt := got.Load(), time.Now()
	for got.Load() < int64(b.N) && time.Since(lastAt) < 50*time.Millisecond {
		time.Sleep(100 * time.Microsecond)
		if n := got.Load(); n != last {
			last, lastAt = n, time.Now()
		}
	}
	el := time.Since(start)
	if got.Load() < int64(b.N) {
		el -= time.Since(lastAt) // do not charge the wait for datagrams that were lost
	}
	b.StopTimer()
	_ = rx.Close()
	<-done
	n := got.Load()
	rate := float64(n) / el.Seconds()
	b.ReportMetric(rate, "msgs/s")
	b.ReportMetric(100*float64(int64(b.N)-n)/float64(b.N), "%lost")
	return rate
}

// benchClient sends b.N messages from one client goroutine to a rank of
// another client on the same node, through the node's agent (ModeHost) or
// straight (ModeNone), and waits until all were delivered.
func benchClient(b *testing.B, mode Mode, size int) float64 {
	var got atomic.Int64
	all := make(chan struct{})
	want := int64(b.N)
	tc := startCluster(b, spec{mode: mode, nodes: 1, clientsPerNode: 2, ranksPerClient: 1, workers: 1, handler: true,
		tune: func(c *Config) {
			c.SenderShards = 1
			c.SocketBuffer = 4 << 20
		},
		onMsg: func(uint32, []byte) {
			if got.Add(1) == want {
				close(all)
			}
		}})
	src := tc.clients[0][0]
	rank := tc.cfg.Nodes[0].Clients[1].Ranks[0].Lo
	msg := make([]byte, size)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		if err := src.Send(rank, msg); err != nil {
			b.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := src.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	select {
	case <-all:
	case <-ctx.Done():
		b.Fatalf("%d of %d messages delivered", got.Load(), b.N)
	}
	el := time.Since(start)
	b.StopTimer()
	rate := float64(b.N) / el.Seconds()
	b.ReportMetric(rate, "msgs/s")
	if testing.Verbose() {
		for _, a := range tc.agents {
			b.Logf("agent %+v", a.Stats())
		}
		b.Logf("src %+v", src.Stats())
		b.Logf("dst %+v", tc.clients[0][1].Stats())
	}
	st := src.Stats().Sent()
	if st.Bundles > 0 {
		b.ReportMetric(st.AvgBundleBytes, "B/bundle")
	}
	return rate
}
