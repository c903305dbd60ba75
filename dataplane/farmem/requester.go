package farmem

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"sync"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// call is one request in flight and, once done, its reply.
type call struct {
	rec    Record // request: Op, Region, Offset, Size, Aux; ID set by issue
	data   []byte // request data (write bytes, create path), owned by the call
	dst    netip.AddrPort
	tenant uint32

	buf  []byte // a read's destination, len(buf) == rec.Size
	have [MaxChunk / FragUnit / 64]uint64
	got  int // fragment units received

	reply Record // the reply's fields (Data is nil; see rdata)
	rdata []byte // a non-read reply's data, copied
	err   error  // ErrUnavailable after the last try, ErrClosed

	tries int
	due   time.Time
	start time.Time
	done  chan struct{} // closed when complete, if not nil
	user  any           // the owner's context (the agent's host request)
}

func (c *call) units() int { return (int(c.rec.Size) + FragUnit - 1) / FragUnit }

// what names the request in errors. A create's Region holds half of its
// nonce, not a region: it is named by its size.
func (c *call) what() string {
	switch {
	case c.rec.Op != OpCreate:
		return fmt.Sprintf("%v of region %d", c.rec.Op, c.rec.Region)
	case c.rec.Offset == 0 && len(c.data) > 0:
		return "create of its preload's size"
	}
	return fmt.Sprintf("create of %d bytes", c.rec.Offset)
}

// requester is the requesting half of the protocol, one per transport: it
// numbers requests, packs them (several per datagram where they fit),
// retransmits those unanswered with backoff, reassembles fragmented read
// replies straight into the caller's buffer, and completes each call once.
// Clients use it towards their agent or memory node, agents towards the
// memory nodes.
type requester struct {
	cfg      Config
	tr       transport.Transport
	ctr      *linkCounters
	lat      *histogram    // the replies' round trips; nil: the owner records them (complete)
	complete func([]*call) // called with every batch of completed calls
	// notice takes the OpFreed notices that arrive (from, the sender;
	// rec aliases the receive buffer); nil counts them as orphans.
	// Called from the receive loop, without mu.
	notice func(from netip.AddrPort, rec *Record)

	slots chan struct{} // the window

	mu      sync.Mutex
	next    uint64
	pending map[uint64]*call
	pk      *packer
	closed  bool
	batches uint64 // task batches: per issue, the distinct (peer, tenant) groups
}

func newRequester(cfg Config, tr transport.Transport, ctr *linkCounters, lat *histogram, complete func([]*call)) *requester {
	return &requester{
		cfg: cfg, tr: tr, ctr: ctr, lat: lat, complete: complete,
		slots: make(chan struct{}, cfg.Window),
		// IDs start at the clock so that a restarted requester's IDs lie
		// above its previous run's: responders drop IDs below a floor.
		next:    uint64(time.Now().UnixNano()),
		pending: make(map[uint64]*call),
		pk:      newPacker(min(cfg.MaxDatagram, tr.MaxPayload())),
	}
}

// floor is the lowest outstanding ID, or the next ID when none is. Call
// with mu held.
func (r *requester) floor() uint64 {
	f := r.next
	for id := range r.pending {
		f = min(f, id)
	}
	return f
}

// issue sends calls, packed per (memory node, tenant); it waits for room in
// the window, or until ctx is done (the calls not yet issued then fail with
// ctx's error). More calls than the window go a window at a time: all at
// once, they would wait for slots that only their own answers free.
func (r *requester) issue(ctx context.Context, calls []*call) error {
	var err error
	for len(calls) > 0 {
		n := min(len(calls), cap(r.slots))
		if e := r.issueWindow(ctx, calls[:n]); e != nil && err == nil {
			err = e
		}
		calls = calls[n:]
	}
	return err
}

// issueWindow is issue for at most a window of calls.
func (r *requester) issueWindow(ctx context.Context, calls []*call) error {
	for i := range calls {
		select {
		case r.slots <- struct{}{}:
			continue
		case <-ctx.Done():
		}
		failed := calls[i:]
		for _, c := range failed {
			c.err = ctx.Err()
		}
		defer r.complete(failed)
		calls = calls[:i]
		break
	}
	if len(calls) == 0 {
		return ctx.Err()
	}
	now := time.Now()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		for range calls {
			<-r.slots
		}
		for _, c := range calls {
			c.err = ErrClosed
		}
		r.complete(calls)
		return ErrClosed
	}
	for _, c := range calls {
		c.rec.ID = r.next
		r.next++
		c.start, c.tries = now, 1
		c.due = now.Add(r.cfg.RetransmitTimeout.D())
		c.got, c.have = 0, [len(c.have)]uint64{}
		r.pending[c.rec.ID] = c
	}
	r.pk.floor = r.floor()
	var err error
	for _, c := range calls {
		if e := r.pack(c); e != nil && err == nil {
			err = e
		}
	}
	n, b, ferr := r.pk.flush(r.tr)
	r.batches += uint64(groups(calls))
	r.mu.Unlock()
	r.ctr.requests.Add(uint64(len(calls)))
	r.ctr.sent(n, b)
	if err == nil {
		err = ferr
	}
	return err
}

func (r *requester) pack(c *call) error {
	rec := c.rec
	return r.pk.add(c.dst, c.tenant, rec.Op.requestType(), rec, c.data, rec.Op == OpWrite)
}

// cancel removes an unfinished call (its caller gave up); a late reply is
// then an orphan.
func (r *requester) cancel(c *call) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pending[c.rec.ID] != c {
		return false
	}
	delete(r.pending, c.rec.ID)
	<-r.slots
	return true
}

// backoff is the timeout before try n+1.
func (r *requester) backoff(tries int) time.Duration {
	d := float64(r.cfg.RetransmitTimeout.D()) * math.Pow(2, float64(tries-1))
	return time.Duration(min(d, float64(r.cfg.MaxRetransmitTimeout.D())))
}

// retransmit sends again every call whose timeout passed and fails those
// out of tries.
func (r *requester) retransmit(now time.Time) {
	var failed []*call
	r.mu.Lock()
	r.pk.floor = r.floor()
	r.pk.flags = wire.FlagRetransmit
	resent := 0
	for id, c := range r.pending {
		if now.Before(c.due) {
			continue
		}
		if c.tries >= r.cfg.Tries {
			delete(r.pending, id)
			<-r.slots
			c.err = fmt.Errorf("%w: %s after %d tries", ErrUnavailable, c.what(), c.tries)
			failed = append(failed, c)
			continue
		}
		c.tries++
		c.due = now.Add(r.backoff(c.tries))
		_ = r.pack(c)
		resent++
	}
	n, b, _ := r.pk.flush(r.tr)
	r.pk.flags = 0
	r.mu.Unlock()
	r.ctr.retransmits.Add(uint64(resent))
	r.ctr.timeouts.Add(uint64(len(failed)))
	r.ctr.sent(n, b)
	if len(failed) > 0 {
		r.complete(failed)
	}
}

// run receives replies and runs the retransmission timer until ctx is done
// or the transport is closed; then it fails every outstanding call.
func (r *requester) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := max(r.cfg.RetransmitTimeout.D()/4, 500*time.Microsecond)
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				r.retransmit(now)
			}
		}
	}()
	err := r.recvLoop(ctx)
	cancel()
	wg.Wait()
	r.shutdown()
	if errors.Is(err, context.Canceled) || errors.Is(err, transport.ErrClosed) {
		err = nil
	}
	return err
}

func (r *requester) shutdown() {
	r.mu.Lock()
	r.closed = true
	var failed []*call
	for id, c := range r.pending {
		delete(r.pending, id)
		<-r.slots
		c.err = ErrClosed
		failed = append(failed, c)
	}
	r.mu.Unlock()
	if len(failed) > 0 {
		r.complete(failed)
	}
}

func (r *requester) recvLoop(ctx context.Context) error {
	pkts := make([]transport.Packet, 64)
	for i := range pkts {
		pkts[i].Data = make([]byte, r.tr.MaxPayload())
	}
	var recs []Record
	var done []*call
	for {
		for i := range pkts {
			pkts[i].Data = pkts[i].Data[:cap(pkts[i].Data)]
		}
		n, err := r.tr.Recv(ctx, pkts)
		if err != nil {
			return err
		}
		r.ctr.receives.Add(1)
		done = done[:0]
		for _, p := range pkts[:n] {
			r.ctr.rxDgrams.Add(1)
			r.ctr.rxBytes.Add(uint64(len(p.Data)))
			var h wire.Header
			h, _, recs, err = Decode(p.Data, recs[:0])
			if err != nil || h.Type != wire.TypeMemReply {
				r.ctr.malformed.Add(1)
				continue
			}
			notices := false
			r.mu.Lock()
			for i := range recs {
				if recs[i].Op == OpFreed {
					notices = true
					continue
				}
				if c := r.accept(p.Addr, &recs[i]); c != nil {
					done = append(done, c)
				}
			}
			r.mu.Unlock()
			if notices {
				r.notices(p.Addr, recs)
			}
		}
		if len(done) > 0 {
			if r.lat != nil {
				now := time.Now()
				for _, c := range done {
					r.lat.record(now.Sub(c.start))
				}
			}
			r.complete(done)
		}
	}
}

// notices hands the OpFreed records of one datagram to the owner.
func (r *requester) notices(from netip.AddrPort, recs []Record) {
	for i := range recs {
		switch {
		case recs[i].Op != OpFreed:
		case r.notice == nil:
			r.ctr.orphans.Add(1)
		default:
			r.notice(from, &recs[i])
		}
	}
}

// accept applies one reply record; it returns the call it completed.
// Call with mu held.
func (r *requester) accept(from netip.AddrPort, rec *Record) *call {
	c := r.pending[rec.ID]
	if c == nil || c.dst != from || c.rec.Op != rec.Op {
		r.ctr.orphans.Add(1)
		return nil
	}
	if rec.Op == OpRead && rec.Status == StatusOK {
		if rec.Size != c.rec.Size {
			r.ctr.malformed.Add(1)
			return nil
		}
		copy(c.buf[rec.Frag:], rec.Data)
		end := (int(rec.Frag) + len(rec.Data) + FragUnit - 1) / FragUnit
		for u := int(rec.Frag) / FragUnit; u < end; u++ {
			if c.have[u/64]&(1<<(u%64)) == 0 {
				c.have[u/64] |= 1 << (u % 64)
				c.got++
			}
		}
		if c.got < c.units() {
			return nil
		}
	}
	c.reply = *rec
	c.reply.Data, c.reply.Frag = nil, 0
	if rec.Op != OpRead {
		c.rdata = append([]byte(nil), rec.Data...)
	}
	delete(r.pending, rec.ID)
	<-r.slots
	return c
}

// groups counts the distinct (peer, tenant) pairs of calls: the task
// batches one issue sends.
func groups(calls []*call) int {
	n := 0
	for i, c := range calls {
		first := true
		for _, d := range calls[:i] {
			if d.dst == c.dst && d.tenant == c.tenant {
				first = false
				break
			}
		}
		if first {
			n++
		}
	}
	return n
}
