package memnet

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
)

func bufs(n, size int) []transport.Packet {
	p := make([]transport.Packet, n)
	for i := range p {
		p[i].Data = make([]byte, size)
	}
	return p
}

var a0 = netip.MustParseAddrPort("10.0.0.1:0")

func TestDeliveryAndContract(t *testing.T) {
	n := New(Options{MaxPayload: 100, Queue: 3})
	x, err := n.Listen(a0)
	if err != nil {
		t.Fatal(err)
	}
	y, err := n.Listen(a0)
	if err != nil {
		t.Fatal(err)
	}
	if x.LocalAddr() == y.LocalAddr() || x.LocalAddr().Port() == 0 {
		t.Fatalf("ports: %v %v", x.LocalAddr(), y.LocalAddr())
	}
	if _, err := n.Listen(x.LocalAddr()); !errors.Is(err, ErrInUse) {
		t.Fatalf("second listen on %v: %v", x.LocalAddr(), err)
	}
	// A done context polls.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rx := bufs(8, 100)
	if k, err := y.Recv(ctx, rx); k != 0 || !errors.Is(err, context.Canceled) {
		t.Fatalf("poll: %d %v", k, err)
	}
	// Too big and bad addresses refuse that datagram, after the ones before.
	pk := []transport.Packet{{Addr: y.LocalAddr(), Data: []byte("a")}, {Addr: y.LocalAddr(), Data: make([]byte, 101)}}
	if k, err := x.Send(pk); k != 1 || !errors.Is(err, transport.ErrTooBig) {
		t.Fatalf("too big: %d %v", k, err)
	}
	if k, err := x.Send([]transport.Packet{{Data: []byte("b")}}); k != 0 || !errors.Is(err, transport.ErrAddr) {
		t.Fatalf("no address: %d %v", k, err)
	}
	// Four more: the queue holds 3, the fourth overflows.
	for i := range 4 {
		if _, err := x.Send([]transport.Packet{{Addr: y.LocalAddr(), Data: []byte{byte('c' + i)}}}); err != nil {
			t.Fatal(err)
		}
	}
	if q := n.InFlight(); q != 3 {
		t.Fatalf("%d datagrams queued, want 3", q)
	}
	k, err := y.Recv(ctx, rx)
	if err != nil || k != 3 || string(rx[0].Data) != "a" || string(rx[1].Data) != "c" || rx[0].Addr != x.LocalAddr() {
		t.Fatalf("recv: %d %v %q %v", k, err, rx[0].Data, rx[0].Addr)
	}
	if q := n.InFlight(); q != 3 {
		t.Fatalf("%d datagrams in flight while the receiver handles the 3 Recv took, want 3", q)
	}
	if k, err := y.Recv(ctx, rx); k != 0 || !errors.Is(err, context.Canceled) {
		t.Fatalf("poll: %d %v", k, err)
	}
	if q := n.InFlight(); q != 0 {
		t.Fatalf("%d datagrams in flight after the receiver came back to Recv", q)
	}
	c := n.Counters()
	if c.Sent != 5 || c.Delivered != 3 || c.Overflow != 2 {
		t.Fatalf("counters %+v", c)
	}
	// Nobody there: counted, not an error.
	if _, err := x.Send([]transport.Packet{{Addr: netip.MustParseAddrPort("10.9.9.9:1"), Data: []byte("z")}}); err != nil {
		t.Fatal(err)
	}
	if n.Counters().NoRoute != 1 {
		t.Fatal("no route not counted")
	}
	// Close wakes a blocked Recv, and frees the address.
	done := make(chan error, 1)
	go func() { _, err := y.Recv(context.Background(), rx); done <- err }()
	_ = y.Close()
	if err := <-done; !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("recv after close: %v", err)
	}
	if _, err := x.Send([]transport.Packet{{Addr: y.LocalAddr(), Data: []byte("z")}}); err != nil {
		t.Fatal(err)
	}
	if n.Counters().NoRoute != 2 {
		t.Fatal("a closed endpoint still receives")
	}
	if _, err := n.Listen(y.LocalAddr()); err != nil {
		t.Fatalf("address not freed: %v", err)
	}
}

func TestGroupSteers(t *testing.T) {
	n := New(Options{})
	g, err := n.ListenGroup(netip.MustParseAddrPort("10.0.0.2:7"), 3, func(d []byte) int { return int(d[0]) })
	if err != nil {
		t.Fatal(err)
	}
	x, _ := n.Listen(a0)
	for i := range 6 {
		if _, err := x.Send([]transport.Packet{{Addr: g[0].LocalAddr(), Data: []byte{byte(i)}}}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i, e := range g {
		rx := bufs(8, 10)
		k, err := e.Recv(ctx, rx)
		if err != nil || k != 2 || int(rx[0].Data[0]) != i || int(rx[1].Data[0]) != i+3 {
			t.Fatalf("endpoint %d: %d %v", i, k, err)
		}
	}
}

func TestFaults(t *testing.T) {
	n := New(Options{Seed: 1, Queue: 1 << 20})
	x, _ := n.Listen(a0)
	y, _ := n.Listen(a0)
	z, _ := n.Listen(a0)
	n.SetFaults(x.LocalAddr(), y.LocalAddr(), Faults{Drop: 0.1, Dup: 0.1, Reorder: 0.2})
	const total = 10000
	batch := make([]transport.Packet, 0, 2*16)
	for i := range total / 16 {
		batch = batch[:0]
		for j := range 16 {
			s := []byte(fmt.Sprint(i*16 + j))
			batch = append(batch, transport.Packet{Addr: y.LocalAddr(), Data: s}, transport.Packet{Addr: z.LocalAddr(), Data: s})
		}
		if _, err := x.Send(batch); err != nil {
			t.Fatal(err)
		}
	}
	lc := n.LinkCounters(x.LocalAddr(), y.LocalAddr())
	for name, v := range map[string]uint64{"dropped": lc.Dropped, "duplicated": lc.Duplicated, "reordered": lc.Reordered} {
		if v < total/20 || v > total/3 {
			t.Errorf("%s %d of %d", name, v, total)
		}
	}
	if lc.Sent != total {
		t.Errorf("link sent %d", lc.Sent)
	}
	// The other link is clean: everything arrives once, in order.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rx := bufs(total, 8)
	k, err := z.Recv(ctx, rx)
	if err != nil || k != total {
		t.Fatalf("clean link: %d %v", k, err)
	}
	for i := range k {
		if string(rx[i].Data) != fmt.Sprint(i) {
			t.Fatalf("clean link: datagram %d is %q", i, rx[i].Data)
		}
	}
	k, _ = y.Recv(ctx, rx)
	if want := uint64(total) - lc.Dropped + lc.Duplicated; uint64(k) != want {
		t.Fatalf("faulty link delivered %d, want %d", k, want)
	}
}

func TestFaulty(t *testing.T) {
	n := New(Options{Queue: 1 << 20})
	x, _ := n.Listen(a0)
	y, _ := n.Listen(a0)
	w := NewFaulty(x, 3, Faults{Drop: 0.5})
	pk := make([]transport.Packet, 1000)
	for i := range pk {
		pk[i] = transport.Packet{Addr: y.LocalAddr(), Data: []byte{1}}
	}
	if k, err := w.Send(pk); k != len(pk) || err != nil {
		t.Fatalf("send: %d %v", k, err)
	}
	c := w.Counters()
	if c.Sent != 1000 || c.Dropped < 400 || c.Dropped > 600 || n.Counters().Delivered != 1000-c.Dropped {
		t.Fatalf("faulty %+v, network %+v", c, n.Counters())
	}
	w.SetFaults(Faults{})
	if _, err := w.Send(pk); err != nil {
		t.Fatal(err)
	}
	if w.Counters().Dropped != c.Dropped {
		t.Fatal("dropped after the faults were cleared")
	}
}

// TestConcurrentSend: Send may be called from several goroutines at once;
// every datagram arrives once.
func TestConcurrentSend(t *testing.T) {
	n := New(Options{Queue: 1 << 20})
	x, _ := n.Listen(a0)
	y, _ := n.Listen(a0)
	const per, senders = 2000, 4
	done := make(chan error, senders)
	for g := range senders {
		go func() {
			for i := range per {
				p := []transport.Packet{{Addr: y.LocalAddr(), Data: []byte(fmt.Sprint(g*per + i))}}
				if _, err := x.Send(p); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range senders {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rx := bufs(per*senders+1, 8)
	k, err := y.Recv(ctx, rx)
	if err != nil || k != per*senders {
		t.Fatalf("received %d of %d: %v", k, per*senders, err)
	}
	seen := map[string]bool{}
	for _, p := range rx[:k] {
		seen[string(p.Data)] = true
	}
	if len(seen) != per*senders {
		t.Fatalf("%d distinct datagrams of %d", len(seen), per*senders)
	}
}

// TestCloseDropsQueue: an endpoint that closes loses what it had queued, as
// a closed socket does: InFlight no longer counts it, and Closed does, as it
// counts what is steered to a closed member of a group that keeps the
// address. Before, a closed group member kept its queue in InFlight for
// good (a test waiting for a quiet network waited on it), and what was
// steered to it counted as Overflow.
func TestCloseDropsQueue(t *testing.T) {
	for _, tc := range []struct {
		name        string
		members     int // endpoints on the address; member 0 closes
		queued      []int
		handled     bool // member 0 took its queue with Recv before closing
		closeAll    bool // every member closes: the address is free
		after       int  // datagrams sent to member 0 after it closed
		inFlight    int
		closed      uint64
		noRoute     uint64
		othersRecvd int
	}{
		{name: "alone", members: 1, queued: []int{3}, after: 1, closed: 3, noRoute: 1},
		{name: "group, others open", members: 2, queued: []int{2, 1}, after: 2, inFlight: 1, closed: 4, othersRecvd: 1},
		{name: "group, queue taken before", members: 2, queued: []int{2, 1}, handled: true, inFlight: 1, othersRecvd: 1},
		{name: "group, all closed", members: 2, queued: []int{2, 0}, closeAll: true, after: 1, closed: 2, noRoute: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := New(Options{})
			g, err := n.ListenGroup(netip.MustParseAddrPort("10.0.0.3:7"), tc.members, func(d []byte) int { return int(d[0]) })
			if err != nil {
				t.Fatal(err)
			}
			x, _ := n.Listen(a0)
			send := func(member, k int) {
				t.Helper()
				for range k {
					if _, err := x.Send([]transport.Packet{{Addr: g[0].LocalAddr(), Data: []byte{byte(member)}}}); err != nil {
						t.Fatal(err)
					}
				}
			}
			for m, k := range tc.queued {
				send(m, k)
			}
			done, cancel := context.WithCancel(context.Background())
			cancel()
			if tc.handled {
				if k, err := g[0].Recv(done, bufs(8, 8)); k != tc.queued[0] || err != nil {
					t.Fatalf("recv before close: %d %v", k, err)
				}
			}
			_ = g[0].Close()
			if tc.closeAll {
				for _, e := range g[1:] {
					_ = e.Close()
				}
			}
			send(0, tc.after)
			c := n.Counters()
			if q := n.InFlight(); q != tc.inFlight || c.Closed != tc.closed || c.NoRoute != tc.noRoute || c.Overflow != 0 {
				t.Errorf("in flight %d, counters %+v; want in flight %d, closed %d, no route %d, no overflow",
					q, c, tc.inFlight, tc.closed, tc.noRoute)
			}
			if k, err := g[0].Recv(done, bufs(8, 8)); k != 0 || !errors.Is(err, transport.ErrClosed) {
				t.Errorf("recv on the closed endpoint: %d %v, want 0 and ErrClosed", k, err)
			}
			if tc.members > 1 && tc.othersRecvd > 0 {
				if k, err := g[1].Recv(done, bufs(8, 8)); k != tc.othersRecvd || err != nil {
					t.Errorf("recv on the open member: %d %v, want %d", k, err, tc.othersRecvd)
				}
			}
		})
	}
}

// TestRecvEmpty: Recv with no room returns 0 at once, as the udp and xdp
// transports do, whatever is queued and whether or not the endpoint is
// closed, and takes nothing. Before, it waited until ctx was done, however
// many datagrams arrived (the deadline here stands for a caller's forever).
func TestRecvEmpty(t *testing.T) {
	for _, tc := range []struct {
		name   string
		queued int
		closed bool
		pkts   []transport.Packet
	}{
		{name: "nil, nothing queued", pkts: nil},
		{name: "empty, nothing queued", pkts: []transport.Packet{}},
		{name: "empty, datagrams queued", queued: 2, pkts: []transport.Packet{}},
		{name: "nil, closed", closed: true, pkts: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := New(Options{})
			x, _ := n.Listen(a0)
			y, _ := n.Listen(a0)
			for range tc.queued {
				if _, err := x.Send([]transport.Packet{{Addr: y.LocalAddr(), Data: []byte("q")}}); err != nil {
					t.Fatal(err)
				}
			}
			if tc.closed {
				_ = y.Close()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if k, err := y.Recv(ctx, tc.pkts); k != 0 || err != nil {
				t.Fatalf("recv with no room: %d %v, want 0 and no error at once", k, err)
			}
			if q := n.InFlight(); q != tc.queued && !tc.closed {
				t.Errorf("%d in flight after an empty Recv, want the %d queued", q, tc.queued)
			}
			if tc.queued > 0 {
				if k, err := y.Recv(ctx, bufs(8, 8)); k != tc.queued || err != nil {
					t.Errorf("recv after the empty one: %d %v, want the %d queued", k, err, tc.queued)
				}
			}
		})
	}
}

// TestDupReorderCounts: with every datagram duplicated and reordered, a
// reorder moves the datagram's second copy before the datagram that came
// before it on the link, and is counted only when there is one: a datagram
// swapped with its own first copy changes no order. Before, that swap was
// counted as a reorder ("one datagram": reordered 1), and a duplicated
// datagram was never reordered ("two datagrams": a a b b, reordered 2).
func TestDupReorderCounts(t *testing.T) {
	for _, tc := range []struct {
		name       string
		faults     Faults
		send       string // one datagram per byte, in one batch
		want       string // as received
		dup, reord uint64
	}{
		{name: "one datagram", faults: Faults{Dup: 1, Reorder: 1}, send: "a", want: "aa", dup: 1},
		{name: "two datagrams", faults: Faults{Dup: 1, Reorder: 1}, send: "ab", want: "abba", dup: 2, reord: 1},
		{name: "reorder only", faults: Faults{Reorder: 1}, send: "ab", want: "ba", reord: 1},
		{name: "duplicate only", faults: Faults{Dup: 1}, send: "ab", want: "aabb", dup: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := New(Options{})
			x, _ := n.Listen(a0)
			y, _ := n.Listen(a0)
			n.SetFaults(x.LocalAddr(), y.LocalAddr(), tc.faults)
			var batch []transport.Packet
			for i := range len(tc.send) {
				batch = append(batch, transport.Packet{Addr: y.LocalAddr(), Data: []byte{tc.send[i]}})
			}
			if _, err := x.Send(batch); err != nil {
				t.Fatal(err)
			}
			done, cancel := context.WithCancel(context.Background())
			cancel()
			rx := bufs(8, 8)
			k, err := y.Recv(done, rx)
			if err != nil {
				t.Fatal(err)
			}
			var got []byte
			for _, p := range rx[:k] {
				got = append(got, p.Data...)
			}
			lc := n.LinkCounters(x.LocalAddr(), y.LocalAddr())
			if string(got) != tc.want || lc.Duplicated != tc.dup || lc.Reordered != tc.reord {
				t.Errorf("received %q, duplicated %d, reordered %d; want %q, %d, %d", got, lc.Duplicated, lc.Reordered, tc.want, tc.dup, tc.reord)
			}
		})
	}
}
