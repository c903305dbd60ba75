package messaging

import (
	"fmt"

	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// Endpoint is the value of a messaging datagram's Src and Dst header fields:
// the sending and receiving end of a link, an agent worker or a client
// sender shard. It is not an application rank; ranks travel in the record
// headers inside a bundle. Its layout lets XDP rules steer by the header's
// destination field (the steering rules' "rank"):
//
//	bits 31..16  node index (position in Config.Nodes)
//	bit  15      0: agent worker, 1: client
//	agent:  bits 14..0  worker index
//	client: bits 14..6  client index (position in Node.Clients), bits 5..0 sender shard
type Endpoint uint32

// Endpoint layout limits.
const (
	MaxNodes          = 1 << 16
	MaxWorkers        = 1 << 15
	MaxClientsPerNode = 1 << 9
	MaxShards         = 1 << 6
	clientBit         = 1 << 15
)

// KernelSteer returns the reuseport steering program of an agent's kernel
// UDP sockets (udp.ListenGroup): socket w of the group receives the
// datagrams whose destination endpoint names worker w, as the XDP rules
// send them to AF_XDP queue w.
func KernelSteer() *udp.Steer {
	return &udp.Steer{Offset: wire.OffsetDst, Mask: MaxWorkers - 1}
}

// AgentEndpoint returns the endpoint of worker w of the agent on node n.
func AgentEndpoint(n, w int) Endpoint {
	return Endpoint(uint32(n)<<16 | uint32(w)&(MaxWorkers-1))
}

// ClientEndpoint returns the endpoint of sender shard s of client c on node
// n. Bundles to a client name shard 0.
func ClientEndpoint(n, c, s int) Endpoint {
	return Endpoint(uint32(n)<<16 | clientBit | uint32(c)&(MaxClientsPerNode-1)<<6 | uint32(s)&(MaxShards-1))
}

// Node returns the endpoint's node index.
func (e Endpoint) Node() int { return int(e >> 16) }

// IsClient reports whether the endpoint is a client's.
func (e Endpoint) IsClient() bool { return e&clientBit != 0 }

// Worker returns an agent endpoint's worker index.
func (e Endpoint) Worker() int { return int(e & (MaxWorkers - 1)) }

// Client returns a client endpoint's client index.
func (e Endpoint) Client() int { return int(e>>6) & (MaxClientsPerNode - 1) }

// Shard returns a client endpoint's sender shard.
func (e Endpoint) Shard() int { return int(e) & (MaxShards - 1) }

// String formats the endpoint as "n3/w1" or "n3/c2.s5".
func (e Endpoint) String() string {
	if e.IsClient() {
		return fmt.Sprintf("n%d/c%d.s%d", e.Node(), e.Client(), e.Shard())
	}
	return fmt.Sprintf("n%d/w%d", e.Node(), e.Worker())
}
