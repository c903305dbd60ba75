package xdp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/internal/deadline"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
	"github.com/lovelock-dpu/lovelock/dataplane/xsk"
)

// DefaultMissTTL is how long a destination whose next hop had no neighbour
// entry keeps going through the kernel socket before the AF_XDP path is
// tried again: long enough for the kernel to resolve the neighbour, short
// enough that the AF_XDP path takes over within a few bundles.
const DefaultMissTTL = 100 * time.Millisecond

// healthInterval is how often an idle Group.Recv looks for a socket error:
// when an interface goes away the kernel unbinds its AF_XDP socket and sets
// ENETDOWN, but poll(2) never wakes for it (see dataplane/xsk).
const healthInterval = 500 * time.Millisecond

// GroupOptions configure a Group: the transport of one agent worker.
type GroupOptions struct {
	// Interfaces are the interfaces the worker receives on (on a DPU: the
	// host-facing representor and the uplink, e.g. pf0hpf and p0). The
	// Group opens an AF_XDP socket on queue Queue of each.
	Interfaces []string
	// Queue is the worker's queue: the <queue> of its steering rules'
	// xsk:<queue> action.
	Queue uint32
	// Addr is the worker's IPv4 address and UDP port: the agent's address.
	// It need not belong to every interface; a DPU's agent has one address
	// and receives on it through all of them.
	Addr netip.AddrPort
	// Kernel is the worker's kernel UDP socket on Addr: socket Queue of a
	// SO_REUSEPORT group that steers by the same field as the XDP rules
	// (udp.ListenGroup). Required; the Group owns it. OpenGroups opens it.
	Kernel *udp.Conn
	// UMEM and Socket configure each AF_XDP socket (one UMEM per socket);
	// nil takes xsk's defaults.
	UMEM   *xsk.UMEMConfig
	Socket *xsk.SocketConfig
	// NeighbourTTL is how long a next-hop MAC and a route are cached (0:
	// DefaultNeighbourTTL).
	NeighbourTTL time.Duration
	// MissTTL is how long a destination without a neighbour entry keeps
	// going through the kernel socket (0: DefaultMissTTL).
	MissTTL time.Duration
	// SendWait bounds how long Send waits for a full TX ring (0:
	// DefaultSendWait).
	SendWait time.Duration
	// NoUDPChecksum sends UDP checksum 0 on the AF_XDP path.
	NoUDPChecksum bool
	// MultiBuffer binds every AF_XDP socket with XDP_USE_SG (see
	// Options.MultiBuffer): datagrams up to the MTU less 28 on the AF_XDP
	// path. Register the sockets with Steer.SetXSKMultiBuffer.
	MultiBuffer bool
}

// Group is the transport of one messaging agent worker on a DPU: an AF_XDP
// socket on the worker's queue of each of several interfaces, and the
// worker's kernel UDP socket on the same address and port. It implements
// transport.Transport.
//
// Recv takes datagrams from all of them: the AF_XDP sockets (what the
// steering program redirected) and the kernel socket, which receives what
// XDP could not hand to a socket and passed to the stack instead (counted
// xsk_miss by the steering program: a packet that arrived on another queue
// than its rule's, or before the socket was registered), so nothing is
// lost. Each call starts with the source after the one that supplied the
// previous call's last datagram, so a busy socket cannot starve the others; when all are empty it sleeps in one poll(2) on
// every descriptor (no busy spinning) until a datagram arrives, ctx ends or
// the Group is closed.
//
// Send sends each datagram through the AF_XDP socket of the interface the
// kernel's route to its destination leaves through (looked up over netlink
// and cached for NeighbourTTL), in one batch per interface. A destination
// routed through none of the Group's interfaces (a local address, another
// port) goes through the kernel socket, and so does a datagram whose next
// hop has no neighbour entry yet: the kernel resolves it, and the AF_XDP
// path takes over after MissTTL.
type Group struct {
	xs         []*Transport
	kernel     *udp.Conn
	local      netip.AddrPort
	maxPayload int
	ttl        time.Duration
	missTTL    time.Duration

	routeMu sync.Mutex // nl, routes
	nl      *netlink.Handle
	routes  map[netip.Addr]groupRoute

	recvMu    sync.Mutex // one Recv at a time: next, kernelHot, kernelAt, events
	next      int        // the source the next Recv starts with
	kernelHot bool       // the kernel socket may have datagrams waiting
	kernelAt  time.Time  // when Recv last looked at the kernel socket
	fds       []int      // the AF_XDP sockets' descriptors, for SO_ERROR
	events    [8]unix.EpollEvent

	// ep is an epoll instance holding every socket of the Group, itself
	// registered with the Go runtime's poller: a waiting Recv parks its
	// goroutine instead of blocking a thread in poll(2), which would hold
	// on to its P until the runtime noticed.
	ep   *os.File
	eprc syscall.RawConn
	wake deadline.Waker // ends a waiting Recv with its context

	txPool sync.Pool // of *groupScratch

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error

	rxKernel, txKernel, txFallback  atomic.Uint64
	polls, kernelReads, kernelSends atomic.Uint64
}

// kernelEvery is how often a busy Recv looks at the kernel socket when
// nothing says it has datagrams: each look is a recvmmsg(2), while an
// empty AF_XDP ring costs no system call. The socket being reported
// readable (a waiting Recv's epoll covers it), or its last read returning
// datagrams, makes Recv look at once. It bounds the extra delay of a
// datagram XDP passed to the stack while the worker is busy.
const kernelEvery = 250 * time.Microsecond

// groupRoute is a cached path: an index into xs, or pathKernel or
// pathFallback.
type groupRoute struct {
	path    int
	expires time.Time
}

type groupScratch struct {
	buckets [][]int32 // packet indices per path
	todo    []int32
	again   []int32
	sel     []int32 // the packet index of each batch entry
	batch   []transport.Packet
}

// GroupStats are a Group's counters.
type GroupStats struct {
	// Sockets has one entry per interface, in GroupOptions order.
	Sockets []SocketStats
	// KernelRX counts datagrams received on the kernel socket: the ones
	// XDP passed to the stack instead of an AF_XDP socket.
	KernelRX uint64
	// KernelTX counts datagrams sent through the kernel socket because
	// their route leaves through none of the Group's interfaces;
	// KernelFallback those sent there because their next hop had no
	// neighbour entry.
	KernelTX       uint64
	KernelFallback uint64
	// Polls counts poll(2) calls (Recv waiting), KernelReads recvmmsg(2)
	// and KernelSends sendmmsg(2) calls on the kernel socket: with the
	// AF_XDP sockets' wakeups (SocketStats.Socket) they are the Group's
	// system calls.
	Polls, KernelReads, KernelSends uint64
}

// SocketStats are the counters of one AF_XDP socket of a Group.
type SocketStats struct {
	Interface string
	Ifindex   int
	Queue     uint32
	Mode      xsk.Mode
	// Transport counts the datagrams Recv delivered and Send queued.
	Transport Stats
	// Socket is the kernel's and dataplane/xsk's view (zero once closed).
	Socket xsk.Stats
}

// OpenGroups opens the transports of n agent workers on addr: a kernel UDP
// SO_REUSEPORT group of n sockets on addr (with kernel as their options;
// kernel.Steer must pick socket w for worker w's datagrams, as the XDP
// rules do), and for each worker w a Group on queue w of every interface
// of opts (opts.Queue and opts.Kernel are set per worker). Like Open, it
// must run on a thread inside the interfaces' network namespace. On error
// everything it opened is closed again.
func OpenGroups(opts GroupOptions, n int, kernel udp.Options) ([]*Group, error) {
	if n < 1 {
		return nil, fmt.Errorf("xdp: %d workers", n)
	}
	// Refuse a bad interface list before binding anything.
	if err := checkInterfaces(opts.Interfaces, n); err != nil {
		return nil, err
	}
	conns, err := udp.ListenGroup(opts.Addr, n, kernel)
	if err != nil {
		return nil, fmt.Errorf("xdp: kernel sockets: %w", err)
	}
	groups := make([]*Group, 0, n)
	for w, c := range conns {
		o := opts
		o.Queue, o.Kernel = uint32(w), c
		g, err := OpenGroup(o)
		if err != nil {
			for _, g := range groups {
				_ = g.Close()
			}
			for _, c := range conns[w+1:] {
				_ = c.Close()
			}
			return nil, fmt.Errorf("xdp: worker %d: %w", w, err)
		}
		groups = append(groups, g)
	}
	return groups, nil
}

// OpenGroup opens an AF_XDP socket on queue opts.Queue of every interface of
// opts.Interfaces and the Group around them and opts.Kernel. It must run on
// a thread inside the interfaces' network namespace. The sockets receive
// nothing until the caller registers each with the steering program:
// Steer.SetXSK(t.Ifindex(), t.Queue(), t.FD()) for t in Transports(). On
// error the Group's sockets, opts.Kernel included, are closed.
func OpenGroup(opts GroupOptions) (_ *Group, err error) {
	g := &Group{kernel: opts.Kernel, ttl: opts.NeighbourTTL, missTTL: opts.MissTTL,
		routes: make(map[netip.Addr]groupRoute)}
	defer func() {
		if err != nil {
			_ = g.Close()
		}
	}()
	if opts.Kernel == nil {
		return nil, errors.New("xdp: group needs the worker's kernel UDP socket (GroupOptions.Kernel)")
	}
	ip := opts.Addr.Addr().Unmap()
	if !ip.Is4() || ip.IsUnspecified() || opts.Addr.Port() == 0 {
		return nil, fmt.Errorf("xdp: group address %v: want an IPv4 address and a port: %w", opts.Addr, transport.ErrAddr)
	}
	g.local = netip.AddrPortFrom(ip, opts.Addr.Port())
	if g.ttl <= 0 {
		g.ttl = DefaultNeighbourTTL
	}
	if g.missTTL <= 0 {
		g.missTTL = DefaultMissTTL
	}
	if err := checkInterfaces(opts.Interfaces, int(opts.Queue)+1); err != nil {
		return nil, err
	}
	for _, name := range opts.Interfaces {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return nil, fmt.Errorf("xdp: interface %q: %w", name, err)
		}
		t, err := Open(Options{
			Ifindex: l.Attrs().Index, Interface: name, Queue: opts.Queue, Addr: g.local,
			UMEM: opts.UMEM, Socket: opts.Socket, NeighbourTTL: opts.NeighbourTTL, SendWait: opts.SendWait,
			NoFallback: true, NoUDPChecksum: opts.NoUDPChecksum, MultiBuffer: opts.MultiBuffer,
		})
		if err != nil {
			if errors.Is(err, unix.EINVAL) {
				err = fmt.Errorf("%w (is queue %d active? ethtool -l %s)", err, opts.Queue, name)
			}
			return nil, err
		}
		g.xs = append(g.xs, t)
	}
	g.maxPayload = opts.Kernel.MaxPayload()
	for _, t := range g.xs {
		g.maxPayload = min(g.maxPayload, t.MaxPayload())
	}
	if g.nl, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
		return nil, fmt.Errorf("xdp: group %s: netlink: %w", g.local, err)
	}
	rc, err := opts.Kernel.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("xdp: group %s: kernel socket: %w", g.local, err)
	}
	kfd := -1
	if err := rc.Control(func(fd uintptr) { kfd = int(fd) }); err != nil {
		return nil, fmt.Errorf("xdp: group %s: kernel socket: %w", g.local, err)
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("xdp: group %s: epoll: %w", g.local, err)
	}
	// os.NewFile registers a non-blocking descriptor with the runtime's
	// poller; an epoll instance is readable while any of its sockets is.
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("xdp: group %s: epoll: %w", g.local, err)
	}
	g.ep = os.NewFile(uintptr(epfd), "xdp-group")
	if g.eprc, err = g.ep.SyscallConn(); err != nil {
		return nil, fmt.Errorf("xdp: group %s: epoll: %w", g.local, err)
	}
	for i, t := range g.xs {
		g.fds = append(g.fds, t.FD())
		if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, t.FD(), &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(i)}); err != nil {
			return nil, fmt.Errorf("xdp: group %s: epoll: %w", g.local, err)
		}
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, kfd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(len(g.xs))}); err != nil {
		return nil, fmt.Errorf("xdp: group %s: epoll: %w", g.local, err)
	}
	nb := len(g.xs) + 2
	g.txPool.New = func() any { return &groupScratch{buckets: make([][]int32, nb)} }
	return g, nil
}

// ErrQueues is wrapped by OpenGroup and OpenGroups when an interface has
// fewer RX queues than the workers need.
var ErrQueues = errors.New("not enough queues")

// checkInterfaces checks that names are distinct interfaces of the calling
// thread's network namespace with at least queues RX queues each. The
// kernel would refuse a bind to a queue the device lacks (EINVAL); this
// says why first.
func checkInterfaces(names []string, queues int) error {
	if len(names) == 0 {
		return errors.New("xdp: group needs at least one interface")
	}
	seen := map[string]bool{}
	for _, name := range names {
		if seen[name] {
			return fmt.Errorf("xdp: interface %s listed twice", name)
		}
		seen[name] = true
		l, err := netlink.LinkByName(name)
		if err != nil {
			return fmt.Errorf("xdp: interface %q: %w", name, err)
		}
		if q := l.Attrs().NumRxQueues; q > 0 && q < queues {
			return fmt.Errorf("xdp: interface %s has %d RX queues, %d workers need %d (one AF_XDP socket per worker, on queue <worker>): %w",
				name, q, queues, queues, ErrQueues)
		}
	}
	return nil
}

// Paths beyond the AF_XDP sockets' indices.
func (g *Group) pathKernel() int   { return len(g.xs) }
func (g *Group) pathFallback() int { return len(g.xs) + 1 }

// LocalAddr returns the worker's address and port.
func (g *Group) LocalAddr() netip.AddrPort { return g.local }

// MaxPayload returns the smallest MaxPayload of the Group's sockets.
func (g *Group) MaxPayload() int { return g.maxPayload }

// Transports returns the Group's AF_XDP transports, one per interface, for
// registration with the steering program (Ifindex, Queue, FD) and their
// modes. The Group owns them: do not receive, send on or close them.
func (g *Group) Transports() []*Transport { return g.xs }

// Stats returns the Group's counters.
func (g *Group) Stats() GroupStats {
	st := GroupStats{KernelRX: g.rxKernel.Load(), KernelTX: g.txKernel.Load(), KernelFallback: g.txFallback.Load(),
		Polls: g.polls.Load(), KernelReads: g.kernelReads.Load(), KernelSends: g.kernelSends.Load()}
	for _, t := range g.xs {
		ss := SocketStats{Interface: t.ifname, Ifindex: t.ifindex, Queue: t.sock.Queue(), Mode: t.Mode(), Transport: t.Stats()}
		ss.Socket, _ = t.sock.Stats()
		st.Sockets = append(st.Sockets, ss)
	}
	return st
}

// Paths returns the Group's counters as worker's paths: one per AF_XDP
// socket, then its kernel socket.
func (g *Group) Paths(worker int) []transport.PathStats {
	st := g.Stats()
	var out []transport.PathStats
	for i, s := range st.Sockets {
		out = append(out, transport.PathStats{
			Worker: worker, Path: "xsk", Interface: s.Interface, Queue: int(s.Queue), Mode: s.Mode.String(),
			MultiBuffer: i < len(g.xs) && g.xs[i].MultiBuffer(),
			RX:          s.Transport.RXPackets, TX: s.Transport.TXPackets,
			Dropped: s.Socket.RXDropped + s.Socket.RXRingFull,
		})
	}
	return append(out, transport.PathStats{Worker: worker, Path: "kernel", RX: st.KernelRX, TX: st.KernelTX + st.KernelFallback, TXFallback: st.KernelFallback})
}

// Close closes every socket of the Group (the kernel drops the AF_XDP
// sockets from the steering program's socket map; the caller should still
// unregister them with Steer.ClearXSK), after waking a blocked Recv, which
// returns an error wrapping transport.ErrClosed. It is safe to call more
// than once.
func (g *Group) Close() error {
	g.closeOnce.Do(func() {
		g.closed.Store(true)
		var errs []error
		if g.ep != nil {
			// Wakes a waiting Recv; the sockets stay open until it has
			// returned.
			errs = append(errs, g.ep.Close())
		}
		g.recvMu.Lock()
		defer g.recvMu.Unlock()
		for _, t := range g.xs {
			errs = append(errs, t.Close())
		}
		if g.kernel != nil {
			errs = append(errs, g.kernel.Close())
		}
		g.routeMu.Lock()
		if g.nl != nil {
			g.nl.Close()
			g.nl = nil
		}
		g.routeMu.Unlock()
		if err := errors.Join(errs...); err != nil {
			g.closeErr = fmt.Errorf("xdp group %s: close: %w", g.local, err)
		}
	})
	return g.closeErr
}

func (g *Group) errClosed() error {
	return fmt.Errorf("xdp group %s: %w", g.local, transport.ErrClosed)
}

// doneCtx is a context that is already done: a Recv with it only polls.
var doneCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

func isCtxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// Recv implements transport.Transport. It takes what is waiting from each
// source in turn, starting after the source that filled the previous call
// last, until pkts is full or every source is empty, and waits in poll(2)
// only when nothing was there.
func (g *Group) Recv(ctx context.Context, pkts []transport.Packet) (int, error) {
	if len(pkts) == 0 {
		return 0, nil
	}
	g.recvMu.Lock()
	defer g.recvMu.Unlock()
	sources := len(g.xs) + 1
	for {
		if g.closed.Load() {
			return 0, g.errClosed()
		}
		// Start after the source that supplied the last datagram of the
		// previous call: empty sources give up their turn.
		start := g.next
		n := 0
		for k := 0; k < sources && n < len(pkts); k++ {
			i := (start + k) % sources
			var got int
			var err error
			if i < len(g.xs) {
				got, err = g.xs[i].Recv(doneCtx, pkts[n:])
			} else {
				if now := time.Now(); g.kernelHot || now.Sub(g.kernelAt) >= kernelEvery {
					g.kernelAt = now
				} else {
					continue
				}
				got, err = g.kernel.Recv(doneCtx, pkts[n:])
				g.kernelReads.Add(1)
				g.rxKernel.Add(uint64(got))
				g.kernelHot = got > 0
			}
			n += got
			if got > 0 {
				g.next = (i + 1) % sources
			}
			if err != nil && !isCtxErr(err) {
				if n > 0 {
					return n, nil // the error comes back on the next call
				}
				if errors.Is(err, transport.ErrClosed) {
					return 0, g.errClosed()
				}
				return 0, fmt.Errorf("xdp group %s: %w", g.local, err)
			}
		}
		if n > 0 {
			return n, nil
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if err := g.wait(ctx); err != nil {
			return 0, err
		}
	}
}

// wait parks the goroutine until a socket of the Group is readable, ctx
// ends, the Group is closed, or healthInterval passes (then it checks the
// AF_XDP sockets for an error). It returns nil to make Recv look again.
func (g *Group) wait(ctx context.Context) error {
	until := time.Now().Add(healthInterval)
	ctxDeadline, hasDeadline := ctx.Deadline()
	if hasDeadline && ctxDeadline.Before(until) {
		until = ctxDeadline
	}
	disarm := g.wake.Arm(ctx, g.ep, until)
	g.polls.Add(1)
	err := g.eprc.Read(func(fd uintptr) bool {
		n, err := unix.EpollWait(int(fd), g.events[:], 0)
		for _, ev := range g.events[:max(n, 0)] {
			if int(ev.Fd) == len(g.xs) {
				g.kernelHot = true
			}
		}
		return n > 0 || (err != nil && err != unix.EINTR)
	})
	disarm()
	switch {
	case err == nil:
		return nil
	case g.closed.Load():
		return g.errClosed()
	case !errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("xdp group %s: wait: %w", g.local, err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if hasDeadline && !time.Now().Before(ctxDeadline) {
		return context.DeadlineExceeded
	}
	// Idle for healthInterval: an AF_XDP socket whose interface went away
	// reports it only here (its poll never wakes for it).
	for i, t := range g.xs {
		v, err := unix.GetsockoptInt(g.fds[i], unix.SOL_SOCKET, unix.SO_ERROR)
		if err == nil && v != 0 {
			err = syscall.Errno(v)
		}
		if err != nil {
			return fmt.Errorf("xdp group %s: %s queue %d: %w", g.local, t.ifname, t.Queue(), err)
		}
	}
	return nil
}

// check refuses a datagram no path can carry.
func (g *Group) check(p *transport.Packet) error {
	if len(p.Data) > g.maxPayload {
		return fmt.Errorf("xdp group %s: %d bytes to %s: %w", g.local, len(p.Data), p.Addr, transport.ErrTooBig)
	}
	dst := p.Addr.Addr().Unmap()
	if !dst.Is4() || p.Addr.Port() == 0 || dst.IsUnspecified() || dst.IsMulticast() {
		return fmt.Errorf("xdp group %s: send to %s: %w", g.local, p.Addr, transport.ErrAddr)
	}
	return nil
}

// path returns the path to dst: the index of the AF_XDP transport on the
// interface the kernel's route leaves through, or pathKernel, or
// pathFallback while a neighbour miss is fresh.
func (g *Group) path(dst netip.Addr, now time.Time) int {
	g.routeMu.Lock()
	defer g.routeMu.Unlock()
	if r, ok := g.routes[dst]; ok && now.Before(r.expires) {
		return r.path
	}
	p := g.pathKernel()
	if g.nl != nil {
		if rs, err := g.nl.RouteGet(dst.AsSlice()); err == nil && len(rs) > 0 {
			for i, t := range g.xs {
				if t.ifindex == rs[0].LinkIndex {
					p = i
				}
			}
		}
	}
	if len(g.routes) >= 4096 {
		clear(g.routes) // bound the cache; entries are cheap to look up again
	}
	g.routes[dst] = groupRoute{path: p, expires: now.Add(g.ttl)}
	return p
}

// missed sends dst through the kernel for MissTTL.
func (g *Group) missed(dst netip.Addr, now time.Time) {
	g.routeMu.Lock()
	defer g.routeMu.Unlock()
	g.routes[dst] = groupRoute{path: g.pathFallback(), expires: now.Add(g.missTTL)}
}

// Send implements transport.Transport. It sorts the datagrams by path,
// keeping their order within each, and hands each path its datagrams in
// one batch. A datagram that no path can carry (too big, not IPv4) is found
// before anything is sent, so Send returns n < len(pkts) with pkts[:n] sent
// and pkts[n] refused. If instead a socket fails while sending (a full ring
// for longer than SendWait, a closed socket), n is the first datagram it
// failed on, and datagrams after it on other paths may have gone out
// already: a caller that sends the rest again may duplicate a few, which
// the messaging protocol detects.
func (g *Group) Send(pkts []transport.Packet) (int, error) {
	if g.closed.Load() {
		return 0, g.errClosed()
	}
	valid := len(pkts)
	var failErr error
	for i := range pkts {
		if err := g.check(&pkts[i]); err != nil {
			valid, failErr = i, err
			break
		}
	}
	failAt := valid
	s := g.txPool.Get().(*groupScratch)
	defer g.txPool.Put(s)
	s.todo = s.todo[:0]
	for i := range valid {
		s.todo = append(s.todo, int32(i))
	}
	now := time.Now()
	// Each round either sends everything left or moves at least one more
	// destination to the fallback path; the bound is a safety net.
	for round := 0; len(s.todo) > 0 && round <= len(pkts); round++ {
		for b := range s.buckets {
			s.buckets[b] = s.buckets[b][:0]
		}
		var last netip.Addr
		lastPath := -1
		for _, i := range s.todo {
			d := pkts[i].Addr.Addr().Unmap()
			if lastPath < 0 || d != last {
				last, lastPath = d, g.path(d, now)
			}
			s.buckets[lastPath] = append(s.buckets[lastPath], i)
		}
		s.again = s.again[:0]
		used := 0 // the most entries of s.batch a path filled this round
		for b, idx := range s.buckets {
			s.batch, s.sel = s.batch[:0], s.sel[:0]
			for _, i := range idx {
				if int(i) < failAt {
					s.batch = append(s.batch, pkts[i])
					s.sel = append(s.sel, i)
				}
			}
			if len(s.batch) == 0 {
				continue
			}
			used = max(used, len(s.batch))
			var n int
			var err error
			switch b {
			case g.pathKernel(), g.pathFallback():
				n, err = g.kernel.Send(s.batch)
				g.kernelSends.Add(1)
				if b == g.pathKernel() {
					g.txKernel.Add(uint64(n))
				} else {
					g.txFallback.Add(uint64(n))
				}
			default:
				n, err = g.xs[b].Send(s.batch)
			}
			if err == nil {
				continue
			}
			if errors.Is(err, transport.ErrClosed) {
				// Like any failing socket: the paths before this one
				// may have sent datagrams below it, and the later
				// ones still send those (returning 0 here counted
				// them unsent).
				err = g.errClosed()
			}
			if b < len(g.xs) && errors.Is(err, ErrNoNeighbour) {
				// The next hop is unresolved: the kernel path resolves
				// it; what is left of this batch is routed again.
				g.missed(s.batch[n].Addr.Addr().Unmap(), now)
				s.again = append(s.again, s.sel[n:]...)
				continue
			}
			if f := int(s.sel[n]); f < failAt {
				failAt, failErr = f, err
			}
		}
		// Do not keep the caller's buffers alive in the pool: each path
		// refilled s.batch from its start, so clear up to the longest
		// path's batch, not only the last path's.
		clear(s.batch[:used])
		s.todo, s.again = s.again, s.todo
	}
	for _, i := range s.todo {
		if int(i) < failAt {
			failAt, failErr = int(i), fmt.Errorf("xdp group %s: send to %s: no path took it", g.local, pkts[i].Addr)
		}
	}
	if failAt < len(pkts) {
		return failAt, failErr
	}
	return len(pkts), nil
}
