// Package apps holds applications of the messaging service after the Buddy
// paper's evaluation: Histogram (random increments into a table spread over
// all ranks) and single-source shortest paths (Bellman-Ford relaxation
// messages on an R-MAT graph). Each runs over a Cluster of agents and
// clients, checks its own result exactly against a local recomputation, and
// reports its throughput.
package apps

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
)

// Layout describes a cluster: its mode, its nodes, their clients and the
// ranks each client serves (consecutive, node by node).
type Layout struct {
	Mode           messaging.Mode
	Nodes          int
	ClientsPerNode int
	RanksPerClient int
	// Workers is the agents' worker count (0: 2).
	Workers int
	// Tune adjusts the config (defaults plus the layout) before validation.
	Tune func(*messaging.Config)
	// ListenAgent opens node n's agent sockets (a SO_REUSEPORT group of
	// workers sockets steered by destination endpoint, as in opts); nil
	// opens them on loopback: 127.0.1.(n+1) in ModeDPU (a DPU of its own),
	// 127.0.0.1 otherwise.
	ListenAgent func(n int, opts udp.Options, workers int) ([]*udp.Conn, error)
	// OpenAgent, when set, opens node n's agent transports instead of
	// ListenAgent (for example AF_XDP groups on a DPU, see
	// dataplane/transport/xdp): one per worker, all on one address.
	OpenAgent func(n int, opts udp.Options, workers int) ([]transport.Transport, error)
	// ListenClient opens the socket of client c of node n; nil opens it on
	// 127.0.0.1.
	ListenClient func(n, c int, opts udp.Options) (*udp.Conn, error)
	// MaxPayload caps every socket's datagram size (0: no cap).
	MaxPayload int
}

// Ranks is the number of ranks of the layout.
func (l Layout) Ranks() uint32 { return uint32(l.Nodes * l.ClientsPerNode * l.RanksPerClient) }

// Cluster is a running set of agents (in the modes that have them) and
// clients.
type Cluster struct {
	Config  messaging.Config
	Agents  []*messaging.Agent
	Clients []*messaging.Client // node by node, client by client
	perRank int
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	errs    []error
}

// StartCluster opens every socket, starts the agents and the clients. Every
// client delivers its messages to handler (on its own delivery goroutine,
// one message at a time per client).
func StartCluster(l Layout, handler func(rank uint32, payload []byte)) (*Cluster, error) {
	if l.Nodes < 1 || l.ClientsPerNode < 1 || l.RanksPerClient < 1 {
		return nil, errors.New("apps: layout needs at least one node, client and rank")
	}
	workers := l.Workers
	if workers == 0 {
		workers = 2
	}
	cfg := messaging.Defaults()
	cfg.Mode = l.Mode
	cfg.Workers = workers
	cfg.SenderShards = 2
	cfg.SocketBuffer = 4 << 20
	if l.Tune != nil {
		l.Tune(&cfg)
	}
	cl := &Cluster{perRank: l.RanksPerClient}
	var agentTrs [][]transport.Transport
	var clientTrs []transport.Transport
	closeAll := func() {
		for _, g := range agentTrs {
			for _, t := range g {
				_ = t.Close()
			}
		}
		for _, t := range clientTrs {
			_ = t.Close()
		}
	}
	rank := uint32(0)
	for n := range l.Nodes {
		node := messaging.Node{Name: fmt.Sprintf("node%d", n)}
		opts := udp.Options{ReadBuffer: cfg.SocketBuffer, WriteBuffer: cfg.SocketBuffer, MaxPayload: l.MaxPayload}
		if l.Mode.HasAgent() {
			aopts := opts
			aopts.Steer = messaging.KernelSteer()
			listen := l.ListenAgent
			if listen == nil {
				listen = func(n int, opts udp.Options, workers int) ([]*udp.Conn, error) {
					ip := netip.AddrFrom4([4]byte{127, 0, 0, 1})
					if l.Mode == messaging.ModeDPU {
						ip = netip.AddrFrom4([4]byte{127, 0, 1, byte(n + 1)})
					}
					return udp.ListenGroup(netip.AddrPortFrom(ip, 0), workers, opts)
				}
			}
			var trs []transport.Transport
			var err error
			if l.OpenAgent != nil {
				trs, err = l.OpenAgent(n, aopts, workers)
			} else {
				var group []*udp.Conn
				group, err = listen(n, aopts, workers)
				for _, g := range group {
					trs = append(trs, g)
				}
			}
			if err != nil {
				closeAll()
				return nil, fmt.Errorf("apps: node %d agent: %w", n, err)
			}
			agentTrs = append(agentTrs, trs)
			node.Agent = trs[0].LocalAddr()
		}
		for c := range l.ClientsPerNode {
			listen := l.ListenClient
			if listen == nil {
				listen = func(_, _ int, opts udp.Options) (*udp.Conn, error) {
					return udp.Listen(netip.MustParseAddrPort("127.0.0.1:0"), opts)
				}
			}
			tr, err := listen(n, c, opts)
			if err != nil {
				closeAll()
				return nil, fmt.Errorf("apps: node %d client %d: %w", n, c, err)
			}
			clientTrs = append(clientTrs, tr)
			node.Clients = append(node.Clients, messaging.ClientSpec{
				Name: fmt.Sprintf("c%d", c), Addr: tr.LocalAddr(), Ranks: messaging.Range(rank, rank+uint32(l.RanksPerClient)-1),
			})
			rank += uint32(l.RanksPerClient)
		}
		cfg.Nodes = append(cfg.Nodes, node)
	}
	if err := cfg.Validate(); err != nil {
		closeAll()
		return nil, err
	}
	cl.Config = cfg
	ctx, cancel := context.WithCancel(context.Background())
	cl.cancel = cancel
	for n := range agentTrs {
		a, err := messaging.NewAgent(cfg, cfg.Nodes[n].Name, messaging.AgentOptions{Transports: agentTrs[n]})
		if err != nil {
			for _, t := range agentTrs[n] {
				_ = t.Close()
			}
			_ = cl.Close()
			return nil, err
		}
		agentTrs[n] = nil // owned by the agent now
		cl.Agents = append(cl.Agents, a)
		cl.wg.Add(1)
		go func() {
			defer cl.wg.Done()
			if err := a.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				cl.mu.Lock()
				cl.errs = append(cl.errs, fmt.Errorf("agent %d: %w", n, err))
				cl.mu.Unlock()
			}
		}()
	}
	i := 0
	for n := range l.Nodes {
		for c := range l.ClientsPerNode {
			c, err := messaging.NewClient(cfg, cfg.Nodes[n].Name, fmt.Sprintf("c%d", c),
				messaging.ClientOptions{Transport: clientTrs[i], Handler: handler})
			if err != nil {
				for _, t := range clientTrs[i:] {
					_ = t.Close()
				}
				_ = cl.Close()
				return nil, err
			}
			cl.Clients = append(cl.Clients, c)
			i++
		}
	}
	return cl, nil
}

// StartClients starts the clients of cfg, every one of them, for a cluster
// whose agents run elsewhere (lovelockd's, on the DPUs). listen opens the
// socket of client c of node n on its address in cfg; every client must
// serve the same number of ranks, consecutive from 0 in node and client
// order, as StartCluster lays them out. Each client delivers to handler.
func StartClients(cfg messaging.Config, listen func(n, c int) (*udp.Conn, error), handler func(rank uint32, payload []byte)) (*Cluster, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cl := &Cluster{Config: cfg, cancel: func() {}}
	next := uint32(0)
	for n, node := range cfg.Nodes {
		for c, spec := range node.Clients {
			all := spec.Ranks.All()
			if len(all) == 0 || all[0] != next || (cl.perRank != 0 && len(all) != cl.perRank) || all[len(all)-1] != next+uint32(len(all))-1 {
				_ = cl.Close()
				return nil, fmt.Errorf("apps: node %s client %s: ranks %v: want %d consecutive ranks from %d", node.Name, spec.Name, spec.Ranks, max(cl.perRank, 1), next)
			}
			cl.perRank = len(all)
			next += uint32(len(all))
			tr, err := listen(n, c)
			if err != nil {
				_ = cl.Close()
				return nil, fmt.Errorf("apps: node %s client %s: %w", node.Name, spec.Name, err)
			}
			c, err := messaging.NewClient(cfg, node.Name, spec.Name, messaging.ClientOptions{Transport: tr, Handler: handler})
			if err != nil {
				_ = tr.Close()
				_ = cl.Close()
				return nil, err
			}
			cl.Clients = append(cl.Clients, c)
		}
	}
	return cl, nil
}

// Ranks is the number of ranks of the cluster.
func (c *Cluster) Ranks() uint32 { return uint32(len(c.Clients) * c.perRank) }

// ClientOf returns the client that serves rank.
func (c *Cluster) ClientOf(rank uint32) *messaging.Client { return c.Clients[int(rank)/c.perRank] }

// Flush flushes every client.
func (c *Cluster) Flush(ctx context.Context) error {
	var errs []error
	for _, cl := range c.Clients {
		errs = append(errs, cl.Flush(ctx))
	}
	return errors.Join(errs...)
}

// Stats returns the clients' and the agents' counters.
func (c *Cluster) Stats() (clients, agents []messaging.Stats) {
	for _, cl := range c.Clients {
		clients = append(clients, cl.Stats())
	}
	for _, a := range c.Agents {
		agents = append(agents, a.Stats())
	}
	return clients, agents
}

// Close stops the clients and the agents. It returns what their Close
// calls and the agents' runs reported: a client's Close says how many
// messages it could not send, which a caller must not be spared.
func (c *Cluster) Close() error {
	var errs []error
	for i, cl := range c.Clients {
		if err := cl.Close(); err != nil {
			errs = append(errs, fmt.Errorf("client %d: %w", i, err))
		}
	}
	if c.cancel != nil {
		c.cancel()
	}
	c.wg.Wait()
	for i, a := range c.Agents {
		if err := a.Close(); err != nil {
			errs = append(errs, fmt.Errorf("agent %d: %w", i, err))
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return errors.Join(append(errs, c.errs...)...)
}
