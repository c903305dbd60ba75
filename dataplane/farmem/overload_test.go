package farmem

import (
	"context"
	"log/slog"
	"net/netip"
	"runtime"
	"strings"
	"sync"
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
	if g := goroutinesIn("farmem.(*hostWorker).resolve"); g > limit {
		t.Errorf("%d goroutines wait to resolve %d reads of an unknown region: want at most %d", g, n, limit)
	}
	if got := p.replies(StatusUnavailable, n-limit); got < n-limit {
		t.Errorf("%d reads answered unavailable, want at least %d", got, n-limit)
	}
}

// countLog counts the log lines that contain each of its strings.
type countLog struct {
	mu     sync.Mutex
	counts map[string]int
}

func (c *countLog) Enabled(context.Context, slog.Level) bool { return true }
func (c *countLog) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *countLog) WithGroup(string) slog.Handler            { return c }
func (c *countLog) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for s := range c.counts {
		if strings.Contains(r.Message, s) {
			c.counts[s]++
		}
	}
	return nil
}

func (c *countLog) count(s string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[s]
}

// TestStaticLoadsBounded: with the only memory node silent, a static load
// of a region the agent does not know waits seconds for a refresh. A
// flood of them holds a few loaders and one bounded queue, not a goroutine
// each; the rest are answered "unavailable" at once and counted. A flood
// of refused hints is counted, and each kind is logged once, not per
// record.
func TestStaticLoadsBounded(t *testing.T) {
	silent := listen(t, loopback) // never read
	logs := &countLog{counts: map[string]int{"hint refused": 0, "static load refused": 0}}
	cfg := AgentConfig{Config: testConfig(), Servers: []ServerSpec{{Addr: silent.LocalAddr()}}}
	agent, err := NewAgent(cfg, AgentOptions{HostTransports: []transport.Transport{listen(t, loopback)},
		FabricTransports: []transport.Transport{listen(t, loopback)}, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	run(t, agent.Run)
	p := rawPeer{t: t, tr: listen(t, loopback), to: agent.Addr()}
	n := flood(p, wire.TypeMemRead, 20, 200, func(id uint64) Record { return Record{Op: OpStatic, Region: 999, ID: id} })
	hints := flood(p, wire.TypeMemRead, 5, 200, func(id uint64) Record {
		return Record{Op: OpHint, Region: 999, ID: 1<<20 + id, Aux: 0x200} // unknown flag
	})
	waitFor(t, "the agent to take every request", func() bool { return agent.Stats().HostRequests == uint64(n+hints) })
	st := agent.Stats()
	limit := st.Overload.StaticLimit
	if limit != staticQueue+staticLoaders || st.Overload.StaticQueued > limit || st.Overload.StaticRefused < uint64(n-limit) {
		t.Errorf("overload %+v after %d static loads of an unknown region: want at most %d queued, the rest refused", st.Overload, n, staticQueue+staticLoaders)
	}
	if st.Refused.Hints != uint64(hints) {
		t.Errorf("refused %+v: want %d hints", st.Refused, hints)
	}
	if g := goroutinesIn("farmem.(*Agent).loadStatic"); g > staticLoaders {
		t.Errorf("%d goroutines load %d static loads of an unknown region: want at most %d", g, n, staticLoaders)
	}
	if got := p.replies(StatusUnavailable, n-limit); got < n-limit {
		t.Errorf("%d static loads answered unavailable, want at least %d", got, n-limit)
	}
	// Logged once the worker released its lock: wait for the first line
	// of each; a second could come only a minute later.
	waitFor(t, "the refusals' log lines", func() bool { return logs.count("hint refused") > 0 && logs.count("static load refused") > 0 })
	if h, s := logs.count("hint refused"), logs.count("static load refused"); h != 1 || s != 1 {
		t.Errorf("logged %d refused hints and %d refused static loads in %d and %d: want each once", h, s, hints, n-limit)
	}
}

// goroutinesIn counts the goroutines with fn on their stack.
func goroutinesIn(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	c := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, fn+"(") {
			c++
		}
	}
	return c
}

// TestUnknownRegionWritesLeaveNoRecord: writes to region IDs no memory
// node has are answered "unknown region" and leave nothing in the agent's
// cache: before, each ID written to kept a record for good (Stats'
// Cache.Regions, a Prometheus series each), so a host could grow the
// agent's memory without bound. A region the config names, not created
// yet, keeps its settings, and a real region its record.
func TestUnknownRegionWritesLeaveNoRecord(t *testing.T) {
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	stride := PrefetchStride
	const configured = 555_555
	a := startCachingAgent(t, srv, CacheConfig{Size: 1 << 20, EntrySize: 256 << 10, BNet: 1, BIntra: 2,
		Regions: []CacheRegion{{Region: configured, Prefetcher: &stride}}})
	c := newClient(t, a.Addr(), 1)
	real, _ := writtenRegion(t, c, 1<<20, 64<<10)
	p := rawPeer{t: t, tr: listen(t, loopback), to: a.Addr()}
	// 2000 one-byte writes, each to a region ID of its own, a datagram of
	// 100 at a time, and one to the configured region.
	const base, n, per = 1_000_000, 2000, 100
	for d := range n / per {
		var recs []Record
		for i := range per {
			id := uint64(d*per + i + 1)
			recs = append(recs, Record{Op: OpWrite, Region: base + uint32(id), ID: id, Size: 1, Data: []byte{byte(id)}})
		}
		if d == 0 {
			recs = append(recs, Record{Op: OpWrite, Region: configured, ID: n + 1, Size: 1, Data: []byte{1}})
		}
		p.send(AppendDatagram(nil, wire.Header{Type: wire.TypeMemWrite, Tenant: 1}, 0, recs...))
		if got := p.replies(StatusUnknownRegion, len(recs)); got != len(recs) {
			t.Fatalf("%d of %d writes to regions that do not exist answered unknown region", got, len(recs))
		}
	}
	var left []uint32
	var sawConfigured, sawReal bool
	for _, r := range a.Stats().Cache.Regions {
		switch {
		case r.Region > base:
			left = append(left, r.Region)
		case r.Region == configured:
			sawConfigured = r.Prefetcher == "stride"
		case r.Region == real.ID():
			sawReal = true
		}
	}
	if len(left) > 0 {
		t.Errorf("%d writes to regions that do not exist left %d records in the agent's cache (first %d)", n, len(left), left[0])
	}
	if !sawConfigured || !sawReal {
		t.Errorf("configured region %d with its prefetcher kept: %v; the written region %d kept: %v", configured, sawConfigured, real.ID(), sawReal)
	}
}

// TestBatchOverWindow: one host datagram of more requests than the agent's
// window towards the memory nodes is forwarded a window at a time, and
// every request is answered. (Before, issue took a window slot for every
// request of the batch before sending any: with more requests than slots
// and none in flight, the agent's worker waited for itself for good.)
func TestBatchOverWindow(t *testing.T) {
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	cfg := AgentConfig{Config: testConfig(), Servers: []ServerSpec{{Addr: srv.Addr()}}}
	cfg.Window = 16
	a, err := NewAgent(cfg, AgentOptions{HostTransports: []transport.Transport{listen(t, loopback)}, FabricTransports: []transport.Transport{listen(t, loopback)}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, a.Run)
	c := newClient(t, a.Addr(), 1)
	r, want := writtenRegion(t, c, 1<<20, 64<<10)
	p := rawPeer{t: t, tr: listen(t, loopback), to: a.Addr()}
	const n = 40 // 2.5 windows
	var recs []Record
	for i := range n {
		recs = append(recs, Record{Op: OpRead, Region: r.ID(), ID: uint64(i + 1), Offset: uint64(i) * 4096, Size: 1})
	}
	p.send(AppendDatagram(nil, wire.Header{Type: wire.TypeMemRead, Tenant: 1}, 0, recs...))
	if got := p.replies(StatusOK, n); got != n {
		t.Fatalf("%d of %d reads in one datagram answered, with the agent's window %d", got, n, cfg.Window)
	}
	// The agent still serves: its worker is not stuck.
	b := make([]byte, 1)
	if _, err := r.ReadAt(b, 4096*7); err != nil || b[0] != want[4096*7] {
		t.Fatalf("a read after the batch: %v, %#x; want %#x", err, b[0], want[4096*7])
	}
}
