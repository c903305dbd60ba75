package farmem

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/memnet"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
)

var loopback = netip.MustParseAddrPort("127.0.0.1:0")

// jumbo is the datagram size of the testbed's 9000-byte MTU.
var jumbo = udp.MaxPayloadForMTU(9000, false)

// testConfig has short timeouts so that loss is repaired quickly, and
// enough tries that a 10% lossy link never exhausts them.
func testConfig() Config {
	return Config{RetransmitTimeout: Duration(5 * time.Millisecond), MaxRetransmitTimeout: Duration(80 * time.Millisecond),
		Tries: 40, LeaseTTL: Duration(2 * time.Second)}
}

func listen(t testing.TB, addr netip.AddrPort) *udp.Conn {
	t.Helper()
	c, err := udp.Listen(addr, udp.Options{MaxPayload: jumbo, ReadBuffer: 4 << 20, WriteBuffer: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// running is a started Server or Agent and the means to stop it.
type running struct {
	stop func()
}

// startServer runs a server in dir on tr.
func startServer(t testing.TB, dir string, tr transport.Transport) (*Server, *running) {
	t.Helper()
	s, err := NewServer(ServerOptions{Config: testConfig(), StateDir: dir, Capacity: 64 << 20, Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	return s, run(t, s.Run)
}

func run(t testing.TB, fn func(context.Context) error) *running {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	var once sync.Once
	r := &running{stop: func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
		})
	}}
	t.Cleanup(r.stop)
	return r
}

// startAgent runs an agent in front of servers, its fabric side wrapped.
func startAgent(t testing.TB, host transport.Transport, servers []netip.AddrPort, wrap func(transport.Transport) transport.Transport) (*Agent, *running) {
	t.Helper()
	cfg := AgentConfig{Config: testConfig()}
	for _, s := range servers {
		cfg.Servers = append(cfg.Servers, ServerSpec{Addr: s})
	}
	var fab transport.Transport = listen(t, loopback)
	if wrap != nil {
		fab = wrap(fab)
	}
	a, err := NewAgent(cfg, AgentOptions{HostTransports: []transport.Transport{host}, FabricTransports: []transport.Transport{fab}})
	if err != nil {
		t.Fatal(err)
	}
	return a, run(t, a.Run)
}

func newClient(t testing.TB, server netip.AddrPort, tenant uint32) *Client {
	t.Helper()
	c, err := NewClient(ClientOptions{Config: testConfig(), Server: server, Tenant: tenant, Transport: listen(t, loopback)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// workload writes random chunks of random sizes and offsets into r from
// several goroutines, each into its own stripe, keeping a shadow copy, and
// then reads the whole region back and compares.
func workload(t testing.TB, r *Region, seed uint64, goroutines, ops int) {
	t.Helper()
	shadow := make([]byte, r.Size())
	stripe := int(r.Size()) / goroutines
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			base := g * stripe
			for range ops {
				n := 1 + rng.IntN(min(stripe, 150<<10))
				off := base + rng.IntN(stripe-n+1)
				p := make([]byte, n)
				for i := range p {
					p[i] = byte(rng.Uint32())
				}
				if _, err := r.WriteAt(p, int64(off)); err != nil {
					errs <- fmt.Errorf("write %d at %d: %w", n, off, err)
					return
				}
				copy(shadow[off:], p)
				got := make([]byte, n)
				if _, err := r.ReadAt(got, int64(off)); err != nil {
					errs <- fmt.Errorf("read %d at %d: %w", n, off, err)
					return
				}
				if !bytes.Equal(got, p) {
					errs <- fmt.Errorf("read back %d bytes at %d: differ", n, off)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	checkRegion(t, r, shadow)
}

func checkRegion(t testing.TB, r *Region, want []byte) {
	t.Helper()
	got := make([]byte, len(want))
	if _, err := r.ReadAt(got, 0); err != nil {
		t.Fatalf("read whole region: %v", err)
	}
	if i := firstDiff(got, want); i >= 0 {
		t.Fatalf("region %d differs from what was written first at byte %d", r.ID(), i)
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// lossyWrap wraps transports with the same loss and keeps them for stats.
type lossyWrap struct {
	seed               uint64
	drop, dup, reorder float64
	mu                 sync.Mutex
	all                []*memnet.Faulty
}

func (l *lossyWrap) wrap(tr transport.Transport) transport.Transport {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := memnet.NewFaulty(tr, l.seed+uint64(len(l.all)), memnet.Faults{Drop: l.drop, Dup: l.dup, Reorder: l.reorder})
	l.all = append(l.all, w)
	return w
}

func (l *lossyWrap) counts() (dropped, duplicated, reordered int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, w := range l.all {
		c := w.Counters()
		dropped += int64(c.Dropped)
		duplicated += int64(c.Duplicated)
		reordered += int64(c.Reordered)
	}
	return
}
