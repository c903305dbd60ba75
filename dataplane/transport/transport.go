// Package transport owns the datagram interface that Lovelock's services move
// their packets through, so that a service is written once and runs over any
// of them: kernel UDP sockets (subpackage udp: hosts, and the fallback where
// AF_XDP is unavailable) or AF_XDP sockets steered by XDP (on a DPU; built on
// dataplane/xsk). It holds the interface and its contract, nothing else: no
// implementation lives here, and no service logic lives in an
// implementation.
//
// A Transport carries whole UDP payloads, one Packet each, in batches: Send
// hands a batch to the kernel (sendmmsg, or the AF_XDP TX ring) and Recv
// fills a batch of caller-owned buffers (recvmmsg, or the RX ring). Batching
// is the point: one system call or ring access moves many datagrams.
package transport

import (
	"context"
	"errors"
	"net/netip"
)

// Packet is one datagram: the peer's address and the UDP payload.
//
// On Send, Addr is the destination and Data the payload to send. On Recv,
// Addr is set to the source and Data, a caller-owned buffer, is re-sliced to
// the bytes received (Data[:n] of Data[:cap(Data)]).
type Packet struct {
	Addr netip.AddrPort
	Data []byte
}

// Transport is a datagram socket that moves batches of packets.
//
// Send may be called from several goroutines at once; Recv from one
// goroutine at a time (an implementation may serialise concurrent callers).
// Close may be called at any time and more than once; it makes a blocked Recv
// return an error wrapping ErrClosed.
type Transport interface {
	// Send transmits pkts in order and returns how many it handed to the
	// network. When that is fewer than len(pkts), err says why pkts[n] was
	// not sent (it wraps ErrClosed, ErrTooBig, or the system's error for
	// that datagram); the caller may skip pkts[n] and call Send again with
	// the rest. Send waits while the socket or ring is full, and does not
	// keep any Data after it returns. Delivery is not guaranteed: like UDP,
	// a transport may lose, duplicate or reorder datagrams.
	Send(pkts []Packet) (n int, err error)

	// Recv fills pkts[0:n] with received datagrams, at least one, and
	// returns n; with an empty pkts it returns 0 and no error at once. Each pkts[i].Data must have capacity for the largest
	// datagram expected (MaxPayload); a longer datagram is cut to that
	// capacity. Recv first takes the datagrams that are already waiting,
	// even when ctx is done; only if there are none does it wait, until a
	// datagram arrives, ctx is done or its deadline passes (an error
	// wrapping ctx.Err(), context.DeadlineExceeded for the deadline), or
	// the transport is closed (ErrClosed). A done ctx therefore makes Recv
	// a non-blocking poll.
	Recv(ctx context.Context, pkts []Packet) (n int, err error)

	// LocalAddr is the address the transport receives on.
	LocalAddr() netip.AddrPort

	// MaxPayload is the largest UDP payload the transport sends and
	// receives in one datagram, without IP fragmentation where the
	// implementation knows the path's MTU. Services size their datagrams
	// by it.
	MaxPayload() int

	// Close releases the transport. It is safe to call more than once.
	Close() error
}

// PathStats count one worker's datagrams on one path of a transport that
// has several (xdp.Group: an AF_XDP socket per interface, and the kernel UDP
// socket beside them).
type PathStats struct {
	Worker int `json:"worker"`
	// Path is "xsk" (an AF_XDP socket on Interface, queue Queue, in Mode
	// copy or zero-copy) or "kernel".
	Path      string `json:"path"`
	Interface string `json:"interface,omitempty"`
	Queue     int    `json:"queue"`
	Mode      string `json:"mode,omitempty"`
	// MultiBuffer: the AF_XDP socket is bound with XDP_USE_SG and takes
	// datagrams up to the MTU in several frames.
	MultiBuffer bool `json:"multi_buffer,omitempty"`
	// RX and TX count datagrams received and sent. On the kernel path RX
	// counts what XDP passed to the stack instead of an AF_XDP socket, TX
	// what no AF_XDP socket could send.
	RX uint64 `json:"rx"`
	TX uint64 `json:"tx"`
	// TXFallback counts, of TX, datagrams whose next hop had no
	// neighbour entry yet (kernel path).
	TXFallback uint64 `json:"tx_fallback,omitempty"`
	// Dropped counts frames the kernel dropped for an AF_XDP socket: RX
	// ring full or no fill frame (the worker fell behind).
	Dropped uint64 `json:"dropped,omitempty"`
}

// Sentinel errors that implementations wrap.
var (
	// ErrClosed: the transport was closed.
	ErrClosed = errors.New("transport closed")
	// ErrTooBig: a packet's Data is longer than MaxPayload.
	ErrTooBig = errors.New("datagram larger than the transport's max payload")
	// ErrAddr: a packet's Addr is invalid or of a family the transport
	// cannot reach.
	ErrAddr = errors.New("unusable destination address")
)

// SendAll sends every packet of pkts, skipping the ones the transport
// refuses. It calls onErr (when not nil) for each refused packet and returns
// how many were sent. It stops early, returning ErrClosed, once the transport
// is closed.
func SendAll(t Transport, pkts []Packet, onErr func(p Packet, err error)) (int, error) {
	sent := 0
	for len(pkts) > 0 {
		n, err := t.Send(pkts)
		sent += n
		if err == nil {
			return sent, nil
		}
		if errors.Is(err, ErrClosed) {
			return sent, err
		}
		if n >= len(pkts) {
			return sent, nil
		}
		if onErr != nil {
			onErr(pkts[n], err)
		}
		pkts = pkts[n+1:]
	}
	return sent, nil
}
