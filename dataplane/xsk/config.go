package xsk

import (
	"errors"
	"fmt"
	"math/bits"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Defaults follow libxdp (xsk.h) and xdp-tools: 4096-byte frames (one page,
// the largest chunk the kernel accepts in aligned mode without huge pages),
// 4096 frames (16 MiB of UMEM), 2048 descriptors per ring (half the frames
// sit in the fill ring, half are left for TX) and batches of 64 (enough to
// amortise a system call, small enough to stay in L1).
const (
	DefaultFrameSize  = 4096
	DefaultFrameCount = 4096
	DefaultRingSize   = 2048
	DefaultBatchSize  = 64

	// MinFrameSize is the smallest frame the kernel accepts (XDP_UMEM_MIN_CHUNK_SIZE).
	MinFrameSize = 2048
	// PacketHeadroom is the headroom the kernel keeps in front of every
	// received packet, after the UMEM's own headroom (XDP_PACKET_HEADROOM).
	PacketHeadroom = 256
)

// Errors callers test for. They come wrapped with the interface and queue.
var (
	// ErrClosed is returned by every operation on a closed socket or UMEM.
	ErrClosed = errors.New("closed")
	// ErrRingFull means the TX ring has no free descriptor now; reclaim
	// completions (Transmit does) or Poll, then retry.
	ErrRingFull = errors.New("ring full")
	// ErrNoFrames means the UMEM has no free frame now; frames come back as
	// transmissions complete and as received frames are recycled.
	ErrNoFrames = errors.New("no free UMEM frame")
	// ErrFrameTooLarge is returned by Transmit for an empty frame or one
	// longer than a UMEM frame minus its headroom.
	ErrFrameTooLarge = errors.New("frame size out of range")
	// ErrInvalidDesc is returned for a descriptor that lies outside the UMEM,
	// crosses a frame boundary, or names a frame its caller does not hold.
	ErrInvalidDesc = errors.New("invalid descriptor")
	// ErrNoRing is returned for RX calls on a socket created without an RX
	// ring, and TX calls on one without a TX ring.
	ErrNoRing = errors.New("socket has no such ring")
	// ErrMultiBuffer wraps the bind error of a SocketConfig.MultiBuffer
	// socket that the kernel or driver refused with XDP_USE_SG (EINVAL
	// from a kernel before 6.6, EOPNOTSUPP from a driver without
	// multi-buffer support): the caller may open it again without.
	ErrMultiBuffer = errors.New("multi-buffer AF_XDP (XDP_USE_SG) refused")
	// ErrShortBatch is returned by RecvBatch and RecvPackets on a
	// MultiBuffer socket when the packet at the head of the RX ring has
	// more descriptors than the slice given holds: the packet stays on the
	// ring. Pass at least ceil(longest frame / RX frame room) descriptors,
	// the room being FrameSize - Headroom - PacketHeadroom.
	ErrShortBatch = errors.New("descriptor slice shorter than a packet's chain")
)

// Mode is how a socket moves packets between the driver and the UMEM.
type Mode int

const (
	// ModeAuto asks for zero-copy and falls back to copy mode when the
	// driver cannot do it. [Socket.Mode] reports what the bind got.
	ModeAuto Mode = iota
	// ModeCopy forces copy mode (XDP_COPY): the kernel copies each packet
	// between an skb or XDP buffer and the UMEM. Works on every device with
	// XDP, veth included.
	ModeCopy
	// ModeZeroCopy forces zero-copy (XDP_ZEROCOPY): the driver DMAs straight
	// into UMEM frames. The bind fails where the driver lacks support.
	ModeZeroCopy
)

// String returns "auto", "copy" or "zero-copy".
func (m Mode) String() string {
	switch m {
	case ModeAuto:
		return "auto"
	case ModeCopy:
		return "copy"
	case ModeZeroCopy:
		return "zero-copy"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Desc is one RX or TX descriptor, laid out as the kernel's struct
// xdp_desc: Addr is an offset into the UMEM, Len the packet length.
type Desc struct {
	Addr    uint64
	Len     uint32
	Options uint32
}

// More reports that the packet goes on in the next descriptor: the
// kernel's XDP_PKT_CONTD, set on every descriptor of a MultiBuffer packet
// but its last. A descriptor without it ends a packet.
func (d Desc) More() bool { return d.Options&unix.XDP_PKT_CONTD != 0 }

// The ring layout depends on Desc matching struct xdp_desc byte for byte.
var _ [16 - unsafe.Sizeof(Desc{})]struct{}
var _ [unsafe.Sizeof(Desc{}) - 16]struct{}

// UMEMConfig sizes a UMEM. Zero fields take the defaults.
type UMEMConfig struct {
	// FrameSize is the size of one frame (chunk) in bytes: a power of two,
	// at least MinFrameSize and at most the page size. Default 4096.
	FrameSize int
	// FrameCount is the number of frames. Default 4096.
	FrameCount int
	// Headroom is reserved in front of every frame's packet, for the
	// caller's own metadata or headers to prepend; the kernel adds
	// PacketHeadroom after it on receive. Default 0.
	Headroom int
	// FillSize and CompletionSize are the descriptor counts of the fill and
	// completion rings, powers of two. Each (interface, queue) the UMEM is
	// bound to gets its own pair. Default 2048 each.
	FillSize       int
	CompletionSize int
	// NoNeedWakeup turns XDP_USE_NEED_WAKEUP off, so that every TX submit
	// makes a sendto(2). Only for comparing; the flag is on by default.
	// Sockets sharing the UMEM inherit the setting (the kernel refuses
	// per-socket flags on a shared bind).
	NoNeedWakeup bool
}

func (c *UMEMConfig) normalise() (UMEMConfig, error) {
	var n UMEMConfig
	if c != nil {
		n = *c
	}
	if n.FrameSize == 0 {
		n.FrameSize = DefaultFrameSize
	}
	if n.FrameCount == 0 {
		n.FrameCount = DefaultFrameCount
	}
	if n.FillSize == 0 {
		n.FillSize = DefaultRingSize
	}
	if n.CompletionSize == 0 {
		n.CompletionSize = DefaultRingSize
	}
	switch {
	case !isPow2(n.FrameSize) || n.FrameSize < MinFrameSize:
		// Aligned mode only: the kernel masks addresses with the chunk
		// size, which must be a power of two.
		return n, fmt.Errorf("frame size %d: want a power of two >= %d", n.FrameSize, MinFrameSize)
	case n.FrameCount < 1 || n.FrameCount > 1<<24:
		return n, fmt.Errorf("frame count %d out of range", n.FrameCount)
	case n.Headroom < 0 || n.Headroom >= n.FrameSize-PacketHeadroom:
		return n, fmt.Errorf("headroom %d: want 0 <= headroom < frame size - %d", n.Headroom, PacketHeadroom)
	case !isPow2(n.FillSize) || !isPow2(n.CompletionSize):
		return n, fmt.Errorf("fill ring %d, completion ring %d: want powers of two", n.FillSize, n.CompletionSize)
	}
	return n, nil
}

// SocketConfig sets up one socket. Zero fields take the defaults.
type SocketConfig struct {
	// RXSize and TXSize are the descriptor counts of the RX and TX rings,
	// powers of two. Default 2048 each.
	RXSize int
	TXSize int
	// NoRX and NoTX leave out the RX or the TX ring (a socket needs one).
	NoRX bool
	NoTX bool
	// Mode asks for copy or zero-copy. Default ModeAuto. A socket that
	// shares its UMEM with an earlier socket inherits that socket's mode;
	// asking for a different one is an error.
	Mode Mode
	// BatchSize is how many descriptors TryReceive and Receive take per
	// ring access (on a MultiBuffer socket, at least one packet's chain:
	// a longer one grows the batch). Default 64.
	BatchSize int
	// FillFrames is how many frames go into the fill ring when this socket
	// is the first on its (interface, queue), and the level the receive path
	// keeps it topped up to. Default: the fill ring size or half the free
	// frames, whichever is smaller, so TX always keeps frames of its own.
	FillFrames int
	// IdleSpin is how long Receive keeps looking at an empty RX ring,
	// yielding the processor in between, before it sleeps in poll(2).
	// Sleeping costs the kernel a wakeup per burst (an IPI in a VM); a
	// worker that owns its core should spin. Default 0: sleep at once.
	IdleSpin time.Duration
	// BusyTimeout is how long the bind keeps retrying while the queue is
	// busy (EBUSY). The kernel releases a closed socket's hold on its queue
	// asynchronously, after an RCU grace period (up to ~50 ms measured on
	// veth), so a worker that closes and reopens its socket would otherwise
	// fail. Default 1 s; negative: no retry.
	BusyTimeout time.Duration
	// MultiBuffer binds with XDP_USE_SG: the socket receives frames longer
	// than one UMEM frame (or than the driver's first XDP buffer) as
	// several descriptors, each but the last flagged XDP_PKT_CONTD, and
	// Transmit sends a frame longer than one UMEM frame the same way. The
	// steering program hands such frames only to sockets registered with
	// Steer.SetXSKMultiBuffer. A socket that shares its UMEM with an
	// earlier one binds without it (the kernel refuses the flag on a
	// shared bind); Socket.MultiBuffer says what the bind got. A kernel
	// or driver that refuses the flag fails Open with an error wrapping
	// ErrMultiBuffer.
	MultiBuffer bool
}

func (c *SocketConfig) normalise() (SocketConfig, error) {
	var n SocketConfig
	if c != nil {
		n = *c
	}
	if n.RXSize == 0 {
		n.RXSize = DefaultRingSize
	}
	if n.TXSize == 0 {
		n.TXSize = DefaultRingSize
	}
	if n.BatchSize == 0 {
		n.BatchSize = DefaultBatchSize
	}
	if n.BusyTimeout == 0 {
		n.BusyTimeout = time.Second
	}
	switch {
	case n.NoRX && n.NoTX:
		return n, errors.New("socket needs an RX or a TX ring")
	case !isPow2(n.RXSize) || !isPow2(n.TXSize):
		return n, fmt.Errorf("RX ring %d, TX ring %d: want powers of two", n.RXSize, n.TXSize)
	case n.BatchSize < 1:
		return n, fmt.Errorf("batch size %d out of range", n.BatchSize)
	case n.IdleSpin < 0:
		return n, fmt.Errorf("idle spin %v out of range", n.IdleSpin)
	case n.FillFrames < 0:
		return n, fmt.Errorf("fill frames %d out of range", n.FillFrames)
	case n.Mode < ModeAuto || n.Mode > ModeZeroCopy:
		return n, fmt.Errorf("unknown mode %d", n.Mode)
	}
	return n, nil
}

func isPow2(n int) bool { return n > 0 && n&(n-1) == 0 }

func log2(n int) uint { return uint(bits.TrailingZeros(uint(n))) }
