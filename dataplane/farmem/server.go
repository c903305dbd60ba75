package farmem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
	"golang.org/x/sys/unix"
)

// ServerOptions configure a memory-node server.
type ServerOptions struct {
	Config
	// StateDir holds the regions' backing files and metadata; required.
	StateDir string `json:"state_dir"`
	// Capacity is the most bytes of regions the server holds; creates
	// beyond it fail with ErrNoSpace. Required.
	Capacity uint64 `json:"capacity"`
	// MaxRegions bounds the number of regions the server holds (0:
	// DefaultMaxRegions): each keeps its backing file open, so without it
	// a tenant creating many tiny regions runs the process out of file
	// descriptors (EMFILE) for every other tenant and for restarts.
	// Creates beyond it fail with ErrNoSpace. NewServer lowers it to leave
	// 256 descriptors of the open-files limit (RLIMIT_NOFILE) to the rest
	// of the process, and warns. Regions already in StateDir all load even beyond it; new
	// creates are refused until enough are freed.
	MaxRegions int `json:"max_regions,omitempty"`
	// IDBase is the first region ID this server hands out, so that
	// several memory nodes hand out distinct IDs (0: 1).
	IDBase uint32 `json:"id_base,omitempty"`
	// Addr is where the server listens when Transport is nil.
	Addr netip.AddrPort `json:"addr,omitzero"`
	// PreloadDir is where creates that arrive over the network may
	// preload from: a path relative to it, or an absolute one inside it
	// once symlinks are resolved. Empty, such creates may not preload:
	// otherwise any host could read any file of the node through a region.
	// Server.Create (lovelockd's API, for the node's operator) preloads
	// from anywhere.
	PreloadDir string `json:"preload_dir,omitempty"`
	// Transport carries the server's traffic; nil opens a kernel UDP
	// socket on Addr. The server owns it and closes it when Run returns.
	Transport transport.Transport `json:"-"`
	// Logger receives the server's few messages; nil discards them.
	Logger *slog.Logger `json:"-"`
	// Now replaces the clock for leases in tests; nil is time.Now.
	Now func() time.Time `json:"-"`
}

// Bounds of ServerOptions.MaxRegions.
const (
	// DefaultMaxRegions is a quarter of the kernel's default hard
	// open-files limit (4096), which Go raises the soft limit to.
	DefaultMaxRegions = 1024
	// MaxRegionsLimit is the kernel's default fs.nr_open, the most
	// descriptors a process may be allowed.
	MaxRegionsLimit = 1 << 20
)

// fdReserve is the descriptors of the open-files limit a memory node
// leaves to other than its regions: its sockets, metadata writes,
// preloads, and the rest of lovelockd.
const fdReserve = 256

// CheckMaxRegions validates ServerOptions.MaxRegions (0 is the default).
func CheckMaxRegions(n int) error {
	if n < 0 || n > MaxRegionsLimit {
		return fmt.Errorf("farmem: config: max_regions %d: want 0 (the default, %d) to %d", n, DefaultMaxRegions, MaxRegionsLimit)
	}
	return nil
}

// regionLimit returns the most regions a server holds: want, lowered when
// it would not leave fdReserve of nofile (the open-files limit; half of it
// when that is smaller) to the process's other files. lowered reports
// whether it was.
func regionLimit(want int, nofile uint64) (n int, lowered bool) {
	room := nofile - min(fdReserve, nofile/2)
	if uint64(want) <= room {
		return want, false
	}
	return max(int(room), 1), true
}

// Server is a memory node: it owns regions and answers page reads and
// writes and control operations from agents and clients.
type Server struct {
	opts  ServerOptions
	st    *store
	tr    transport.Transport
	resp  *responder
	ctr   linkCounters
	errs  statusCounters
	read  atomic.Uint64
	wrote atomic.Uint64
	// notices counts the freed notices sent (one per peer and free,
	// repeats not counted).
	notices atomic.Uint64
	// regionsFull is set while creates are refused for the region count,
	// so that the warning is logged once each time it fills.
	regionsFull atomic.Bool
	log         *slog.Logger
	done        chan struct{} // closed by Close: repeats of notices stop

	wg        sync.WaitGroup // creates with a preload, running off the loop
	closeOnce sync.Once
}

// ServerStats are a server's counters.
type ServerStats struct {
	Regions int `json:"regions"`
	// Tenants counts the tenants that own regions, Writers the regions
	// whose writer lease is held.
	Tenants int `json:"tenants"`
	Writers int `json:"writers"`
	// MaxRegions is the bound creates meet: ServerOptions.MaxRegions, or
	// less where NewServer lowered it to the open-files limit.
	MaxRegions int    `json:"max_regions"`
	Used       uint64 `json:"used_bytes"`
	Capacity   uint64 `json:"capacity_bytes"`
	ReadBytes  uint64 `json:"read_bytes"`
	WriteBytes uint64 `json:"write_bytes"`
	// FreedNotices counts the notices that a region was freed sent to
	// the peers that cache it (OpFreed; one per peer and free, not
	// counting its repeats).
	FreedNotices uint64      `json:"freed_notices"`
	Link         LinkStats   `json:"link"`
	Errors       ErrorCounts `json:"errors"`
}

// NewServer validates opts, opens (or creates) the state directory,
// reopening every region it holds, and opens the transport.
func NewServer(opts ServerOptions) (*Server, error) {
	opts.Config = opts.Config.WithDefaults()
	if err := opts.Config.Validate(); err != nil {
		return nil, err
	}
	if opts.StateDir == "" {
		return nil, errors.New("farmem: server: state_dir is required")
	}
	if opts.Capacity == 0 {
		return nil, errors.New("farmem: server: capacity is required")
	}
	if err := CheckMaxRegions(opts.MaxRegions); err != nil {
		return nil, err
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	maxRegions := cmp.Or(opts.MaxRegions, DefaultMaxRegions)
	var nofile unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile); err == nil {
		if n, lowered := regionLimit(maxRegions, nofile.Cur); lowered {
			log.Warn("farmem: server: the open-files limit leaves too few descriptors for max_regions: holding fewer regions; "+
				"raise lovelockd's open-files limit (ulimit -n, LimitNOFILE=) or lower max_regions",
				"max_regions", maxRegions, "holding_at_most", n, "open_files_limit", nofile.Cur, "limit_needed", maxRegions+fdReserve)
			maxRegions = n
		}
	}
	st, err := openStore(opts.StateDir, opts.Capacity, maxRegions, opts.IDBase, opts.Now().Add(opts.LeaseTTL.D()), log)
	if err != nil {
		return nil, err
	}
	if len(st.regions) >= maxRegions {
		log.Warn("farmem: server: the state directory holds max_regions regions or more: all are served, and creates are refused until enough are freed (or raise max_regions)",
			"regions", len(st.regions), "max_regions", maxRegions)
	}
	tr := opts.Transport
	if tr == nil {
		c, err := udp.Listen(opts.Addr, kernelUDP)
		if err != nil {
			st.close()
			return nil, fmt.Errorf("farmem: server: %w", err)
		}
		tr = c
	}
	if tr.MaxPayload() < MinDatagram {
		st.close()
		_ = tr.Close()
		return nil, fmt.Errorf("farmem: server: transport carries %d-byte datagrams, need %d", tr.MaxPayload(), MinDatagram)
	}
	s := &Server{opts: opts, st: st, tr: tr, log: log, done: make(chan struct{})}
	s.resp = newResponder(opts.Config, &s.ctr)
	log.Info("farmem: server ready", "addr", tr.LocalAddr(), "regions", len(st.regions), "used", st.used, "capacity", opts.Capacity)
	return s, nil
}

// Addr returns the address the server receives on.
func (s *Server) Addr() netip.AddrPort { return s.tr.LocalAddr() }

// Create makes a region for tenant (lovelockd's API calls it directly).
func (s *Server) Create(tenant uint32, size uint64, writable bool, preload string) (RegionInfo, error) {
	ri, err := s.st.create(tenant, size, writable, preload, 0)
	s.noteRegionsFull(tenant, err)
	return ri, err
}

// noteRegionsFull logs, once each time the server fills, that creates are
// refused for the region count: the wire carries only StatusNoSpace, which
// a requester reads as bytes.
func (s *Server) noteRegionsFull(tenant uint32, err error) {
	switch {
	case errors.Is(err, errRegionLimit):
		if !s.regionsFull.Swap(true) {
			s.log.Warn("farmem: server: creates refused: "+err.Error(), "tenant", tenant)
		}
	case err == nil:
		s.regionsFull.Store(false)
	}
}

// Free deletes region id of tenant (0: any tenant) and its backing file,
// and tells the peers that cache it (DPU agents) that it is gone.
func (s *Server) Free(tenant, id uint32) error {
	cachers, err := s.st.free(tenant, id)
	if err == nil {
		s.noticeFreed(id, cachers, netip.AddrPort{})
	}
	return err
}

// Repeats of a freed notice: it is sent at once and again after each of
// these times the retransmission timeout, against loss. A notice lost
// every time leaves the peer to learn of the free from its periodic list
// of the node's regions (docs/farmem.md, "Coherence").
var noticeRepeats = []int{1, 5}

// noticeFreed sends OpFreed for region id to each of peers but except
// (the peer that asked for the free, which knows), at once and then
// repeated off the caller's goroutine. Fire and forget: nothing answers a
// notice.
func (s *Server) noticeFreed(id uint32, peers []netip.AddrPort, except netip.AddrPort) {
	peers = slices.DeleteFunc(slices.Clone(peers), func(p netip.AddrPort) bool { return p == except })
	if len(peers) == 0 {
		return
	}
	s.notices.Add(uint64(len(peers)))
	b := AppendDatagram(nil, wire.Header{Type: wire.TypeMemReply, Dst: id}, 0,
		Record{Op: OpFreed, Region: id, Aux: NoticeVersion})
	pkts := make([]transport.Packet, len(peers))
	for i, p := range peers {
		pkts[i] = transport.Packet{Addr: p, Data: b}
	}
	send := func() {
		n, _ := transport.SendAll(s.tr, pkts, nil)
		s.ctr.sent(n, n*len(b))
	}
	send()
	s.log.Info("farmem: server: region freed; told the peers that cache it", "region", id, "peers", len(peers))
	go func() {
		rt := s.opts.RetransmitTimeout.D()
		prev := 0
		for _, k := range noticeRepeats {
			select {
			case <-s.done:
				return
			case <-time.After(time.Duration(k-prev) * rt):
			}
			prev = k
			send()
		}
	}()
}

// List returns tenant's regions (0: every region) in ID order.
func (s *Server) List(tenant uint32) []RegionInfo { return s.st.list(tenant, 0, s.opts.Now()) }

// Stats returns a snapshot of the counters.
func (s *Server) Stats() ServerStats {
	used, regions := s.st.usage(s.opts.Now())
	tenants := map[uint32]bool{}
	writers := 0
	for _, r := range regions {
		tenants[r.Tenant] = true
		if r.Writer {
			writers++
		}
	}
	return ServerStats{Regions: len(regions), Tenants: len(tenants), Writers: writers, MaxRegions: s.st.maxRegions, Used: used, Capacity: s.opts.Capacity,
		ReadBytes: s.read.Load(), WriteBytes: s.wrote.Load(), FreedNotices: s.notices.Load(), Link: s.ctr.snapshot(), Errors: s.errs.snapshot()}
}

// Close closes the transport and the backing files; Run returns.
func (s *Server) Close() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.done)
		err = s.tr.Close()
	})
	return err
}

// Run answers requests until ctx is done or the server is closed, then
// closes it. It returns nil after a cancellation or Close.
func (s *Server) Run(ctx context.Context) error {
	defer s.st.close()
	defer s.wg.Wait() // preloads in progress, before the files close
	defer s.Close()
	pkts := make([]transport.Packet, 64)
	for i := range pkts {
		pkts[i].Data = make([]byte, s.tr.MaxPayload())
	}
	pk := newPacker(min(s.opts.MaxDatagram, s.tr.MaxPayload()))
	var recs []Record
	var reqs []request
	var dups []resend
	buf := make([]byte, MaxChunk)
	for {
		for i := range pkts {
			pkts[i].Data = pkts[i].Data[:cap(pkts[i].Data)]
		}
		n, err := s.tr.Recv(ctx, pkts)
		if err != nil {
			if errors.Is(err, context.Canceled) || errors.Is(err, transport.ErrClosed) {
				return nil
			}
			return fmt.Errorf("farmem: server: %w", err)
		}
		s.ctr.receives.Add(1)
		for _, p := range pkts[:n] {
			s.ctr.rxDgrams.Add(1)
			s.ctr.rxBytes.Add(uint64(len(p.Data)))
			h, floor, rs, err := Decode(p.Data, recs[:0])
			recs = rs
			if err != nil || h.Type == wire.TypeMemReply {
				s.ctr.malformed.Add(1)
				continue
			}
			reqs, dups = s.resp.accept(p.Addr, h, floor, recs, reqs[:0], dups[:0])
			for _, d := range dups {
				_ = pk.add(d.src, d.tenant, wire.TypeMemReply, d.rec, d.rec.Data, false)
			}
			for i := range reqs {
				if q := reqs[i]; q.rec.Op == OpCreate && len(q.rec.Data) > 0 {
					// A preload copies a whole file: off the loop, so that
					// reads and writes go on meanwhile.
					s.wg.Add(1)
					go func() {
						defer s.wg.Done()
						apk := newPacker(pk.max)
						s.execute(apk, &q, nil)
						s.flush(apk)
					}()
					continue
				}
				s.execute(pk, &reqs[i], buf)
			}
		}
		s.flush(pk)
	}
}

func (s *Server) flush(pk *packer) {
	np, nb, _ := pk.flush(s.tr)
	s.ctr.sent(np, nb)
}

// execute runs one request and packs its reply.
func (s *Server) execute(pk *packer, q *request, buf []byte) {
	s.ctr.requests.Add(1)
	rec := &q.rec
	reply := Record{Op: rec.Op, Region: rec.Region, ID: rec.ID, Offset: rec.Offset, Size: rec.Size}
	var data []byte
	now := s.opts.Now()
	ttl := s.opts.LeaseTTL.D()
	err := func() error {
		if rec.Status != StatusOK {
			return fmt.Errorf("%w: %v of %d bytes, chunk size %d", rec.Status.Err(), rec.Op, rec.Size, s.opts.ChunkSize)
		}
		switch rec.Op {
		case OpCreate:
			reply.Region, reply.Size = 0, 0 // the request's are its nonce
			preload := string(rec.Data)
			if preload != "" {
				var err error
				if preload, err = s.preloadPath(preload); err != nil {
					s.log.Warn("farmem: server: create refused", "tenant", q.tenant, "err", err)
					return err
				}
			}
			ri, err := s.st.create(q.tenant, rec.Offset, rec.Aux&CreateWritable != 0, preload, rec.nonce())
			reply.Region, reply.Offset = ri.ID, ri.Size
			s.noteRegionsFull(q.tenant, err)
			return err
		case OpList:
			infos := s.st.list(q.tenant, rec.Region, now)
			room := pk.room() / listEntryLen
			if len(infos) > room {
				infos, reply.Aux = infos[:room], 1
			}
			for _, ri := range infos {
				data = appendInfo(data, ri)
			}
			return nil
		}
		r, err := s.st.get(q.tenant, rec.Region)
		if err != nil {
			return err
		}
		switch rec.Op {
		case OpRead:
			if rec.Aux&ReadCaches != 0 && !r.noteCacher(q.src) {
				// Freed since get: the requester would keep bytes that
				// no notice covers.
				return fmt.Errorf("%w: %d", ErrUnknownRegion, rec.Region)
			}
			data = buf[:rec.Size]
			if err := r.readAt(data, rec.Offset); err != nil {
				data = nil
				return err
			}
			s.read.Add(uint64(len(data)))
		case OpWrite:
			if err := r.holds(rec.Aux, now, false, false, ttl); err != nil {
				return err
			}
			if err := r.writeAt(rec.Data, rec.Offset); err != nil {
				return err
			}
			s.wrote.Add(uint64(len(rec.Data)))
		case OpOpen:
			reply.Offset, reply.Size = r.info.Size, 0
			if r.info.Writable {
				reply.Size = CreateWritable
			}
			if rec.Aux > 1 {
				return fmt.Errorf("%w: open with aux %d (0 to read, 1 to write)", ErrBadRequest, rec.Aux)
			}
			if rec.Aux == 1 {
				// Size: the lease the writer held before (OpenRetake).
				lease, err := r.acquire(now, ttl, rec.Size, rec.nonce())
				reply.Aux = lease
				return err
			}
		case OpRenew:
			return r.holds(rec.Aux, now, true, false, ttl)
		case OpRelease:
			return r.holds(rec.Aux, now, false, true, ttl)
		case OpFree:
			cachers, err := s.st.free(q.tenant, rec.Region)
			if err == nil {
				s.noticeFreed(rec.Region, cachers, q.src)
			}
			return err
		case OpSync:
			return r.sync()
		}
		return nil
	}()
	if err != nil {
		reply.Status = statusOf(err)
		s.errs.count(reply.Status)
		data = nil
	}
	_ = pk.add(q.src, q.tenant, wire.TypeMemReply, reply, data, rec.Op == OpRead)
	reply.Data = data
	s.resp.finish(q.src, reply)
}

// preloadPath resolves the preload path of a create that arrived over the
// network, which must lie inside ServerOptions.PreloadDir with symlinks
// resolved, and returns the resolved path (the one opened, so that a link
// swapped in later leads nowhere else).
func (s *Server) preloadPath(p string) (string, error) {
	if s.opts.PreloadDir == "" {
		return "", fmt.Errorf("%w: preload %s: preloads over the network are off on this memory node "+
			"(set its preload_dir, or create through its lovelockd: lovelock mem create --preload)", ErrBadRequest, p)
	}
	dir, err := filepath.EvalSymlinks(s.opts.PreloadDir)
	if err != nil {
		return "", fmt.Errorf("%w: preload_dir: %v", ErrIO, err)
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(dir, p)
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", fmt.Errorf("%w: preload %s: %v", ErrBadRequest, p, err)
	}
	if rel, err := filepath.Rel(dir, real); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("%w: preload %s: outside the memory node's preload_dir %s", ErrBadRequest, p, s.opts.PreloadDir)
	}
	return real, nil
}
