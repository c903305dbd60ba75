package messaging

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
)

// ClientOptions are a client's run-time inputs besides its Config.
type ClientOptions struct {
	// Transport is the client's socket, receiving on its configured
	// address; nil opens a kernel UDP socket there. The client owns it and
	// closes it on Close.
	Transport transport.Transport
	// Handler, when set, receives every message on the client's delivery
	// goroutine, one at a time, with the destination rank (one of the
	// client's) and the payload, which is valid only during the call.
	// Recv is then unavailable. The handler may call Send, but should use
	// TrySend, or hand the work to another goroutine, where waiting for a
	// send buffer could close a cycle of waits between processes, or with
	// itself: messages for the client's own ranks are delivered in memory
	// through the same queue, whose bundles come back only as this
	// goroutine consumes them.
	Handler func(rank uint32, payload []byte)
	// Logger receives the client's few messages; nil discards them.
	Logger *slog.Logger
	// MaxLinks bounds the incoming links the client tracks (0: 4096).
	MaxLinks int
	// Clock is the time source of the client's timers; nil is the system
	// clock. Tests advance one by hand instead of sleeping.
	Clock Clock
}

// Message is a received message.
type Message struct {
	// Rank is the destination rank, one of the client's.
	Rank uint32
	// Payload is the message, owned by the caller.
	Payload []byte
}

// Client is the messaging library of one application process: it sends
// messages to ranks, aggregated into bundles towards the node's agent (or,
// in ModeNone, towards each destination client), and receives the messages
// for its own ranks. Messages it sends to its own ranks never touch the
// network: their bundles go straight to its delivery queue (local.go).
// Send and TrySend may be called from many goroutines at once: each takes
// one of several independent sender shards, so they do not contend on one
// lock.
type Client struct {
	cfg   Config
	node  int
	idx   int
	tr    transport.Transport
	tsize int
	table *rankTable
	hops  []hop
	local int32 // the index in hops of the local hop: the client's own ranks
	// hopDead says, by hop, that a shard declared the next hop dead and no
	// shard has heard from it since: Send fails fast on every shard.
	hopDead []atomic.Bool
	mine    Ranks
	shards  []*shard
	pool    sync.Pool // of *shard: a goroutine tends to get the shard its P used last
	rr      atomic.Uint32
	handler func(uint32, []byte)
	log     *slog.Logger
	clk     clock

	// The receive goroutine's own state.
	recv   *receiver // incoming links, sequencing, credits
	rx     []transport.Packet
	out    batch
	rxSize int
	bufs   sync.Pool // of receive buffers handed to the delivery queue

	q      deliveryQueue
	rxDone chan struct{} // closed when the receive goroutine has stopped: the queue grows no more
	rlock  chan struct{} // the consumer lock (Recv or the handler goroutine), usable with a context
	rcur   *delivery     // the bundle being consumed
	rcount uint64        // messages the handler took from rcur, not yet counted (Recv counts its own)

	ctr     counters
	kick    chan struct{}
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	tcancel context.CancelFunc // stops the timer goroutine alone (Close)
	twg     sync.WaitGroup
	closed  atomic.Bool
	once    sync.Once
}

// NewClient starts the client named client on node: it validates cfg,
// builds the next-hop table, opens (or takes) its transport and starts its
// receive, delivery and timer goroutines, which run until Close.
func NewClient(cfg Config, node, client string, opts ClientOptions) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n, ci, err := cfg.ClientIndex(node, client)
	if err != nil {
		return nil, err
	}
	spec := cfg.Nodes[n].Clients[ci]
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tr := opts.Transport
	if tr == nil {
		if tr, err = udp.Listen(spec.Addr, udp.Options{ReadBuffer: cfg.SocketBuffer, WriteBuffer: cfg.SocketBuffer}); err != nil {
			return nil, fmt.Errorf("messaging: client %s/%s: %w", node, client, err)
		}
	}
	tsize := min(cfg.TransferSize, tr.MaxPayload())
	if tsize < MinTransferSize {
		_ = tr.Close()
		return nil, fmt.Errorf("messaging: client %s/%s: transport carries %d-byte datagrams, bundles need %d", node, client, tsize, MinTransferSize)
	}
	c := &Client{
		cfg: cfg, node: n, idx: ci, tr: tr, tsize: tsize, mine: spec.Ranks, handler: opts.Handler, log: log,
		clk:  newClock(opts.Clock),
		kick: make(chan struct{}, 1), rlock: make(chan struct{}, 1), rxDone: make(chan struct{}),
	}
	c.recv = newReceiver(&c.cfg, opts.MaxLinks, &c.ctr, c, &c.out)
	c.q.notify = make(chan struct{}, 1)
	// The client's own ranks map to the local hop, the last: their
	// messages go into bundles that the delivery queue takes in memory
	// (local.go), never through the network.
	var route func(node, client int) int32
	if cfg.Mode.HasAgent() {
		c.hops = []hop{{name: cfg.Nodes[n].Name, addr: cfg.Nodes[n].Agent, node: n, client: -1}}
		route = func(int, int) int32 { return 0 }
	} else {
		first := make([]int32, len(cfg.Nodes))
		for m, nd := range cfg.Nodes {
			first[m] = int32(len(c.hops))
			for k, cl := range nd.Clients {
				c.hops = append(c.hops, hop{name: nd.Name + "/" + cl.Name, addr: cl.Addr, node: m, client: k, isClient: true})
			}
		}
		route = func(node, client int) int32 { return first[node] + int32(client) }
	}
	c.local = int32(len(c.hops))
	c.hops = append(c.hops, hop{name: localHopName, node: n, client: ci, local: true})
	c.table = newRankTable(cfg, func(node, client int) int32 {
		if node == n && client == ci {
			return c.local
		}
		return route(node, client)
	})
	c.hopDead = make([]atomic.Bool, len(c.hops))
	nshards := cfg.SenderShards
	if nshards == 0 {
		nshards = min(runtime.GOMAXPROCS(0), MaxShards)
	}
	for s := range nshards {
		sh := &shard{
			c: c, idx: s, self: ClientEndpoint(n, ci, s),
			links: make([]*outLink, len(c.hops)), byPeer: map[uint32]*outLink{},
			waitCh: make(chan struct{}),
		}
		sh.dirtyF = sh.addDirty
		c.shards = append(c.shards, sh)
	}
	c.rxSize = max(cfg.TransferSize, 2048)
	c.bufs.New = func() any { b := make([]byte, c.rxSize); return &b }
	c.rx = make([]transport.Packet, batchSize)
	for i := range c.rx {
		c.rx[i].Data = make([]byte, c.rxSize)
	}
	// The goroutines run until Close cancels their context.
	ctx, cancel := context.WithCancel(context.Background())
	c.ctx, c.cancel = ctx, cancel
	tctx, tcancel := context.WithCancel(ctx)
	c.tcancel = tcancel
	c.wg.Add(1)
	c.twg.Add(1)
	go c.receive(ctx)
	go c.timers(tctx)
	if c.handler != nil {
		c.wg.Add(1)
		go c.deliver()
	}
	log.Info("messaging: client ready", "node", node, "client", client, "addr", tr.LocalAddr(), "mode", cfg.Mode,
		"shards", nshards, "transfer_size", tsize)
	return c, nil
}

func (c *Client) clock() int64 { return c.clk.now() }

// Addr returns the address the client receives on.
func (c *Client) Addr() netip.AddrPort { return c.tr.LocalAddr() }

// Ranks returns the ranks the client receives for.
func (c *Client) Ranks() Ranks { return c.mine }

// TransferSize returns the bundle size in use.
func (c *Client) TransferSize() int { return c.tsize }

// Close sends what the buffers hold as far as the receivers' windows allow
// (without waiting for acknowledgements or for a window to open: call
// Flush first for that), stops the client's goroutines and closes its
// transport. Messages left waiting for a window are dropped, counted
// (Drops.Closed) and reported in the error. Blocked Send calls return
// ErrClosed. Every message already in the delivery queue, those for the
// client's own ranks included, is still delivered: with a Handler, it is
// handed to it before Close returns (a call in progress is waited for);
// without, Recv goes on returning them and returns ErrClosed once none is
// left. It is safe to call more than once.
func (c *Client) Close() error {
	var err error
	c.once.Do(func() {
		c.closed.Store(true)
		// The timer goroutine stops first: after the flush below, nothing
		// but a racing Send writes a buffer, and the delivery goroutine,
		// which stops after it, sees every local bundle queued.
		c.tcancel()
		c.twg.Wait()
		for _, s := range c.shards {
			s.mu.Lock()
			now := c.clock()
			for _, l := range s.links {
				if l != nil {
					l.close(flushExplicit, now, &s.out)
				}
			}
			s.send()
			s.mu.Unlock()
		}
		c.cancel()
		err = c.tr.Close()
		c.wg.Wait()
		// Counted once nothing can send any more: a credit that the
		// receive goroutine took meanwhile may have opened a window.
		unsent := 0
		for _, s := range c.shards {
			s.mu.Lock()
			for _, l := range s.links {
				if l != nil {
					unsent += l.unsent()
					if l.loc != nil && l.cur != nil {
						unsent += l.cur.msgs // a Send that raced Close wrote it after the flush
					}
					l.dropGaveUp() // no one asks any more
				}
			}
			s.mu.Unlock()
		}
		if unsent > 0 {
			c.ctr.drop(dropClosed, uint64(unsent))
			err = errors.Join(fmt.Errorf("messaging: close: %d messages not sent (the receiver's window stayed closed); "+
				"call Flush(ctx) before Close to wait for it", unsent), err)
		}
	})
	return err
}

// Stats returns the client's counters.
func (c *Client) Stats() Stats {
	s := Stats{
		Role: "client", Node: c.cfg.Nodes[c.node].Name, Client: c.cfg.Nodes[c.node].Clients[c.idx].Name,
		Mode: c.cfg.Mode, Workers: len(c.shards), TransferSize: c.tsize,
	}
	for h, hp := range c.hops {
		d := DestStats{Name: hp.name, Addr: hp.addr.String()}
		if hp.local {
			d.Addr = ""
		}
		used := false
		for _, sh := range c.shards {
			sh.mu.Lock()
			l := sh.links[h]
			sh.mu.Unlock()
			if l != nil {
				used = true
				d.add(l.st.snapshot())
			}
		}
		if !used {
			continue
		}
		d.PeerDead = d.PeerDead || c.hopDead[h].Load()
		if d.Bundles > 0 {
			d.AvgBundleBytes = float64(d.Bytes) / float64(d.Bundles)
		}
		if hp.local {
			s.Local = d // not a next hop: not in Destinations, nor in Sent
			continue
		}
		s.Destinations = append(s.Destinations, d)
	}
	c.ctr.addTo(&s.Received, &s.Drops)
	return s
}
