package farmem

import (
	"context"
	"net/netip"
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
)

// TestLossyFabric: with datagrams lost, duplicated and reordered between the
// DPU agent and the memory node (both directions) and, in the second case,
// between the host and the agent too, concurrent writes and reads of 1 to
// 150 KiB (several 64 KiB chunks, each several jumbo datagrams) complete
// with exact data, and the retransmissions and duplicates are counted.
func TestLossyFabric(t *testing.T) {
	for _, tc := range []struct {
		name               string
		drop, dup, reorder float64
		hostToo            bool
	}{
		{"no loss", 0, 0, 0, false},
		{"fabric 5% loss", 0.05, 0.03, 0.1, false},
		{"fabric and host 3% loss", 0.03, 0.03, 0.1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lw := &lossyWrap{seed: 11, drop: tc.drop, dup: tc.dup, reorder: tc.reorder}
			srv, _ := startServer(t, t.TempDir(), lw.wrap(listen(t, loopback)))
			var hostTr transport.Transport = listen(t, loopback)
			if tc.hostToo {
				hostTr = lw.wrap(hostTr)
			}
			agent, _ := startAgent(t, hostTr, []netip.AddrPort{srv.Addr()}, lw.wrap)
			var clientTr transport.Transport = listen(t, loopback)
			if tc.hostToo {
				clientTr = lw.wrap(clientTr)
			}
			c, err := NewClient(ClientOptions{Config: testConfig(), Server: agent.Addr(), Tenant: 5, Transport: clientTr})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			r, err := c.Alloc(context.Background(), 2<<20)
			if err != nil {
				t.Fatal(err)
			}
			workload(t, r, 1, 4, 12)
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			dropped, duplicated, reordered := lw.counts()
			as, ss := agent.Stats(), srv.Stats()
			t.Logf("injected: %d dropped, %d duplicated, %d reordered", dropped, duplicated, reordered)
			t.Logf("agent: %+v", as)
			t.Logf("server: %+v", ss)
			if tc.drop > 0 {
				if dropped == 0 || duplicated == 0 || reordered == 0 {
					t.Fatalf("the wrapper injected too little: %d %d %d", dropped, duplicated, reordered)
				}
				if as.Fabric.Retransmits == 0 {
					t.Error("no fabric retransmission counted despite loss")
				}
				if ss.Link.Duplicates == 0 {
					t.Error("the server counted no duplicate despite duplication")
				}
			}
			if as.Fabric.Timeouts != 0 || as.Errors != (ErrorCounts{}) {
				t.Errorf("agent failures: timeouts %d, errors %+v", as.Fabric.Timeouts, as.Errors)
			}
			// The agent's own list request is its own, not forwarded.
			if as.Forwarded != as.HostRequests || as.Batches == 0 || as.Batches > as.Forwarded || as.OwnRequests == 0 {
				t.Errorf("forwarded %d of %d host requests in %d batches, %d own requests", as.Forwarded, as.HostRequests, as.Batches, as.OwnRequests)
			}
		})
	}
}
