// Package udp is the kernel UDP implementation of transport.Transport: the
// transport of host processes, of routing agents that run on a host, and the
// fallback on a DPU where AF_XDP is unavailable. It batches with
// recvmmsg(2)/sendmmsg(2) on golang.org/x/sys/unix through the Go runtime's
// poller (no thread blocks in a system call), asks for large socket buffers,
// and can open a group of SO_REUSEPORT sockets on one port whose datagrams a
// classic BPF program spreads by a field of the payload: the stand-in, on
// kernel sockets, for XDP steering to one AF_XDP socket per worker.
//
// With Options.GSO, Send hands each run of equal-sized datagrams to one
// address to the kernel as one UDP_SEGMENT message (generic segmentation
// offload): one socket buffer per run instead of one per datagram, split at
// the egress device, in software before a veth peer's XDP program, or at the
// receiving socket. It is off by default because a run can reach a
// receiving reuseport group in one piece, which a payload steering program
// would then send to one socket; a kernel or route that refuses it turns it
// off for the Conn, and the datagrams go without it. A run that the kernel
// refuses without GSO too (a peer the socket cannot reach) fails as it
// would without GSO, and leaves it on for the other peers.
//
// An IPv6 link-local peer's zone picks the link: Send passes it to the
// kernel as the scope ID (a zone is an interface index, or a name looked up
// in the socket's network namespace), and Recv reports a link-local source
// with the index of the interface it came in on as its zone ("fe80::1%3"),
// so that a reply goes back out of the same link. Listen looks a zone name
// up in the calling thread's network namespace, where the socket opens, and
// LocalAddr reports a link-local bound address's zone as its index too.
package udp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/internal/deadline"
)

// Protocol limits on a UDP payload: 65535 bytes of IP packet less the IPv4
// (20) or, for IPv6, only the UDP (8) header, since the IPv6 payload length
// excludes the fixed header. Datagrams this large are IP-fragmented on any
// link but loopback; see MaxPayloadForMTU.
const (
	MaxPayloadIPv4 = 65535 - 20 - 8
	MaxPayloadIPv6 = 65535 - 8
)

// DefaultBuffer is the socket buffer size asked for when Options leaves it
// zero: 4 MiB, Debian's usual net.core.rmem_max on servers and room for
// 256 bundles of 16 KiB in flight towards one socket.
const DefaultBuffer = 4 << 20

// batch is the number of datagrams moved per system call: the scratch
// arrays are this long, and longer batches are split.
const batch = 64

// Limits on one UDP_SEGMENT (GSO) message: at most gsoMaxSegs datagrams
// (the kernel's UDP_MAX_SEGMENTS is 64 on older kernels, 128 on newer ones)
// and at most gsoMaxBytes of payload in all, the IPv4 limit on one UDP
// datagram, which the kernel checks against the whole message; it is also
// below the IPv6 one.
const (
	gsoMaxSegs  = 64
	gsoMaxBytes = MaxPayloadIPv4
)

// MaxPayloadForMTU returns the largest UDP payload that fits one IP packet on
// a link with the given MTU, so that it is never fragmented: MTU less 28
// bytes for IPv4, 48 for IPv6 (without extension headers).
func MaxPayloadForMTU(mtu int, ipv6 bool) int {
	if ipv6 {
		return mtu - 40 - 8
	}
	return mtu - 20 - 8
}

// Options tune a socket. The zero value is usable.
type Options struct {
	// ReadBuffer and WriteBuffer are the socket buffer sizes in bytes
	// (SO_RCVBUF, SO_SNDBUF); 0 means DefaultBuffer. With CAP_NET_ADMIN
	// the sysctl limits net.core.rmem_max and wmem_max are bypassed
	// (SO_RCVBUFFORCE); without it the kernel caps the size at them.
	ReadBuffer, WriteBuffer int
	// MaxPayload is what MaxPayload reports and the largest datagram Send
	// accepts; 0 means the protocol limit (MaxPayloadIPv4 or
	// MaxPayloadIPv6). Set it to MaxPayloadForMTU of the path to keep
	// datagrams unfragmented.
	MaxPayload int
	// Steer, for ListenGroup, picks the socket of the group that receives
	// each datagram. Nil leaves the choice to the kernel's hash of the
	// addresses and ports.
	Steer *Steer
	// GSO turns on UDP generic segmentation offload on send: Send hands
	// each run of consecutive datagrams to one address with one length
	// (the last of a run may be shorter) to the kernel as one message with
	// a UDP_SEGMENT control message, so the kernel builds one buffer for
	// the run instead of one per datagram and segments it at the egress
	// device, in software where the device cannot (a veth whose peer has
	// XDP attached), or at the receiving socket. Receivers see the same
	// datagrams, with one exception that keeps it off by default: on
	// loopback and veth the run reaches the receiving host in one piece, and
	// a reuseport group's steering program (Options.Steer of ListenGroup)
	// picks one socket for all of it by the first datagram's payload. Turn
	// it on only towards receivers that do not steer by payload. A Conn
	// whose kernel or route refuses it turns it off by itself (see GSO).
	GSO bool
}

// Steer picks, in a group of n sockets, the socket that receives a datagram
// from a 32-bit big-endian field of its UDP payload: socket
// ((field >> Shift) & Mask) mod n. A datagram too short for the field goes
// to socket 0. It runs as a classic BPF program attached with
// SO_ATTACH_REUSEPORT_CBPF, which sees the datagram from its UDP payload on.
type Steer struct {
	Offset uint32 // byte offset of the field in the UDP payload
	Shift  uint8  // right shift applied to the field
	Mask   uint32 // mask applied after the shift
}

// program returns the classic BPF program for s in a group of n sockets.
func (s Steer) program(n int) []unix.SockFilter {
	return []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: s.Offset},
		{Code: unix.BPF_ALU | unix.BPF_RSH | unix.BPF_K, K: uint32(s.Shift)},
		{Code: unix.BPF_ALU | unix.BPF_AND | unix.BPF_K, K: s.Mask},
		{Code: unix.BPF_ALU | unix.BPF_MOD | unix.BPF_K, K: uint32(n)},
		{Code: unix.BPF_RET | unix.BPF_A},
	}
}

// Conn is a kernel UDP socket that implements transport.Transport.
type Conn struct {
	pc         *net.UDPConn
	rc         syscall.RawConn
	v6         bool
	local      netip.AddrPort
	maxPayload int
	rbuf, wbuf int

	recvMu  sync.Mutex // one Recv at a time: it owns rx and drained
	rx      *scratch
	drained bool // the last Recv emptied the socket: the next one goes straight to its wait

	wake deadline.Waker // ends a blocked Recv with its context

	txPool sync.Pool // of *scratch, one per concurrent Send
	closed atomic.Bool
	gso    atomic.Bool // coalesce runs into UDP_SEGMENT messages; cleared for good on a refusal
}

var _ transport.Transport = (*Conn)(nil)

// Listen opens a UDP socket bound to addr (port 0 picks a free port). The
// address family of addr decides the socket's: an IPv4 (or IPv4-mapped)
// address opens an IPv4 socket, which reaches IPv4 peers only; an IPv6
// address an IPv6-only socket.
func Listen(addr netip.AddrPort, opts Options) (*Conn, error) {
	return listen(addr, opts, false, false)
}

// ListenGroup opens n sockets bound to the same address with SO_REUSEPORT
// (port 0 picks one free port for all of them). Socket i of the result is
// index i of the kernel's reuseport group, which is what Options.Steer
// selects. Every socket is closed again if any step fails. A port that a
// socket holds already fails with EADDRINUSE, as for Listen, even when the
// holder is another reuseport group, which the kernel would let these
// sockets join.
//
// With Options.Steer, no socket receives anything until the whole group is
// bound and the steering program attached: until then the kernel would
// spread datagrams by its hash (a program's index beyond the sockets bound
// so far falls back to it), and a receiver that keys state by the steered
// field, such as a messaging agent's worker, would see part of another
// worker's stream. Each socket drops what reaches it meanwhile (a socket
// filter attached before bind, detached at the end); senders that care
// retransmit.
func ListenGroup(addr netip.AddrPort, n int, opts Options) ([]*Conn, error) {
	if n < 1 {
		return nil, fmt.Errorf("udp: group of %d sockets", n)
	}
	addr, err := zoneByIndex(addr) // for freePort's bind too
	if err != nil {
		return nil, err
	}
	if addr.Port() != 0 {
		// The kernel lets these sockets join a reuseport group of this
		// user that holds the port already (a second agent given the
		// same address, or a predecessor still running), and the two
		// groups would share each other's datagrams. A plain bind
		// fails on any holder; a group that takes the port between
		// this check and its bind is not seen.
		if _, err := freePort(addr); err != nil {
			return nil, fmt.Errorf("udp: group on %v: %w (another socket holds the port, perhaps another process's group: find it with ss -ulpn 'sport = :%d', or choose another port)",
				addr, err, addr.Port())
		}
		return listenGroup(addr, n, opts)
	}
	// An ephemeral bind with SO_REUSEPORT may be given the port of another
	// reuseport group of this user, which the kernel counts as free: the
	// two groups would share each other's datagrams. A plain bind finds a
	// port no socket holds; the group takes it, or tries another should a
	// plain socket take it in between.
	for try := 1; ; try++ {
		port, err := freePort(addr)
		if err != nil {
			return nil, fmt.Errorf("udp: group: find a free port: %w", err)
		}
		conns, err := listenGroup(netip.AddrPortFrom(addr.Addr(), port), n, opts)
		if err == nil || !errors.Is(err, unix.EADDRINUSE) || try == 8 {
			return conns, err
		}
	}
}

// zoneByIndex returns addr with its zone, if a name, replaced by the
// interface's index. Go would look the name up in a process-wide cache,
// which may hold another network namespace's names; the calling thread is
// in the namespace the socket opens in.
func zoneByIndex(addr netip.AddrPort) (netip.AddrPort, error) {
	z := addr.Addr().Zone()
	if z == "" {
		return addr, nil
	}
	if _, err := strconv.ParseUint(z, 10, 32); err == nil {
		return addr, nil
	}
	ifi, err := net.InterfaceByName(z)
	if err != nil {
		return addr, fmt.Errorf("udp: listen on %v: zone %q names no interface of this network namespace (%v); use one of its interfaces, or an index: %w",
			addr, z, err, transport.ErrAddr)
	}
	return netip.AddrPortFrom(addr.Addr().WithZone(strconv.Itoa(ifi.Index)), addr.Port()), nil
}

// freePort returns a port of addr's address that no socket holds.
func freePort(addr netip.AddrPort) (uint16, error) {
	network := "udp6"
	if addr.Addr().Unmap().Is4() {
		network, addr = "udp4", netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	}
	c, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Port(), nil
}

// listenGroup is ListenGroup on a given port.
func listenGroup(addr netip.AddrPort, n int, opts Options) ([]*Conn, error) {
	conns := make([]*Conn, 0, n)
	fail := func(err error) ([]*Conn, error) {
		for _, c := range conns {
			_ = c.Close()
		}
		return nil, err
	}
	hold := opts.Steer != nil && n > 1
	for i := range n {
		a := addr
		if i > 0 {
			a = conns[0].local // the port the first bind picked
		}
		c, err := listen(a, opts, true, hold)
		if err != nil {
			return fail(fmt.Errorf("udp: group socket %d: %w", i, err))
		}
		conns = append(conns, c)
	}
	if hold {
		prog := opts.Steer.program(n)
		fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
		var serr error
		if err := conns[0].rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_CBPF, &fprog)
		}); err != nil {
			serr = err
		}
		if serr != nil {
			return fail(fmt.Errorf("udp %s: attach reuseport steering program: %w", conns[0].local, serr))
		}
		waitForReceivers()
		for i, c := range conns {
			if err := c.rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DETACH_FILTER, 0)
			}); err != nil {
				serr = err
			}
			if serr != nil {
				return fail(fmt.Errorf("udp %s: group socket %d: detach the hold filter: %w", c.local, i, serr))
			}
		}
	}
	return conns, nil
}

// membarrierGlobal is MEMBARRIER_CMD_GLOBAL (linux/membarrier.h), which
// x/sys/unix does not name: the kernel answers it with synchronize_rcu().
const membarrierGlobal = 1

// waitForReceivers returns once every datagram the kernel was delivering
// when it was called has met its socket's filter. The kernel picks a
// group's socket and runs that socket's filter within one RCU read-side
// section, so after a grace period no datagram picked by hash before the
// steering program was attached can still be checked against a hold filter
// that is about to go: without the wait, one such datagram (picked while
// the program was not there yet, filtered after the detach) now and then
// reached the wrong socket (TestGroupSteerWhileOpening, about 1 group in
// 10,000 on an idle 2-core machine).
func waitForReceivers() {
	if _, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, membarrierGlobal, 0, 0); errno != 0 {
		// Refused (a kernel without CONFIG_MEMBARRIER, or nohz_full
		// CPUs): wait what a grace period takes on an idle machine, many
		// times over.
		time.Sleep(50 * time.Millisecond)
	}
}

// dropAll is a socket filter that drops every datagram.
var dropAll = []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0}}

func listen(addr netip.AddrPort, opts Options, reuse, hold bool) (*Conn, error) {
	if !addr.IsValid() {
		return nil, fmt.Errorf("udp: listen on %v: %w", addr, transport.ErrAddr)
	}
	addr, err := zoneByIndex(addr)
	if err != nil {
		return nil, err
	}
	ip := addr.Addr().Unmap()
	v6 := ip.Is6()
	network, limit := "udp4", MaxPayloadIPv4
	if v6 {
		network, limit = "udp6", MaxPayloadIPv6
	}
	maxPayload := opts.MaxPayload
	if maxPayload == 0 {
		maxPayload = limit
	}
	if maxPayload < 1 || maxPayload > limit {
		return nil, fmt.Errorf("udp: max payload %d outside 1..%d", maxPayload, limit)
	}
	rbuf, wbuf := opts.ReadBuffer, opts.WriteBuffer
	if rbuf == 0 {
		rbuf = DefaultBuffer
	}
	if wbuf == 0 {
		wbuf = DefaultBuffer
	}
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			if reuse {
				if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); serr != nil {
					serr = fmt.Errorf("SO_REUSEPORT: %w", serr)
					return
				}
			}
			if hold {
				fprog := unix.SockFprog{Len: uint16(len(dropAll)), Filter: &dropAll[0]}
				if serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &fprog); serr != nil {
					serr = fmt.Errorf("hold filter: %w", serr)
					return
				}
			}
			if serr = setBuffer(int(fd), unix.SO_RCVBUFFORCE, unix.SO_RCVBUF, rbuf); serr != nil {
				return
			}
			serr = setBuffer(int(fd), unix.SO_SNDBUFFORCE, unix.SO_SNDBUF, wbuf)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	bind := netip.AddrPortFrom(ip, addr.Port())
	pc, err := lc.ListenPacket(context.Background(), network, bind.String())
	if err != nil {
		return nil, fmt.Errorf("udp: %w", err)
	}
	uc := pc.(*net.UDPConn)
	rc, err := uc.SyscallConn()
	if err != nil {
		_ = uc.Close()
		return nil, fmt.Errorf("udp: %w", err)
	}
	// Not uc.LocalAddr: Go names a link-local address's zone by a
	// process-wide cache of interface names, filled in whatever network
	// namespace some thread was in, which need not be the socket's.
	local, err := localName(rc)
	if err != nil {
		_ = uc.Close()
		return nil, fmt.Errorf("udp: bound to %v: %w", bind, err)
	}
	c := &Conn{pc: uc, rc: rc, v6: v6, local: local, maxPayload: maxPayload, rx: newScratch()}
	c.gso.Store(opts.GSO)
	c.txPool.New = func() any { return newScratch() }
	_ = rc.Control(func(fd uintptr) {
		c.rbuf, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
		c.wbuf, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
	})
	return c, nil
}

// setBuffer sets a socket buffer size, bypassing the sysctl limit where the
// process may (force) and staying within it where it may not.
func setBuffer(fd, force, plain, size int) error {
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, force, size); err == nil {
		return nil
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, plain, size); err != nil {
		return fmt.Errorf("socket buffer %d: %w", size, err)
	}
	return nil
}

// localName returns the address the socket is bound to, as name writes it:
// a link-local address's zone is its interface's index, never wrong in the
// socket's namespace, as Recv reports a source's and Send takes it.
func localName(rc syscall.RawConn) (netip.AddrPort, error) {
	var sa unix.RawSockaddrInet6 // large enough for either family
	n := uint32(unix.SizeofSockaddrInet6)
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_GETSOCKNAME, fd, uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&n)))
	}); err != nil {
		return netip.AddrPort{}, err
	}
	if errno != 0 {
		return netip.AddrPort{}, fmt.Errorf("getsockname: %w", errno)
	}
	return name(&sa), nil
}

// LocalAddr returns the bound address (the chosen port when bound to 0). A
// link-local address's zone is the index of its interface ("fe80::1%3"),
// whatever the address was bound with: a name would have to be looked up
// in the socket's network namespace, which the caller's need not be.
func (c *Conn) LocalAddr() netip.AddrPort { return c.local }

// MaxPayload returns Options.MaxPayload or the protocol limit.
func (c *Conn) MaxPayload() int { return c.maxPayload }

// SyscallConn returns the socket's raw connection, for a caller that waits
// on its descriptor together with others in poll(2) (the AF_XDP worker
// transport does). The caller must not read, write or close through it, and
// must stop using the descriptor once the Conn is closed.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.rc, nil }

// Buffers returns the socket buffer sizes the kernel granted, as it reports
// them (twice the requested size, for its bookkeeping overhead).
func (c *Conn) Buffers() (read, write int) { return c.rbuf, c.wbuf }

// Close closes the socket; a blocked Recv returns ErrClosed.
func (c *Conn) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	return c.pc.Close()
}

// GSO reports whether Send coalesces runs of datagrams into UDP_SEGMENT
// messages: Options.GSO, until the kernel refuses one whose first datagram
// it then takes on its own; then false for good.
func (c *Conn) GSO() bool { return c.gso.Load() }

// cmsgSpace is the room of one UDP_SEGMENT control message (a uint16): 24
// bytes on 64-bit Linux, 16 on 32-bit.
var cmsgSpace = unix.CmsgSpace(2)

// scratch holds the system call arguments of one batch: message headers,
// one iovec per datagram, and per message one socket address, the index of
// its first datagram and room for a UDP_SEGMENT control message. On receive
// and without GSO a message is one datagram. The kernel reads and writes
// them; they live on the heap, which the Go collector never moves.
type scratch struct {
	hdrs  [batch]unix.Mmsghdr
	iovs  [batch]unix.Iovec
	names [batch]unix.RawSockaddrInet6 // large enough for either family
	first [batch]int                   // send: index in the batch of message i's first datagram
	cmsgs [batch][3]uint64             // send: message i's UDP_SEGMENT, 8-byte aligned (cmsgSpace is 24)

	n, got int
	errno  unix.Errno
	block  bool
	recvF  func(fd uintptr) bool // bound once: passing a method value allocates
	sendF  func(fd uintptr) bool
}

func newScratch() *scratch {
	s := new(scratch)
	s.recvF = s.recv
	s.sendF = s.send
	return s
}

// recv is the RawConn.Read callback: one recvmmsg(2). It returns false, to
// wait for the socket to become readable, only for a blocking receive that
// found nothing.
//
// recv and send make their system calls raw (no entersyscall): the socket
// is non-blocking, so they never wait in the kernel and the P need not be
// offered to another thread. A plain Syscall would also wake the runtime's
// monitor thread (sysmon) from its deep sleep whenever it is the first
// system call after the process was idle, as it is on every wake-up of a
// receiver that waits for one datagram at a time (the GPU host agent's
// doorbells): a futex wake, and the monitor's futex wait and 20 µs
// nanosleep on the same CPU, about a third of such a wake-up's system
// calls (docs/ingest-bench.md).
func (s *scratch) recv(fd uintptr) bool {
	for {
		r, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&s.hdrs[0])), uintptr(s.n), 0, 0, 0)
		if e == unix.EINTR {
			continue
		}
		s.got, s.errno = int(r), e
		if e != 0 {
			s.got = 0
		}
		return !(e == unix.EAGAIN && s.block)
	}
}

// send is the RawConn.Write callback: one sendmmsg(2). It returns false, to
// wait for room in the socket buffer, when the kernel has none.
func (s *scratch) send(fd uintptr) bool {
	for {
		r, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&s.hdrs[0])), uintptr(s.n), 0, 0, 0)
		if e == unix.EINTR {
			continue
		}
		s.got, s.errno = int(r), e
		if e != 0 {
			s.got = 0
		}
		return e != unix.EAGAIN
	}
}

// Send implements transport.Transport: sendmmsg(2) of up to 64 datagrams a
// call, with Options.GSO each run of datagrams that GSO can carry in one
// message.
func (c *Conn) Send(pkts []transport.Packet) (int, error) {
	if c.closed.Load() {
		return 0, fmt.Errorf("udp %s: %w", c.local, transport.ErrClosed)
	}
	s := c.txPool.Get().(*scratch)
	defer c.txPool.Put(s)
	sent := 0
	probe := false // send this chunk without GSO: did the kernel refuse GSO, or the datagrams?
	for sent < len(pkts) {
		chunk := pkts[sent:min(len(pkts), sent+batch)]
		gso := c.gso.Load() && !probe
		k, m, bad := c.fill(s, chunk, gso)
		if m > 0 {
			// A Write that fails before it calls sendF (Close shut the
			// socket after the check above) must not count what an
			// earlier Send on this pooled scratch sent.
			s.n, s.got, s.errno = m, 0, 0
			err := c.rc.Write(s.sendF)
			got, errno := s.got, s.errno
			clear(s.iovs[:k]) // do not keep the caller's buffers alive in the pool
			if got < m {
				sent += s.first[got] // the kernel counts messages; the caller, datagrams
			} else {
				sent += k
			}
			if err != nil {
				return sent, c.wrapErr("sendmmsg", err)
			}
			if probe {
				probe = false
				if got > 0 {
					// The first datagram of the refused message
					// went on its own: GSO is what the kernel or
					// the route refuses. Turn it off.
					c.gso.Store(false)
				}
				// Else the datagram fails on its own too (a peer
				// the socket cannot reach, such as one off
				// loopback from a socket bound to 127.0.0.1:
				// EINVAL), and its error below is the peer's: GSO
				// stays on for the other peers.
			}
			if errno != 0 {
				if gso && s.hdrs[0].Hdr.Controllen != 0 && gsoRefused(errno) {
					// The kernel refused a UDP_SEGMENT message
					// (sendmmsg fails only on its first message),
					// perhaps for GSO, perhaps for what the
					// datagrams would meet without it: send the
					// same datagrams without GSO and see.
					probe = true
					continue
				}
				return sent, fmt.Errorf("udp %s: sendmmsg to %s: %w", c.local, pkts[sent].Addr, errno)
			}
			if got == 0 {
				return sent, fmt.Errorf("udp %s: sendmmsg sent nothing", c.local)
			}
			if got < m {
				continue // the kernel took part of the batch; send the rest
			}
		}
		if bad != nil {
			return sent, bad
		}
	}
	return sent, nil
}

// gsoRefused tells the errors with which the kernel may refuse a UDP_SEGMENT
// message that it would have sent as separate datagrams: no checksum
// offload on the route or SO_NO_CHECK (EIO, EINVAL), a segment larger than
// the path's MTU (EINVAL), no UDP_SEGMENT in this kernel (EINVAL,
// ENOPROTOOPT), a message over a limit of this kernel (EMSGSIZE). The kernel
// gives some of them for a datagram sent alone as well (EINVAL to a peer
// off loopback from a socket bound to a loopback address), so Send turns
// GSO off only once the same datagram goes without it.
func gsoRefused(e unix.Errno) bool {
	return e == unix.EIO || e == unix.EINVAL || e == unix.ENOPROTOOPT || e == unix.EMSGSIZE
}

// fill prepares the system call arguments for chunk (at most batch
// datagrams) in s: k datagrams in m messages, stopping before the first
// datagram that cannot be sent, which bad then describes. With gso, a
// datagram joins the message before it when it goes to the same address,
// is no longer than that message's first (gso_size) and that message has
// no shorter one yet, and the message stays within gsoMaxSegs datagrams and
// gsoMaxBytes; a message of two or more datagrams carries a UDP_SEGMENT
// control message.
func (c *Conn) fill(s *scratch, chunk []transport.Packet, gso bool) (k, m int, bad error) {
	var (
		seg, total, segs int  // the open message's gso_size, bytes and datagrams
		closed           bool // it has a shorter last datagram
	)
	for ; k < len(chunk); k++ {
		p := &chunk[k]
		n := len(p.Data)
		if n > c.maxPayload {
			bad = fmt.Errorf("udp %s: %d bytes to %s: %w", c.local, n, p.Addr, transport.ErrTooBig)
			break
		}
		if gso && m > 0 && !closed && n > 0 && n <= seg && segs < gsoMaxSegs && total+n <= gsoMaxBytes &&
			p.Addr == chunk[s.first[m-1]].Addr {
			s.setIov(k, p.Data)
			h := &s.hdrs[m-1]
			segs++
			total += n
			closed = n < seg
			h.Hdr.SetIovlen(segs)
			if segs == 2 {
				cm := unsafe.Slice((*byte)(unsafe.Pointer(&s.cmsgs[m-1])), cmsgSpace)
				ch := (*unix.Cmsghdr)(unsafe.Pointer(&cm[0]))
				ch.Level, ch.Type = unix.SOL_UDP, unix.UDP_SEGMENT
				ch.SetLen(unix.CmsgLen(2))
				*(*uint16)(unsafe.Pointer(&cm[unix.CmsgLen(0)])) = uint16(seg)
				h.Hdr.Control = &cm[0]
				h.Hdr.SetControllen(cmsgSpace)
			}
			continue
		}
		nl, ok := c.putName(&s.names[m], p.Addr)
		if !ok {
			bad = fmt.Errorf("udp %s: send to %s: %w", c.local, p.Addr, transport.ErrAddr)
			break
		}
		s.setIov(k, p.Data)
		h := &s.hdrs[m]
		h.Hdr = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&s.names[m])), Namelen: nl, Iov: &s.iovs[k]}
		h.Hdr.SetIovlen(1)
		h.Len = 0
		s.first[m] = k
		m++
		seg, total, segs, closed = n, n, 1, false
	}
	return k, m, bad
}

// setIov points iovec i at b.
func (s *scratch) setIov(i int, b []byte) {
	s.iovs[i] = unix.Iovec{}
	if len(b) > 0 {
		s.iovs[i].Base = &b[0]
	}
	s.iovs[i].SetLen(len(b))
}

// putName writes the socket address of a into sa and returns its length.
func (c *Conn) putName(sa *unix.RawSockaddrInet6, a netip.AddrPort) (uint32, bool) {
	ip := a.Addr()
	if !ip.IsValid() || a.Port() == 0 {
		return 0, false
	}
	port := a.Port()
	if c.v6 {
		if ip.Is4() {
			return 0, false // an IPv6-only socket cannot reach IPv4
		}
		*sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: ip.As16()}
		if z := ip.Zone(); z != "" {
			// The kernel picks the link of a link-local (or
			// link-scoped multicast) peer by the scope ID: without
			// it, it routes by the first link-local route, out of
			// whichever link that is.
			id, ok := c.zoneIndex(z)
			if !ok {
				return 0, false
			}
			sa.Scope_id = id
		}
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		p[0], p[1] = byte(port>>8), byte(port)
		return unix.SizeofSockaddrInet6, true
	}
	ip = ip.Unmap()
	if !ip.Is4() {
		return 0, false
	}
	sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
	*sa4 = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: ip.As4()}
	p := (*[2]byte)(unsafe.Pointer(&sa4.Port))
	p[0], p[1] = byte(port>>8), byte(port)
	return unix.SizeofSockaddrInet4, true
}

// zoneIndex returns the interface index that zone names: the zone itself
// when it is a number (as Recv reports it), else the index of the interface
// of that name in the socket's network namespace, which a lookup through the
// socket finds whatever namespace the calling thread is in.
func (c *Conn) zoneIndex(zone string) (uint32, bool) {
	if id, err := strconv.ParseUint(zone, 10, 32); err == nil {
		return uint32(id), true
	}
	ifr, err := unix.NewIfreq(zone)
	if err != nil {
		return 0, false
	}
	var serr error
	if err := c.rc.Control(func(fd uintptr) { serr = unix.IoctlIfreq(int(fd), unix.SIOCGIFINDEX, ifr) }); err != nil || serr != nil {
		return 0, false
	}
	return ifr.Uint32(), true
}

// name reads the source address the kernel wrote into sa. A link-local
// source's zone is the index of the interface it came in on, in decimal,
// which Send takes back: a reply goes out of the same link.
func name(sa *unix.RawSockaddrInet6) netip.AddrPort {
	switch sa.Family {
	case unix.AF_INET:
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		p := (*[2]byte)(unsafe.Pointer(&sa4.Port))
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), uint16(p[0])<<8|uint16(p[1]))
	case unix.AF_INET6:
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		ip := netip.AddrFrom16(sa.Addr).Unmap()
		if sa.Scope_id != 0 {
			ip = ip.WithZone(strconv.FormatUint(uint64(sa.Scope_id), 10))
		}
		return netip.AddrPortFrom(ip, uint16(p[0])<<8|uint16(p[1]))
	}
	return netip.AddrPort{}
}

// Recv implements transport.Transport: recvmmsg(2) of up to 64 datagrams.
func (c *Conn) Recv(ctx context.Context, pkts []transport.Packet) (int, error) {
	if len(pkts) == 0 {
		return 0, nil
	}
	c.recvMu.Lock()
	defer c.recvMu.Unlock()
	s := c.rx
	k := min(len(pkts), batch)
	for i := range k {
		b := pkts[i].Data[:cap(pkts[i].Data)]
		s.iovs[i] = unix.Iovec{}
		if len(b) > 0 {
			s.iovs[i].Base = &b[0]
		}
		s.iovs[i].SetLen(len(b))
		h := &s.hdrs[i]
		h.Hdr = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&s.names[i])), Namelen: unix.SizeofSockaddrInet6, Iov: &s.iovs[i]}
		h.Hdr.SetIovlen(1)
		h.Len = 0
	}
	s.n = k
	defer clear(s.iovs[:k])

	// Take what is waiting without touching deadlines: the busy case.
	// After a Recv that emptied the socket, the next most likely finds
	// nothing: it goes straight to the wait, whose first recvmmsg takes
	// what came in meanwhile, rather than spend a second one finding
	// nothing. A done ctx still gets the non-blocking receive.
	var err error
	if c.drained && ctx.Err() == nil {
		err = c.recvBlocking(ctx, s)
	} else {
		s.block = false
		err = c.rc.Read(s.recvF)
		if err == nil && s.errno == unix.EAGAIN {
			if err := ctx.Err(); err != nil {
				c.drained = true
				return 0, err
			}
			err = c.recvBlocking(ctx, s)
		}
	}
	if err != nil {
		return 0, err
	}
	if s.errno != 0 {
		return 0, fmt.Errorf("udp %s: recvmmsg: %w", c.local, s.errno)
	}
	// recvmmsg(2) without MSG_WAITFORONE on a non-blocking socket stops
	// short of k only when the queue ran dry.
	c.drained = s.got < k
	for i := range s.got {
		pkts[i].Data = pkts[i].Data[:s.hdrs[i].Len]
		pkts[i].Addr = name(&s.names[i])
	}
	return s.got, nil
}

// recvBlocking waits for datagrams under ctx's deadline and cancellation.
func (c *Conn) recvBlocking(ctx context.Context, s *scratch) error {
	at, _ := ctx.Deadline()
	disarm := c.wake.Arm(ctx, c.pc, at)
	s.block = true
	err := c.rc.Read(s.recvF)
	disarm()
	if err == nil {
		return nil
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		return context.DeadlineExceeded
	}
	return c.wrapErr("recvmmsg", err)
}

func (c *Conn) wrapErr(op string, err error) error {
	if errors.Is(err, net.ErrClosed) || c.closed.Load() {
		return fmt.Errorf("udp %s: %w", c.local, transport.ErrClosed)
	}
	return fmt.Errorf("udp %s: %s: %w", c.local, op, err)
}
