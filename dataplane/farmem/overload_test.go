package farmem

import (
	"context"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// flood sends datagrams of per records each, made by rec(id), from p, and
// returns the number of records sent.
func flood(p rawPeer, typ wire.Type, datagrams, per int, rec func(id uint64) Record) int {
	id := uint64(1)
	for range datagrams {
		var recs []Record
		for range per {
			recs = append(recs, rec(id))
			id++
		}
		p.send(AppendDatagram(nil, wire.Header{Type: typ, Tenant: 1}, 0, recs...))
	}
	return datagrams * per
}

// waitFor polls cond until it holds or 10 s passed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// replies reads reply records from p until want of them have status st
// (or 10 s passed), and returns how many had it.
func (p rawPeer) replies(st Status, want int) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pkts := make([]transport.Packet, 16)
	for i := range pkts {
		pkts[i].Data = make([]byte, 65536)
	}
	got := 0
	for got < want {
		for i := range pkts {
			pkts[i].Data = pkts[i].Data[:cap(pkts[i].Data)]
		}
		n, err := p.tr.Recv(ctx, pkts)
		if err != nil {
			return got
		}
		for _, pk := range pkts[:n] {
			_, _, recs, err := Decode(pk.Data, nil)
			if err != nil {
				p.t.Fatalf("bad reply: %v", err)
			}
			for _, r := range recs {
				if r.Status == st {
					got++
				}
			}
		}
	}
	return got
}

// TestUnresolvedBounded: with one of two memory nodes silent, a refresh
// lasts the fabric's retry budget. A flood of reads of a region no node
// lists waits for it without a read buffer each, at most the window of
// them; the rest are answered "unavailable" at once and counted, and no
// goroutine per receive batch piles up.
func TestUnresolvedBounded(t *testing.T) {
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	silent := listen(t, loopback) // never read: every list of it times out
	agent, _ := startAgent(t, listen(t, loopback), []netip.AddrPort{srv.Addr(), silent.LocalAddr()}, nil)
	p := rawPeer{t: t, tr: listen(t, loopback), to: agent.Addr()}
	g0 := runtime.NumGoroutine()
	limit := agent.Stats().Overload.UnresolvedLimit
	if limit != DefaultWindow {
		t.Fatalf("unresolved limit %d, want the window %d", limit, DefaultWindow)
	}
	n := flood(p, wire.TypeMemRead, 20, 200, func(id uint64) Record {
		return Record{Op: OpRead, Region: 999, ID: id, Size: 64 << 10}
	})
	waitFor(t, "the agent to take every request", func() bool { return agent.Stats().HostRequests == uint64(n) })
	st := agent.Stats().Overload
	if st.Unresolved > limit || st.UnresolvedRefused < uint64(n-limit) {
		t.Errorf("overload %+v after %d reads of an unknown region: want at most %d waiting, the rest refused", st, n, limit)
	}
	if allocs := agent.readBufAllocs.Load(); allocs != 0 {
		t.Errorf("%d read buffers made for reads with no memory node to go to: want none", allocs)
	}
	if g := runtime.NumGoroutine() - g0; g > 10 {
		t.Errorf("%d more goroutines after %d reads of an unknown region: want a few", g, n)
	}
	if got := p.replies(StatusUnavailable, n-limit); got < n-limit {
		t.Errorf("%d reads answered unavailable, want at least %d", got, n-limit)
	}
}
