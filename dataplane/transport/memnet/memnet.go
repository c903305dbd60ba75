// Package memnet is an in-process datagram network for protocol tests: a
// Network of endpoints that implement transport.Transport and hand each
// other datagrams through memory, and the faults a congested fabric adds
// (loss, duplication, reordering), set per link (a direction between two
// addresses) and counted. Faulty adds the same faults to any other
// transport, for tests that keep real sockets (a veth, loopback). Both
// services' tests (messaging, far memory) inject faults through it; nothing
// outside tests uses it.
//
// The random decisions come from a seeded source, so a failing run repeats
// its faults as long as the order of sends repeats.
package memnet

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
)

// Faults are what a link does to the datagrams sent over it. Each datagram
// is dropped with probability Drop, else sent twice with probability Dup;
// with probability Reorder a datagram (its second copy, if duplicated)
// swaps places with the datagram before it on the same link in the same
// Send batch (not with its own first copy, which would change no order).
type Faults struct {
	Drop, Dup, Reorder float64
}

// Counters count what happened to datagrams: sent (handed to Send), the
// faults injected, what was delivered into an endpoint's queue, and what
// was lost because no endpoint had the address (NoRoute), the receiving
// queue was full (Overflow), as a socket buffer overflows, or the receiving
// endpoint was closed (Closed): those it had queued and not received when
// it closed (also in Delivered), and those steered to it afterwards while
// its group kept the address.
type Counters struct {
	Sent, Dropped, Duplicated, Reordered uint64
	Delivered, NoRoute, Overflow, Closed uint64
}

type counters struct {
	sent, dropped, duplicated, reordered atomic.Uint64
	delivered, noRoute, overflow, closed atomic.Uint64
}

func (c *counters) snapshot() Counters {
	return Counters{
		Sent: c.sent.Load(), Dropped: c.dropped.Load(), Duplicated: c.duplicated.Load(), Reordered: c.reordered.Load(),
		Delivered: c.delivered.Load(), NoRoute: c.noRoute.Load(), Overflow: c.overflow.Load(), Closed: c.closed.Load(),
	}
}

// injector applies Faults to a batch with its own seeded source.
type injector struct {
	mu  sync.Mutex
	rng *rand.Rand
}

func newInjector(seed uint64) *injector {
	return &injector{rng: rand.New(rand.NewPCG(seed, 0x6d656d6e6574))}
}

// apply returns the batch as the faults leave it, in out (reused), counting
// into ctr. faults gives the faults of a packet's link, ctr its counters
// (nil: only total).
func (in *injector) apply(pkts []transport.Packet, out []transport.Packet, faults func(netip.AddrPort) (Faults, *counters), total *counters) []transport.Packet {
	in.mu.Lock()
	defer in.mu.Unlock()
	out = out[:0]
	for _, p := range pkts {
		f, lc := faults(p.Addr)
		count := func(sel func(*counters) *atomic.Uint64) {
			sel(total).Add(1)
			if lc != nil {
				sel(lc).Add(1)
			}
		}
		count(func(c *counters) *atomic.Uint64 { return &c.sent })
		if f == (Faults{}) {
			out = append(out, p)
			continue
		}
		before := len(out) - 1 // the last datagram out before this one
		switch r := in.rng.Float64(); {
		case r < f.Drop:
			count(func(c *counters) *atomic.Uint64 { return &c.dropped })
			continue
		case r < f.Drop+f.Dup:
			count(func(c *counters) *atomic.Uint64 { return &c.duplicated })
			out = append(out, p)
		}
		out = append(out, p)
		if f.Reorder > 0 && in.rng.Float64() < f.Reorder {
			n := len(out)
			for i := before; i >= 0; i-- {
				if out[i].Addr == p.Addr {
					out[i], out[n-1] = out[n-1], out[i]
					count(func(c *counters) *atomic.Uint64 { return &c.reordered })
					break
				}
			}
		}
	}
	return out
}

// Faulty wraps a transport and applies Faults to what it sends, as a
// congested link would, while the transport under it stays real.
type Faulty struct {
	transport.Transport
	faults atomic.Pointer[Faults]
	in     *injector
	ctr    counters
	pool   sync.Pool
}

// NewFaulty wraps tr with faults f; seed makes the faults repeatable.
func NewFaulty(tr transport.Transport, seed uint64, f Faults) *Faulty {
	w := &Faulty{Transport: tr, in: newInjector(seed)}
	w.faults.Store(&f)
	return w
}

// SetFaults changes the faults from now on.
func (w *Faulty) SetFaults(f Faults) { w.faults.Store(&f) }

// Counters returns what the wrapper did so far. Delivered, NoRoute and
// Overflow stay 0: the transport under it delivers.
func (w *Faulty) Counters() Counters { return w.ctr.snapshot() }

// Send implements transport.Transport: the faults are applied, and what is
// left is sent with transport.SendAll (datagrams the transport refuses are
// skipped, as a lossy link would lose them).
func (w *Faulty) Send(pkts []transport.Packet) (int, error) {
	f := *w.faults.Load()
	bp, _ := w.pool.Get().(*[]transport.Packet)
	if bp == nil {
		bp = new([]transport.Packet)
	}
	out := w.in.apply(pkts, *bp, func(netip.AddrPort) (Faults, *counters) { return f, nil }, &w.ctr)
	_, err := transport.SendAll(w.Transport, out, nil)
	clear(out)
	*bp = out[:0]
	w.pool.Put(bp)
	if err != nil {
		return 0, err
	}
	return len(pkts), nil
}

// Options configure a Network.
type Options struct {
	// Seed seeds the fault decisions.
	Seed uint64
	// Faults apply to every link that has none of its own (SetFaults).
	Faults Faults
	// MaxPayload is every endpoint's MaxPayload (0: 65507).
	MaxPayload int
	// Queue is how many datagrams an endpoint holds unreceived before it
	// drops (0: 4096), as a socket buffer does.
	Queue int
}

// Network is a set of endpoints that reach each other by address. It is
// safe for concurrent use.
type Network struct {
	opts Options
	in   *injector
	ctr  counters

	mu     sync.RWMutex
	groups map[netip.AddrPort]*group
	links  map[[2]netip.AddrPort]*link
	port   uint16
}

type link struct {
	faults Faults
	ctr    counters
}

// group is the endpoints sharing one address, as a SO_REUSEPORT group does,
// and the function that picks one for a datagram.
type group struct {
	eps   []*Endpoint
	steer func(data []byte) int
}

// New returns an empty network.
func New(opts Options) *Network {
	if opts.MaxPayload <= 0 {
		opts.MaxPayload = 65507
	}
	if opts.Queue <= 0 {
		opts.Queue = 4096
	}
	return &Network{opts: opts, in: newInjector(opts.Seed), groups: map[netip.AddrPort]*group{},
		links: map[[2]netip.AddrPort]*link{}, port: 40000}
}

// ErrInUse: Listen on an address that has endpoints.
var ErrInUse = errors.New("memnet: address in use")

// Listen opens an endpoint on addr. Port 0 picks a free port.
func (n *Network) Listen(addr netip.AddrPort) (*Endpoint, error) {
	eps, err := n.ListenGroup(addr, 1, nil)
	if err != nil {
		return nil, err
	}
	return eps[0], nil
}

// ListenGroup opens count endpoints on one address; steer picks, for each
// datagram to it, the index of the endpoint that receives it (taken modulo
// count; nil: the first). Port 0 picks a free port.
func (n *Network) ListenGroup(addr netip.AddrPort, count int, steer func(data []byte) int) ([]*Endpoint, error) {
	if count < 1 {
		return nil, fmt.Errorf("memnet: group of %d endpoints", count)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if addr.Port() == 0 {
		for {
			n.port++
			if a := netip.AddrPortFrom(addr.Addr(), n.port); n.groups[a] == nil {
				addr = a
				break
			}
		}
	}
	if n.groups[addr] != nil {
		return nil, fmt.Errorf("memnet: listen %v: %w", addr, ErrInUse)
	}
	g := &group{steer: steer}
	for range count {
		g.eps = append(g.eps, &Endpoint{n: n, g: g, addr: addr, notify: make(chan struct{}, 1), closed: make(chan struct{})})
	}
	n.groups[addr] = g
	return append([]*Endpoint(nil), g.eps...), nil
}

// SetFaults sets the faults of the link from one address to another.
func (n *Network) SetFaults(from, to netip.AddrPort, f Faults) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.linkLocked(from, to).faults = f
}

// SetDefaultFaults sets the faults of every link without faults of its own.
func (n *Network) SetDefaultFaults(f Faults) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.opts.Faults = f
}

// InFlight returns the datagrams delivered to endpoints and not yet
// received, plus those received and not yet handled (their receiver has not
// come back to Recv since): 0 when nothing is in flight. Tests that advance
// a clock by hand wait for it, so that the clock does not run ahead of the
// datagrams or of the goroutines answering them.
func (n *Network) InFlight() int {
	n.mu.RLock()
	defer n.mu.RUnlock()
	q := 0
	for _, g := range n.groups {
		for _, e := range g.eps {
			e.mu.Lock()
			q += len(e.queue) + e.inHand
			e.mu.Unlock()
		}
	}
	return q
}

// Counters returns the whole network's counters.
func (n *Network) Counters() Counters { return n.ctr.snapshot() }

// LinkCounters returns the counters of the link from one address to
// another.
func (n *Network) LinkCounters(from, to netip.AddrPort) Counters {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.linkLocked(from, to).ctr.snapshot()
}

func (n *Network) linkLocked(from, to netip.AddrPort) *link {
	k := [2]netip.AddrPort{from, to}
	l := n.links[k]
	if l == nil {
		l = &link{faults: Faults{-1, -1, -1}} // unset: the default applies
		n.links[k] = l
	}
	return l
}

// faults returns the faults and counters of the link from one address to
// another; the read lock is held.
func (n *Network) faults(from, to netip.AddrPort) (Faults, *counters) {
	if l := n.links[[2]netip.AddrPort{from, to}]; l != nil {
		if l.faults.Drop < 0 {
			return n.opts.Faults, &l.ctr
		}
		return l.faults, &l.ctr
	}
	return n.opts.Faults, nil
}

// deliver hands one datagram from an endpoint to the endpoint its address
// and the group's steering pick; the read lock is held.
func (n *Network) deliver(from netip.AddrPort, p transport.Packet) {
	g := n.groups[p.Addr]
	if g == nil {
		n.ctr.noRoute.Add(1)
		return
	}
	i := 0
	if g.steer != nil && len(g.eps) > 1 {
		i = g.steer(p.Data) % len(g.eps)
		if i < 0 {
			i += len(g.eps)
		}
	}
	switch g.eps[i].push(from, p.Data) {
	case pushQueued:
		n.ctr.delivered.Add(1)
	case pushFull:
		n.ctr.overflow.Add(1)
	case pushClosed:
		n.ctr.closed.Add(1)
	}
}

// Endpoint is one transport on a Network.
type Endpoint struct {
	n    *Network
	g    *group
	addr netip.AddrPort

	mu     sync.Mutex
	queue  []transport.Packet // owned copies
	inHand int                // datagrams the last Recv returned
	notify chan struct{}
	closed chan struct{}
	once   sync.Once
	bufs   sync.Pool // of *[]transport.Packet: Send may run concurrently
}

var _ transport.Transport = (*Endpoint)(nil)

type pushResult uint8

const (
	pushQueued pushResult = iota
	pushFull
	pushClosed // a group member closed while the others keep the address
)

func (e *Endpoint) push(from netip.AddrPort, data []byte) pushResult {
	e.mu.Lock()
	if e.isClosed() {
		e.mu.Unlock()
		return pushClosed
	}
	if len(e.queue) >= e.n.opts.Queue {
		e.mu.Unlock()
		return pushFull
	}
	e.queue = append(e.queue, transport.Packet{Addr: from, Data: append([]byte(nil), data...)})
	e.mu.Unlock()
	select {
	case e.notify <- struct{}{}:
	default:
	}
	return pushQueued
}

func (e *Endpoint) isClosed() bool {
	select {
	case <-e.closed:
		return true
	default:
		return false
	}
}

// Send implements transport.Transport: each datagram meets its link's
// faults, and what is left is queued at its destination at once.
func (e *Endpoint) Send(pkts []transport.Packet) (int, error) {
	if e.isClosed() {
		return 0, transport.ErrClosed
	}
	for i, p := range pkts {
		if len(p.Data) > e.n.opts.MaxPayload {
			if i > 0 {
				if _, err := e.Send(pkts[:i]); err != nil {
					return 0, err
				}
			}
			return i, fmt.Errorf("memnet: %d bytes to %v: %w", len(p.Data), p.Addr, transport.ErrTooBig)
		}
		if !p.Addr.IsValid() {
			if i > 0 {
				if _, err := e.Send(pkts[:i]); err != nil {
					return 0, err
				}
			}
			return i, fmt.Errorf("memnet: send to %v: %w", p.Addr, transport.ErrAddr)
		}
	}
	n := e.n
	n.mu.RLock()
	defer n.mu.RUnlock()
	bp, _ := e.bufs.Get().(*[]transport.Packet)
	if bp == nil {
		bp = new([]transport.Packet)
	}
	out := n.in.apply(pkts, *bp, func(to netip.AddrPort) (Faults, *counters) { return n.faults(e.addr, to) }, &n.ctr)
	for _, p := range out {
		n.deliver(e.addr, p)
	}
	clear(out)
	*bp = out[:0]
	e.bufs.Put(bp)
	return len(pkts), nil
}

// Recv implements transport.Transport. With no room in pkts it returns 0
// at once, as the udp and xdp transports do; the caller is back, so what
// the last Recv returned counts as handled.
func (e *Endpoint) Recv(ctx context.Context, pkts []transport.Packet) (int, error) {
	if len(pkts) == 0 {
		e.mu.Lock()
		e.inHand = 0
		e.mu.Unlock()
		return 0, nil
	}
	for {
		e.mu.Lock()
		k := min(len(pkts), len(e.queue))
		e.inHand = k
		for i := range k {
			q := e.queue[i]
			pkts[i].Addr = q.Addr
			pkts[i].Data = pkts[i].Data[:copy(pkts[i].Data[:cap(pkts[i].Data)], q.Data)]
		}
		clear(e.queue[:k])
		e.queue = e.queue[k:]
		if len(e.queue) == 0 {
			e.queue = nil
		}
		e.mu.Unlock()
		if k > 0 {
			return k, nil
		}
		if e.isClosed() {
			return 0, transport.ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		select {
		case <-e.notify:
		case <-ctx.Done():
		case <-e.closed:
		}
	}
}

// LocalAddr implements transport.Transport.
func (e *Endpoint) LocalAddr() netip.AddrPort { return e.addr }

// MaxPayload implements transport.Transport.
func (e *Endpoint) MaxPayload() int { return e.n.opts.MaxPayload }

// Close implements transport.Transport. The datagrams it had queued are
// lost, as a closed socket's are, and counted (Closed); the address is free
// again once every endpoint of its group is closed.
func (e *Endpoint) Close() error {
	e.once.Do(func() {
		close(e.closed)
		e.mu.Lock()
		e.inHand = 0
		lost := len(e.queue)
		clear(e.queue)
		e.queue = nil
		e.mu.Unlock()
		n := e.n
		n.ctr.closed.Add(uint64(lost))
		n.mu.Lock()
		defer n.mu.Unlock()
		for _, o := range e.g.eps {
			if !o.isClosed() {
				return
			}
		}
		if n.groups[e.addr] == e.g {
			delete(n.groups, e.addr)
		}
	})
	return nil
}
