package farmem

import (
	"net/netip"
	"sync"

	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// maxSources bounds the requesters a responder keeps state for; beyond it
// one without requests in progress is forgotten.
const maxSources = 4096

// request is one complete request a responder hands its owner. A request
// with a non-zero rec.Status was refused by the responder (oversize): the
// owner answers that status without executing it.
type request struct {
	src    netip.AddrPort
	tenant uint32
	rec    Record // Data: the whole write (owned), or a copy of other data
}

// resend is a cached reply to send again to a duplicate.
type resend struct {
	src    netip.AddrPort
	tenant uint32
	rec    Record
}

// responder is the responding half of the protocol: it reassembles
// fragmented writes with bounded memory, drops requests below their
// requester's floor, ignores duplicates of requests in progress and answers
// duplicates of finished non-idempotent ones (writes, control operations)
// from a bounded reply cache, so that each is executed once. Reads are
// idempotent and not cached: a duplicate read that arrives after its reply
// is read again. Servers use it towards their requesters, agents towards
// their hosts. It is safe for concurrent use.
//
// The reply cache is bounded twice: ReplyCache replies per requester, and
// ReplyCacheBytes (replyCost each) across all of them, so that many
// requesters (or spoofed source ports) cannot make it hold maxSources x
// ReplyCache replies. Either bound drops the oldest reply first: of the
// requester, or of all requesters.
type responder struct {
	cfg Config
	ctr *linkCounters

	mu      sync.Mutex
	sources map[netip.AddrPort]*source
	asm     map[asmKey]*assembly
	asmFIFO []asmKey
	replies replyList // every cached reply, oldest first
	bytes   uint64    // replyCost of the replies in it
}

type source struct {
	floor    uint64
	inflight map[uint64]struct{}
	replies  map[uint64]*cachedReply
	order    replyList // this requester's cached replies, oldest first
}

// cachedReply is one cached reply, on two lists: the responder's (all)
// and its requester's (own).
type cachedReply struct {
	rec  Record // Data owned
	src  *source
	link [2]struct{ older, newer *cachedReply }
}

// The lists a cachedReply is on.
const (
	allReplies = iota
	ownReplies
)

// replyCostOverhead is about what a cached reply costs besides its data:
// the cachedReply (Record, five pointers, rounded up to its size class) and
// its map entry.
const replyCostOverhead = 160

// replyCost is what a cached reply counts against ReplyCacheBytes.
func replyCost(rec *Record) uint64 { return replyCostOverhead + uint64(cap(rec.Data)) }

// replyList is an intrusive doubly linked list of cached replies, oldest
// first, through their link[which].
type replyList struct {
	which          int
	oldest, newest *cachedReply
}

func (l *replyList) push(c *cachedReply) {
	c.link[l.which].older, c.link[l.which].newer = l.newest, nil
	if l.newest != nil {
		l.newest.link[l.which].newer = c
	} else {
		l.oldest = c
	}
	l.newest = c
}

func (l *replyList) remove(c *cachedReply) {
	lk := &c.link[l.which]
	if lk.older != nil {
		lk.older.link[l.which].newer = lk.newer
	} else {
		l.oldest = lk.newer
	}
	if lk.newer != nil {
		lk.newer.link[l.which].older = lk.older
	} else {
		l.newest = lk.older
	}
	lk.older, lk.newer = nil, nil
}

type asmKey struct {
	src netip.AddrPort
	id  uint64
}

type assembly struct {
	rec  Record
	buf  []byte
	have [MaxChunk / FragUnit / 64]uint64
	got  int
}

func newResponder(cfg Config, ctr *linkCounters) *responder {
	return &responder{cfg: cfg, ctr: ctr, sources: make(map[netip.AddrPort]*source), asm: make(map[asmKey]*assembly),
		replies: replyList{which: allReplies}}
}

func (r *responder) source(src netip.AddrPort) *source {
	s := r.sources[src]
	if s == nil {
		if len(r.sources) >= maxSources {
			for k, o := range r.sources {
				if len(o.inflight) == 0 {
					// Its replies leave the cache, and the total, with it.
					for o.order.oldest != nil {
						r.dropReply(o.order.oldest, true)
					}
					delete(r.sources, k)
					break
				}
			}
		}
		s = &source{inflight: make(map[uint64]struct{}), replies: make(map[uint64]*cachedReply), order: replyList{which: ownReplies}}
		r.sources[src] = s
	}
	return s
}

// accept takes one request datagram's records and appends the requests it
// completes to reqs and the cached replies owed to duplicates to dups.
func (r *responder) accept(src netip.AddrPort, h wire.Header, floor uint64, recs []Record, reqs []request, dups []resend) ([]request, []resend) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.source(src)
	if floor > s.floor {
		s.floor = floor
		// Replies below the floor will never be asked for again.
		for c := s.order.oldest; c != nil; {
			next := c.link[ownReplies].newer
			if c.rec.ID < floor {
				r.dropReply(c, false)
			}
			c = next
		}
	}
	for i := range recs {
		rec := &recs[i]
		if c, ok := s.replies[rec.ID]; ok {
			r.ctr.duplicates.Add(1)
			dups = append(dups, resend{src, h.Tenant, c.rec})
			continue
		}
		if _, ok := s.inflight[rec.ID]; ok {
			r.ctr.duplicates.Add(1)
			continue
		}
		if rec.ID < s.floor {
			r.ctr.stale.Add(1)
			continue
		}
		if (rec.Op == OpRead || rec.Op == OpWrite) && int(rec.Size) > r.cfg.ChunkSize {
			// Refused before any reassembly memory is spent on it; the
			// owner answers StatusBadRequest.
			req := request{src, h.Tenant, *rec}
			req.rec.Data, req.rec.Frag, req.rec.Status = nil, 0, StatusBadRequest
			s.inflight[rec.ID] = struct{}{}
			reqs = append(reqs, req)
			continue
		}
		if rec.Op != OpWrite {
			req := request{src, h.Tenant, *rec}
			req.rec.Data = append([]byte(nil), rec.Data...)
			s.inflight[rec.ID] = struct{}{}
			reqs = append(reqs, req)
			continue
		}
		k := asmKey{src, rec.ID}
		a := r.asm[k]
		if a == nil {
			a = r.newAssembly(k, rec)
		} else if a.rec.Size != rec.Size || a.rec.Offset != rec.Offset || a.rec.Region != rec.Region {
			r.ctr.malformed.Add(1) // fragments of one request disagree
			continue
		}
		copy(a.buf[rec.Frag:], rec.Data)
		end := (int(rec.Frag) + len(rec.Data) + FragUnit - 1) / FragUnit
		for u := int(rec.Frag) / FragUnit; u < end; u++ {
			if a.have[u/64]&(1<<(u%64)) == 0 {
				a.have[u/64] |= 1 << (u % 64)
				a.got++
			}
		}
		if a.got < (int(a.rec.Size)+FragUnit-1)/FragUnit {
			continue
		}
		delete(r.asm, k)
		req := request{src, h.Tenant, a.rec}
		req.rec.Data = a.buf
		s.inflight[rec.ID] = struct{}{}
		reqs = append(reqs, req)
	}
	return reqs, dups
}

func (r *responder) newAssembly(k asmKey, rec *Record) *assembly {
	for len(r.asm) >= r.cfg.Reassembly && len(r.asmFIFO) > 0 {
		old := r.asmFIFO[0]
		r.asmFIFO = r.asmFIFO[1:]
		if _, ok := r.asm[old]; ok {
			delete(r.asm, old)
			r.ctr.evicted.Add(1)
		}
	}
	if len(r.asmFIFO) > 4*r.cfg.Reassembly { // compact keys of finished assemblies
		kept := r.asmFIFO[:0]
		for _, o := range r.asmFIFO {
			if _, ok := r.asm[o]; ok {
				kept = append(kept, o)
			}
		}
		r.asmFIFO = kept
	}
	a := &assembly{rec: *rec, buf: make([]byte, rec.Size)}
	a.rec.Data, a.rec.Frag = nil, 0
	r.asm[k] = a
	r.asmFIFO = append(r.asmFIFO, k)
	return a
}

// finish marks the request from src done; a reply of a non-idempotent
// request (anything but a read or a list) is kept to answer duplicates.
//
// Dropping a reply early (for ReplyCache, ReplyCacheBytes or maxSources,
// before its requester's floor passed it) is counted (RepliesEvicted). A
// late duplicate of it below the floor its requester has sent since is
// still dropped as stale; one that is not (its requester has not heard the
// reply, or an older request of it is still outstanding) is executed again,
// as all of them are after a restart of the responder: a write writes the
// same bytes again (over a later write of its requester to them, should one
// have come between: the one case where it is not harmless), a create or a
// writer's open gets the first answer by its nonce, a renew or sync does it
// again, and a release or free answers not writer or unknown region. The oldest reply goes first, so with room
// for the live requesters' windows that is the reply of a requester that
// stopped sending, whose duplicates no longer come.
func (r *responder) finish(src netip.AddrPort, reply Record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.source(src)
	delete(s.inflight, reply.ID)
	if reply.Op == OpRead || reply.Op == OpList {
		return
	}
	if old := s.replies[reply.ID]; old != nil { // keeps the map and lists in step should an ID finish twice
		r.dropReply(old, false)
	}
	reply.Data = append([]byte(nil), reply.Data...)
	c := &cachedReply{rec: reply, src: s}
	s.replies[reply.ID] = c
	s.order.push(c)
	r.replies.push(c)
	r.bytes += replyCost(&c.rec)
	for len(s.replies) > r.cfg.ReplyCache {
		r.dropReply(s.order.oldest, true)
	}
	for r.bytes > uint64(r.cfg.ReplyCacheBytes) && r.replies.oldest != nil {
		r.dropReply(r.replies.oldest, true)
	}
}

// dropReply removes c from the cache; early says it goes before its
// requester's floor passed it, which is counted.
func (r *responder) dropReply(c *cachedReply, early bool) {
	delete(c.src.replies, c.rec.ID)
	c.src.order.remove(c)
	r.replies.remove(c)
	r.bytes -= replyCost(&c.rec)
	if early {
		r.ctr.repliesEvicted.Add(1)
	}
}
