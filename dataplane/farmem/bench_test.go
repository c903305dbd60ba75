package farmem

import (
	"context"
	"net/netip"
	"os"
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
)

// BenchmarkChunks moves 64 KiB chunks between a host client and a memory
// node over kernel UDP with 8972-byte datagrams, 16 requests in flight:
// straight to the node (the text's server-only baseline) and through a DPU
// agent, on loopback and, as root, with the memory node in another network
// namespace behind a 9000-MTU veth pair (client and agent stay together, as
// a host and its DPU share a card). Compare the rows of one run:
//
//	go test -run='^$' -bench=Chunks -benchtime=2000x ./dataplane/farmem/
func BenchmarkChunks(b *testing.B) {
	nets := []string{"loopback"}
	if os.Geteuid() == 0 {
		nets = append(nets, "veth")
	}
	for _, nw := range nets {
		for _, via := range []string{"direct", "agent"} {
			for _, op := range []string{"read", "write"} {
				b.Run(nw+"/"+via+"/"+op, func(b *testing.B) {
					benchChunks(b, nw, via, op)
				})
			}
		}
	}
}

func benchChunks(b *testing.B, nw, via, op string) {
	var srvTr, agentHost, agentFab, clientTr transport.Transport
	if nw == "veth" {
		open := vethPair(b)
		srvTr = open(1, netip.AddrPort{}, 4<<20)
		agentHost = open(0, netip.MustParseAddrPort("127.0.0.1:0"), 4<<20)
		agentFab = open(0, netip.AddrPort{}, 4<<20)
		if via == "direct" {
			clientTr = open(0, netip.AddrPort{}, 4<<20)
		} else {
			clientTr = open(0, netip.MustParseAddrPort("127.0.0.1:0"), 4<<20)
		}
	} else {
		srvTr, agentHost, agentFab, clientTr = listen(b, loopback), listen(b, loopback), listen(b, loopback), listen(b, loopback)
	}
	srv, _ := startServer(b, b.TempDir(), srvTr)
	addr := srv.Addr()
	var agent *Agent
	if via == "agent" {
		var err error
		agent, err = NewAgent(AgentConfig{Config: testConfig(), Servers: []ServerSpec{{Addr: addr}}},
			AgentOptions{HostTransports: []transport.Transport{agentHost}, FabricTransports: []transport.Transport{agentFab}})
		if err != nil {
			b.Fatal(err)
		}
		run(b, agent.Run)
		addr = agent.Addr()
	} else {
		_ = agentHost.Close()
		_ = agentFab.Close()
	}
	c, err := NewClient(ClientOptions{Config: testConfig(), Server: addr, Tenant: 1, Transport: clientTr})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	r, err := c.Alloc(context.Background(), 16<<20)
	if err != nil {
		b.Fatal(err)
	}
	const chunk = 64 << 10
	b.SetBytes(chunk)
	b.SetParallelism(8) // × GOMAXPROCS goroutines, one chunk in flight each
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		p := make([]byte, chunk)
		i := 0
		for pb.Next() {
			off := int64(i%256) * chunk
			i++
			var err error
			if op == "read" {
				_, err = r.ReadAt(p, off)
			} else {
				_, err = r.WriteAt(p, off)
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	st := c.Stats()
	b.ReportMetric(st.Latency.P50us, "p50-µs")
	b.ReportMetric(st.Latency.P99us, "p99-µs")
	retrans := st.Link.Retransmits
	if agent != nil {
		as := agent.Stats()
		b.ReportMetric(as.AvgBatch, "req/batch")
		retrans += as.Fabric.Retransmits
	}
	b.ReportMetric(float64(retrans)/float64(b.N), "retrans/op")
}
