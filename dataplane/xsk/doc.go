// Package xsk owns Lovelock's AF_XDP sockets: the UMEM (the packet memory
// shared with the kernel), its fill and completion rings, and the RX and TX
// rings of each socket bound to an (interface, queue). Nothing else in the
// module mmaps an AF_XDP ring or touches a UMEM frame behind this package's
// back.
//
// It is written on golang.org/x/sys/unix alone: cilium/ebpf has no AF_XDP
// support, and the package knows nothing of the BPF objects in bpf/. The
// caller places a socket in the steering program's xsks map with [Socket.FD];
// the slot must be the queue the socket is bound to, on the interface the
// packet arrives on (see docs/xsk.md).
//
// # Rings
//
// The four rings are single-producer, single-consumer queues shared with the
// kernel. This package produces on the fill and TX rings (reserve, write,
// submit) and consumes the RX and completion rings (peek, read, release). Each
// side keeps cached copies of both indices and reads the other side's index
// only when the cache runs out; the shared producer and consumer words are
// read and written with sync/atomic, which gives the acquire and release
// ordering the kernel pairs with its own barriers. With XDP_USE_NEED_WAKEUP
// (the default) a system call is made only when the kernel sets the ring's
// need-wakeup flag.
//
// # Frames
//
// Every UMEM frame has exactly one owner at a time: the free list, the
// kernel's receive side (fill ring), the caller (after [Socket.RecvBatch]),
// or the kernel's transmit side (TX ring until the completion ring hands it
// back). Ownership changes are compare-and-swap operations on a per-frame
// state word, so a frame handed back twice, or a descriptor naming a frame
// its holder does not own, is refused instead of corrupting a packet.
// [UMEM.Frames] counts frames by owner.
//
// # Concurrency
//
// A socket's receive side (RecvBatch, Recycle, TryReceive, Receive) and its
// transmit side (Transmit, TransmitDescs, Reclaim) may run in two different
// goroutines; calls on one side are serialised by a lock. Close may be called
// from any goroutine at any time: it wakes a blocked Poll or Receive, waits
// for calls in progress, and then unmaps. Nothing on the packet path panics;
// full rings and exhausted frames are reported as [ErrRingFull] and
// [ErrNoFrames].
package xsk
