package messaging

import (
	"context"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging/bundle"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/memnet"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// exchange has every client send n messages of random sizes (1 B to
// maxSize) to random ranks from senders goroutines each, then checks that
// every message arrived exactly once, intact, at the right rank.
func exchange(t *testing.T, tc *testCluster, n, senders, maxSize int, seed uint64) {
	t.Helper()
	clients, sinks := tc.all()
	ranks := tc.ranks()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var rwg sync.WaitGroup
	if clients[0].handler == nil {
		for i, c := range clients {
			rwg.Add(1)
			go recvInto(ctx, c, sinks[i], &rwg)
		}
	}
	type sent struct {
		id   msgID
		rank uint32
	}
	var mu sync.Mutex
	var all []sent
	tiny := map[msgID]int{}
	var swg sync.WaitGroup
	for ci, c := range clients {
		for g := range senders {
			swg.Add(1)
			go func() {
				defer swg.Done()
				src := uint32(ci*senders + g)
				rng := rand.New(rand.NewPCG(seed, uint64(src)))
				var mine []sent
				myTiny := map[msgID]int{}
				for seq := range uint32(n / senders) {
					rank := ranks[rng.IntN(len(ranks))]
					size := 16 + rng.IntN(maxSize-15)
					switch rng.IntN(10) {
					case 0:
						size = 1 + rng.IntN(15)
					case 1:
						size = maxSize
					}
					if err := c.Send(rank, payload(src, seq, rank, size)); err != nil {
						t.Errorf("send: %v", err)
						return
					}
					if size < 16 {
						myTiny[msgID{0xffffffff, uint32(size)<<24 | rank}]++
					} else {
						mine = append(mine, sent{msgID{src, seq}, rank})
					}
				}
				mu.Lock()
				all = append(all, mine...)
				for k, v := range myTiny {
					tiny[k] += v
				}
				mu.Unlock()
			}()
		}
	}
	swg.Wait()
	for _, c := range clients {
		if err := c.Flush(ctx); err != nil {
			t.Fatalf("flush: %v", err)
		}
	}
	total := len(all)
	for _, v := range tiny {
		total += v
	}
	waitCount(t, sinks, int64(total), 15*time.Second)
	time.Sleep(20 * time.Millisecond) // duplicates would show up now
	cancel()
	rwg.Wait()

	owner := map[uint32]int{}
	for i, c := range clients {
		for _, r := range c.Ranks().All() {
			owner[r] = i
		}
	}
	got := map[msgID]int{}
	for i, s := range sinks {
		s.mu.Lock()
		for _, b := range s.bad {
			t.Errorf("client %d: %s", i, b)
		}
		for k, v := range s.got {
			got[k] += v
		}
		s.mu.Unlock()
	}
	for _, m := range all {
		if c := got[m.id]; c != 1 {
			t.Errorf("message %d/%d to rank %d arrived %d times", m.id.src, m.id.seq, m.rank, c)
		}
		if s := sinks[owner[m.rank]]; s.got[m.id] != 1 {
			t.Errorf("message %d/%d did not reach rank %d's client", m.id.src, m.id.seq, m.rank)
		}
	}
	for k, v := range tiny {
		if got[k] != v {
			t.Errorf("%d tiny messages of %d bytes to rank %d, %d arrived", v, k.seq>>24, k.seq&0xffffff, got[k])
		}
	}
	if t.Failed() || testing.Verbose() {
		tc.logStats(t)
	}
}

func (tc *testCluster) logStats(t *testing.T) {
	for _, a := range tc.agents {
		t.Logf("agent %+v", a.Stats())
	}
	cs, _ := tc.all()
	for _, c := range cs {
		t.Logf("client %+v", c.Stats())
	}
}

func TestSmoke(t *testing.T) {
	tc := startCluster(t, spec{mode: ModeHost, nodes: 1, clientsPerNode: 2, ranksPerClient: 2})
	exchange(t, tc, 200, 1, 100, 1)
	for _, a := range tc.agents {
		t.Logf("%+v", a.Stats())
	}
}

// TestExactDelivery: 3 agents (one per node, on a DPU address each), 2
// clients each with 4 ranks, several senders per client, messages of 1 B
// to 8 KiB with bundles of 4 KiB, so that many messages are fragmented.
func TestExactDelivery(t *testing.T) {
	for _, mode := range []Mode{ModeDPU, ModeHost, ModeNone} {
		t.Run(string(mode), func(t *testing.T) {
			tc := startCluster(t, spec{mode: mode, nodes: 3, clientsPerNode: 2, ranksPerClient: 4,
				tune: func(c *Config) { c.TransferSize = 4096 }})
			exchange(t, tc, 1500, 3, 8192, 42)
			var fragmented uint64
			for _, a := range tc.agents {
				st := a.Stats()
				if d := st.Drops.Total(); d != 0 {
					t.Errorf("agent %s dropped %d: %+v", st.Node, d, st.Drops)
				}
				fragmented += st.Received.Bundles
			}
			cs, _ := tc.all()
			for _, c := range cs {
				st := c.Stats()
				if d := st.Drops.Total(); d != 0 {
					t.Errorf("client %s/%s dropped %d: %+v", st.Node, st.Client, d, st.Drops)
				}
			}
			_ = fragmented
		})
	}
}

// noDrops fails the test if any agent or client counted a drop.
func (tc *testCluster) noDrops(t *testing.T) {
	t.Helper()
	for _, a := range tc.agents {
		if st := a.Stats(); st.Drops.Total() != 0 {
			t.Errorf("agent %s dropped: %+v", st.Node, st.Drops)
		}
	}
	cs, _ := tc.all()
	for _, c := range cs {
		if st := c.Stats(); st.Drops.Total() != 0 {
			t.Errorf("client %s/%s dropped: %+v", st.Node, st.Client, st.Drops)
		}
	}
}

// TestLossyLinks: with 3% of all datagrams lost, 2% duplicated and some
// reordered (bundles and credits alike), every message still arrives
// exactly once: sequence numbers, selective acknowledgements and
// retransmission repair the links.
func TestLossyLinks(t *testing.T) {
	mem := memnet.New(memnet.Options{Seed: 1, Faults: memnet.Faults{Drop: 0.03, Dup: 0.02, Reorder: 0.05}})
	tc := startCluster(t, spec{mode: ModeDPU, nodes: 3, clientsPerNode: 2, ranksPerClient: 4, mem: mem,
		tune: func(c *Config) {
			c.TransferSize = 4096
			c.RetransmitTimeout = Duration(2 * time.Millisecond)
		}})
	exchange(t, tc, 900, 3, 8192, 7)
	var retrans, dups uint64
	for _, a := range tc.agents {
		st := a.Stats()
		retrans += st.Sent().Retransmits
		dups += st.Received.Duplicates
	}
	cs, _ := tc.all()
	for _, c := range cs {
		st := c.Stats()
		retrans += st.Sent().Retransmits
		dups += st.Received.Duplicates
	}
	if retrans == 0 || dups == 0 {
		t.Errorf("%d retransmissions and %d duplicates: the loss did not happen?", retrans, dups)
	}
	t.Logf("%d retransmissions, %d duplicates received; network: %+v", retrans, dups, mem.Counters())
	tc.noDrops(t)
}

// TestTransferSizeBoundedByTransport: a 16 KiB transfer size over
// transports that carry 1472-byte datagrams (a 1500-byte MTU) is lowered to
// 1472, and messages up to 8 KiB still arrive, in fragments.
func TestTransferSizeBoundedByTransport(t *testing.T) {
	tc := startCluster(t, spec{mode: ModeDPU, nodes: 2, clientsPerNode: 1, ranksPerClient: 2, maxPayload: 1472})
	for _, a := range tc.agents {
		if a.TransferSize() != 1472 {
			t.Fatalf("agent transfer size %d, want 1472", a.TransferSize())
		}
	}
	exchange(t, tc, 400, 2, 8192, 3)
	for _, a := range tc.agents {
		st := a.Stats()
		if st.TransferSize != 1472 {
			t.Errorf("stats transfer size %d", st.TransferSize)
		}
		for _, d := range st.Destinations {
			if d.Bundles > 0 && d.AvgBundleBytes > 1472 {
				t.Errorf("%s: average bundle %.0f bytes", d.Name, d.AvgBundleBytes)
			}
		}
	}
	tc.noDrops(t)
}

// TestMisdirectedCredits: steered by the wrong field (as a kernel hash or
// an incomplete XDP rule set would), credits reach agent workers that do
// not own their link; they are passed on, and nothing is lost.
func TestMisdirectedCredits(t *testing.T) {
	tc := startCluster(t, spec{mode: ModeHost, nodes: 2, clientsPerNode: 2, ranksPerClient: 2, workers: 3, steerSrc: true})
	exchange(t, tc, 600, 2, 2000, 5)
	var mis uint64
	for _, a := range tc.agents {
		mis += a.Stats().Received.Misdirected
	}
	if mis == 0 {
		t.Errorf("no credit was misdirected; the test does not exercise the mailbox")
	}
	tc.noDrops(t)
}

// TestMisdirectedMailboxFull: a credit passed to the worker that owns its
// link counts as misdirected when that worker's mailbox takes it; when the
// mailbox is full it is lost and counted under mailbox only, not twice.
func TestMisdirectedMailboxFull(t *testing.T) {
	mem := memnet.New(memnet.Options{})
	group, err := mem.ListenGroup(netip.MustParseAddrPort("127.0.0.1:0"), 2, func([]byte) int { return 0 })
	if err != nil {
		t.Fatal(err)
	}
	cfg := Defaults()
	cfg.Mode, cfg.Workers = ModeHost, 2
	cfg.Nodes = []Node{{Name: "node0", Agent: group[0].LocalAddr(), Clients: []ClientSpec{
		{Name: "c0", Addr: netip.MustParseAddrPort("127.0.0.1:7000"), Ranks: Range(0, 0)},
	}}}
	a, err := NewAgent(cfg, "node0", AgentOptions{Transports: []transport.Transport{group[0], group[1]}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	w0, w1 := a.workers[0], a.workers[1]
	for len(w1.mailbox) < cap(w1.mailbox) {
		w1.mailbox <- mail{}
	}
	h := wire.Header{Type: wire.TypeCredit, Dst: uint32(AgentEndpoint(0, 1))}
	w0.credit(h, bundle.Credit{}, netip.AddrPort{}, []byte{1}, 0)
	if m, d := w0.ctr.misdirected.Load(), w0.ctr.drops[dropMailbox].Load(); m != 0 || d != 1 {
		t.Errorf("a credit for a full mailbox: misdirected %d, mailbox drops %d; want 0, 1", m, d)
	}
	<-w1.mailbox
	w0.credit(h, bundle.Credit{}, netip.AddrPort{}, []byte{1}, 0)
	if m, d := w0.ctr.misdirected.Load(), w0.ctr.drops[dropMailbox].Load(); m != 1 || d != 1 {
		t.Errorf("a credit the mailbox took: misdirected %d, mailbox drops %d; want 1, 1", m, d)
	}
}
