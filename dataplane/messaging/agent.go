package messaging

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
)

// AgentOptions are an agent's run-time inputs besides its Config.
type AgentOptions struct {
	// Transports are the workers' sockets, one per worker
	// (Config.Workers), all receiving on the node's agent address. On a
	// DPU they are AF_XDP sockets, one per queue, with XDP rules steering
	// each worker's endpoints (Config.WorkerEndpoints) to its queue. Nil
	// opens a kernel UDP SO_REUSEPORT group on the node's agent address
	// whose reuseport program steers by the same field. The agent owns the
	// transports: it closes them when Run returns, or on Close.
	Transports []transport.Transport
	// Logger receives the agent's few messages (start, transfer size
	// lowered); nil discards them.
	Logger *slog.Logger
	// MaxLinks bounds the incoming links each worker tracks (0: 4096);
	// bundles of further links are dropped and counted.
	MaxLinks int
	// Drain is how long Run keeps going after ctx is done, to stop
	// without losing a message (0: stop at once). While draining, the
	// workers acknowledge no new bundles (their senders send them again,
	// to whoever answers next on the agent's address) but take the ones
	// that complete what they already acknowledged: a gap below an
	// out-of-order bundle, the rest of a fragmented message. They flush
	// every buffer at once, route what waits on the blocklist, and stop
	// when every bundle they acknowledged has been forwarded and
	// acknowledged by its next hop, or when Drain has passed.
	Drain time.Duration
	// Clock is the time source of the agent's timers; nil is the system
	// clock. Tests advance one by hand instead of sleeping.
	Clock Clock
}

// Agent is a node's routing agent: it receives bundles from the node's
// clients and from other nodes' agents, routes every message by its
// destination rank, and sends it on in bundles aggregated per next hop.
type Agent struct {
	cfg     Config
	node    int
	tsize   int
	table   *rankTable
	hops    []hop
	workers []*worker
	log     *slog.Logger
	clk     clock
	drain   time.Duration

	running   atomic.Bool
	closeOnce sync.Once
}

// hop is one next hop of an agent: another node's agent or a local client.
type hop struct {
	name     string
	addr     netip.AddrPort
	node     int // the peer node (an agent hop), or -1
	client   int // the local client (a client hop), or -1
	isClient bool
	local    bool // a client's own ranks: delivered in memory (local.go)
}

// NewAgent validates cfg, builds the next-hop table of node and opens (or
// takes) the workers' transports. Run starts it.
func NewAgent(cfg Config, node string, opts AgentOptions) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.Mode.HasAgent() {
		return nil, fmt.Errorf("messaging: agent in mode %q, which has none: %w", cfg.Mode, ErrMode)
	}
	n, err := cfg.NodeIndex(node)
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	trs := opts.Transports
	if trs == nil {
		group, err := udp.ListenGroup(cfg.Nodes[n].Agent, cfg.Workers, udp.Options{
			ReadBuffer: cfg.SocketBuffer, WriteBuffer: cfg.SocketBuffer,
			Steer: KernelSteer(),
		})
		if err != nil {
			return nil, fmt.Errorf("messaging: agent %s: %w", node, err)
		}
		for _, c := range group {
			trs = append(trs, c)
		}
	}
	closeAll := func() {
		for _, t := range trs {
			_ = t.Close()
		}
	}
	if len(trs) != cfg.Workers {
		closeAll()
		return nil, fmt.Errorf("messaging: agent %s: %d transports for %d workers", node, len(trs), cfg.Workers)
	}
	tsize := cfg.TransferSize
	for _, t := range trs {
		tsize = min(tsize, t.MaxPayload())
	}
	if tsize < MinTransferSize {
		closeAll()
		return nil, fmt.Errorf("messaging: agent %s: transport carries %d-byte datagrams, bundles need %d", node, tsize, MinTransferSize)
	}
	if tsize < cfg.TransferSize {
		log.Info("messaging: transfer size lowered to the transport's max payload", "node", node, "configured", cfg.TransferSize, "used", tsize)
	}
	a := &Agent{cfg: cfg, node: n, tsize: tsize, log: log, clk: newClock(opts.Clock), drain: opts.Drain}
	nodeHop := make([]int32, len(cfg.Nodes))
	for m, nd := range cfg.Nodes {
		nodeHop[m] = -1
		if m != n {
			nodeHop[m] = int32(len(a.hops))
			a.hops = append(a.hops, hop{name: nd.Name, addr: nd.Agent, node: m, client: -1})
		}
	}
	clientHop := make([]int32, len(cfg.Nodes[n].Clients))
	for c, cl := range cfg.Nodes[n].Clients {
		clientHop[c] = int32(len(a.hops))
		a.hops = append(a.hops, hop{name: cfg.Nodes[n].Name + "/" + cl.Name, addr: cl.Addr, node: -1, client: c, isClient: true})
	}
	a.table = newRankTable(cfg, func(node, client int) int32 {
		if node == n {
			return clientHop[client]
		}
		return nodeHop[node]
	})
	maxLinks := opts.MaxLinks
	if maxLinks <= 0 {
		maxLinks = 4096
	}
	for i, t := range trs {
		a.workers = append(a.workers, newWorker(a, i, t, maxLinks))
	}
	log.Info("messaging: agent ready", "node", node, "addr", trs[0].LocalAddr(), "workers", cfg.Workers,
		"transfer_size", tsize, "next_hops", len(a.hops))
	return a, nil
}

// Addr returns the address the agent receives on.
func (a *Agent) Addr() netip.AddrPort { return a.workers[0].tr.LocalAddr() }

// TransferSize returns the bundle size in use (Config.TransferSize lowered
// to the transports' MaxPayload).
func (a *Agent) TransferSize() int { return a.tsize }

// Run runs the workers until ctx is done or the agent is closed. On the way
// out each worker drains for up to AgentOptions.Drain, then sends what its
// buffers still hold (as far as the windows allow, without waiting for
// acknowledgements), and Run closes the transports. It
// returns nil after a cancellation or Close, and the first worker's error
// otherwise. Run may be called once.
func (a *Agent) Run(ctx context.Context) error {
	if !a.running.CompareAndSwap(false, true) {
		return errors.New("messaging: agent: Run called twice")
	}
	defer func() { _ = a.Close() }()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(a.workers))
	var wg sync.WaitGroup
	for i, w := range a.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.run(ctx); err != nil {
				errs[i] = err
				cancel()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Close closes the transports, which makes Run return. It is safe to call
// more than once and concurrently with Run.
func (a *Agent) Close() error {
	var errs []error
	a.closeOnce.Do(func() {
		for _, w := range a.workers {
			if err := w.tr.Close(); err != nil {
				errs = append(errs, err)
			}
		}
	})
	return errors.Join(errs...)
}

// Stats returns the agent's counters summed over its workers. It is safe to
// call at any time.
func (a *Agent) Stats() Stats {
	s := Stats{Role: "agent", Node: a.cfg.Nodes[a.node].Name, Mode: a.cfg.Mode, Workers: len(a.workers), TransferSize: a.tsize}
	s.Destinations = make([]DestStats, len(a.hops))
	for h, hp := range a.hops {
		d := DestStats{Name: hp.name, Addr: hp.addr.String()}
		for _, w := range a.workers {
			d.add(w.links[h].st.snapshot())
		}
		if d.Bundles > 0 {
			d.AvgBundleBytes = float64(d.Bytes) / float64(d.Bundles)
		}
		s.Destinations[h] = d
	}
	for _, w := range a.workers {
		w.ctr.addTo(&s.Received, &s.Drops)
	}
	return s
}
