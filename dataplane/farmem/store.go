package farmem

import (
	"cmp"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// RegionInfo describes one region.
type RegionInfo struct {
	ID       uint32 `json:"id"`
	Tenant   uint32 `json:"tenant"`
	Size     uint64 `json:"size"`
	Writable bool   `json:"writable"`
	// Source is the file the region was preloaded from, empty for an
	// anonymous (zero-filled) region.
	Source string `json:"source,omitempty"`
	// Writer reports whether a writer lease is held.
	Writer bool `json:"writer,omitempty"`
}

// listEntryLen is the wire size of one RegionInfo in a list reply:
// id u32, tenant u32, size u64, flags u32 (bit 0 writable, bit 1 writer).
const listEntryLen = 20

func appendInfo(b []byte, ri RegionInfo) []byte {
	b = binary.BigEndian.AppendUint32(b, ri.ID)
	b = binary.BigEndian.AppendUint32(b, ri.Tenant)
	b = binary.BigEndian.AppendUint64(b, ri.Size)
	var f uint32
	if ri.Writable {
		f |= 1
	}
	if ri.Writer {
		f |= 2
	}
	return binary.BigEndian.AppendUint32(b, f)
}

func parseInfos(b []byte) ([]RegionInfo, error) {
	if len(b)%listEntryLen != 0 {
		return nil, fmt.Errorf("%w: list reply of %d bytes", ErrMalformed, len(b))
	}
	var out []RegionInfo
	for ; len(b) > 0; b = b[listEntryLen:] {
		f := binary.BigEndian.Uint32(b[16:])
		out = append(out, RegionInfo{ID: binary.BigEndian.Uint32(b), Tenant: binary.BigEndian.Uint32(b[4:]),
			Size: binary.BigEndian.Uint64(b[8:]), Writable: f&1 != 0, Writer: f&2 != 0})
	}
	return out, nil
}

// store is a memory node's regions: one backing file per region in the
// state directory and a metadata file written atomically (temp, fsync,
// rename, fsync of the directory). A write is acknowledged once pwrite(2)
// returned, so it survives a restart of the server process (it is in the
// page cache); OpSync fsyncs the backing file for power loss.
//
// The writer leases held are written the same way (leases.json) whenever
// one is granted or released, so that a restart does not hand a region to
// a second writer while the first still writes: a restored lease is good
// for one TTL from the restart, which its holder's renewals extend. Expiry
// times are not written (renewals would cost an fsync each); a holder that
// died holds its region for at most one TTL after a restart, as it would
// without one. The file also keeps, per region, the last lease granted
// (released or expired ones too), so that a writer whose lease lapsed takes
// it again only if no other writer was granted the region since, across
// restarts as well (region.acquire).
type store struct {
	dir      string
	capacity uint64
	// maxRegions bounds the regions held and being created (each keeps
	// its backing file open); a start may load more, which creates wait
	// out.
	maxRegions int

	mu       sync.RWMutex
	regions  map[uint32]*region
	reserved map[uint32]bool // IDs of regions being created
	used     uint64          // bytes of regions and reservations
	nextID   uint32

	// leaseMu orders the writes of leases.json; leases and last are what
	// it holds, by region: the leases held, and the last one granted.
	// Lock order: a region's mu, then leaseMu.
	leaseMu sync.Mutex
	leases  map[uint32]uint32
	last    map[uint32]uint32
	nonces  map[uint32]uint64 // of the opens that got the leases held

	// byNonce finds a region by the nonce of the create that made it, so
	// that a repeated create (after a restart, or forwarded again by a
	// restarted DPU agent) answers the first one's region; creating holds
	// the nonces of creates in progress. Under mu.
	byNonce  map[createKey]uint32
	creating map[createKey]chan struct{}

	// syncDir fsyncs the state directory (a field so that tests can fail
	// it); log receives what a failure of it leaves.
	syncDir func(dir string) error
	log     *slog.Logger

	// closed is set once the server stopped and closed the backing
	// files: a create then would open one nobody closes. Under mu.
	closed bool
}

// errStopped refuses a create on a memory node that stopped serving.
var errStopped = fmt.Errorf("%w: the memory node stopped: create the region once it runs again", ErrUnavailable)

// createKey is a create's nonce, of its tenant.
type createKey struct {
	tenant uint32
	nonce  uint64
}

type region struct {
	info  RegionInfo
	f     *os.File
	st    *store
	mu    sync.Mutex // lease, exp, last, nonce
	lease uint32
	exp   time.Time
	// nonce is that of the open that got lease (0: none): a repeat of
	// that open gets the same lease back instead of ErrWriterBusy.
	nonce uint64
	// createNonce is that of the create that made the region (0: none).
	createNonce uint64
	// last is the last lease granted, held or not (0: none known): a
	// writer that asks for its lapsed lease back gets it only if it is
	// still this one.
	last uint32

	// cachers are the peers whose reads asked to hear of the region's free
	// (ReadCaches), the most recent last, at most maxCachers; freed is set
	// when the region is freed, after which none is added.
	cmu     sync.Mutex
	cachers []netip.AddrPort
	freed   bool
}

// maxCachers bounds the peers a region remembers for its freed notice (the
// DPU agents that cache it: one per compute node that reads it, and one
// per fabric socket of each). Beyond it the one that read least recently
// is forgotten, and learns of the free from its periodic list instead.
const maxCachers = 16

// noteCacher remembers peer as one that caches the region's bytes. It is
// called before the read: a free that comes after it tells peer, and a
// free that came before it makes it fail (false), so that no bytes read
// from the region reach a peer that the free did not tell.
func (r *region) noteCacher(peer netip.AddrPort) bool {
	r.cmu.Lock()
	defer r.cmu.Unlock()
	if r.freed {
		return false
	}
	if i := slices.Index(r.cachers, peer); i >= 0 {
		if i < len(r.cachers)-1 {
			r.cachers = append(slices.Delete(r.cachers, i, i+1), peer)
		}
		return true
	}
	if len(r.cachers) >= maxCachers {
		r.cachers = slices.Delete(r.cachers, 0, 1)
	}
	r.cachers = append(r.cachers, peer)
	return true
}

// takeCachers marks the region freed and returns the peers to tell.
func (r *region) takeCachers() []netip.AddrPort {
	r.cmu.Lock()
	defer r.cmu.Unlock()
	r.freed = true
	c := r.cachers
	r.cachers = nil
	return c
}

type metaFile struct {
	NextID  uint32       `json:"next_id"`
	Regions []RegionInfo `json:"regions"`
	// CreateNonces are the nonces of the creates that made the regions,
	// by region (servers that predate them ignore them).
	CreateNonces map[uint32]uint64 `json:"create_nonces,omitempty"`
}

const (
	metaName   = "regions.json"
	leasesName = "leases.json"
)

// leaseFile is leases.json: the writer lease of each region that has one,
// and the last lease granted of each region that had one (servers that
// predate it ignore it; without it, the held lease counts as the last).
type leaseFile struct {
	Leases map[uint32]uint32 `json:"leases"`
	Last   map[uint32]uint32 `json:"last,omitempty"`
	// Nonces are those of the opens that got the leases held.
	Nonces map[uint32]uint64 `json:"nonces,omitempty"`
}

func regionFile(dir string, id uint32) string {
	return filepath.Join(dir, fmt.Sprintf("region-%08x.mem", id))
}

// openStore loads the state directory (creating it), reopening every region
// the metadata lists and restoring the writer leases held, each good until
// leaseUntil. It loads every region even beyond maxRegions (a limit lowered
// since they were created must not lose them); creates then fail until
// enough are freed.
func openStore(dir string, capacity uint64, maxRegions int, idBase uint32, leaseUntil time.Time, log *slog.Logger) (*store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("farmem: state dir: %w", err)
	}
	s := &store{dir: dir, capacity: capacity, maxRegions: maxRegions, regions: make(map[uint32]*region), reserved: make(map[uint32]bool), nextID: max(idBase, 1),
		leases: make(map[uint32]uint32), last: make(map[uint32]uint32), nonces: make(map[uint32]uint64),
		byNonce: make(map[createKey]uint32), creating: make(map[createKey]chan struct{}), syncDir: syncDir, log: log}
	data, err := os.ReadFile(filepath.Join(dir, metaName))
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("farmem: state: %w", err)
	}
	var m metaFile
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("farmem: state %s: %w (the file is written atomically, so something else changed it: restore it from a backup, or move the state directory away to start empty)", metaName, err)
	}
	var lf leaseFile
	switch data, err := os.ReadFile(filepath.Join(dir, leasesName)); {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("farmem: state: %w", err)
	default:
		if err := json.Unmarshal(data, &lf); err != nil {
			return nil, fmt.Errorf("farmem: state %s: %w (delete it to start with no writer leases: writers then take theirs again)", leasesName, err)
		}
	}
	s.nextID = max(s.nextID, m.NextID)
	for _, ri := range m.Regions {
		f, err := os.OpenFile(regionFile(dir, ri.ID), os.O_RDWR, 0)
		if err != nil {
			s.close()
			if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
				return nil, fmt.Errorf("farmem: state: region %d: %w (the state directory holds %d regions, each kept open: "+
					"raise the process's open-files limit, ulimit -n or LimitNOFILE=, above that with room to spare)", ri.ID, err, len(m.Regions))
			}
			if errors.Is(err, os.ErrNotExist) {
				// No crash leaves this (the file is made before the
				// metadata lists it): serving without it would lose the
				// region's acknowledged writes silently.
				return nil, fmt.Errorf("farmem: state: region %d of tenant %d, listed in %s: %w (restore the backing file from a backup; "+
					"or, to give up its bytes, remove the region from %s)", ri.ID, ri.Tenant, metaName, err, metaName)
			}
			return nil, fmt.Errorf("farmem: state: region %d: %w", ri.ID, err)
		}
		if st, err := f.Stat(); err != nil || uint64(st.Size()) < ri.Size {
			// Not a crash's doing either (a create sizes the file before
			// the metadata lists it): reads of the missing tail would
			// fail for ever, and its acknowledged writes are gone.
			_ = f.Close()
			s.close()
			if err != nil {
				return nil, fmt.Errorf("farmem: state: region %d: %w", ri.ID, err)
			}
			return nil, fmt.Errorf("farmem: state: region %d of tenant %d, listed in %s: backing file %s is %d bytes, shorter than the region's %d "+
				"(restore it from a backup; or, to give up its bytes, remove the region from %s)", ri.ID, ri.Tenant, metaName, f.Name(), st.Size(), ri.Size, metaName)
		}
		ri.Writer = false
		r := &region{info: ri, f: f, st: s}
		if lease := lf.Leases[ri.ID]; lease != 0 && ri.Writable {
			r.lease, r.exp = lease, leaseUntil
			s.leases[ri.ID] = lease
			if n := lf.Nonces[ri.ID]; n != 0 {
				r.nonce = n
				s.nonces[ri.ID] = n
			}
		}
		if n := m.CreateNonces[ri.ID]; n != 0 {
			r.createNonce = n
			s.byNonce[createKey{ri.Tenant, n}] = ri.ID
		}
		if last := cmp.Or(lf.Last[ri.ID], r.lease); last != 0 && ri.Writable {
			r.last = last
			s.last[ri.ID] = last
		}
		s.regions[ri.ID] = r
		s.used += ri.Size
	}
	s.removeOrphans()
	return s, nil
}

// removeOrphans removes the backing files that no region owns and the
// temporary files of metadata writes: what a crash between a create's
// backing file and the metadata write that lists it (a long preload), or
// between a free's metadata write and the file's removal, or inside a
// metadata write leaves. An orphan's ID is never handed out again when it
// lies below next_id, so its blocks (reserved by fallocate) would stay
// taken for good, out of the capacity's count. Called only once the
// metadata was read: without it, every file would look orphaned.
func (s *store) removeOrphans() {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		s.log.Warn("farmem: server: state directory not scanned for leftovers of a crash", "dir", s.dir, "err", err)
		return
	}
	for _, e := range entries {
		name := e.Name()
		var id uint32
		orphan := strings.HasPrefix(name, metaName+".tmp") || strings.HasPrefix(name, leasesName+".tmp")
		if n, _ := fmt.Sscanf(name, "region-%08x.mem", &id); n == 1 && filepath.Join(s.dir, name) == regionFile(s.dir, id) {
			orphan = s.regions[id] == nil
		}
		if !orphan || !e.Type().IsRegular() {
			continue
		}
		if err := os.Remove(filepath.Join(s.dir, name)); err != nil {
			s.log.Warn("farmem: server: leftover of a crash not removed: remove it by hand", "file", filepath.Join(s.dir, name), "err", err)
			continue
		}
		s.log.Info("farmem: server: removed a leftover of a crash (no region owns it)", "file", filepath.Join(s.dir, name))
	}
}

// recordLease writes region id's lease (0: none; a non-zero one is also
// the last granted) and the nonce of the open that got it (0: none) to
// leases.json. forget drops the region's entries altogether (it was freed).
func (s *store) recordLease(id, lease uint32, nonce uint64, forget bool) error {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	old, had := s.leases[id]
	oldLast, hadLast := s.last[id]
	oldNonce, hadNonce := s.nonces[id]
	delete(s.nonces, id)
	switch {
	case forget:
		if !had && !hadLast {
			return nil
		}
		delete(s.leases, id)
		delete(s.last, id)
	case lease == 0:
		if !had {
			return nil
		}
		delete(s.leases, id)
	default:
		s.leases[id] = lease
		s.last[id] = lease
		if nonce != 0 {
			s.nonces[id] = nonce
		}
	}
	data, err := json.MarshalIndent(leaseFile{Leases: s.leases, Last: s.last, Nonces: s.nonces}, "", "  ")
	if err == nil {
		err = s.writeAtomic(leasesName, data)
	}
	if err != nil {
		restore := func(m map[uint32]uint32, v uint32, ok bool) {
			if ok {
				m[id] = v
			} else {
				delete(m, id)
			}
		}
		restore(s.leases, old, had)
		restore(s.last, oldLast, hadLast)
		if hadNonce {
			s.nonces[id] = oldNonce
		} else {
			delete(s.nonces, id)
		}
		return fmt.Errorf("%w: recording the writer lease of region %d: %v", ErrIO, id, err)
	}
	return nil
}

func (s *store) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, r := range s.regions {
		_ = r.f.Close()
	}
}

// saveMeta writes the metadata atomically. Call with mu held.
func (s *store) saveMeta() error {
	m := metaFile{NextID: s.nextID}
	for _, r := range s.regions {
		ri := r.info
		ri.Writer = false
		m.Regions = append(m.Regions, ri)
		if r.createNonce != 0 {
			if m.CreateNonces == nil {
				m.CreateNonces = make(map[uint32]uint64)
			}
			m.CreateNonces[ri.ID] = r.createNonce
		}
	}
	sort.Slice(m.Regions, func(i, j int) bool { return m.Regions[i].ID < m.Regions[j].ID })
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return s.writeAtomic(metaName, data)
}

func (s *store) writeAtomic(name string, data []byte) error {
	dir := s.dir
	tmp, err := os.CreateTemp(dir, name+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return err
	}
	// Renamed, the new file is what a restarted process reads: the change
	// is made, and failing it now would leave the memory node's state and
	// the file apart (a created region's backing file removed while the
	// file lists it). Only a power loss can still undo it.
	if err := s.syncDir(dir); err != nil {
		s.log.Warn("farmem: server: state directory not synced after writing "+name+
			"; the change stands, but a power loss may undo it: check the disk of state_dir", "dir", dir, "err", err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// errRegionLimit marks a create refused for the count of regions rather
// than their bytes (it also wraps ErrNoSpace).
var errRegionLimit = errors.New("too many regions")

// create makes a region of size bytes, zero-filled, or preloaded from the
// file at preload (size 0 takes the file's size; a larger size pads with
// zeros). Capacity counts region sizes, and the backing file's blocks are
// reserved (fallocate) where the file system can, so a full server refuses
// instead of failing writes later; maxRegions counts regions (their open
// files), so that tiny ones cannot run the process out of descriptors. A create with the nonce (not 0) of one
// that made a region of the tenant returns that region instead; a create
// with the nonce of one in progress waits for it if it preloads (it runs off
// the server's loop), and otherwise fails with ErrUnavailable, to be
// retransmitted (only a forged one can meet that: a create without a
// preload runs on the loop, one at a time).
func (s *store) create(tenant uint32, size uint64, writable bool, preload string, nonce uint64) (RegionInfo, error) {
	if nonce != 0 {
		k := createKey{tenant, nonce}
		for {
			s.mu.Lock()
			if id, ok := s.byNonce[k]; ok {
				r := s.regions[id]
				s.mu.Unlock()
				return r.info, nil
			}
			ch, busy := s.creating[k]
			if !busy {
				s.creating[k] = make(chan struct{})
				s.mu.Unlock()
				break
			}
			s.mu.Unlock()
			if preload == "" {
				return RegionInfo{}, fmt.Errorf("%w: a create with nonce %016x is in progress", ErrUnavailable, nonce)
			}
			<-ch
		}
		defer func() {
			s.mu.Lock()
			close(s.creating[k])
			delete(s.creating, k)
			s.mu.Unlock()
		}()
	}
	var src *os.File
	if preload != "" {
		// Non-blocking, so that a named pipe (or a device) is refused
		// below instead of waiting for a writer for ever.
		f, err := os.OpenFile(preload, os.O_RDONLY|unix.O_NONBLOCK, 0)
		if err != nil {
			return RegionInfo{}, fmt.Errorf("%w: preload: %v", ErrBadRequest, err)
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil || !st.Mode().IsRegular() {
			return RegionInfo{}, fmt.Errorf("%w: preload %s is not a regular file", ErrBadRequest, preload)
		}
		size = max(size, uint64(st.Size()))
		src = f
	}
	if size == 0 {
		return RegionInfo{}, fmt.Errorf("%w: region of 0 bytes", ErrBadRequest)
	}
	// Reserve the ID and the capacity, then build the backing file without
	// the lock (a preload may copy gigabytes), then publish the region.
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return RegionInfo{}, errStopped
	}
	if n := len(s.regions) + len(s.reserved); n >= s.maxRegions {
		s.mu.Unlock()
		return RegionInfo{}, fmt.Errorf("%w: %w: %d held, the most it may hold (max_regions %d; each keeps a file open): "+
			"free regions, or raise the memory node's max_regions", ErrNoSpace, errRegionLimit, n, s.maxRegions)
	}
	if s.used+size > s.capacity || s.used+size < s.used {
		// A start with a capacity lowered below the regions held loads
		// them all: used may exceed it.
		free := s.capacity - min(s.used, s.capacity)
		s.mu.Unlock()
		return RegionInfo{}, fmt.Errorf("%w: %d bytes asked, %d of %d free (free regions, or raise the memory node's capacity)", ErrNoSpace, size, free, s.capacity)
	}
	id := s.nextID
	for s.regions[id] != nil || s.reserved[id] || id == 0 {
		id++
	}
	s.reserved[id] = true
	s.used += size
	s.nextID = id + 1
	s.mu.Unlock()
	unreserve := func() {
		s.mu.Lock()
		delete(s.reserved, id)
		s.used -= size
		s.mu.Unlock()
	}

	path := regionFile(s.dir, id)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		unreserve()
		return RegionInfo{}, fmt.Errorf("%w: %v", ErrIO, err)
	}
	fail := func(err error) (RegionInfo, error) {
		f.Close()
		os.Remove(path)
		unreserve()
		return RegionInfo{}, err
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(size)); err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return fail(fmt.Errorf("%w: backing file of %d bytes: %v", ErrNoSpace, size, err))
		}
		if !errors.Is(err, unix.EOPNOTSUPP) {
			return fail(fmt.Errorf("%w: %v", ErrIO, err))
		}
	}
	if src != nil {
		if _, err := io.Copy(f, src); err != nil {
			return fail(fmt.Errorf("%w: preload: %v", ErrIO, err))
		}
	}
	if err := f.Truncate(int64(size)); err != nil {
		return fail(fmt.Errorf("%w: %v", ErrIO, err))
	}
	if err := f.Sync(); err != nil {
		return fail(fmt.Errorf("%w: %v", ErrIO, err))
	}
	ri := RegionInfo{ID: id, Tenant: tenant, Size: size, Writable: writable, Source: preload}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.reserved, id)
	if s.closed {
		// Stopped while this create built its file.
		s.used -= size
		f.Close()
		os.Remove(path)
		return RegionInfo{}, errStopped
	}
	s.regions[id] = &region{info: ri, f: f, st: s, createNonce: nonce}
	if err := s.saveMeta(); err != nil {
		delete(s.regions, id)
		s.used -= size
		f.Close()
		os.Remove(path)
		return RegionInfo{}, fmt.Errorf("%w: metadata: %v", ErrIO, err)
	}
	if nonce != 0 {
		s.byNonce[createKey{tenant, nonce}] = id
	}
	return ri, nil
}

// get returns the region id of tenant (tenant 0, the infrastructure, may
// use any region).
func (s *store) get(tenant, id uint32) (*region, error) {
	s.mu.RLock()
	r := s.regions[id]
	s.mu.RUnlock()
	if r == nil {
		return nil, fmt.Errorf("%w: %d", ErrUnknownRegion, id)
	}
	if tenant != 0 && r.info.Tenant != tenant {
		return nil, fmt.Errorf("%w: region %d", ErrWrongTenant, id)
	}
	return r, nil
}

// free deletes region id of tenant (0: any) and returns the peers that
// cache it (region.noteCacher), to be told.
func (s *store) free(tenant, id uint32) ([]netip.AddrPort, error) {
	r, err := s.get(tenant, id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.regions[id] != r {
		return nil, fmt.Errorf("%w: %d", ErrUnknownRegion, id)
	}
	delete(s.regions, id)
	if err := s.saveMeta(); err != nil {
		s.regions[id] = r
		return nil, fmt.Errorf("%w: metadata: %v", ErrIO, err)
	}
	if r.createNonce != 0 {
		delete(s.byNonce, createKey{r.info.Tenant, r.createNonce})
	}
	cachers := r.takeCachers()
	s.used -= r.info.Size
	_ = r.f.Close()
	_ = os.Remove(regionFile(s.dir, id))
	// A lease of a region that is gone blocks nothing: a failure to
	// forget it only leaves a line in leases.json that the next start
	// ignores.
	_ = s.recordLease(id, 0, 0, true)
	return cachers, nil
}

// list returns tenant's regions (all for tenant 0) with IDs from first on,
// in ID order; a lease counts as held if it is unexpired at now.
func (s *store) list(tenant, first uint32, now time.Time) []RegionInfo {
	s.mu.RLock()
	out := s.listLocked(tenant, first, now)
	s.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// usage returns the bytes used and every region, read together under one
// lock, so that they agree (a create or free between two reads would not).
// used also counts the capacity of creates still building their files,
// which are not listed yet.
func (s *store) usage(now time.Time) (uint64, []RegionInfo) {
	s.mu.RLock()
	used, out := s.used, s.listLocked(0, 0, now)
	s.mu.RUnlock()
	return used, out
}

// listLocked is list's loop; call with s.mu held (read is enough).
func (s *store) listLocked(tenant, first uint32, now time.Time) []RegionInfo {
	var out []RegionInfo
	for _, r := range s.regions {
		if r.info.ID >= first && (tenant == 0 || r.info.Tenant == tenant) {
			ri := r.info
			r.mu.Lock()
			ri.Writer = r.lease != 0 && now.Before(r.exp)
			r.mu.Unlock()
			out = append(out, ri)
		}
	}
	return out
}

// acquire grants the writer lease of r, or fails with ErrWriterBusy while
// another unexpired lease is held. old, when not 0, is the lease the
// writer held before (it lapsed, or the server lost it): the writer gets
// it back only if no other lease was granted since; otherwise another
// writer may have written, the old holder's writes not yet acknowledged
// must not land over that, and it gets ErrWriterBusy (its client reports
// ErrLeaseLost). A region whose last grant is unknown (leases.json was
// removed) gives old back if no one holds it, as before. nonce, when not 0,
// is the open's: a repeat of the open that got the lease now held (or
// lapsed with no grant since) gets that lease again, renewed, so that a
// retransmitted open that the reply cache does not answer (a restart of
// the server, or of the DPU agent that forwards it under a new ID) is not
// refused by its own lease.
func (r *region) acquire(now time.Time, ttl time.Duration, old uint32, nonce uint64) (uint32, error) {
	if !r.info.Writable {
		return 0, fmt.Errorf("%w: region %d", ErrReadOnly, r.info.ID)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if nonce != 0 && r.nonce == nonce && r.lease != 0 {
		r.exp = now.Add(ttl)
		return r.lease, nil
	}
	if old != 0 && r.last != 0 && r.last != old {
		return 0, fmt.Errorf("%w: region %d: lease %08x lost, another writer was granted the region since", ErrWriterBusy, r.info.ID, old)
	}
	held := r.lease != 0 && now.Before(r.exp)
	if held && (old == 0 || r.lease != old) {
		return 0, fmt.Errorf("%w: region %d", ErrWriterBusy, r.info.ID)
	}
	lease := old
	for lease == 0 || old == 0 && (lease == r.lease || lease == r.last) {
		var b [4]byte
		_, _ = rand.Read(b[:])
		lease = binary.BigEndian.Uint32(b[:])
	}
	if r.lease != lease || r.nonce != nonce {
		// Recorded before it is granted: a lease the server would forget
		// in a restart is not one writer at a time.
		if err := r.st.recordLease(r.info.ID, lease, nonce, false); err != nil {
			return 0, err
		}
	}
	r.lease, r.last, r.nonce = lease, lease, nonce
	r.exp = now.Add(ttl)
	return r.lease, nil
}

// holds checks lease and, when renew is set, extends it; release drops it.
func (r *region) holds(lease uint32, now time.Time, renew, release bool, ttl time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.info.Writable {
		// No lease is ever granted on it: say why, not that the lease
		// is wrong.
		return fmt.Errorf("%w: region %d (created read-only: create a writable region to write)", ErrReadOnly, r.info.ID)
	}
	if lease == 0 || r.lease != lease || !now.Before(r.exp) {
		return fmt.Errorf("%w: region %d", ErrNotWriter, r.info.ID)
	}
	switch {
	case release:
		r.lease, r.nonce = 0, 0
		// If this write fails the lease stays in leases.json, where a
		// restart would restore it for one TTL: a delay for the next
		// writer, never a second writer, so the release stands.
		_ = r.st.recordLease(r.info.ID, 0, 0, false)
	case renew:
		r.exp = now.Add(ttl)
	}
	return nil
}

func (r *region) check(off uint64, n int) error {
	if off > r.info.Size || uint64(n) > r.info.Size-off {
		return fmt.Errorf("%w: %d bytes at %d of a %d-byte region", ErrOutOfRange, n, off, r.info.Size)
	}
	return nil
}

func (r *region) readAt(p []byte, off uint64) error {
	if err := r.check(off, len(p)); err != nil {
		return err
	}
	if _, err := r.f.ReadAt(p, int64(off)); err != nil {
		return r.ioErr(err)
	}
	return nil
}

func (r *region) writeAt(p []byte, off uint64) error {
	if err := r.check(off, len(p)); err != nil {
		return err
	}
	if _, err := r.f.WriteAt(p, int64(off)); err != nil {
		return r.ioErr(err)
	}
	return nil
}

func (r *region) sync() error {
	if err := r.f.Sync(); err != nil {
		return r.ioErr(err)
	}
	return nil
}

// ioErr wraps an error of the backing file. A closed file is a region freed
// since the request found it (a free through lovelockd's API runs off the
// server's loop): unknown, as it is to the next request, not a failing disk.
func (r *region) ioErr(err error) error {
	if errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("%w: %d (freed)", ErrUnknownRegion, r.info.ID)
	}
	return fmt.Errorf("%w: %v", ErrIO, err)
}
