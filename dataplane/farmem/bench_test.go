package farmem

import (
	"context"
	"net/netip"
	"testing"
)

// BenchmarkChunks moves 64 KiB chunks between a host client and a memory
// node over kernel UDP on loopback with 8972-byte datagrams, straight to
// the node (the text's server-only baseline) and through a DPU agent, with
// 16 requests in flight. Compare the two in one run:
//
//	go test -run='^$' -bench=Chunks -benchtime=2000x ./dataplane/farmem/
func BenchmarkChunks(b *testing.B) {
	for _, via := range []string{"direct", "agent"} {
		for _, op := range []string{"read", "write"} {
			b.Run(via+"/"+op, func(b *testing.B) {
				srv, _ := startServer(b, b.TempDir(), listen(b, loopback))
				addr := srv.Addr()
				var agent *Agent
				if via == "agent" {
					agent, _ = startAgent(b, listen(b, loopback), []netip.AddrPort{addr}, nil)
					addr = agent.Addr()
				}
				c := newClient(b, addr, 1)
				r, err := c.Alloc(context.Background(), 16<<20)
				if err != nil {
					b.Fatal(err)
				}
				const chunk = 64 << 10
				b.SetBytes(chunk)
				b.SetParallelism(16)
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
				b.ReportMetric(float64(st.Link.Retransmits), "retransmits")
				if agent != nil {
					b.ReportMetric(agent.Stats().AvgBatch, "req/batch")
				}
			})
		}
	}
}
