package messaging

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/memnet"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// spec describes a test cluster on loopback: real kernel UDP sockets.
type spec struct {
	mode           Mode
	nodes          int
	clientsPerNode int
	ranksPerClient int
	workers        int
	// tune adjusts the config before validation.
	tune func(*Config)
	// mem, when set, puts every agent and client on this in-process
	// network (with its faults) instead of loopback sockets.
	mem *memnet.Network
	// handler, when set, makes clients deliver through ClientOptions.Handler
	// into their sink; otherwise tests call Recv.
	handler bool
	// slow, when set, is called by the handler before each message.
	slow func(node, client int)
	// onMsg, when set, replaces the sink in the handler.
	onMsg func(rank uint32, p []byte)
	// steerSrc steers the agents' datagrams by the source endpoint instead
	// of the destination: bundles of a link still meet one worker, but
	// credits reach workers that do not own their link.
	steerSrc bool
	// maxPayload caps every transport's datagram size.
	maxPayload int
	// readBuffer overrides the sockets' receive buffer size.
	readBuffer int
	// listenAgent and listenClient open node n's sockets; nil opens them
	// on loopback (127.0.0.1, or 127.0.1.n+1 for a DPU agent).
	listenAgent  func(n int, opts udp.Options, workers int) ([]*udp.Conn, error)
	listenClient func(n, c int, opts udp.Options) (*udp.Conn, error)
	// drain is the agents' AgentOptions.Drain.
	drain time.Duration
	// clock, when set, is every agent's and client's Clock.
	clock Clock
	// wrap, when set, wraps every transport at start: node n's client c
	// or, for c = -1, one of its agent's.
	wrap func(n, c int, tr transport.Transport) transport.Transport
}

type testCluster struct {
	t       testing.TB
	sp      spec
	cfg     Config
	ctx     context.Context
	agents  []*Agent
	stops   []context.CancelFunc // per agent
	dones   []chan struct{}      // per agent: closed when its Run returned
	clients [][]*Client
	sinks   [][]*sink
	cancel  context.CancelFunc
	agentWG sync.WaitGroup
}

// sink collects the messages a client received.
type sink struct {
	mu     sync.Mutex
	got    map[msgID]int
	bad    []string
	count  atomic.Int64
	notify chan struct{} // when set (waitCount), signalled per message
}

type msgID struct {
	src uint32 // sender id
	seq uint32
}

// testBase is the loopback address of node n's agent in ModeDPU (a DPU of
// its own), 127.0.0.1 otherwise.
func nodeAddr(mode Mode, n int) netip.Addr {
	if mode == ModeDPU {
		return netip.AddrFrom4([4]byte{127, 0, 1, byte(n + 1)})
	}
	return netip.AddrFrom4([4]byte{127, 0, 0, 1})
}

func startCluster(t testing.TB, sp spec) *testCluster {
	t.Helper()
	if sp.workers == 0 {
		sp.workers = 2
	}
	cfg := Defaults()
	cfg.Mode = sp.mode
	cfg.Workers = sp.workers
	cfg.Tenant = 7
	cfg.SenderShards = 2
	cfg.SocketBuffer = 1 << 20
	if sp.tune != nil {
		sp.tune(&cfg)
	}
	var agentTrs [][]transport.Transport
	var clientTrs [][]transport.Transport
	rank := uint32(0)
	for n := range sp.nodes {
		node := Node{Name: fmt.Sprintf("node%d", n)}
		if sp.mode.HasAgent() {
			opts := udp.Options{ReadBuffer: cfg.SocketBuffer, WriteBuffer: cfg.SocketBuffer, MaxPayload: sp.maxPayload}
			if sp.readBuffer > 0 {
				opts.ReadBuffer = sp.readBuffer
			}
			opts.Steer = KernelSteer()
			if sp.steerSrc {
				opts.Steer.Offset = wire.OffsetSrc
			}
			listen := sp.listenAgent
			if sp.mem != nil {
				group, err := sp.mem.ListenGroup(netip.AddrPortFrom(nodeAddr(sp.mode, n), 0), sp.workers, memSteer(opts.Steer))
				if err != nil {
					t.Fatal(err)
				}
				var trs []transport.Transport
				for _, g := range group {
					trs = append(trs, g)
				}
				agentTrs = append(agentTrs, trs)
				node.Agent = group[0].LocalAddr()
				listen = nil
			} else if listen == nil {
				listen = func(n int, opts udp.Options, workers int) ([]*udp.Conn, error) {
					return udp.ListenGroup(netip.AddrPortFrom(nodeAddr(sp.mode, n), 0), workers, opts)
				}
			}
			if listen != nil {
				group, err := listen(n, opts, sp.workers)
				if err != nil {
					t.Fatal(err)
				}
				var trs []transport.Transport
				for _, g := range group {
					trs = append(trs, g)
				}
				agentTrs = append(agentTrs, trs)
				node.Agent = group[0].LocalAddr()
			}
			if sp.wrap != nil {
				for i, tr := range agentTrs[n] {
					agentTrs[n][i] = sp.wrap(n, -1, tr)
				}
			}
		}
		var ctrs []transport.Transport
		for c := range sp.clientsPerNode {
			opts := udp.Options{ReadBuffer: cfg.SocketBuffer, WriteBuffer: cfg.SocketBuffer, MaxPayload: sp.maxPayload}
			if sp.readBuffer > 0 {
				opts.ReadBuffer = sp.readBuffer
			}
			listen := sp.listenClient
			if listen == nil {
				listen = func(_, _ int, opts udp.Options) (*udp.Conn, error) {
					return udp.Listen(netip.MustParseAddrPort("127.0.0.1:0"), opts)
				}
			}
			var tr transport.Transport
			var err error
			if sp.mem != nil {
				tr, err = sp.mem.Listen(netip.MustParseAddrPort("127.0.0.1:0"))
			} else {
				tr, err = listen(n, c, opts)
			}
			if err != nil {
				t.Fatal(err)
			}
			if sp.wrap != nil {
				tr = sp.wrap(n, c, tr)
			}
			ctrs = append(ctrs, tr)
			node.Clients = append(node.Clients, ClientSpec{
				Name: fmt.Sprintf("c%d", c), Addr: tr.LocalAddr(), Ranks: Range(rank, rank+uint32(sp.ranksPerClient)-1),
			})
			rank += uint32(sp.ranksPerClient)
		}
		clientTrs = append(clientTrs, ctrs)
		cfg.Nodes = append(cfg.Nodes, node)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	tc := &testCluster{t: t, sp: sp, cfg: cfg}
	ctx, cancel := context.WithCancel(context.Background())
	tc.ctx, tc.cancel = ctx, cancel
	t.Cleanup(tc.stop)
	tc.agents = make([]*Agent, len(agentTrs))
	tc.stops = make([]context.CancelFunc, len(agentTrs))
	tc.dones = make([]chan struct{}, len(agentTrs))
	for n := range agentTrs {
		tc.startAgent(n, agentTrs[n])
	}
	for n := range sp.nodes {
		var row []*Client
		var srow []*sink
		for c := range sp.clientsPerNode {
			sk := &sink{got: map[msgID]int{}}
			opts := ClientOptions{Transport: clientTrs[n][c], Clock: sp.clock}
			if sp.handler {
				opts.Handler = func(rank uint32, payload []byte) {
					if sp.onMsg != nil {
						sp.onMsg(rank, payload)
						return
					}
					if sp.slow != nil {
						sp.slow(n, c)
					}
					sk.add(cfg.Nodes[n].Clients[c].Ranks, rank, payload)
				}
			}
			cl, err := NewClient(cfg, cfg.Nodes[n].Name, fmt.Sprintf("c%d", c), opts)
			if err != nil {
				t.Fatal(err)
			}
			row, srow = append(row, cl), append(srow, sk)
		}
		tc.clients, tc.sinks = append(tc.clients, row), append(tc.sinks, srow)
	}
	return tc
}

// startAgent starts node n's agent on trs.
func (tc *testCluster) startAgent(n int, trs []transport.Transport) {
	tc.t.Helper()
	a, err := NewAgent(tc.cfg, tc.cfg.Nodes[n].Name, AgentOptions{Transports: trs, Drain: tc.sp.drain, Logger: testLogger(tc.t), Clock: tc.sp.clock})
	if err != nil {
		tc.t.Fatal(err)
	}
	ctx, stop := context.WithCancel(tc.ctx)
	done := make(chan struct{})
	tc.agents[n], tc.stops[n], tc.dones[n] = a, stop, done
	tc.agentWG.Add(1)
	go func() {
		defer tc.agentWG.Done()
		defer close(done)
		if err := a.Run(ctx); err != nil {
			tc.t.Errorf("agent %d: %v", n, err)
		}
	}()
}

// restartAgent stops node n's agent (it drains for spec.drain), and starts
// a new one on the same address, as a restarted daemon would.
func (tc *testCluster) restartAgent(n int) {
	tc.t.Helper()
	addr := tc.agents[n].Addr()
	tc.stops[n]()
	<-tc.dones[n]
	var trs []transport.Transport
	if tc.sp.mem != nil {
		group, err := tc.sp.mem.ListenGroup(addr, tc.cfg.Workers, memSteer(KernelSteer()))
		if err != nil {
			tc.t.Fatal(err)
		}
		for _, g := range group {
			trs = append(trs, g)
		}
	} else {
		opts := udp.Options{ReadBuffer: tc.cfg.SocketBuffer, WriteBuffer: tc.cfg.SocketBuffer, MaxPayload: tc.sp.maxPayload, Steer: KernelSteer()}
		group, err := udp.ListenGroup(addr, tc.cfg.Workers, opts)
		if err != nil {
			tc.t.Fatal(err)
		}
		for _, g := range group {
			trs = append(trs, g)
		}
	}
	tc.startAgent(n, trs)
}

func (tc *testCluster) stop() {
	for _, row := range tc.clients {
		for _, c := range row {
			_ = c.Close()
		}
	}
	tc.cancel()
	tc.agentWG.Wait()
}

// all returns the clients in order with their sinks.
func (tc *testCluster) all() (cs []*Client, ss []*sink) {
	for n := range tc.clients {
		cs = append(cs, tc.clients[n]...)
		ss = append(ss, tc.sinks[n]...)
	}
	return cs, ss
}

// ranks returns every rank of the cluster.
func (tc *testCluster) ranks() []uint32 {
	var r []uint32
	for _, n := range tc.cfg.Nodes {
		for _, c := range n.Clients {
			r = append(r, c.Ranks.All()...)
		}
	}
	return r
}

// payload builds a verifiable message: sender, sequence, destination rank,
// a CRC of the rest, and size-16 pattern bytes. Sizes below 16 carry a
// prefix of the header only and are checked by length and what is there.
func payload(src, seq, rank uint32, size int) []byte {
	b := make([]byte, max(size, 16))
	binary.BigEndian.PutUint32(b, src)
	binary.BigEndian.PutUint32(b[4:], seq)
	binary.BigEndian.PutUint32(b[8:], rank)
	for i := 16; i < len(b); i++ {
		b[i] = byte(uint32(i)*2654435761 + seq)
	}
	binary.BigEndian.PutUint32(b[12:], crc32.ChecksumIEEE(b[16:]))
	return b[:size]
}

func (s *sink) add(mine Ranks, rank uint32, p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.count.Add(1)
	if s.notify != nil {
		select {
		case s.notify <- struct{}{}:
		default:
		}
	}
	if !mine.Contains(rank) {
		s.bad = append(s.bad, fmt.Sprintf("message for rank %d, not ours", rank))
		return
	}
	if len(p) < 16 {
		// Tiny messages: key on their length and the bytes there are.
		id := msgID{src: 0xffffffff, seq: uint32(len(p))<<24 | uint32(rank)}
		s.got[id]++
		return
	}
	src, seq, dst := binary.BigEndian.Uint32(p), binary.BigEndian.Uint32(p[4:]), binary.BigEndian.Uint32(p[8:])
	if dst != rank {
		s.bad = append(s.bad, fmt.Sprintf("message %d/%d for rank %d arrived at rank %d", src, seq, dst, rank))
	}
	if crc32.ChecksumIEEE(p[16:]) != binary.BigEndian.Uint32(p[12:]) {
		s.bad = append(s.bad, fmt.Sprintf("message %d/%d (%d bytes) is corrupt", src, seq, len(p)))
	}
	s.got[msgID{src, seq}]++
}

// recvInto drains a client by Recv into its sink until stopped.
func recvInto(ctx context.Context, c *Client, s *sink, wg *sync.WaitGroup) {
	defer wg.Done()
	for {
		m, err := c.Recv(ctx)
		if err != nil {
			return
		}
		s.add(c.Ranks(), m.Rank, m.Payload)
	}
}

// waitCount waits until the sinks hold want messages in total.
func waitCount(t testing.TB, sinks []*sink, want int64, timeout time.Duration) {
	t.Helper()
	if got, ok := arrived(sinks, want, timeout); !ok {
		t.Fatalf("%d of %d messages arrived within %v", got, want, timeout)
	}
}

// arrived waits until the sinks hold want messages in total, or timeout
// passes, and returns how many they hold and whether that is want.
func arrived(sinks []*sink, want int64, timeout time.Duration) (int64, bool) {
	ch := make(chan struct{}, 1)
	for _, s := range sinks {
		s.mu.Lock()
		s.notify = ch
		s.mu.Unlock()
	}
	defer func() {
		for _, s := range sinks {
			s.mu.Lock()
			s.notify = nil
			s.mu.Unlock()
		}
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		var got int64
		for _, s := range sinks {
			got += s.count.Load()
		}
		if got >= want {
			return got, true
		}
		select {
		case <-ch:
		case <-timer.C:
			return got, false
		}
	}
}

// eventually polls cond, which reads counters that signal nothing, until
// it holds or timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		<-tick.C
	}
}

// level is a counter that goroutines can wait on.
type level struct {
	mu   sync.Mutex
	cond *sync.Cond
	v    int64
}

func newLevel() *level {
	l := &level{}
	l.cond = sync.NewCond(&l.mu)
	return l
}

func (l *level) add(n int64) {
	l.mu.Lock()
	l.v += n
	l.mu.Unlock()
	l.cond.Broadcast()
}

func (l *level) load() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.v
}

// wait waits until the level reaches v or ctx ends, and reports whether it
// reached v.
func (l *level) wait(ctx context.Context, v int64) bool {
	stop := context.AfterFunc(ctx, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.cond.Broadcast()
	})
	defer stop()
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.v < v && ctx.Err() == nil {
		l.cond.Wait()
	}
	return l.v >= v
}

// memSteer steers a memnet group as s steers a SO_REUSEPORT group.
func memSteer(s *udp.Steer) func([]byte) int {
	return func(d []byte) int {
		if len(d) < int(s.Offset)+4 {
			return 0
		}
		return int(binary.BigEndian.Uint32(d[s.Offset:]) >> s.Shift & s.Mask)
	}
}

// testLogger logs warnings and errors through t.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type tlogWriter struct{ t testing.TB }

func (w tlogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// gate is a transport under a test's control: while shut, it refuses every
// bundle datagram (the one that a Send reaches, as a socket refuses one
// datagram of a sendmmsg batch and takes those before it), and it counts
// what it took by kind and what it refused. Without a transport under it,
// it takes everything and delivers nothing.
type gate struct {
	transport.Transport
	shut atomic.Bool

	mu                           sync.Mutex
	bundles, bundleBytes, probes uint64 // taken
	refused                      uint64
}

func (g *gate) Send(pkts []transport.Packet) (int, error) {
	n := len(pkts)
	if g.shut.Load() {
		for i, p := range pkts {
			if h, _, err := wire.Decode(p.Data); err == nil && h.Type == wire.TypeBundle {
				n = i
				break
			}
		}
	}
	took := n
	var err error
	if g.Transport != nil && n > 0 {
		took, err = g.Transport.Send(pkts[:n])
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range pkts[:took] {
		h, _, derr := wire.Decode(p.Data)
		switch {
		case derr != nil:
		case h.Type == wire.TypeBundle:
			g.bundles++
			g.bundleBytes += uint64(len(p.Data))
		case h.Flags&wire.FlagAckReq != 0:
			g.probes++
		}
	}
	if err != nil || n == len(pkts) {
		return took, err
	}
	g.refused++
	return took, fmt.Errorf("gate shut: %w", transport.ErrAddr)
}

// counts returns what the gate took and refused so far.
func (g *gate) counts() (bundles, bundleBytes, probes, refused uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.bundles, g.bundleBytes, g.probes, g.refused
}
