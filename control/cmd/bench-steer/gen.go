package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	llnetns "github.com/lovelock-dpu/lovelock/control/netns"
	"github.com/lovelock-dpu/lovelock/dataplane/xsk"
)

// Generator kinds (-gen).
const (
	genXSK    = "xsk"
	genPacket = "packet"
)

// generator sends one prebuilt frame as fast as it can from the gen
// namespace until stopped.
type generator interface {
	describe() string
	// run sends until stop is set; it counts into offered.
	run(ctx context.Context, stop *atomic.Bool) error
	// drain waits until nothing the generator queued is still waiting to
	// be handed to the device.
	drain()
	// offered is how many frames the kernel took (handed to the device,
	// where veth may still drop them).
	offered() uint64
	Close() error
}

func newGenerator(kind string, f iface, frame []byte, batch int) (generator, error) {
	switch kind {
	case genXSK:
		return newXSKGen(f, frame, batch)
	case genPacket:
		return newPacketGen(f, frame, batch)
	}
	return nil, fmt.Errorf("unknown generator %q (want %s or %s)", kind, genXSK, genPacket)
}

// xskGen transmits with an AF_XDP socket in copy mode (the only mode veth
// has). Each sendto(2) wakeup builds an skb per frame and hands it to the
// veth, 32 frames a call.
type xskGen struct {
	s     *xsk.Socket
	f     iface
	batch [][]byte
}

func newXSKGen(f iface, frame []byte, batch int) (*xskGen, error) {
	g := &xskGen{f: f, batch: make([][]byte, batch)}
	for i := range g.batch {
		g.batch[i] = frame
	}
	err := llnetns.Do(f.ns, func() error {
		var err error
		g.s, err = xsk.Open(f.index, 0, nil, &xsk.SocketConfig{NoRX: true, Mode: xsk.ModeCopy, BatchSize: batch})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("generator: %w", err)
	}
	return g, nil
}

func (g *xskGen) describe() string {
	return fmt.Sprintf("AF_XDP %s mode, TX only, on %s queue 0, Transmit batches of %d", g.s.Mode(), g.f.name, len(g.batch))
}

func (g *xskGen) run(ctx context.Context, stop *atomic.Bool) error {
	for !stop.Load() {
		n, err := g.s.Transmit(g.batch)
		if err == nil {
			continue
		}
		if !errors.Is(err, xsk.ErrRingFull) && !errors.Is(err, xsk.ErrNoFrames) {
			return fmt.Errorf("generator: %w", err)
		}
		if n == 0 {
			// Nothing queued, so Transmit made no wakeup: poll(2)
			// drives copy-mode transmission and waits for room.
			if _, err := g.s.Poll(ctx, time.Millisecond); err != nil && ctx.Err() == nil {
				return fmt.Errorf("generator: %w", err)
			}
		}
	}
	return nil
}

func (g *xskGen) drain() {
	deadline := time.Now().Add(200 * time.Millisecond)
	for g.s.UMEM().Frames().TX > 0 && time.Now().Before(deadline) {
		_, _ = g.s.Poll(context.Background(), time.Millisecond)
		_, _ = g.s.Reclaim()
	}
}

func (g *xskGen) offered() uint64 {
	st, err := g.s.Stats()
	if err != nil {
		return 0
	}
	return st.TXPackets
}

func (g *xskGen) Close() error { return g.s.Close() }

// packetGen sends with sendmmsg(2) on an AF_PACKET socket that bypasses the
// qdisc layer (PACKET_QDISC_BYPASS); every message is the same frame.
type packetGen struct {
	fd   int
	f    iface
	msgs []unix.Mmsghdr
	iov  []unix.Iovec
	buf  []byte
	sent atomic.Uint64
}

func newPacketGen(f iface, frame []byte, batch int) (*packetGen, error) {
	g := &packetGen{fd: -1, f: f, buf: append([]byte(nil), frame...)}
	err := llnetns.Do(f.ns, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0) // protocol 0: receives nothing
		if err != nil {
			return fmt.Errorf("AF_PACKET socket: %w", err)
		}
		g.fd = fd
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1); err != nil {
			return fmt.Errorf("PACKET_QDISC_BYPASS: %w", err)
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 4<<20); err != nil {
			return fmt.Errorf("SO_SNDBUFFORCE: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Ifindex: f.index}); err != nil {
			return fmt.Errorf("bind to %s: %w", f.name, err)
		}
		return nil
	})
	if err != nil {
		g.Close()
		return nil, fmt.Errorf("generator: %w", err)
	}
	g.iov = make([]unix.Iovec, batch)
	g.msgs = make([]unix.Mmsghdr, batch)
	for i := range g.msgs {
		g.iov[i].Base = &g.buf[0]
		g.iov[i].SetLen(len(g.buf))
		g.msgs[i].Hdr.Iov = &g.iov[i]
		g.msgs[i].Hdr.SetIovlen(1)
	}
	return g, nil
}

func (g *packetGen) describe() string {
	return fmt.Sprintf("AF_PACKET sendmmsg(2) of %d, PACKET_QDISC_BYPASS, on %s", len(g.msgs), g.f.name)
}

func (g *packetGen) run(_ context.Context, stop *atomic.Bool) error {
	for !stop.Load() {
		r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(g.fd), uintptr(unsafe.Pointer(&g.msgs[0])), uintptr(len(g.msgs)), unix.MSG_DONTWAIT, 0, 0)
		switch {
		case e == 0:
			g.sent.Add(uint64(r))
		case e == unix.EAGAIN || e == unix.ENOBUFS || e == unix.EINTR:
			// The device dropped the frame (veth: its peer's ring is
			// full) or the socket buffer is full: go on.
		default:
			return fmt.Errorf("generator: sendmmsg: %w", e)
		}
	}
	return nil
}

func (g *packetGen) drain() {}

func (g *packetGen) offered() uint64 { return g.sent.Load() }

func (g *packetGen) Close() error {
	if g.fd < 0 {
		return nil
	}
	err := unix.Close(g.fd)
	g.fd = -1
	return err
}

// udpFrame builds a 64-byte Ethernet/IPv4/UDP frame (as handed to the
// device; a wire would add a 4-byte FCS), 10.99.0.1:5555 → 10.99.0.2:dport.
func udpFrame(dst, src []byte, dport uint16) []byte {
	f := make([]byte, 64)
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:34]
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(len(f)-14))
	copy(ip[12:], []byte{10, 99, 0, 1, 10, 99, 0, 2})
	var sum uint32
	for i := 0; i < len(ip); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	udp := f[34:]
	binary.BigEndian.PutUint16(udp[0:], 5555)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp))) // checksum 0: none, as IPv4 allows
	return f
}
