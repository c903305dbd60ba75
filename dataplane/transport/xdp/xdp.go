// Package xdp is the AF_XDP implementation of transport.Transport: the
// transport of a DPU agent worker. One Transport owns one AF_XDP socket
// (dataplane/xsk) bound to an (interface, queue); the steering program
// (bpf/) redirects the worker's UDP datagrams to it with an xsk:<queue>
// rule, once the caller has registered the socket with Steer.SetXSK
// (see [Transport.FD]).
//
// Receive keeps only IPv4 UDP datagrams to the transport's local address and
// port (the Lovelock port), strips the Ethernet (with at most one 802.1Q
// tag), IPv4 and UDP headers and hands out the UDP payload with the
// sender's address. Every other frame (not IPv4/UDP, another destination,
// an IP fragment, inconsistent lengths, a bad IPv4 header checksum) is
// dropped and counted in [Stats]; nothing on the receive path panics. The
// UDP checksum of received datagrams is not verified.
//
// Send builds Ethernet/IPv4/UDP frames itself: the local interface's MAC as
// source, the next hop's MAC (the destination, or the gateway of the
// kernel's route to it) from the kernel's neighbour table, read over
// netlink and cached for Options.NeighbourTTL. The IPv4 header checksum is
// always computed, with DF set and TTL 64; the UDP checksum is computed too
// (RFC 768 allows 0 for IPv4; Options.NoUDPChecksum sends 0 and saves the
// pass over the payload). When the neighbour table has no usable entry for
// the next hop, the datagram goes out through a kernel UDP socket bound to
// the same local address and port instead (which also makes the kernel
// resolve the neighbour, so the next datagrams take the AF_XDP path), and
// is counted in Stats.TXFallback; with Options.NoFallback it is refused
// with an error wrapping ErrNoNeighbour and counted in Stats.TXNoNeighbour.
//
// Only IPv4 is carried. MaxPayload is the interface MTU less 28, capped by
// what one UMEM frame holds (frame size less headroom, the kernel's 256
// bytes of receive headroom and the Ethernet header) and by what reaches a
// copy-mode receiver's XDP program in one buffer (SingleBufferFrame): 3478
// bytes at any MTU from 3506 up, 1472 at MTU 1500.
//
// A Group is what a DPU's agent worker runs on: one Transport on the
// worker's queue of each interface the agent receives on (pf0hpf from its
// host, p0 from the fabric) and the worker's kernel UDP socket, which
// receives what XDP passed to the stack instead of a socket and sends what
// the AF_XDP sockets cannot. OpenGroups opens one per worker.
package xdp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
	"github.com/lovelock-dpu/lovelock/dataplane/xsk"
)

// ErrNoNeighbour is wrapped by Send, with Options.NoFallback, for a
// datagram whose next hop has no usable entry in the kernel's neighbour
// table (or no route through the transport's interface). It also wraps
// transport.ErrAddr, so callers that skip unusable destinations skip it.
var ErrNoNeighbour = fmt.Errorf("no neighbour entry for the next hop: %w", transport.ErrAddr)

// DefaultNeighbourTTL is how long a resolved next-hop MAC is used before
// the neighbour table is read again.
const DefaultNeighbourTTL = 5 * time.Second

// DefaultSendWait is how long Send waits for room in the TX ring or free
// UMEM frames before giving up on a datagram.
const DefaultSendWait = time.Second

// Header sizes.
const (
	ethLen  = 14
	vlanLen = 4
	ipv4Len = 20
	udpLen  = 8
	// Overhead is the IPv4 and UDP header bytes of a datagram: MaxPayload
	// is the MTU less this.
	Overhead = ipv4Len + udpLen
)

// batch is the number of frames built and received per ring access.
const batch = 64

// SingleBufferFrame is the largest frame, Ethernet header included, that
// reaches XDP in one buffer on veth and on the generic (skb) XDP path
// (measured on veth, kernel 6.18): both copy a frame into a page-pool page
// before running the program (skb_pp_cow_data), and that page holds 4096
// bytes less XDP_PACKET_HEADROOM (256) and the skb_shared_info kept at its
// end (320). A longer frame reaches XDP as a multi-buffer frame (the
// steering program is xdp.frags, so the interface may run a jumbo MTU). The
// AF_XDP sockets of dataplane/xsk are not bound with XDP_USE_SG and the
// kernel would drop such a frame at the socket, so the steering program
// passes an xsk verdict on it to the stack (xsk_miss): with a Group it still
// reaches the worker, through its kernel socket, but off the AF_XDP path.
// MaxPayload keeps every datagram a Transport sends (and so the bundles of
// an agent on it) within this frame: 3478 bytes of UDP payload. It assumes
// pages of 4 KiB.
//
// This is the limit of a copy-mode receiver. A zero-copy driver writes the
// frame into one UMEM frame instead (a larger one only with XDP_USE_SG),
// which the UMEM cap of MaxPayload already covers (3798 bytes of payload
// with 4096-byte frames); since a sender cannot know the receiver's mode,
// both caps always apply. Multi-buffer AF_XDP (XDP_USE_SG, one datagram in
// several UMEM frames) would carry datagrams up to the MTU; it is not
// implemented.
//
// An 802.1Q tag inside the frame adds 4 bytes (measured on veth with a
// tagged frame written through AF_PACKET: 3474 bytes of payload, a 3520-byte
// frame, reach the socket; 3475 pass to the stack as xsk_miss). Transport
// never tags its frames, and a tag carried beside the frame (TX VLAN offload
// on the sender, as veth and NICs have by default; RX VLAN stripping on a
// NIC) is not part of what XDP sees (not measured: this kernel has no 802.1Q
// devices). Only a tag that stays in the frame data up to the receiving XDP
// program costs room: there a full-size datagram takes the kernel path, to
// the receiver's VLAN device and the Group's kernel socket. Use a
// transfer_size of 3474 on such links.
const SingleBufferFrame = 4096 - xsk.PacketHeadroom - 320

// MaxPayloadForMTU returns the MaxPayload of a Transport on an interface of
// the given MTU with the default UMEM (xsk.DefaultFrameSize frames, no
// headroom): min(MTU, SingleBufferFrame less the Ethernet header, the UMEM
// frame's room) less 28. That is 1472 at MTU 1500 and 3478 at MTU 3506 and
// above. A messaging cluster whose agents run on AF_XDP should keep
// transfer_size within it, so that the clients' bundles take the AF_XDP
// path too.
func MaxPayloadForMTU(mtu int) int {
	return maxPayload(mtu, xsk.DefaultFrameSize-xsk.PacketHeadroom-ethLen)
}

// MaxPayloadForMTUMulti returns the MaxPayload of a MultiBuffer Transport
// on an interface of the given MTU with the default UMEM frames: the MTU
// less 28, as on a kernel UDP socket (xsk.MaxTXFrags UMEM frames, 61 KiB,
// cap nothing an Ethernet MTU allows).
func MaxPayloadForMTUMulti(mtu int) int {
	return maxPayloadMulti(mtu, xsk.DefaultFrameSize) // the default UMEM has no headroom
}

// maxPayloadMulti is MaxPayload on a MultiBuffer socket whose UMEM frames
// hold txRoom bytes of a frame to send.
func maxPayloadMulti(mtu, txRoom int) int {
	return min(mtu, xsk.MaxTXFrags*txRoom-ethLen, 65535) - Overhead
}

// maxPayload is MaxPayload for an interface MTU and the room one UMEM frame
// has for a received frame (its size less headroom, the kernel's receive
// headroom and the Ethernet header).
func maxPayload(mtu, umemRoom int) int {
	return min(mtu, umemRoom, SingleBufferFrame-ethLen) - Overhead
}

// Options configure a Transport.
type Options struct {
	// Interface names the network interface; Ifindex, when non-zero,
	// takes precedence.
	Interface string
	Ifindex   int
	// Queue is the interface queue the socket binds to: the <queue> of the
	// steering rule's xsk:<queue> action.
	Queue uint32
	// Addr is the local IPv4 address and UDP port the transport receives
	// on and sends from. An unspecified or invalid address takes the
	// interface's first IPv4 address; port 0 takes wire.DefaultPort.
	Addr netip.AddrPort
	// UMEM and Socket configure the AF_XDP socket; nil takes xsk's
	// defaults (copy or zero-copy chosen by the driver).
	UMEM   *xsk.UMEMConfig
	Socket *xsk.SocketConfig
	// NeighbourTTL is how long a next-hop MAC is cached (0:
	// DefaultNeighbourTTL).
	NeighbourTTL time.Duration
	// SendWait bounds how long Send waits for a full TX ring or exhausted
	// UMEM frames (0: DefaultSendWait).
	SendWait time.Duration
	// NoFallback refuses datagrams whose next hop is not resolved
	// (ErrNoNeighbour) instead of sending them through a kernel UDP socket.
	// Without it Open binds that socket to Addr, which fails when another
	// socket holds the port.
	NoFallback bool
	// NoUDPChecksum sends UDP checksum 0 (allowed for IPv4).
	NoUDPChecksum bool
	// MultiBuffer binds the socket with XDP_USE_SG (multi-buffer AF_XDP):
	// a datagram may then take several UMEM frames both ways, and
	// MaxPayload is the MTU less 28 (MaxPayloadForMTUMulti) instead of
	// what one XDP buffer holds. Register the socket with
	// Steer.SetXSKMultiBuffer so that the steering program hands it
	// multi-buffer frames. Its peers must take such frames too: kernel
	// sockets do, and so do AF_XDP sockets with MultiBuffer.
	MultiBuffer bool
}

// Stats count a transport's datagrams. RX drops are frames the steering
// program handed to the socket that Recv did not deliver.
type Stats struct {
	RXPackets uint64 // datagrams delivered by Recv
	RXTrunc   uint64 // of those, cut to the caller's buffer capacity
	// RXNotUDP counts frames that are not IPv4 UDP (another EtherType,
	// another IP protocol, an IP fragment).
	RXNotUDP uint64
	// RXWrongDest counts IPv4 UDP datagrams to another address or port.
	RXWrongDest uint64
	// RXMalformed counts truncated frames, inconsistent IPv4 or UDP
	// lengths, bad IPv4 versions or header checksums.
	RXMalformed uint64

	TXPackets     uint64 // datagrams queued on the AF_XDP TX ring
	TXFallback    uint64 // datagrams sent through the kernel UDP socket
	TXNoNeighbour uint64 // datagrams refused for want of a neighbour entry
	TXErrors      uint64 // other datagrams Send returned an error for
}

// Transport is a transport.Transport over one AF_XDP socket.
type Transport struct {
	sock       *xsk.Socket
	ifindex    int
	ifname     string
	local      netip.AddrPort
	localMAC   net.HardwareAddr
	mtu        int
	maxPayload int
	frameLen   int // the longest frame Send builds
	noUDPSum   bool
	sendWait   time.Duration
	ttl        time.Duration

	fallback *net.UDPConn // nil with NoFallback

	neighMu sync.Mutex // nl, neigh
	nl      *netlink.Handle
	neigh   map[netip.Addr]neighEntry

	recvMu  sync.Mutex // one Recv at a time: rxDescs, rxJumbo
	rxDescs []xsk.Desc
	rxBatch int    // datagrams a receive takes at most (Options.Socket.BatchSize, at most 64)
	rxJumbo []byte // a multi-buffer datagram's frames, joined when its first is too short for the headers

	txPool sync.Pool // of *txScratch
	ipID   atomic.Uint32

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error

	rxPackets, rxTrunc, rxNotUDP, rxWrongDest, rxMalformed atomic.Uint64
	txPackets, txFallback, txNoNeigh, txErrors             atomic.Uint64
}

type neighEntry struct {
	mac     [6]byte
	expires time.Time
}

type txScratch struct {
	bufs   [batch][]byte // frame buffers, made as a batch first needs them
	frames [][]byte
}

// buf returns frame buffer i of s, made on first use: a worker's sends are
// mostly a few datagrams, and a scratch the pool lost to the GC is not
// worth 64 jumbo frames again.
func (s *txScratch) buf(i, frameLen int) []byte {
	if s.bufs[i] == nil {
		s.bufs[i] = make([]byte, frameLen)
	}
	return s.bufs[i]
}

var _ transport.Transport = (*Transport)(nil)

// Open creates the AF_XDP socket on (interface, queue) and the transport
// around it. It must run on a thread inside the interface's network
// namespace (see control/netns): the socket, the netlink handle used for
// neighbour look-ups and the fallback socket all belong to the namespace
// they are created in, and keep it when used from other threads.
//
// The socket receives nothing until the caller registers it with the
// steering program: Steer.SetXSK(t.Ifindex(), t.Queue(), t.FD()).
func Open(opts Options) (_ *Transport, err error) {
	var l netlink.Link
	if opts.Ifindex != 0 {
		l, err = netlink.LinkByIndex(opts.Ifindex)
	} else {
		l, err = netlink.LinkByName(opts.Interface)
	}
	if err != nil {
		return nil, fmt.Errorf("xdp: interface %q (index %d): %w", opts.Interface, opts.Ifindex, err)
	}
	a := l.Attrs()
	if len(a.HardwareAddr) != 6 {
		return nil, fmt.Errorf("xdp: interface %s has no Ethernet address", a.Name)
	}
	t := &Transport{
		ifindex: a.Index, ifname: a.Name, localMAC: a.HardwareAddr, mtu: a.MTU,
		noUDPSum: opts.NoUDPChecksum, sendWait: opts.SendWait, ttl: opts.NeighbourTTL,
		neigh: make(map[netip.Addr]neighEntry),
	}
	if t.sendWait <= 0 {
		t.sendWait = DefaultSendWait
	}
	if t.ttl <= 0 {
		t.ttl = DefaultNeighbourTTL
	}
	name := fmt.Sprintf("xdp %s queue %d", a.Name, opts.Queue)

	ip := opts.Addr.Addr().Unmap()
	if !ip.IsValid() || ip.IsUnspecified() {
		addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			return nil, fmt.Errorf("%s: list addresses: %w", name, err)
		}
		for _, ad := range addrs {
			if v, ok := netip.AddrFromSlice(ad.IP.To4()); ok {
				ip = v
				break
			}
		}
		if !ip.IsValid() {
			return nil, fmt.Errorf("%s: interface has no IPv4 address: %w", name, transport.ErrAddr)
		}
	}
	if !ip.Is4() {
		return nil, fmt.Errorf("%s: local address %s is not IPv4: %w", name, ip, transport.ErrAddr)
	}
	port := opts.Addr.Port()
	if port == 0 {
		port = wire.DefaultPort
	}
	t.local = netip.AddrPortFrom(ip, port)

	defer func() {
		if err != nil {
			_ = t.Close()
		}
	}()
	if t.nl, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
		return nil, fmt.Errorf("%s: netlink: %w", name, err)
	}
	if !opts.NoFallback {
		t.fallback, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(t.local))
		if err != nil {
			return nil, fmt.Errorf("%s: fallback socket: %w", name, err)
		}
		// The steering program takes the port's datagrams before the
		// stack sees them; keep the few that slip past (xsk_miss) small.
		_ = t.fallback.SetReadBuffer(4096)
	}
	scfg := opts.Socket
	if opts.MultiBuffer {
		c := xsk.SocketConfig{}
		if scfg != nil {
			c = *scfg
		}
		c.MultiBuffer = true
		scfg = &c
	}
	if t.sock, err = xsk.Open(a.Index, opts.Queue, opts.UMEM, scfg); err != nil {
		return nil, fmt.Errorf("xdp: %w", err)
	}
	u := t.sock.UMEM()
	// A received packet starts after the UMEM and kernel headroom; a sent
	// frame after the UMEM headroom. The smaller room bounds the MTU, and so
	// does the receiver's first XDP buffer (SingleBufferFrame). A
	// multi-buffer socket takes a datagram in several frames both ways.
	room := u.FrameSize() - u.Headroom() - xsk.PacketHeadroom - ethLen
	t.maxPayload = maxPayload(t.mtu, room)
	if t.sock.MultiBuffer() {
		t.maxPayload = maxPayloadMulti(t.mtu, u.FrameSize()-u.Headroom())
		t.rxJumbo = make([]byte, 0, t.mtu+ethLen+vlanLen)
	}
	if t.maxPayload < 1 {
		return nil, fmt.Errorf("%s: MTU %d and UMEM frames of %d bytes leave no payload", name, t.mtu, u.FrameSize())
	}
	bs := batch
	if opts.Socket != nil && opts.Socket.BatchSize > 0 {
		bs = min(bs, opts.Socket.BatchSize)
	}
	t.rxBatch = bs
	t.rxDescs = make([]xsk.Desc, bs)
	if t.sock.MultiBuffer() {
		// BatchSize counts datagrams; the descriptors must hold at
		// least one whole datagram's frames, or RecvPackets fails with
		// xsk.ErrShortBatch and leaves the datagram on the ring (before
		// xsk refused that, it handed out the first frames of one and
		// an 8000-byte datagram at BatchSize 2 was lost, counted 1
		// malformed and 1 not UDP). The kernel
		// copies a frame into as many frames of room bytes as it
		// takes; a zero-copy driver hands at most MAX_SKB_FRAGS+1
		// (up to 46) buffers.
		chain := (t.mtu + ethLen + vlanLen + room + ethLen - 1) / (room + ethLen)
		t.rxDescs = make([]xsk.Desc, max(batch, chain))
	}
	t.frameLen = ethLen + Overhead + t.maxPayload
	t.txPool.New = func() any { return &txScratch{frames: make([][]byte, 0, batch)} }
	return t, nil
}

// LocalAddr returns the address and port the transport receives on.
func (t *Transport) LocalAddr() netip.AddrPort { return t.local }

// MaxPayload returns the interface MTU less 28, capped by the UMEM frame
// and by SingleBufferFrame: at most 3478; with Options.MultiBuffer the MTU
// less 28 (MaxPayloadForMTUMulti).
func (t *Transport) MaxPayload() int { return t.maxPayload }

// FD returns the AF_XDP socket's descriptor, for Steer.SetXSK.
func (t *Transport) FD() int { return t.sock.FD() }

// Ifindex returns the interface the socket is bound to.
func (t *Transport) Ifindex() int { return t.ifindex }

// Interface returns the name of the interface the socket is bound to.
func (t *Transport) Interface() string { return t.ifname }

// Queue returns the queue the socket is bound to.
func (t *Transport) Queue() uint32 { return t.sock.Queue() }

// MultiBuffer reports whether the socket is bound with XDP_USE_SG
// (Options.MultiBuffer): register it with Steer.SetXSKMultiBuffer.
func (t *Transport) MultiBuffer() bool { return t.sock.MultiBuffer() }

// Mode returns the AF_XDP socket's mode (copy or zero-copy).
func (t *Transport) Mode() xsk.Mode { return t.sock.Mode() }

// Socket returns the underlying AF_XDP socket, for its statistics. The
// transport owns it: do not receive, transmit on or close it.
func (t *Transport) Socket() *xsk.Socket { return t.sock }

// Stats returns the transport's counters.
func (t *Transport) Stats() Stats {
	return Stats{
		RXPackets: t.rxPackets.Load(), RXTrunc: t.rxTrunc.Load(), RXNotUDP: t.rxNotUDP.Load(),
		RXWrongDest: t.rxWrongDest.Load(), RXMalformed: t.rxMalformed.Load(),
		TXPackets: t.txPackets.Load(), TXFallback: t.txFallback.Load(),
		TXNoNeighbour: t.txNoNeigh.Load(), TXErrors: t.txErrors.Load(),
	}
}

// Close closes the AF_XDP socket (the kernel drops it from the steering
// program's socket map), the fallback socket and the netlink handle, and
// frees the UMEM. A blocked Recv returns an error wrapping
// transport.ErrClosed. It is safe to call more than once.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		t.closed.Store(true)
		var errs []error
		if t.sock != nil {
			errs = append(errs, t.sock.Close())
		}
		if t.fallback != nil {
			errs = append(errs, t.fallback.Close())
		}
		t.neighMu.Lock()
		if t.nl != nil {
			t.nl.Close()
			t.nl = nil
		}
		t.neighMu.Unlock()
		if err := errors.Join(errs...); err != nil {
			t.closeErr = fmt.Errorf("xdp %s: close: %w", t.local, err)
		}
	})
	return t.closeErr
}

func (t *Transport) errClosed() error {
	return fmt.Errorf("xdp %s: %w", t.local, transport.ErrClosed)
}

// Recv implements transport.Transport. It takes up to len(pkts) frames
// (at most 64) off the RX ring, delivers the valid ones and recycles every
// frame; when none was valid it looks again unless ctx is done, and when the
// ring is empty it waits in poll(2) under ctx.
func (t *Transport) Recv(ctx context.Context, pkts []transport.Packet) (int, error) {
	if len(pkts) == 0 {
		return 0, nil
	}
	t.recvMu.Lock()
	defer t.recvMu.Unlock()
	for {
		if t.closed.Load() {
			return 0, t.errClosed()
		}
		descs := t.rxDescs
		got, err := t.sock.RecvPackets(descs, min(len(pkts), t.rxBatch))
		if err != nil {
			return 0, t.wrapErr("receive", err)
		}
		if got > 0 {
			n := 0
			for i := 0; i < got; {
				var ok bool
				if descs[i].Options&unix.XDP_PKT_CONTD == 0 {
					ok = t.parse(t.sock.Frame(descs[i]), &pkts[n])
					i++
				} else {
					ok, i = t.parseChain(descs[:got], i, &pkts[n])
				}
				if ok {
					n++
				}
			}
			if err := t.sock.Recycle(descs[:got]); err != nil {
				return n, t.wrapErr("recycle", err)
			}
			if n > 0 {
				return n, nil
			}
			// All dropped: look for more before waiting, unless ctx is
			// done. A steady stream of frames that Recv drops would
			// otherwise never let it reach the check below (a Group
			// polls each socket with a done context).
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			continue
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if _, err := t.sock.Poll(ctx, 500*time.Millisecond); err != nil {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return 0, err
			}
			return 0, t.wrapErr("poll", err)
		}
	}
}

// parseChain takes the multi-buffer frame that starts at descs[i] (the
// descriptors it chains with XDP_PKT_CONTD) into p and returns whether it
// was delivered and the index of the next frame. The headers are parsed
// in the first buffer, which holds them (the kernel's first XDP buffer is
// far longer than any headers), and the payload is copied from each
// buffer straight into p: one copy, as for a single-buffer frame. A first
// buffer too short for the headers has the chain joined in rxJumbo first.
// A chain cut short (xsk.RecvPackets hands out whole chains only, so only
// when it refused a frame inside one) is counted as malformed.
func (t *Transport) parseChain(descs []xsk.Desc, i int, p *transport.Packet) (bool, int) {
	j, flen := i, 0
	for ; j < len(descs); j++ {
		flen += int(descs[j].Len)
		if descs[j].Options&unix.XDP_PKT_CONTD == 0 {
			break
		}
	}
	if j == len(descs) {
		t.rxMalformed.Add(1)
		return false, j
	}
	off, end, src, r := t.parseHeaders(t.sock.Frame(descs[i]), flen)
	switch r {
	case hdrDrop:
		return false, j + 1
	case hdrShort:
		b := t.rxJumbo[:0]
		for d := i; d <= j; d++ {
			b = append(b, t.sock.Frame(descs[d])...)
		}
		if cap(b) <= 1<<16 {
			t.rxJumbo = b[:0]
		}
		return t.parse(b, p), j + 1
	}
	b := p.Data[:cap(p.Data)]
	k, pos := 0, 0
	for d := i; d <= j && k < len(b); d++ {
		f := t.sock.Frame(descs[d])
		if lo, hi := max(off-pos, 0), min(end-pos, len(f)); lo < hi {
			k += copy(b[k:], f[lo:hi])
		}
		pos += len(f)
	}
	t.deliver(p, b, k, end-off, src)
	return true, j + 1
}

func (t *Transport) wrapErr(op string, err error) error {
	if errors.Is(err, xsk.ErrClosed) || t.closed.Load() {
		return t.errClosed()
	}
	return fmt.Errorf("xdp %s: %s: %w", t.local, op, err)
}

// parse checks one received frame and, for an IPv4 UDP datagram to the
// local address and port, copies its payload into p. It counts what it
// drops.
func (t *Transport) parse(f []byte, p *transport.Packet) bool {
	off, end, src, r := t.parseHeaders(f, len(f))
	if r != hdrOK {
		return false
	}
	b := p.Data[:cap(p.Data)]
	t.deliver(p, b, copy(b, f[off:end]), end-off, src)
	return true
}

// deliver completes p: k bytes of a payload of size bytes were copied
// into b, from src.
func (t *Transport) deliver(p *transport.Packet, b []byte, k, size int, src netip.AddrPort) {
	if k < size {
		t.rxTrunc.Add(1)
	}
	p.Data = b[:k]
	p.Addr = src
	t.rxPackets.Add(1)
}

// hdrResult is what parseHeaders found.
type hdrResult int

const (
	hdrOK    hdrResult = iota // an IPv4 UDP datagram to the transport
	hdrDrop                   // anything else, counted
	hdrShort                  // the headers run past f, within the frame: join the buffers first
)

// parseHeaders checks the headers of a received frame of flen bytes, of
// which f holds the first (all of them on a single-buffer frame). For an
// IPv4 UDP datagram to the local address and port it returns the
// payload's offset and end in the frame and the datagram's source. It
// counts what it drops.
func (t *Transport) parseHeaders(f []byte, flen int) (off, end int, src netip.AddrPort, r hdrResult) {
	// short is the verdict when the headers need k bytes and f has fewer.
	short := func(k int) hdrResult {
		if k > flen {
			t.rxMalformed.Add(1)
			return hdrDrop
		}
		return hdrShort
	}
	if len(f) < ethLen {
		return 0, 0, src, short(ethLen)
	}
	off = ethLen
	et := binary.BigEndian.Uint16(f[12:14])
	// One 802.1Q tag, as the steering parser walks (docs/wire.md): an
	// 802.1ad tag there makes the frame NOT_LOVELOCK, so the receiver does
	// not walk one either and the two never disagree on a frame.
	if et == 0x8100 {
		if len(f) < ethLen+vlanLen {
			return 0, 0, src, short(ethLen + vlanLen)
		}
		et = binary.BigEndian.Uint16(f[16:18])
		off += vlanLen
	}
	if et != 0x0800 {
		t.rxNotUDP.Add(1)
		return 0, 0, src, hdrDrop
	}
	if len(f) < off+ipv4Len {
		return 0, 0, src, short(off + ipv4Len)
	}
	ip := f[off:]
	if ip[0]>>4 != 4 {
		t.rxMalformed.Add(1)
		return 0, 0, src, hdrDrop
	}
	ihl := int(ip[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(ip[2:4]))
	if ihl < ipv4Len || total < ihl || total > flen-off {
		t.rxMalformed.Add(1)
		return 0, 0, src, hdrDrop
	}
	if len(ip) < ihl {
		return 0, 0, src, short(off + ihl)
	}
	if checksum(ip[:ihl], 0) != 0xffff {
		t.rxMalformed.Add(1)
		return 0, 0, src, hdrDrop
	}
	if ip[9] != unix.IPPROTO_UDP || binary.BigEndian.Uint16(ip[6:8])&0x3fff != 0 {
		t.rxNotUDP.Add(1) // another protocol, or a fragment (MF or offset)
		return 0, 0, src, hdrDrop
	}
	if total-ihl < udpLen {
		t.rxMalformed.Add(1)
		return 0, 0, src, hdrDrop
	}
	if len(ip) < ihl+udpLen {
		return 0, 0, src, short(off + ihl + udpLen)
	}
	u := ip[ihl:]
	ulen := int(binary.BigEndian.Uint16(u[4:6]))
	if ulen < udpLen || ulen > total-ihl {
		t.rxMalformed.Add(1)
		return 0, 0, src, hdrDrop
	}
	dst := netip.AddrFrom4([4]byte(ip[16:20]))
	if dst != t.local.Addr() || binary.BigEndian.Uint16(u[2:4]) != t.local.Port() {
		t.rxWrongDest.Add(1)
		return 0, 0, src, hdrDrop
	}
	src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[12:16])), binary.BigEndian.Uint16(u[0:2]))
	return off + ihl + udpLen, off + ihl + ulen, src, hdrOK
}

// Send implements transport.Transport. It builds a frame per datagram,
// queues them on the TX ring in batches of up to 64, waiting up to
// Options.SendWait while the ring is full, and sends a datagram without a
// resolved next hop through the kernel fallback socket (after flushing the
// frames before it, to keep the order) or refuses it (NoFallback).
func (t *Transport) Send(pkts []transport.Packet) (int, error) {
	if t.closed.Load() {
		return 0, t.errClosed()
	}
	s := t.txPool.Get().(*txScratch)
	defer t.txPool.Put(s)
	sent := 0
	s.frames = s.frames[:0]
	flush := func() error {
		n, err := t.transmit(s.frames)
		sent += n
		t.txPackets.Add(uint64(n))
		s.frames = s.frames[:0]
		return err
	}
	for i := range pkts {
		p := &pkts[i]
		f, err := t.build(s.buf(len(s.frames), t.frameLen), p)
		if err == nil {
			s.frames = append(s.frames, f)
			if len(s.frames) == batch {
				if err := flush(); err != nil {
					t.txErrors.Add(1)
					return sent, err
				}
			}
			continue
		}
		// pkts[i] cannot take the AF_XDP path: send what precedes it.
		if ferr := flush(); ferr != nil {
			t.txErrors.Add(1)
			return sent, ferr
		}
		if errors.Is(err, ErrNoNeighbour) && t.fallback != nil {
			if _, ferr := t.fallback.WriteToUDPAddrPort(p.Data, p.Addr); ferr != nil {
				t.txErrors.Add(1)
				return sent, t.wrapErr("fallback send to "+p.Addr.String(), ferr)
			}
			t.txFallback.Add(1)
			sent++
			continue
		}
		if errors.Is(err, ErrNoNeighbour) {
			t.txNoNeigh.Add(1)
		} else {
			t.txErrors.Add(1)
		}
		return sent, err
	}
	if err := flush(); err != nil {
		t.txErrors.Add(1)
		return sent, err
	}
	return sent, nil
}

// transmit queues frames on the TX ring, waiting while it or the UMEM is
// full, and returns how many it queued.
func (t *Transport) transmit(frames [][]byte) (int, error) {
	done := 0
	var deadline time.Time
	for spins := 0; done < len(frames); spins++ {
		n, err := t.sock.Transmit(frames[done:])
		done += n
		if err == nil {
			continue
		}
		if !errors.Is(err, xsk.ErrRingFull) && !errors.Is(err, xsk.ErrNoFrames) {
			return done, t.wrapErr("transmit", err)
		}
		if n > 0 {
			spins = 0
			deadline = time.Time{}
			continue
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(t.sendWait)
		} else if time.Now().After(deadline) {
			return done, t.wrapErr("transmit", err)
		}
		if t.closed.Load() {
			return done, t.errClosed()
		}
		_, _ = t.sock.Reclaim()
		if spins > 16 {
			time.Sleep(20 * time.Microsecond)
		}
	}
	return done, nil
}

// build writes p's frame into buf and returns it.
func (t *Transport) build(buf []byte, p *transport.Packet) ([]byte, error) {
	if len(p.Data) > t.maxPayload {
		return nil, fmt.Errorf("xdp %s: %d bytes to %s: %w", t.local, len(p.Data), p.Addr, transport.ErrTooBig)
	}
	dst := p.Addr.Addr().Unmap()
	if !dst.Is4() || p.Addr.Port() == 0 || dst.IsUnspecified() || dst.IsMulticast() {
		return nil, fmt.Errorf("xdp %s: send to %s: %w", t.local, p.Addr, transport.ErrAddr)
	}
	mac, err := t.nextHop(dst)
	if err != nil {
		return nil, err
	}
	ulen := udpLen + len(p.Data)
	f := buf[:ethLen+ipv4Len+ulen]
	copy(f[0:6], mac[:])
	copy(f[6:12], t.localMAC)
	binary.BigEndian.PutUint16(f[12:14], 0x0800)

	ip := f[ethLen : ethLen+ipv4Len]
	src := t.local.Addr().As4()
	d4 := dst.As4()
	ip[0], ip[1] = 0x45, 0
	binary.BigEndian.PutUint16(ip[2:4], uint16(ipv4Len+ulen))
	binary.BigEndian.PutUint16(ip[4:6], uint16(t.ipID.Add(1)))
	binary.BigEndian.PutUint16(ip[6:8], 0x4000) // DF
	ip[8], ip[9] = 64, unix.IPPROTO_UDP
	ip[10], ip[11] = 0, 0
	copy(ip[12:16], src[:])
	copy(ip[16:20], d4[:])
	binary.BigEndian.PutUint16(ip[10:12], ^checksum(ip, 0))

	u := f[ethLen+ipv4Len:]
	binary.BigEndian.PutUint16(u[0:2], t.local.Port())
	binary.BigEndian.PutUint16(u[2:4], p.Addr.Port())
	binary.BigEndian.PutUint16(u[4:6], uint16(ulen))
	u[6], u[7] = 0, 0
	copy(u[udpLen:], p.Data)
	if !t.noUDPSum {
		// Pseudo-header: source, destination, zero, protocol, UDP length.
		var sum uint32
		sum += uint32(binary.BigEndian.Uint16(src[0:2])) + uint32(binary.BigEndian.Uint16(src[2:4]))
		sum += uint32(binary.BigEndian.Uint16(d4[0:2])) + uint32(binary.BigEndian.Uint16(d4[2:4]))
		sum += unix.IPPROTO_UDP + uint32(ulen)
		c := ^checksum(u, sum)
		if c == 0 {
			c = 0xffff // 0 means "no checksum"
		}
		binary.BigEndian.PutUint16(u[6:8], c)
	}
	return f, nil
}

// checksum returns the folded ones' complement sum of b, started at sum,
// not complemented: the Internet checksum to store is its complement, and
// over a header that holds a valid checksum it is 0xffff.
//
// It adds 32-bit words into a 64-bit sum, 32 bytes a step: the same sum
// modulo 0xffff as 16-bit words (2^16 = 1 there), folded at the end. A
// jumbo datagram's UDP checksum was a tenth of an AF_XDP agent's CPU time
// a 16-bit word at a time.
func checksum(b []byte, sum uint32) uint16 {
	s := uint64(sum)
	for len(b) >= 32 {
		s += uint64(binary.BigEndian.Uint32(b[0:4])) + uint64(binary.BigEndian.Uint32(b[4:8])) +
			uint64(binary.BigEndian.Uint32(b[8:12])) + uint64(binary.BigEndian.Uint32(b[12:16])) +
			uint64(binary.BigEndian.Uint32(b[16:20])) + uint64(binary.BigEndian.Uint32(b[20:24])) +
			uint64(binary.BigEndian.Uint32(b[24:28])) + uint64(binary.BigEndian.Uint32(b[28:32]))
		b = b[32:]
	}
	for len(b) >= 4 {
		s += uint64(binary.BigEndian.Uint32(b))
		b = b[4:]
	}
	if len(b) >= 2 {
		s += uint64(b[0])<<8 | uint64(b[1])
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint64(b[0]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// nextHop returns the MAC of dst's next hop on the transport's interface:
// from the cache, or from the kernel's route and neighbour tables.
func (t *Transport) nextHop(dst netip.Addr) ([6]byte, error) {
	now := time.Now()
	t.neighMu.Lock()
	defer t.neighMu.Unlock()
	if e, ok := t.neigh[dst]; ok && now.Before(e.expires) {
		return e.mac, nil
	}
	if t.nl == nil {
		return [6]byte{}, t.errClosed()
	}
	mac, err := t.lookup(dst)
	if err != nil {
		delete(t.neigh, dst)
		return mac, err
	}
	if len(t.neigh) >= 4096 {
		clear(t.neigh) // bound the cache; entries are cheap to look up again
	}
	t.neigh[dst] = neighEntry{mac: mac, expires: now.Add(t.ttl)}
	return mac, nil
}

// lookup resolves dst's next hop through netlink. Entries in state
// INCOMPLETE or FAILED (or NOARP without an address) do not count.
func (t *Transport) lookup(dst netip.Addr) ([6]byte, error) {
	var mac [6]byte
	hop := dst
	routes, err := t.nl.RouteGet(dst.AsSlice())
	if err != nil || len(routes) == 0 {
		return mac, fmt.Errorf("xdp %s: no route to %s: %w", t.local, dst, ErrNoNeighbour)
	}
	r := routes[0]
	if r.LinkIndex != t.ifindex {
		return mac, fmt.Errorf("xdp %s: route to %s leaves through ifindex %d, not %s: %w", t.local, dst, r.LinkIndex, t.ifname, ErrNoNeighbour)
	}
	if gw, ok := netip.AddrFromSlice(r.Gw.To4()); ok && r.Gw != nil {
		hop = gw
	}
	neighs, err := t.nl.NeighList(t.ifindex, netlink.FAMILY_V4)
	if err != nil {
		return mac, fmt.Errorf("xdp %s: read neighbour table: %w", t.local, err)
	}
	const usable = netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_DELAY | netlink.NUD_PROBE | netlink.NUD_PERMANENT | netlink.NUD_NOARP
	for _, n := range neighs {
		a, ok := netip.AddrFromSlice(n.IP.To4())
		if !ok || a != hop || n.State&usable == 0 || len(n.HardwareAddr) != 6 {
			continue
		}
		copy(mac[:], n.HardwareAddr)
		return mac, nil
	}
	return mac, fmt.Errorf("xdp %s: next hop %s of %s on %s: %w", t.local, hop, dst, t.ifname, ErrNoNeighbour)
}
