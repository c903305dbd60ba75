package farmem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// ServerSpec is one memory node an agent forwards to.
type ServerSpec struct {
	Addr netip.AddrPort `json:"addr"`
	// Regions the node serves, known in advance; the agent also learns
	// them from the node's list answers and from creates it forwards.
	Regions []uint32 `json:"regions,omitempty"`
}

// AgentConfig is a DPU agent's configuration, the far-memory section
// lovelockd embeds.
type AgentConfig struct {
	Config
	// Listen is the host-facing address when the agent opens its own
	// kernel UDP socket.
	Listen netip.AddrPort `json:"listen,omitzero"`
	// Servers are the memory nodes. A create asks first the node its
	// nonce picks (creates without one take turns), and a create a full
	// node refuses goes on to the next; a list asks every node and merges
	// the answers in region ID order. Give each node its own
	// ServerOptions.IDBase so that their region IDs differ.
	Servers []ServerSpec `json:"servers"`
	// Cache configures the static and dynamic caches (docs/farmem.md,
	// "DPU caches"); the zero value has a static cache only.
	Cache CacheConfig `json:"cache,omitzero"`
}

// Validate checks the knobs and the servers.
func (c AgentConfig) Validate() error {
	errs := []error{c.Config.Validate(), c.Cache.Validate(c.Config.WithDefaults().ChunkSize)}
	if len(c.Servers) == 0 {
		errs = append(errs, errors.New("farmem: agent config: no servers"))
	}
	seen := map[uint32]int{}
	addrs := map[netip.AddrPort]int{}
	for i, s := range c.Servers {
		if !s.Addr.IsValid() || s.Addr.Port() == 0 {
			errs = append(errs, fmt.Errorf("farmem: agent config: server %d: address %v", i, s.Addr))
		}
		if j, ok := addrs[s.Addr]; ok {
			errs = append(errs, fmt.Errorf("farmem: agent config: servers %d and %d are both %v: list each memory node once", j, i, s.Addr))
		}
		addrs[s.Addr] = i
		for _, r := range s.Regions {
			if j, ok := seen[r]; ok && j != i {
				errs = append(errs, fmt.Errorf("farmem: agent config: region %d on servers %d and %d", r, j, i))
			}
			seen[r] = i
		}
	}
	return errors.Join(errs...)
}

// AgentOptions are an agent's run-time inputs besides its config.
type AgentOptions struct {
	// HostTransports face the host processes, one worker each (AF_XDP
	// sockets on pf0hpf under lovelockd); nil opens one kernel UDP socket
	// on Listen. FabricTransports face the memory nodes (AF_XDP on p0);
	// worker i forwards through FabricTransports[i % len]; nil opens one
	// kernel UDP socket per worker on an ephemeral port. The agent owns
	// all of them.
	HostTransports, FabricTransports []transport.Transport
	Logger                           *slog.Logger
}

// Agent is the DPU agent: it receives host requests, looks up which memory
// node serves each region, packs the requests of one receive batch bound for
// the same node and tenant into task batches (several per datagram where
// they fit), forwards them asynchronously, and answers each host from the
// completion loop when the node replied. Per worker one loop receives and
// issues, another (the fabric receive loop) completes.
type Agent struct {
	cfg    AgentConfig
	hosts  []*hostWorker
	fabric []*requester
	log    *slog.Logger

	hctr, fctr linkCounters
	// lat is the forwarded host requests' round trips to the memory
	// nodes, ownLat the agent's own (fills, static loads, lists): the
	// completion loop records each apart (complete).
	lat, ownLat histogram
	errs        statusCounters
	hostReqs    atomic.Uint64
	readBytes   atomic.Uint64
	writeBytes  atomic.Uint64
	cache       *cache
	fillRR      int           // fabric transport of the next fill; fill loop only
	createRR    atomic.Uint32 // the memory node the next create without a nonce asks first
	// readBufs are chunk-sized buffers for forwarded reads, reused once
	// the reply is packed (a read's reply is not kept for duplicates).
	readBufs sync.Pool

	// ctx is Run's context, for the creates that the completion loop
	// sends on to the next memory node.
	ctx context.Context

	mu      sync.RWMutex
	regions map[uint32]int  // region → index in cfg.Servers
	shared  map[uint32]bool // region IDs two nodes list, warned of once
	// A list answered before a free and taken in after it would learn the
	// freed region again. So frees are numbered (freeEpoch), each list
	// notes the number when it is requested (lists counts those in flight
	// by it), and a region dropped as freed since is not learnt from it.
	// freedAt keeps a drop only while a list requested before it is in
	// flight. All under mu.
	freeEpoch uint64
	freedAt   map[uint32]uint64 // region → freeEpoch of its drop
	lists     map[uint64]int    // lists in flight, by freeEpoch at their request

	// forwarded counts host requests sent on to memory nodes, each once;
	// fanOut the further memory nodes they asked (a list's other nodes, a
	// create's next node after a full one); fwdBatches the task batches
	// that carried both.
	forwarded, fanOut, fwdBatches atomic.Uint64

	// unresolved counts the host requests waiting in resolve for a refresh
	// to find their memory node (at most cfg.Window; those beyond are
	// answered StatusUnavailable and counted in unresolvedRefused).
	unresolved        atomic.Int64
	unresolvedRefused atomic.Uint64
	readBufAllocs     atomic.Uint64 // buffers readBuf had to make (the pool was empty)

	// statics queues the hosts' static loads for the staticLoaders
	// loaders (staticLoop); staticPending counts those queued or loading.
	statics       chan staticJob
	staticPending atomic.Int64
	staticRefused atomic.Uint64 // refused: the queue was full
	// Refusals of hints and static loads, counted, and logged at most once
	// per refusalLogEvery.
	hintsRefused, staticFailed atomic.Uint64
	hintLog, staticLog         sometimes

	// Freed notices of memory nodes (NoticeStats).
	noticesIn, noticesDropped, noticesRefused atomic.Uint64

	refreshMu    sync.Mutex // one refresh at a time
	lastRefresh  time.Time  // when the last refresh started; under refreshMu
	refreshedAll bool       // whether it listed every memory node; under refreshMu
	running      atomic.Bool
	closeOnce    sync.Once
}

type hostWorker struct {
	a    *Agent
	tr   transport.Transport
	resp *responder
	fab  *requester

	mu sync.Mutex // pk: replies from the completion loops
	pk *packer

	// logLater are the lines local logs (rate-limited) while it holds
	// mu: the run loop writes them once mu is released. Run loop only.
	logLater []func()
}

// hostReq is what a forwarded call remembers of its host request.
type hostReq struct {
	w      *hostWorker
	src    netip.AddrPort
	tenant uint32
	id     uint64
	server int
	// asked counts the memory nodes a create has asked.
	asked int
	// held: a write that the cache holds in flight (beginWrite), to end
	// (endWrite) once it is answered or given up.
	held bool
	// list collects a list's answers, one per memory node.
	list *listMerge
}

// listMerge is a host's list request asked of every memory node.
type listMerge struct {
	parts  [][]RegionInfo
	more   []bool // the node's answer was cut: it has more regions
	left   int
	failed Status
}

// listPart is the call of one memory node's part of a list.
type listPart struct {
	hr     *hostReq
	server int
	since  uint64 // listStart's epoch
}

// AgentStats are an agent's counters.
type AgentStats struct {
	Servers int `json:"servers"`
	Regions int `json:"regions"`
	// HostRequests counts requests taken from hosts (duplicates not
	// included); Forwarded the host requests sent on to memory nodes,
	// each once however many nodes it asks (so never more than
	// HostRequests); FanOut the requests to further nodes that some of
	// them made: a list's parts beyond the first (it asks every node),
	// and a create's tries of the next node after a full one. Batches
	// counts the task batches that carried them all (the requests of one
	// receive batch bound for one memory node and tenant, packed several
	// per datagram where they fit; Fabric.TXDatagrams counts the
	// datagrams); AvgBatch is Forwarded / Batches, host requests per task
	// batch, SODA's aggregation. OwnRequests counts the agent's own
	// requests to memory nodes: cache fills, static loads and region
	// lists (Fabric.Requests = Forwarded + FanOut + OwnRequests).
	HostRequests uint64  `json:"host_requests"`
	Forwarded    uint64  `json:"forwarded"`
	FanOut       uint64  `json:"fan_out"`
	Batches      uint64  `json:"batches"`
	AvgBatch     float64 `json:"avg_batch"`
	OwnRequests  uint64  `json:"own_requests"`
	// ReadBytes is page data returned to hosts (server → host),
	// WriteBytes page data forwarded to memory nodes (host → server).
	ReadBytes  uint64 `json:"read_bytes"`
	WriteBytes uint64 `json:"write_bytes"`
	// Host counts the host side (RX: host → agent), Fabric the memory
	// node side (TX: agent → nodes, with retransmissions).
	Host   LinkStats `json:"host"`
	Fabric LinkStats `json:"fabric"`
	// Errors counts replies to hosts by failure kind.
	Errors ErrorCounts `json:"errors"`
	// Latency is the round trip from forwarding a host request to the
	// node's reply, one sample per node asked (FanOut included);
	// OwnLatency that of the agent's own requests (OwnRequests: cache
	// fills' and static loads' reads, region lists). Requests that got no
	// reply are in neither.
	Latency    Latency `json:"latency"`
	OwnLatency Latency `json:"own_latency"`
	// Cache is the static and dynamic caches' state and counters.
	Cache CacheStats `json:"cache"`
	// FreedNotices counts the memory nodes' notices that a region the
	// agent caches was freed on them.
	FreedNotices NoticeStats `json:"freed_notices"`
	// Refused counts hints and static loads the agent refused, each kind
	// logged at most once a minute.
	Refused RefusedStats `json:"refused"`
	// Overload counts what the agent turned away to bound its memory and
	// goroutines when hosts send more than it can hold (docs/farmem.md,
	// "The DPU agent", "Bounds").
	Overload OverloadStats `json:"overload"`
}

// OverloadStats are the agent's bounds on work a host can make it hold,
// and what it turned away at them. A request turned away is answered
// StatusUnavailable: the host tries again later.
type OverloadStats struct {
	// Unresolved is the host requests waiting now for the agent to learn
	// which memory node serves their region (a refresh, which a silent
	// node makes last seconds); UnresolvedLimit bounds them (the config's
	// window), and UnresolvedRefused counts those refused beyond it.
	Unresolved        int    `json:"unresolved"`
	UnresolvedLimit   int    `json:"unresolved_limit"`
	UnresolvedRefused uint64 `json:"unresolved_refused"`
	// StaticQueued is the hosts' static loads queued or loading now
	// (op static; a few load at once, the others wait in one queue);
	// StaticLimit bounds them, and StaticRefused counts those refused
	// beyond it.
	StaticQueued  int    `json:"static_queued"`
	StaticLimit   int    `json:"static_limit"`
	StaticRefused uint64 `json:"static_refused"`
}

// RefusedStats count the hosts' hints and static loads that the agent
// refused or could not carry out (their replies' statuses are in
// AgentStats.Errors as well).
type RefusedStats struct {
	// Hints counts hints refused: malformed ranges or flags, a region
	// of another tenant or unknown to the agent.
	Hints uint64 `json:"hints"`
	// StaticLoads counts static loads that failed: a region unknown or
	// of another tenant, a range outside it or beyond static_size, a
	// memory node that did not answer. Those refused for a full queue are
	// in OverloadStats.StaticRefused instead.
	StaticLoads uint64 `json:"static_loads"`
}

// NoticeStats count the notices memory nodes send when they free a region
// that the agent read into its caches (OpFreed; docs/farmem.md,
// "Coherence").
type NoticeStats struct {
	// Received counts every notice that arrived, repeats included.
	Received uint64 `json:"received"`
	// Dropped counts the regions a notice made the agent drop from its
	// routes and caches at once. A repeat, or the notice of a region the
	// agent freed itself, finds nothing left to drop.
	Dropped uint64 `json:"dropped"`
	// Refused counts notices not from the memory node that serves the
	// region (forged, or misdirected), or of a version or length the
	// agent does not know; they change nothing.
	Refused uint64 `json:"refused"`
}

// NewAgent validates cfg and opens (or takes) the transports.
func NewAgent(cfg AgentConfig, opts AgentOptions) (*Agent, error) {
	cfg.Config = cfg.Config.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	hosts, fabric := opts.HostTransports, opts.FabricTransports
	var opened []transport.Transport
	fail := func(err error) (*Agent, error) {
		for _, t := range append(append(opened, hosts...), fabric...) {
			_ = t.Close()
		}
		return nil, fmt.Errorf("farmem: agent: %w", err)
	}
	if hosts == nil {
		c, err := udp.Listen(cfg.Listen, kernelUDP)
		if err != nil {
			return fail(err)
		}
		hosts = []transport.Transport{c}
	}
	if fabric == nil {
		for range hosts {
			c, err := udp.Listen(netip.AddrPortFrom(netip.IPv4Unspecified(), 0), kernelUDP)
			if err != nil {
				return fail(err)
			}
			fabric = append(fabric, c)
		}
	}
	for _, t := range append(append([]transport.Transport{}, hosts...), fabric...) {
		if t.MaxPayload() < MinDatagram {
			return fail(fmt.Errorf("transport carries %d-byte datagrams, need %d", t.MaxPayload(), MinDatagram))
		}
	}
	a := &Agent{cfg: cfg, log: log, regions: make(map[uint32]int), freedAt: map[uint32]uint64{}, lists: map[uint64]int{}, cache: newCache(cfg.Cache, cfg.ChunkSize),
		statics: make(chan staticJob, staticQueue), hintLog: sometimes{every: refusalLogEvery}, staticLog: sometimes{every: refusalLogEvery}}
	a.cache.onFill = a.retryWaiters
	for i, s := range cfg.Servers {
		for _, r := range s.Regions {
			a.regions[r] = i
		}
	}
	for _, t := range fabric {
		f := newRequester(cfg.Config, t, &a.fctr, nil, a.complete)
		f.notice = a.regionFreed
		a.fabric = append(a.fabric, f)
	}
	for i, t := range hosts {
		a.hosts = append(a.hosts, &hostWorker{a: a, tr: t, resp: newResponder(cfg.Config, &a.hctr),
			fab: a.fabric[i%len(a.fabric)], pk: newPacker(min(cfg.MaxDatagram, t.MaxPayload()))})
	}
	log.Info("farmem: agent ready", "addr", hosts[0].LocalAddr(), "workers", len(hosts), "servers", len(cfg.Servers))
	return a, nil
}

// Addr returns the host-facing address.
func (a *Agent) Addr() netip.AddrPort { return a.hosts[0].tr.LocalAddr() }

// Close closes every transport; Run returns.
func (a *Agent) Close() error {
	a.closeOnce.Do(func() {
		for _, w := range a.hosts {
			_ = w.tr.Close()
		}
		for _, f := range a.fabric {
			_ = f.tr.Close()
		}
	})
	return nil
}

// Run runs the workers and the completion loops until ctx is done or the
// agent is closed. Requests in flight then fail towards their hosts, which
// retransmit them to the agent's next run. Run may be called once.
func (a *Agent) Run(ctx context.Context) error {
	if !a.running.CompareAndSwap(false, true) {
		return errors.New("farmem: agent: Run called twice")
	}
	defer a.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.ctx = ctx
	var wg sync.WaitGroup
	errs := make([]error, len(a.hosts)+len(a.fabric))
	for i, f := range a.fabric {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f.run(ctx); err != nil {
				errs[i] = err
			}
			cancel()
		}()
	}
	for i, w := range a.hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.run(ctx); err != nil {
				errs[len(a.fabric)+i] = err
			}
			cancel()
		}()
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		a.fillLoop(ctx)
	}()
	for range staticLoaders {
		wg.Go(func() { a.staticLoop(ctx) })
	}
	go func() {
		defer wg.Done()
		a.watchRegions(ctx)
	}()
	// Waited for like the loops: both stop at ctx's end, and neither may
	// outlive Run (a log line, a cache change after it returned).
	wg.Go(func() {
		a.refresh(ctx, time.Now())
		a.loadConfiguredStatic(ctx)
	})
	wg.Wait()
	return errors.Join(errs...)
}

// refresh learns the regions of every memory node from their list
// answers, unless a refresh started after since (it answers for since as
// well). Refreshes run one at a time, so a stream of requests for unknown
// regions costs at most one list round per node at a time. It reports
// whether every node answered its whole list: if one did not, a region
// not found may be on it.
func (a *Agent) refresh(ctx context.Context, since time.Time) bool {
	a.refreshMu.Lock()
	defer a.refreshMu.Unlock()
	if a.lastRefresh.After(since) {
		return a.refreshedAll
	}
	a.lastRefresh = time.Now()
	a.refreshedAll = false
	// Known before the lists: a region created meanwhile is not taken for
	// freed.
	known := a.knownRegions()
	listed := map[uint32]bool{}
	all := true
	for i, s := range a.cfg.Servers {
		if !a.listServer(ctx, i, s.Addr, listed) {
			all = false
		}
		if ctx.Err() != nil {
			return false
		}
	}
	a.refreshedAll = all
	for _, id := range known {
		if all && !listed[id] {
			a.forgetRegion(id, "no memory node lists it") // freed on its node, past the agent
		}
	}
	return all
}

// listServer learns the regions of memory node i, page by page, adds
// them to listed, and reports whether it listed them all.
func (a *Agent) listServer(ctx context.Context, i int, addr netip.AddrPort, listed map[uint32]bool) bool {
	first := uint32(0)
	for {
		infos, more, ok := a.listPage(ctx, i, addr, first)
		if !ok {
			return false
		}
		for _, ri := range infos {
			listed[ri.ID] = true
		}
		if !more || len(infos) == 0 {
			return true
		}
		first = infos[len(infos)-1].ID + 1
	}
}

// listPage asks memory node i for its regions from first on, learns them,
// and returns them and whether it has more.
func (a *Agent) listPage(ctx context.Context, i int, addr netip.AddrPort, first uint32) ([]RegionInfo, bool, bool) {
	since := a.listStart()
	defer a.listEnd(since) // after learnRegions
	k := &call{rec: Record{Op: OpList, Region: first}, dst: addr, done: make(chan struct{})}
	if err := a.fabric[0].issue(ctx, []*call{k}); err != nil {
		return nil, false, false
	}
	select {
	case <-k.done:
	case <-ctx.Done():
		return nil, false, false
	}
	if k.err != nil || k.reply.Status != StatusOK {
		a.log.Warn("farmem: agent: listing memory node failed", "server", addr, "err", k.err, "status", k.reply.Status)
		return nil, false, false
	}
	infos, err := parseInfos(k.rdata)
	if err != nil {
		a.log.Warn("farmem: agent: memory node's list is malformed", "server", addr, "err", err)
		return nil, false, false
	}
	a.learnRegions(infos, i, since)
	return infos, k.reply.Aux != 0, true
}

// route returns the memory node of a request; a create's is the first it
// asks.
func (a *Agent) route(rec *Record) (int, bool) {
	switch rec.Op {
	case OpCreate:
		// The nonce picks the first node, not a turn: a repeat of the
		// create (the host retransmitting to the agent's next run, whose
		// turn counter started over) asks the node that made the region,
		// which answers with it rather than another node making a second.
		// Random nonces spread creates as turns did.
		if n := rec.nonce(); n != 0 {
			return int(n % uint64(len(a.cfg.Servers))), true
		}
		return int(a.createRR.Add(1)-1) % len(a.cfg.Servers), true
	case OpList:
		return 0, true
	}
	a.mu.RLock()
	i, ok := a.regions[rec.Region]
	a.mu.RUnlock()
	if !ok && len(a.cfg.Servers) == 1 {
		return 0, true // the only node answers for itself
	}
	return i, ok
}

// resolve handles the requests of one batch whose region the agent does not
// know: it asks the memory nodes for their regions (a refresh that started
// after the batch arrived), then forwards those it found and answers the rest
// StatusUnknownRegion, or StatusUnavailable when a memory node did not
// answer its list (the region may be on it: the host retries, and does not
// take the region for gone). It runs on a goroutine of its own, so that the
// worker's loop keeps receiving meanwhile. The misses count as unresolved
// (admitUnresolved) until they are answered or issued; a read gets its
// buffer only once it has a memory node to go to.
func (w *hostWorker) resolve(ctx context.Context, misses []*call, arrived time.Time) {
	a := w.a
	defer a.unresolved.Add(-int64(len(misses)))
	notFound := StatusUnknownRegion
	if !a.refresh(ctx, arrived) {
		notFound = StatusUnavailable
	}
	var found []*call
	w.mu.Lock()
	for _, k := range misses {
		hr := k.user.(*hostReq)
		if srv, ok := a.route(&k.rec); ok {
			hr.server, k.dst = srv, a.cfg.Servers[srv].Addr
			if k.rec.Op == OpRead {
				k.buf = a.readBuf(int(k.rec.Size))
			}
			a.countWrite(k)
			found = append(found, k)
			continue
		}
		if hr.held {
			a.cache.endWrite(k.rec.Region, k.rec.Offset, uint64(k.rec.Size))
		}
		w.replyLocked(hr, Record{Op: k.rec.Op, Region: k.rec.Region, Status: notFound, Size: k.rec.Size}, nil)
	}
	w.flushLocked()
	w.mu.Unlock()
	if len(found) > 0 {
		_ = a.forward(ctx, w.fab, found)
	}
}

// Stats returns a snapshot of the counters.
func (a *Agent) Stats() AgentStats {
	a.mu.RLock()
	nreg := len(a.regions)
	a.mu.RUnlock()
	batches := a.fwdBatches.Load()
	st := AgentStats{Servers: len(a.cfg.Servers), Regions: nreg, HostRequests: a.hostReqs.Load(),
		Batches: batches, ReadBytes: a.readBytes.Load(), WriteBytes: a.writeBytes.Load(),
		Host: a.hctr.snapshot(), Fabric: a.fctr.snapshot(), Errors: a.errs.snapshot(), Latency: a.lat.summary(), OwnLatency: a.ownLat.summary(),
		Cache: a.cache.stats(), FreedNotices: NoticeStats{Received: a.noticesIn.Load(), Dropped: a.noticesDropped.Load(),
			Refused: a.noticesRefused.Load()},
		Overload: OverloadStats{Unresolved: int(a.unresolved.Load()), UnresolvedLimit: a.cfg.Window,
			UnresolvedRefused: a.unresolvedRefused.Load(), StaticQueued: int(a.staticPending.Load()),
			StaticLimit: staticQueue + staticLoaders, StaticRefused: a.staticRefused.Load()},
		Refused: RefusedStats{Hints: a.hintsRefused.Load(), StaticLoads: a.staticFailed.Load()}}
	st.Forwarded, st.FanOut = a.forwarded.Load(), a.fanOut.Load()
	st.OwnRequests = st.Fabric.Requests - min(st.Forwarded+st.FanOut, st.Fabric.Requests)
	if batches > 0 {
		st.AvgBatch = float64(st.Forwarded) / float64(batches)
	}
	return st
}

// run is a worker's receive-and-issue loop.
func (w *hostWorker) run(ctx context.Context) error {
	a := w.a
	pkts := make([]transport.Packet, 64)
	for i := range pkts {
		pkts[i].Data = make([]byte, w.tr.MaxPayload())
	}
	var recs []Record
	var reqs []request
	var dups []resend
	var calls, misses []*call
	for {
		for i := range pkts {
			pkts[i].Data = pkts[i].Data[:cap(pkts[i].Data)]
		}
		n, err := w.tr.Recv(ctx, pkts)
		if err != nil {
			if errors.Is(err, context.Canceled) || errors.Is(err, transport.ErrClosed) {
				return nil
			}
			return fmt.Errorf("farmem: agent: %w", err)
		}
		a.hctr.receives.Add(1)
		calls = calls[:0]
		arrived := time.Now()
		w.mu.Lock()
		for _, p := range pkts[:n] {
			a.hctr.rxDgrams.Add(1)
			a.hctr.rxBytes.Add(uint64(len(p.Data)))
			h, floor, rs, err := Decode(p.Data, recs[:0])
			recs = rs
			if err != nil || h.Type == wire.TypeMemReply {
				a.hctr.malformed.Add(1)
				continue
			}
			reqs, dups = w.resp.accept(p.Addr, h, floor, recs, reqs[:0], dups[:0])
			for _, d := range dups {
				_ = w.pk.add(d.src, d.tenant, wire.TypeMemReply, d.rec, d.rec.Data, false)
			}
			for _, q := range reqs {
				a.hostReqs.Add(1)
				a.hctr.requests.Add(1)
				if q.rec.Status == StatusOK && w.local(ctx, &q) {
					continue
				}
				hr := &hostReq{w: w, src: q.src, tenant: q.tenant, id: q.rec.ID}
				if q.rec.Status != StatusOK {
					w.replyLocked(hr, Record{Op: q.rec.Op, Region: q.rec.Region, Size: q.rec.Size, Status: q.rec.Status}, nil)
					continue
				}
				if q.rec.Op == OpList && len(a.cfg.Servers) > 1 {
					calls = a.listAll(hr, q, calls)
					continue
				}
				calls, misses = w.forwardLocked(&q, calls, misses)
			}
		}
		w.flushLocked()
		w.mu.Unlock()
		for i, l := range w.logLater {
			l()
			w.logLater[i] = nil
		}
		w.logLater = w.logLater[:0]
		if len(misses) > 0 {
			go w.resolve(ctx, misses, arrived)
			misses = nil
		}
		if len(calls) > 0 {
			_ = a.forward(ctx, w.fab, calls)
		}
	}
}

// forward issues calls that carry host requests to memory nodes, in task
// batches: each host request counts once as forwarded, and the calls to
// further nodes that it makes (fanOut) as fan-out; the agent's own
// requests (cache fills, static loads, region lists) go to the requester
// directly and count as its own.
func (a *Agent) forward(ctx context.Context, fab *requester, calls []*call) error {
	var more uint64
	for _, k := range calls {
		if fanOut(k) {
			more++
		}
	}
	a.forwarded.Add(uint64(len(calls)) - more)
	a.fanOut.Add(more)
	a.fwdBatches.Add(uint64(groups(calls)))
	return fab.issue(ctx, calls)
}

// fanOut says whether k asks a further memory node for a host request
// already counted as forwarded: a list's part for any node but the first,
// or a create sent on after a full node refused it (placeElsewhere
// counted that node as asked before it made k).
func fanOut(k *call) bool {
	switch u := k.user.(type) {
	case *listPart:
		return u.server != 0
	case *hostReq:
		return u.asked > 0
	}
	return false
}

// forwardLocked makes the call that sends host request q on to its memory
// node, and adds it to calls, or to misses when the agent does not know the
// node of q's region yet (resolve asks the nodes); beyond the bound on such
// requests (admitUnresolved) it answers StatusUnavailable instead. A write
// into a static range is answered read-only (static ranges are); any other
// write has the overlapping entries invalidated before it leaves, unless
// the region is another tenant's (beginWrite). A read's buffer is taken
// only once the call has a memory node. Call with w.mu held.
func (w *hostWorker) forwardLocked(q *request, calls, misses []*call) ([]*call, []*call) {
	a := w.a
	hr := &hostReq{w: w, src: q.src, tenant: q.tenant, id: q.rec.ID}
	if q.rec.Op == OpWrite {
		switch a.cache.beginWrite(q.tenant, q.rec.Region, q.rec.Offset, uint64(q.rec.Size)) {
		case writeReadOnly:
			w.replyLocked(hr, Record{Op: OpWrite, Region: q.rec.Region, Offset: q.rec.Offset, Size: q.rec.Size, Status: StatusReadOnly}, nil)
			return calls, misses
		case writeHeld:
			hr.held = true
		}
	}
	srv, ok := a.route(&q.rec)
	if !ok && !a.admitUnresolved() {
		if hr.held {
			a.cache.endWrite(q.rec.Region, q.rec.Offset, uint64(q.rec.Size))
		}
		w.replyLocked(hr, Record{Op: q.rec.Op, Region: q.rec.Region, Status: StatusUnavailable, Size: q.rec.Size}, nil)
		return calls, misses
	}
	k := &call{rec: q.rec, tenant: q.tenant, user: hr}
	k.rec.Data, k.data = nil, q.rec.Data
	if !ok {
		return calls, append(misses, k)
	}
	if q.rec.Op == OpRead {
		k.buf = a.readBuf(int(q.rec.Size))
	}
	hr.server, k.dst = srv, a.cfg.Servers[srv].Addr
	a.countWrite(k)
	return append(calls, k), misses
}

// admitUnresolved counts one more request waiting for a refresh to find
// its memory node, and reports whether there was room: at most the
// config's window of them wait (a silent memory node makes a refresh last
// the fabric's retry budget, about 5 s, and hosts may send requests for
// regions no node knows faster than that). A refused one is counted.
func (a *Agent) admitUnresolved() bool {
	if a.unresolved.Add(1) > int64(a.cfg.Window) {
		a.unresolved.Add(-1)
		a.unresolvedRefused.Add(1)
		return false
	}
	return true
}

// countWrite counts a write's page data as forwarded, once its call has a
// memory node to go to (a write to a region no node has is answered, not
// forwarded).
func (a *Agent) countWrite(k *call) {
	if k.rec.Op == OpWrite {
		a.writeBytes.Add(uint64(len(k.data)))
	}
}

// replyLocked packs a reply to a host request and records it with the
// responder. Call with w.mu held.
func (w *hostWorker) replyLocked(hr *hostReq, reply Record, data []byte) {
	reply.ID = hr.id
	if reply.Status != StatusOK {
		w.a.errs.count(reply.Status)
		data = nil
	}
	_ = w.pk.add(hr.src, hr.tenant, wire.TypeMemReply, reply, data, reply.Op == OpRead)
	reply.Data = data
	w.resp.finish(hr.src, reply)
}

func (w *hostWorker) flushLocked() {
	n, b, _ := w.pk.flush(w.tr)
	w.a.hctr.sent(n, b)
}

// complete is the completion loop's handler: it answers the hosts of a
// batch of finished forwarded calls.
func (a *Agent) complete(calls []*call) {
	var touched []*hostWorker
	now := time.Now()
	for _, k := range calls {
		if k.err == nil { // answered: a round trip to record
			lat := &a.lat
			switch k.user.(type) {
			case *hostReq, *listPart:
			default: // the agent's own: k.done or a fill
				lat = &a.ownLat
			}
			lat.record(now.Sub(k.start))
		}
		if hr, ok := k.user.(*hostReq); ok && hr.held {
			// A host's write that the cache holds in flight. Before the
			// host hears of it: fills of the region may start again once
			// the node has applied the write. And before the region is
			// forgotten below, which drops the record that holds the
			// write in flight.
			a.cache.endWrite(k.rec.Region, k.rec.Offset, uint64(k.rec.Size))
		}
		if k.err == nil && k.reply.Status == StatusUnknownRegion && k.rec.Op != OpCreate && k.rec.Op != OpList {
			// Freed on the node past the agent: stop serving its bytes.
			a.forgetRegion(k.rec.Region, "its memory node answered unknown region")
		}
		if k.done != nil { // the agent's own request (refresh, static load)
			close(k.done)
			continue
		}
		if f, ok := k.user.(*fill); ok {
			f.part(a.cache, k)
			continue
		}
		if lp, ok := k.user.(*listPart); ok {
			if w := a.listDone(lp, k); w != nil {
				touched = touch(touched, w)
			}
			continue
		}
		hr := k.user.(*hostReq)
		if a.placeElsewhere(hr, k) {
			continue
		}
		if errors.Is(k.err, ErrClosed) || errors.Is(k.err, context.Canceled) {
			// The agent is stopping: no answer, so that the host sends
			// the request again, to the agent's next run.
			continue
		}
		reply := k.reply
		var data []byte
		if k.err != nil {
			reply = Record{Op: k.rec.Op, Region: k.rec.Region, Size: k.rec.Size, Status: StatusUnavailable}
		}
		switch {
		case reply.Status != StatusOK:
		case k.rec.Op == OpRead:
			data = k.buf
			a.readBytes.Add(uint64(len(data)))
		default:
			data = k.rdata
		}
		if reply.Status == StatusOK {
			switch k.rec.Op {
			case OpCreate:
				a.mu.Lock()
				a.regions[reply.Region] = hr.server
				delete(a.freedAt, reply.Region) // an ID the node gave out again is live
				a.mu.Unlock()
				a.cache.learn(reply.Region, reply.Offset, hr.tenant, true)
			case OpFree:
				a.mu.Lock()
				delete(a.regions, k.rec.Region)
				a.markFreedLocked(k.rec.Region)
				a.mu.Unlock()
				a.cache.forget(k.rec.Region)
			case OpOpen:
				// The server checked the tenant: a non-zero one owns it.
				a.cache.learn(k.rec.Region, reply.Offset, hr.tenant, hr.tenant != 0)
				// The host's datagram, not max_datagram: a reply that
				// does not fit it is never sent.
				data = a.staticMeta(k.rec.Region, hr.w.pk.room())
			}
		}
		hr.w.mu.Lock()
		hr.w.replyLocked(hr, reply, data)
		hr.w.mu.Unlock()
		touched = touch(touched, hr.w)
		if k.rec.Op == OpRead {
			// Packed (copied) into the reply's datagrams; the call is out
			// of the requester's table, so no late fragment writes it.
			buf := k.buf
			k.buf = nil
			a.readBufs.Put(&buf)
		}
	}
	for _, w := range touched {
		w.mu.Lock()
		w.flushLocked()
		w.mu.Unlock()
	}
}

// touch adds w to the workers whose replies need a flush.
func touch(ws []*hostWorker, w *hostWorker) []*hostWorker {
	for _, o := range ws {
		if o == w {
			return ws
		}
	}
	return append(ws, w)
}

// placeElsewhere sends a create that a full memory node refused on to the
// next node it has not asked, and reports whether it did; the host hears
// ErrNoSpace only when every node is full.
func (a *Agent) placeElsewhere(hr *hostReq, k *call) bool {
	if k.rec.Op != OpCreate {
		return false
	}
	hr.asked++
	if k.err != nil || k.reply.Status != StatusNoSpace || hr.asked >= len(a.cfg.Servers) {
		return false
	}
	hr.server = (hr.server + 1) % len(a.cfg.Servers)
	next := &call{rec: k.rec, data: k.data, tenant: k.tenant, user: hr, dst: a.cfg.Servers[hr.server].Addr}
	// Not from here: issue may wait for room in the window that only
	// this completion loop frees.
	go func() { _ = a.forward(a.ctx, hr.w.fab, []*call{next}) }()
	return true
}

// listAll asks every memory node for its part of a host's list request and
// appends the calls to calls.
func (a *Agent) listAll(hr *hostReq, q request, calls []*call) []*call {
	n := len(a.cfg.Servers)
	hr.list = &listMerge{parts: make([][]RegionInfo, n), more: make([]bool, n), left: n}
	for i, srv := range a.cfg.Servers {
		k := &call{rec: q.rec, tenant: q.tenant, user: &listPart{hr: hr, server: i, since: a.listStart()}, dst: srv.Addr}
		k.rec.Data = nil
		calls = append(calls, k)
	}
	return calls
}

// listDone takes one memory node's answer to a list; with the last one it
// answers the host with the merged list and returns the worker to flush.
// Called from the completion loops; the parts of one list may complete on
// different loops, so the merge is under the worker's lock.
func (a *Agent) listDone(lp *listPart, k *call) *hostWorker {
	hr, m := lp.hr, lp.hr.list
	w := hr.w
	var infos []RegionInfo
	status := StatusOK
	switch {
	case k.err != nil: // unreachable, or the agent is stopping (then no answer goes out)
		status = StatusUnavailable
	case k.reply.Status != StatusOK:
		status = k.reply.Status
	default:
		var err error
		if infos, err = parseInfos(k.rdata); err != nil {
			status = StatusUnavailable
		}
	}
	if status == StatusOK {
		a.learnRegions(infos, lp.server, lp.since)
	}
	a.listEnd(lp.since)
	w.mu.Lock()
	defer w.mu.Unlock()
	if status != StatusOK && m.failed == StatusOK {
		m.failed = status
	}
	m.parts[lp.server], m.more[lp.server] = infos, k.reply.Aux != 0
	if m.left--; m.left > 0 {
		return nil
	}
	if errors.Is(k.err, ErrClosed) || errors.Is(k.err, context.Canceled) {
		return nil
	}
	if m.failed != StatusOK {
		// A list without one node's regions would say less than is
		// there: the host gets the failure and asks again.
		w.replyLocked(hr, Record{Op: OpList, Region: k.rec.Region, Status: m.failed}, nil)
		return w
	}
	merged, more := mergeLists(m.parts, m.more, w.pk.room()/listEntryLen)
	var data []byte
	for _, ri := range merged {
		data = appendInfo(data, ri)
	}
	reply := Record{Op: OpList, Region: k.rec.Region}
	if more {
		reply.Aux = 1
	}
	w.replyLocked(hr, reply, data)
	return w
}

// mergeLists merges the memory nodes' list answers (each in ID order, more
// set where a node cut its answer) into one answer of at most room
// entries in ID order, and reports whether the host must ask again from
// the last ID on. A node that cut its answer may hold IDs above its last
// one, so nothing above the lowest such last ID is answered yet: the next
// request finds them without a gap.
func mergeLists(parts [][]RegionInfo, more []bool, room int) ([]RegionInfo, bool) {
	var all []RegionInfo
	limit, cut := uint32(math.MaxUint32), false
	for i, p := range parts {
		all = append(all, p...)
		if more[i] && len(p) > 0 {
			limit, cut = min(limit, p[len(p)-1].ID), true
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].ID < all[j].ID })
	n := sort.Search(len(all), func(i int) bool { return all[i].ID > limit })
	all = all[:n]
	if len(all) > room {
		all, cut = all[:room], true
	}
	return all, cut
}

// readBuf returns a buffer of n bytes (at most the chunk size) for a
// forwarded read. Its bytes are stale: the reply's fragments overwrite all
// of them before the call completes.
func (a *Agent) readBuf(n int) []byte {
	if p, ok := a.readBufs.Get().(*[]byte); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	a.readBufAllocs.Add(1)
	return make([]byte, n, a.cfg.ChunkSize)
}

// learnRegions records that memory node server serves the listed regions,
// from a list requested at epoch since (listStart). A region dropped as
// freed after that is not learnt: the node listed it before the free.
// A region ID that another node listed as well means two nodes hand out
// the same IDs: requests for it reach only the last node that listed it,
// so the agent says so.
func (a *Agent) learnRegions(infos []RegionInfo, server int, since uint64) {
	learnt := infos[:0:0]
	a.mu.Lock()
	for _, ri := range infos {
		if a.freedAt[ri.ID] > since {
			continue
		}
		learnt = append(learnt, ri)
		if old, ok := a.regions[ri.ID]; ok && old != server && !a.shared[ri.ID] {
			// Once: refreshes repeat every few seconds while caches hold bytes.
			if a.shared == nil {
				a.shared = map[uint32]bool{}
			}
			a.shared[ri.ID] = true
			a.log.Warn("farmem: agent: two memory nodes list the same region ID; requests for it go to the second: give each node its own id_base",
				"region", ri.ID, "first", a.cfg.Servers[old].Addr, "second", a.cfg.Servers[server].Addr)
		}
		a.regions[ri.ID] = server
	}
	a.mu.Unlock()
	for _, ri := range learnt {
		a.cache.learn(ri.ID, ri.Size, ri.Tenant, true)
	}
}

// listStart notes a list request about to be sent and returns the epoch
// to give learnRegions and listEnd.
func (a *Agent) listStart() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lists[a.freeEpoch]++
	return a.freeEpoch
}

// listEnd notes that the list requested at epoch since is answered (or
// given up) and learnt from, and forgets the drops that no list in flight
// predates.
func (a *Agent) listEnd(since uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lists[since]--; a.lists[since] <= 0 {
		delete(a.lists, since)
	}
	oldest := a.freeEpoch
	for e := range a.lists {
		oldest = min(oldest, e)
	}
	for id, e := range a.freedAt {
		if e <= oldest {
			delete(a.freedAt, id)
		}
	}
}

// markFreedLocked numbers the drop of a freed region, for lists in flight
// that were requested before it (learnRegions). Called with mu held.
func (a *Agent) markFreedLocked(id uint32) {
	a.freeEpoch++
	if len(a.lists) > 0 {
		a.freedAt[id] = a.freeEpoch
	}
}
