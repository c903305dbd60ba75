package farmem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
)

// kernelUDP are the options of the kernel UDP sockets that the client, the
// server and the agent open for themselves. GSO hands a chunk's equal-sized
// datagrams to the kernel as one buffer per run (a 64 KiB chunk's eight
// jumbo datagrams exceed one run's 65507 bytes: a run of seven and one);
// no far-memory receiver steers by payload, which is what GSO would upset.
var kernelUDP = udp.Options{GSO: true}

// ClientOptions configure a host client.
type ClientOptions struct {
	Config
	// Tenant goes into every request; regions of other tenants refuse.
	Tenant uint32
	// Server is the node's DPU agent, or a memory node directly (the
	// text's server-only baseline).
	Server netip.AddrPort
	// Transport carries the client's traffic; nil opens a kernel UDP
	// socket on Local (zero: an ephemeral port on the unspecified address
	// of Server's family). The client owns it.
	Transport transport.Transport
	Local     netip.AddrPort
	Logger    *slog.Logger
}

// Client is a host process's connection to far memory. It is safe for
// concurrent use.
type Client struct {
	opts   ClientOptions
	req    *requester
	ctr    linkCounters
	lat    histogram
	cancel context.CancelFunc
	done   chan struct{}
	ctx    context.Context
}

// ClientStats are a client's counters.
type ClientStats struct {
	Link    LinkStats `json:"link"`
	Latency Latency   `json:"latency"`
}

// NewClient opens the transport and starts the receive loop.
func NewClient(opts ClientOptions) (*Client, error) {
	opts.Config = opts.Config.WithDefaults()
	if err := opts.Config.Validate(); err != nil {
		return nil, err
	}
	if !opts.Server.IsValid() {
		return nil, errors.New("farmem: client: no server or agent address")
	}
	tr := opts.Transport
	if tr == nil {
		local := opts.Local
		if !local.IsValid() {
			local = netip.AddrPortFrom(netip.IPv4Unspecified(), 0)
			if opts.Server.Addr().Is6() && !opts.Server.Addr().Is4In6() {
				local = netip.AddrPortFrom(netip.IPv6Unspecified(), 0)
			}
		}
		c, err := udp.Listen(local, kernelUDP)
		if err != nil {
			return nil, fmt.Errorf("farmem: client: %w", err)
		}
		tr = c
	}
	if tr.MaxPayload() < MinDatagram {
		_ = tr.Close()
		return nil, fmt.Errorf("farmem: client: transport carries %d-byte datagrams, need %d", tr.MaxPayload(), MinDatagram)
	}
	c := &Client{opts: opts, done: make(chan struct{})}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.req = newRequester(opts.Config, tr, &c.ctr, &c.lat, func(calls []*call) {
		for _, k := range calls {
			close(k.done)
		}
	})
	go func() {
		defer close(c.done)
		_ = c.req.run(c.ctx)
		_ = tr.Close()
	}()
	return c, nil
}

// Close stops the client; calls in progress fail with ErrClosed. Regions
// opened through it stop working; Close them first to release their writer
// leases.
func (c *Client) Close() error {
	c.cancel()
	_ = c.req.tr.Close()
	<-c.done
	return nil
}

// Stats returns a snapshot of the counters.
func (c *Client) Stats() ClientStats {
	return ClientStats{Link: c.ctr.snapshot(), Latency: c.lat.summary()}
}

// do runs one request and returns its reply.
func (c *Client) do(ctx context.Context, k *call) error {
	k.dst, k.tenant, k.done = c.opts.Server, c.opts.Tenant, make(chan struct{})
	if err := c.req.issue(ctx, []*call{k}); err != nil && k.err == nil && !errors.Is(err, ErrClosed) {
		// Packing failed (an oversize record, ErrBadRequest): nothing
		// was sent for k.
		if c.req.cancel(k) {
			return err
		}
	}
	select {
	case <-k.done:
	case <-ctx.Done():
		if c.req.cancel(k) {
			return ctx.Err()
		}
		<-k.done
	}
	if k.err != nil {
		return k.err
	}
	if err := k.reply.Status.Err(); err != nil {
		if k.rec.Op == OpCreate && k.reply.Status == StatusNoSpace {
			// The status does not say which bound refused it.
			return fmt.Errorf("%w (%s: the memory node lacks the capacity for it, or holds its max_regions regions: "+
				"free regions, or raise its capacity or max_regions)", err, k.what())
		}
		return fmt.Errorf("%w (%s)", err, k.what())
	}
	return nil
}

// CreateOptions say what kind of region Create makes.
type CreateOptions struct {
	// Writable regions accept one writer at a time; others are read-only
	// after creation (useful with Preload).
	Writable bool
	// Preload names a file on the memory node whose bytes fill the region
	// (the size then defaults to the file's).
	Preload string
}

// Create makes a region of size bytes on the memory node (through the
// agent: its default one) and returns its description.
func (c *Client) Create(ctx context.Context, size uint64, o CreateOptions) (RegionInfo, error) {
	k := &call{rec: Record{Op: OpCreate, Offset: size}, data: []byte(o.Preload)}
	if o.Writable {
		k.rec.Aux = CreateWritable
	}
	k.rec.setNonce(newNonce()) // a repeat the memory node did not cache makes no second region
	if err := c.do(ctx, k); err != nil {
		return RegionInfo{}, fmt.Errorf("farmem: create: %w", err)
	}
	return RegionInfo{ID: k.reply.Region, Tenant: c.opts.Tenant, Size: k.reply.Offset, Writable: o.Writable, Source: o.Preload}, nil
}

// Free deletes a region.
func (c *Client) Free(ctx context.Context, id uint32) error {
	if err := c.do(ctx, &call{rec: Record{Op: OpFree, Region: id}}); err != nil {
		return fmt.Errorf("farmem: free: %w", err)
	}
	return nil
}

// List returns the tenant's regions.
func (c *Client) List(ctx context.Context) ([]RegionInfo, error) {
	var out []RegionInfo
	first := uint32(0)
	for {
		k := &call{rec: Record{Op: OpList, Region: first}}
		if err := c.do(ctx, k); err != nil {
			return nil, fmt.Errorf("farmem: list: %w", err)
		}
		infos, err := parseInfos(k.rdata)
		if err != nil {
			return nil, err
		}
		out = append(out, infos...)
		if k.reply.Aux == 0 || len(infos) == 0 {
			return out, nil
		}
		first = infos[len(infos)-1].ID + 1
	}
}

// Alloc creates a writable anonymous region and opens it as its writer.
func (c *Client) Alloc(ctx context.Context, size uint64) (*Region, error) {
	ri, err := c.Create(ctx, size, CreateOptions{Writable: true})
	if err != nil {
		return nil, err
	}
	return c.Open(ctx, ri.ID, true)
}

// Open opens region id for reading, and with writer set as its one writer
// (ErrWriterBusy while another writer holds it). A writer's lease is
// renewed in the background until Close.
func (c *Client) Open(ctx context.Context, id uint32, writer bool) (*Region, error) {
	r := &Region{c: c, id: id, writer: writer, stop: make(chan struct{}), stopped: make(chan struct{})}
	if err := r.open(ctx, 0); err != nil {
		return nil, fmt.Errorf("farmem: open region %d: %w", id, err)
	}
	if writer {
		go r.renew()
	} else {
		close(r.stopped)
	}
	return r, nil
}

// Region is an open region: an io.ReaderAt and io.WriterAt whose accesses
// are split into chunks (Config.ChunkSize, aligned to multiples of it in
// the region) issued concurrently. It is safe for concurrent use by many
// goroutines. Writes need the region opened as writer; a WriteAt that
// returned nil is acknowledged: the memory node has written it to its
// backing file, and it survives a restart of the node or of the agent.
type Region struct {
	c      *Client
	id     uint32
	writer bool
	size   uint64

	reacq  sync.Mutex // one reacquire at a time
	mu     sync.Mutex
	lease  uint32
	closed bool
	lost   error   // wraps ErrLeaseLost once another writer got the region; under mu
	static []Range // ranges in the DPU agent's static cache; under mu

	stop, stopped chan struct{}
}

var (
	_ io.ReaderAt = (*Region)(nil)
	_ io.WriterAt = (*Region)(nil)
)

// open opens the region; a writer asks for the lease again with old, the
// lease it held (0: a new writer).
func (r *Region) open(ctx context.Context, old uint32) error {
	k := &call{rec: Record{Op: OpOpen, Region: r.id}}
	if r.writer {
		k.rec.Aux, k.rec.Size = 1, old
		k.rec.setNonce(newNonce()) // a repeat the memory node did not cache is not refused by its own lease
	}
	if err := r.c.do(ctx, k); err != nil {
		return err
	}
	static, _ := parseRanges(k.rdata) // an agent's static ranges; none from a memory node
	r.mu.Lock()
	r.lease = k.reply.Aux
	r.static = static
	r.mu.Unlock()
	if r.size == 0 {
		r.size = k.reply.Offset // before the handle is shared; a size never changes
	}
	return nil
}

// ID returns the region's ID.
func (r *Region) ID() uint32 { return r.id }

// Size returns the region's size in bytes.
func (r *Region) Size() int64 { return int64(r.size) }

func (r *Region) currentLease() (uint32, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return 0, ErrClosed
	}
	return r.lease, nil
}

// lostErr returns the handle's ErrLeaseLost error, nil while it has not
// lost its lease to another writer.
func (r *Region) lostErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lost
}

// Err returns an error wrapping ErrLeaseLost once the writer's lease lapsed
// and another writer was granted the region since (found by a write, a
// Sync or a renewal): the bytes this handle reads may have been written by
// it, and none of its writes are applied any more. Nil otherwise.
func (r *Region) Err() error { return r.lostErr() }

// renew keeps the writer lease alive at a third of its TTL, and takes it
// again when the memory node lost it (a restart) or it lapsed; it stops
// once another writer got the region (ErrLeaseLost).
func (r *Region) renew() {
	defer close(r.stopped)
	t := time.NewTicker(r.c.opts.LeaseTTL.D() / 3)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-r.c.ctx.Done():
			return
		case <-t.C:
		}
		lease, err := r.currentLease()
		if err != nil {
			return
		}
		err = r.c.do(r.c.ctx, &call{rec: Record{Op: OpRenew, Region: r.id, Aux: lease}})
		if errors.Is(err, ErrNotWriter) && errors.Is(r.reacquire(lease), ErrLeaseLost) {
			return
		}
	}
}

// chunks calls fn for each chunk of [off, off+n) concurrently and returns
// the first error.
func (r *Region) chunks(n int, off int64, fn func(lo, hi int) error) error {
	cs := int64(r.c.opts.ChunkSize)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for lo := 0; lo < n; {
		hi := min(n, lo+int(cs-(off+int64(lo))%cs))
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			if err := fn(lo, hi); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}(lo, hi)
		lo = hi
	}
	wg.Wait()
	return first
}

// ReadAt reads len(p) bytes at off. Like any io.ReaderAt it returns io.EOF
// with the bytes up to the end of the region when p reaches past it.
func (r *Region) ReadAt(p []byte, off int64) (int, error) {
	if _, err := r.currentLease(); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, fmt.Errorf("farmem: read region %d: %w: offset %d", r.id, ErrOutOfRange, off)
	}
	if uint64(off) >= r.size {
		return 0, io.EOF
	}
	n := int(min(uint64(len(p)), r.size-uint64(off)))
	err := r.chunks(n, off, func(lo, hi int) error {
		return r.c.do(r.c.ctx, &call{rec: Record{Op: OpRead, Region: r.id, Offset: uint64(off) + uint64(lo), Size: uint32(hi - lo)}, buf: p[lo:hi]})
	})
	if err != nil {
		return 0, fmt.Errorf("farmem: read region %d: %w", r.id, err)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// WriteAt writes p at off; p must lie within the region (ErrOutOfRange).
// When it fails, the bytes it covers hold old or new data, chunk by chunk.
func (r *Region) WriteAt(p []byte, off int64) (int, error) {
	if !r.writer {
		return 0, fmt.Errorf("farmem: write region %d: %w: opened for reading", r.id, ErrNotWriter)
	}
	if off < 0 || uint64(off) > r.size || uint64(len(p)) > r.size-uint64(off) {
		return 0, fmt.Errorf("farmem: write region %d: %w: %d bytes at %d of %d", r.id, ErrOutOfRange, len(p), off, r.size)
	}
	if err := r.lostErr(); err != nil {
		return 0, fmt.Errorf("farmem: write region %d: %w", r.id, err)
	}
	err := r.chunks(len(p), off, func(lo, hi int) error {
		for try := 0; ; try++ {
			lease, err := r.currentLease()
			if err != nil {
				return err
			}
			err = r.c.do(r.c.ctx, &call{rec: Record{Op: OpWrite, Region: r.id, Offset: uint64(off) + uint64(lo), Size: uint32(hi - lo), Aux: lease}, data: p[lo:hi]})
			if errors.Is(err, ErrNotWriter) && try == 0 {
				// The lease lapsed, or the memory node lost it: take it
				// again, unless another writer got it meanwhile
				// (ErrLeaseLost: this chunk is not written).
				if err := r.reacquire(lease); err != nil {
					return err
				}
				continue
			}
			return err
		}
	})
	if err != nil {
		return 0, fmt.Errorf("farmem: write region %d: %w", r.id, err)
	}
	return len(p), nil
}

// reacquire takes the writer lease again after the memory node reported
// lease old invalid, once for all the chunks that saw it fail. The memory
// node gives it back only if no other writer was granted the region since;
// if one was, the handle has lost the region for good: it returns, and from
// then on every write and Sync returns, an error wrapping ErrLeaseLost.
func (r *Region) reacquire(old uint32) error {
	r.reacq.Lock()
	defer r.reacq.Unlock()
	r.mu.Lock()
	changed, lost := r.lease != old, r.lost
	r.mu.Unlock()
	if lost != nil {
		return lost
	}
	if changed {
		return nil
	}
	err := r.open(r.c.ctx, old)
	if !errors.Is(err, ErrWriterBusy) {
		return err
	}
	lost = fmt.Errorf("%w: region %d was granted to another writer after this writer's lease lapsed; "+
		"writes through this handle not acknowledged before are not applied (%w)", ErrLeaseLost, r.id, err)
	r.mu.Lock()
	if r.lost == nil {
		r.lost = lost
	}
	lost = r.lost
	r.mu.Unlock()
	if l := r.c.opts.Logger; l != nil {
		l.Warn("farmem: writer lease lost", "region", r.id, "err", lost)
	}
	return lost
}

// Sync makes every acknowledged write durable on the memory node's disk
// (fsync of the backing file).
// A writer that lost its lease to another writer gets ErrLeaseLost.
func (r *Region) Sync() error {
	if _, err := r.currentLease(); err != nil {
		return err
	}
	if err := r.lostErr(); err != nil {
		return fmt.Errorf("farmem: sync region %d: %w", r.id, err)
	}
	if err := r.c.do(r.c.ctx, &call{rec: Record{Op: OpSync, Region: r.id}}); err != nil {
		return fmt.Errorf("farmem: sync region %d: %w", r.id, err)
	}
	return nil
}

// Close releases the writer lease and stops the handle; later calls fail
// with ErrClosed. It does not free the region.
func (r *Region) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	lease := r.lease
	r.mu.Unlock()
	if !r.writer {
		return nil
	}
	close(r.stop)
	<-r.stopped
	if r.lostErr() != nil {
		return nil // no lease to release: another writer has the region
	}
	if err := r.c.do(r.c.ctx, &call{rec: Record{Op: OpRelease, Region: r.id, Aux: lease}}); err != nil {
		return fmt.Errorf("farmem: close region %d: %w", r.id, err)
	}
	return nil
}

// dropStatic asks the DPU agent to drop the static ranges that the
// requests in reqs (their data) loaded.
func (r *Region) dropStatic(reqs [][]byte) error {
	var errs []error
	for _, data := range reqs {
		k := &call{rec: Record{Op: OpStatic, Region: r.id, Aux: StaticDrop}, data: data}
		if err := r.c.do(r.c.ctx, k); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Static returns the ranges of the region the DPU agent serves from its
// static cache, as of the open and of this handle's LoadStatic calls.
func (r *Region) Static() []Range {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Range(nil), r.static...)
}

func (r *Region) inStatic(rg Range) bool {
	for _, s := range r.static {
		if s.Offset <= rg.Offset && rg.Offset+rg.Size <= s.Offset+s.Size {
			return true
		}
	}
	return false
}

// rangeRecords calls fn with the ranges packed as many per record as one
// datagram carries.
func (r *Region) rangeRecords(rs []Range, fn func(data []byte) error) error {
	per := max(1, r.c.req.pk.room()/RangeLen)
	for len(rs) > 0 {
		n := min(per, len(rs))
		if err := fn(appendRanges(nil, rs[:n])); err != nil {
			return err
		}
		rs = rs[n:]
	}
	return nil
}

// Hint tells the DPU agent that the ranges will be read soon: it loads
// the cache entries that cover them into its dynamic cache, off the
// critical path, and returns how many entry loads it started (0 from a
// memory node, which has no cache, or while the agent's adaptive switch
// has the dynamic cache off). Ranges in the static cache are not sent.
// Hints are advice: the reads stay correct whatever happens to them.
func (r *Region) Hint(ranges []Range) (int, error) {
	if _, err := r.currentLease(); err != nil {
		return 0, err
	}
	r.mu.Lock()
	var send []Range
	for _, rg := range ranges {
		if rg.Size > 0 && !r.inStatic(rg) {
			send = append(send, rg)
		}
	}
	r.mu.Unlock()
	started := 0
	err := r.rangeRecords(send, func(data []byte) error {
		k := &call{rec: Record{Op: OpHint, Region: r.id}, data: data}
		if err := r.c.do(r.c.ctx, k); err != nil {
			return err
		}
		started += int(k.reply.Aux)
		return nil
	})
	if err != nil {
		return started, fmt.Errorf("farmem: hint region %d: %w", r.id, err)
	}
	return started, nil
}

// SetPrefetcher chooses the DPU agent's prefetcher for the region (for
// every host that reads it).
func (r *Region) SetPrefetcher(p Prefetcher) error {
	if p >= numPrefetchers {
		return fmt.Errorf("farmem: region %d: %w: prefetcher %d", r.id, ErrBadRequest, p)
	}
	if err := r.c.do(r.c.ctx, &call{rec: Record{Op: OpHint, Region: r.id, Aux: uint32(p) + 1}}); err != nil {
		return fmt.Errorf("farmem: region %d: set prefetcher: %w", r.id, err)
	}
	return nil
}

// SetDynamicRanges limits the DPU agent's dynamic cache, for this region,
// to the ranges (none: all of the region, the default): reads elsewhere
// go on to the memory node without taking a cache entry or driving the
// prefetcher, so a stream that would gain nothing from the cache does not
// evict one that does (SODA caches the edge arrays of a graph dynamically,
// its vertex data statically or not at all). The ranges must lie inside
// the region and fit one request (about 500 ranges at a 9000-byte MTU).
// A memory node, which has no cache, accepts and ignores it.
func (r *Region) SetDynamicRanges(ranges []Range) error {
	if per := r.c.req.pk.room() / RangeLen; len(ranges) > per {
		return fmt.Errorf("farmem: region %d: %d dynamic cache ranges, at most %d fit one request: merge them", r.id, len(ranges), per)
	}
	k := &call{rec: Record{Op: OpHint, Region: r.id, Aux: HintDynamic}, data: appendRanges(nil, ranges)}
	if err := r.c.do(r.c.ctx, k); err != nil {
		return fmt.Errorf("farmem: region %d: limit the dynamic cache: %w", r.id, err)
	}
	return nil
}

// LoadStatic asks the DPU agent to load the ranges (Size 0 at Offset 0:
// the whole region) into its static cache, and returns when they are
// there: from then on the agent serves their reads without fabric
// traffic, and refuses writes into them (ErrReadOnly). It returns false
// when the far end is a memory node, which has no cache. It loads all of
// them or none: ranges that take more than one request are loaded one
// request at a time, and when one fails, those the requests before it
// loaded are dropped again (StaticDrop).
func (r *Region) LoadStatic(ranges []Range) (bool, error) {
	if _, err := r.currentLease(); err != nil {
		return false, err
	}
	loaded := true
	var done [][]byte // the requests the agent loaded, to drop on a failure
	err := r.rangeRecords(ranges, func(data []byte) error {
		k := &call{rec: Record{Op: OpStatic, Region: r.id}, data: data}
		if err := r.c.do(r.c.ctx, k); err != nil {
			return err
		}
		if k.reply.Aux > 0 {
			done = append(done, data)
		}
		loaded = loaded && k.reply.Aux > 0
		return nil
	})
	if err != nil {
		err = fmt.Errorf("farmem: static ranges of region %d: %w", r.id, err)
		if derr := r.dropStatic(done); derr != nil {
			err = fmt.Errorf("%w; and the ranges its earlier requests loaded could not all be dropped again, so some stay static until the region is freed or the agent restarts: %w", err, derr)
		}
		return false, err
	}
	if loaded {
		r.mu.Lock()
		for _, rg := range ranges {
			if rg.Size == 0 && rg.Offset == 0 {
				rg.Size = r.size
			}
			r.static = append(r.static, rg)
		}
		r.mu.Unlock()
	}
	return loaded, nil
}
