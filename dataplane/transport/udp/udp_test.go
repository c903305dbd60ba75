package udp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
)

var loopback = netip.MustParseAddrPort("127.0.0.1:0")

func listenT(t *testing.T, opts Options) *Conn {
	t.Helper()
	c, err := Listen(loopback, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func bufs(n, size int) []transport.Packet {
	pkts := make([]transport.Packet, n)
	for i := range pkts {
		pkts[i].Data = make([]byte, size)
	}
	return pkts
}

// recvAll receives until want datagrams arrived or the deadline passes.
func recvAll(t *testing.T, c transport.Transport, want int) []transport.Packet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var got []transport.Packet
	for len(got) < want {
		pkts := bufs(16, 2048)
		n, err := c.Recv(ctx, pkts)
		if err != nil {
			t.Fatalf("after %d of %d datagrams: %v", len(got), want, err)
		}
		got = append(got, pkts[:n]...)
	}
	return got
}

func TestSendRecvBatch(t *testing.T) {
	a, b := listenT(t, Options{}), listenT(t, Options{})
	if a.LocalAddr().Port() == 0 || !a.LocalAddr().Addr().Is4() {
		t.Fatalf("local address %v", a.LocalAddr())
	}
	const n = 200 // more than one system call's batch
	pkts := make([]transport.Packet, n)
	for i := range pkts {
		pkts[i] = transport.Packet{Addr: b.LocalAddr(), Data: []byte(fmt.Sprintf("datagram %d", i))}
	}
	sent, err := a.Send(pkts)
	if err != nil || sent != n {
		t.Fatalf("Send = %d, %v", sent, err)
	}
	got := recvAll(t, b, n)
	for i, p := range got {
		if want := fmt.Sprintf("datagram %d", i); string(p.Data) != want {
			t.Fatalf("datagram %d: %q, want %q", i, p.Data, want)
		}
		if p.Addr != a.LocalAddr() {
			t.Fatalf("source %v, want %v", p.Addr, a.LocalAddr())
		}
	}
}

func TestEmptyAndTruncated(t *testing.T) {
	a, b := listenT(t, Options{}), listenT(t, Options{})
	big := bytes.Repeat([]byte{7}, 3000)
	if n, err := a.Send([]transport.Packet{{Addr: b.LocalAddr()}, {Addr: b.LocalAddr(), Data: big}}); n != 2 || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pkts := bufs(2, 100)
	got := 0
	for got < 2 {
		n, err := b.Recv(ctx, pkts[got:])
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	if len(pkts[0].Data) != 0 {
		t.Errorf("empty datagram arrived with %d bytes", len(pkts[0].Data))
	}
	if len(pkts[1].Data) != 100 || !bytes.Equal(pkts[1].Data, big[:100]) {
		t.Errorf("long datagram: %d bytes, want it cut to the buffer's 100", len(pkts[1].Data))
	}
}

func TestSendErrors(t *testing.T) {
	a := listenT(t, Options{MaxPayload: 100})
	b := listenT(t, Options{})
	if a.MaxPayload() != 100 || b.MaxPayload() != MaxPayloadIPv4 {
		t.Fatalf("MaxPayload %d, %d", a.MaxPayload(), b.MaxPayload())
	}
	ok := transport.Packet{Addr: b.LocalAddr(), Data: []byte("ok")}
	for _, tc := range []struct {
		name string
		bad  transport.Packet
		want error
	}{
		{"too big", transport.Packet{Addr: b.LocalAddr(), Data: make([]byte, 101)}, transport.ErrTooBig},
		{"ipv6 from ipv4 socket", transport.Packet{Addr: netip.MustParseAddrPort("[::1]:5"), Data: []byte("x")}, transport.ErrAddr},
		{"port 0", transport.Packet{Addr: netip.MustParseAddrPort("127.0.0.1:0"), Data: []byte("x")}, transport.ErrAddr},
		{"no address", transport.Packet{Data: []byte("x")}, transport.ErrAddr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := a.Send([]transport.Packet{ok, tc.bad, ok})
			if n != 1 || !errors.Is(err, tc.want) {
				t.Fatalf("Send = %d, %v; want 1, %v", n, err, tc.want)
			}
			var refused []transport.Packet
			sent, err := transport.SendAll(a, []transport.Packet{ok, tc.bad, ok}, func(p transport.Packet, err error) {
				refused = append(refused, p)
			})
			if sent != 2 || err != nil || len(refused) != 1 {
				t.Fatalf("SendAll = %d, %v, refused %d", sent, err, len(refused))
			}
			recvAll(t, b, 3)
		})
	}
}

func TestRecvContext(t *testing.T) {
	c := listenT(t, Options{})
	pkts := bufs(4, 64)

	// A done context makes Recv a poll.
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if n, err := c.Recv(done, pkts); n != 0 || !errors.Is(err, context.Canceled) {
		t.Fatalf("poll of an empty socket = %d, %v", n, err)
	}
	if _, err := c.Send([]transport.Packet{{Addr: c.LocalAddr(), Data: []byte("hi")}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := c.Recv(done, pkts)
		if n == 1 && string(pkts[0].Data) == "hi" {
			break
		}
		if !errors.Is(err, context.Canceled) || time.Now().After(deadline) {
			t.Fatalf("poll with a waiting datagram = %d, %v", n, err)
		}
	}

	// A deadline ends the wait with DeadlineExceeded, on time.
	start := time.Now()
	dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer dcancel()
	if n, err := c.Recv(dctx, pkts); n != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Recv past deadline = %d, %v", n, err)
	}
	if el := time.Since(start); el < 25*time.Millisecond || el > 2*time.Second {
		t.Fatalf("deadline of 30ms returned after %v", el)
	}

	// Cancellation wakes a blocked Recv, and the next Recv is unaffected.
	cctx, ccancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Recv(cctx, pkts)
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	ccancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Recv: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancel did not wake Recv")
	}
	if _, err := c.Send([]transport.Packet{{Addr: c.LocalAddr(), Data: []byte("again")}}); err != nil {
		t.Fatal(err)
	}
	if got := recvAll(t, c, 1); string(got[0].Data) != "again" {
		t.Fatalf("after cancel: %q", got[0].Data)
	}
}

func TestCloseWakesRecv(t *testing.T) {
	c, err := Listen(loopback, Options{})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Recv(context.Background(), bufs(1, 64))
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, transport.ErrClosed) {
			t.Fatalf("Recv after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake Recv")
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.Send([]transport.Packet{{Addr: c.LocalAddr(), Data: []byte("x")}}); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Send after Close: %v", err)
	}
}

func TestConcurrentSend(t *testing.T) {
	a, b := listenT(t, Options{}), listenT(t, Options{})
	const senders, each = 4, 250
	var wg sync.WaitGroup
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				var d [8]byte
				binary.BigEndian.PutUint32(d[:], uint32(s))
				binary.BigEndian.PutUint32(d[4:], uint32(i))
				if _, err := a.Send([]transport.Packet{{Addr: b.LocalAddr(), Data: d[:]}}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	got := recvAll(t, b, senders*each)
	wg.Wait()
	seen := map[[8]byte]bool{}
	for _, p := range got {
		seen[[8]byte(p.Data)] = true
	}
	if len(seen) != senders*each {
		t.Fatalf("%d distinct datagrams, want %d", len(seen), senders*each)
	}
}

func TestBuffers(t *testing.T) {
	c := listenT(t, Options{ReadBuffer: 1 << 20, WriteBuffer: 1 << 20})
	r, w := c.Buffers()
	// The kernel doubles the request; as root, SO_RCVBUFFORCE grants it whatever rmem_max says.
	if r < 1<<20 || w < 1<<20 {
		t.Logf("buffers %d/%d (capped by net.core.rmem_max/wmem_max without CAP_NET_ADMIN)", r, w)
	}
}

// TestGroupSteer checks that the reuseport program delivers each datagram to
// the socket its payload field names, for every socket of the group.
func TestGroupSteer(t *testing.T) {
	const n = 4
	group, err := ListenGroup(loopback, n, Options{Steer: &Steer{Offset: 4, Mask: 0xff}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range group {
			_ = c.Close()
		}
	})
	for i, c := range group {
		if c.LocalAddr() != group[0].LocalAddr() {
			t.Fatalf("socket %d on %v, socket 0 on %v", i, c.LocalAddr(), group[0].LocalAddr())
		}
	}
	src := listenT(t, Options{})
	const per = 20
	var pkts []transport.Packet
	for i := range n * per {
		d := make([]byte, 8)
		binary.BigEndian.PutUint32(d[4:], uint32(i%n+n*(i%3))) // field mod n selects the socket
		pkts = append(pkts, transport.Packet{Addr: group[0].LocalAddr(), Data: d})
	}
	pkts = append(pkts, transport.Packet{Addr: group[0].LocalAddr(), Data: []byte{1, 2}}) // too short: socket 0
	if _, err := src.Send(pkts); err != nil {
		t.Fatal(err)
	}
	for i, c := range group {
		want := per
		if i == 0 {
			want++
		}
		got := recvAll(t, c, want)
		for _, p := range got {
			if len(p.Data) == 8 && int(binary.BigEndian.Uint32(p.Data[4:]))%n != i {
				t.Fatalf("socket %d got a datagram for %d", i, binary.BigEndian.Uint32(p.Data[4:])%n)
			}
		}
	}
}

// TestGroupSteerWhileOpening opens and closes a steered group again and
// again under a flood of datagrams to its port: no socket ever receives a
// datagram the steering program would give another one, also while the
// group is being built (when the kernel would fall back to its hash).
//
// It runs in its own network namespace: make test runs test binaries side
// by side, and a reuseport group another one binds could take this port
// between two of this test's groups and then share the next one (same user,
// same port), which shifts every socket's index.
func TestGroupSteerWhileOpening(t *testing.T) {
	const n = 4
	testenv.RequirePriv(t)
	ns := testenv.NewNetNS(t)
	steer := Options{Steer: &Steer{Offset: 0, Mask: 0xff}}
	listenGroup := func(addr netip.AddrPort) []*Conn {
		var g []*Conn
		testenv.InNetNS(t, ns, func() (err error) {
			g, err = ListenGroup(addr, n, steer)
			return err
		})
		return g
	}
	first := listenGroup(loopback)
	addr := first[0].LocalAddr()
	closeAll(first)
	var src *Conn
	testenv.InNetNS(t, ns, func() (err error) {
		src, err = Listen(loopback, Options{})
		return err
	})
	defer src.Close()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var pkts []transport.Packet
		for i := range 64 {
			d := make([]byte, 4)
			binary.BigEndian.PutUint32(d, uint32(i))
			pkts = append(pkts, transport.Packet{Addr: addr, Data: d})
		}
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = src.Send(pkts)
			time.Sleep(20 * time.Microsecond)
		}
	}()
	defer func() { close(stop); <-done }()
	got := 0
	for iter := range 30 {
		group := listenGroup(addr)
		time.Sleep(time.Millisecond)
		pkts := make([]transport.Packet, 64)
		for i := range pkts {
			pkts[i].Data = make([]byte, 16)
		}
		done, cancel := context.WithCancel(context.Background())
		cancel()
		for i, c := range group {
			k, _ := c.Recv(done, pkts)
			for _, p := range pkts[:k] {
				if f := int(binary.BigEndian.Uint32(p.Data)) % n; f != i {
					t.Fatalf("group %d: socket %d received a datagram for socket %d", iter, i, f)
				}
			}
			got += k
		}
		for _, c := range group {
			c.Close()
		}
	}
	if got == 0 {
		t.Error("no datagram received: the flood did not reach the groups")
	}
}

func TestIPv6(t *testing.T) {
	c, err := Listen(netip.MustParseAddrPort("[::1]:0"), Options{})
	if err != nil {
		var se *net.OpError
		if errors.As(err, &se) {
			t.Skipf("no IPv6 loopback: %v", err)
		}
		t.Fatal(err)
	}
	defer c.Close()
	if c.MaxPayload() != MaxPayloadIPv6 {
		t.Fatalf("MaxPayload %d", c.MaxPayload())
	}
	if _, err := c.Send([]transport.Packet{{Addr: c.LocalAddr(), Data: []byte("six")}}); err != nil {
		t.Fatal(err)
	}
	got := recvAll(t, c, 1)
	if string(got[0].Data) != "six" || got[0].Addr != c.LocalAddr() {
		t.Fatalf("got %q from %v", got[0].Data, got[0].Addr)
	}
	if _, err := c.Send([]transport.Packet{{Addr: netip.MustParseAddrPort("127.0.0.1:9"), Data: []byte("x")}}); !errors.Is(err, transport.ErrAddr) {
		t.Fatalf("IPv4 destination from an IPv6 socket: %v", err)
	}
}

func TestListenErrors(t *testing.T) {
	if _, err := Listen(netip.AddrPort{}, Options{}); !errors.Is(err, transport.ErrAddr) {
		t.Errorf("invalid address: %v", err)
	}
	if _, err := Listen(loopback, Options{MaxPayload: MaxPayloadIPv4 + 1}); err == nil {
		t.Error("max payload above the IPv4 limit accepted")
	}
	if _, err := ListenGroup(loopback, 0, Options{}); err == nil {
		t.Error("empty group accepted")
	}
	if got := MaxPayloadForMTU(1500, false); got != 1472 {
		t.Errorf("MaxPayloadForMTU(1500, v4) = %d", got)
	}
	if got := MaxPayloadForMTU(1500, true); got != 1452 {
		t.Errorf("MaxPayloadForMTU(1500, v6) = %d", got)
	}
}

// TestGroupOwnPort: a group on port 0 gets a port no other socket holds.
// An ephemeral bind with SO_REUSEPORT may be given the port of another
// reuseport group of the same user (the kernel counts it free), and the
// two groups then share datagrams: with two ephemeral ports to pick from,
// half the groups landed on the first one's port. (CI saw it once in a
// messaging test: "node2 agent: address 127.0.0.1:35064 is also node1
// agent's".)
func TestGroupOwnPort(t *testing.T) {
	testenv.RequirePriv(t)
	ns := testenv.NewNetNS(t)
	testenv.InNetNS(t, ns, func() error {
		// Two ephemeral ports in this namespace: one for the first
		// group, one for each later group while it lives.
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte("40000 40001"), 0o644); err != nil {
			return err
		}
		first, err := ListenGroup(loopback, 2, Options{})
		if err != nil {
			return err
		}
		defer closeAll(first)
		for i := range 20 {
			g, err := ListenGroup(loopback, 2, Options{})
			if err != nil {
				return fmt.Errorf("group %d: %w", i, err)
			}
			shared := g[0].LocalAddr() == first[0].LocalAddr()
			closeAll(g)
			if shared {
				return fmt.Errorf("group %d bound %v, the first group's port", i, first[0].LocalAddr())
			}
		}
		return nil
	})
}

func closeAll(cs []*Conn) {
	for _, c := range cs {
		c.Close()
	}
}

// TestSendClosing counts what a Send that meets Close counts as sent: a
// Send that passed the closed check when Close shut the socket (simulated
// by closing the descriptor under the Conn) hands the kernel nothing, so it
// must count nothing, whatever an earlier Send on the pooled scratch left.
func TestSendClosing(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		runs []run
	}{
		{"plain", Options{}, []run{{0, 3, 100}}},
		{"gso", Options{GSO: true}, []run{{0, 3, 100}, {0, 2, 50}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Several tries: the race detector's sync.Pool drops a
			// quarter of what it is given.
			for try := range 8 {
				c, err := Listen(loopback, tc.opts)
				if err != nil {
					t.Fatal(err)
				}
				b := listenT(t, Options{})
				pkts := makePkts([]netip.AddrPort{b.LocalAddr()}, tc.runs)
				if n, err := c.Send(pkts); n != len(pkts) || err != nil {
					t.Fatalf("Send = %d, %v", n, err)
				}
				_ = c.pc.Close() // Close's effect, without its closed flag: the race
				n, err := c.Send(pkts)
				_ = c.Close()
				if n != 0 || !errors.Is(err, transport.ErrClosed) {
					t.Fatalf("try %d: Send on a closed socket = %d, %v; want 0, ErrClosed", try, n, err)
				}
			}
		})
	}
}

// TestGroupPortTaken: ListenGroup on a port that a socket holds fails with
// EADDRINUSE, as Listen does, even when the holder is another SO_REUSEPORT
// group of this user (a second agent configured with the same address, or
// one whose predecessor still runs), which the kernel would let the new
// sockets join: the two groups would then share each other's datagrams.
func TestGroupPortTaken(t *testing.T) {
	for _, tc := range []struct {
		name string
		hold func(port uint16) (func(), error)
		addr string // the new group's address; its port is the holder's
	}{
		{"plain socket", func(port uint16) (func(), error) {
			c, err := Listen(netip.AddrPortFrom(loopback.Addr(), port), Options{})
			if err != nil {
				return nil, err
			}
			return func() { c.Close() }, nil
		}, "127.0.0.1"},
		{"another group", func(port uint16) (func(), error) {
			g, err := ListenGroup(netip.AddrPortFrom(loopback.Addr(), port), 2, Options{})
			if err != nil {
				return nil, err
			}
			return func() { closeAll(g) }, nil
		}, "127.0.0.1"},
		{"a wildcard group", func(port uint16) (func(), error) {
			g, err := ListenGroup(netip.AddrPortFrom(netip.IPv4Unspecified(), port), 2, Options{})
			if err != nil {
				return nil, err
			}
			return func() { closeAll(g) }, nil
		}, "127.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port, err := freePort(loopback)
			if err != nil {
				t.Fatal(err)
			}
			release, err := tc.hold(port)
			if err != nil {
				t.Fatal(err)
			}
			defer release()
			g, err := ListenGroup(netip.AddrPortFrom(netip.MustParseAddr(tc.addr), port), 2, Options{})
			if err == nil {
				closeAll(g)
				t.Fatalf("ListenGroup on port %d, which a %s holds, succeeded", port, tc.name)
			}
			if !errors.Is(err, syscall.EADDRINUSE) {
				t.Fatalf("ListenGroup on a held port: %v, want EADDRINUSE", err)
			}
			t.Log(err)
		})
	}
}

// waitBlocked returns once some goroutine waits in the poller inside fn
// (a function name as a stack trace writes it), or fails the test.
func waitBlocked(t *testing.T, fn string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		for _, g := range bytes.Split(buf[:runtime.Stack(buf, true)], []byte("\n\n")) {
			if bytes.Contains(g, []byte("waitRead")) && bytes.Contains(g, []byte(fn)) {
				return
			}
		}
	}
	t.Fatalf("no goroutine waits in %s", fn)
}

// TestRecvAfterEmptied: a Recv that follows one that emptied the socket
// goes straight to its wait, and keeps every contract of Recv: it returns
// what is queued when it starts and what arrives while it waits, a done
// context still makes it a poll, and cancellation, a deadline and Close
// wake it; the Recv after it is unaffected. A Recv that filled its batch
// leaves the next on the non-blocking path.
func TestRecvAfterEmptied(t *testing.T) {
	send := func(t *testing.T, c *Conn, msgs ...string) {
		t.Helper()
		var pkts []transport.Packet
		for _, m := range msgs {
			pkts = append(pkts, transport.Packet{Addr: c.LocalAddr(), Data: []byte(m)})
		}
		if n, err := c.Send(pkts); n != len(pkts) || err != nil {
			t.Fatalf("send: %d, %v", n, err)
		}
	}
	type result struct {
		got []string
		err error
	}
	// recv runs one Recv with ctx and reports what it returned.
	recv := func(ctx context.Context, c *Conn) result {
		pkts := bufs(4, 64)
		n, err := c.Recv(ctx, pkts)
		var r result
		for _, p := range pkts[:n] {
			r.got = append(r.got, string(p.Data))
		}
		r.err = err
		return r
	}
	// await returns the result of a Recv started in a goroutine.
	await := func(t *testing.T, rc <-chan result) result {
		t.Helper()
		select {
		case r := <-rc:
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("Recv did not return")
			return result{}
		}
	}
	done, cancelDone := context.WithCancel(context.Background())
	cancelDone()
	for _, tc := range []struct {
		name string
		// run does the Recv under test on a Conn whose last Recv
		// emptied it, and returns what the Recv returned.
		run     func(t *testing.T, c *Conn) result
		want    []string
		wantErr error
		closed  bool
	}{
		{name: "queued before it starts", want: []string{"a", "b"}, run: func(t *testing.T, c *Conn) result {
			send(t, c, "a", "b")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return recv(ctx, c)
		}},
		{name: "arrives while it waits", want: []string{"a"}, run: func(t *testing.T, c *Conn) result {
			rc := make(chan result, 1)
			go func() { rc <- recv(context.Background(), c) }()
			waitBlocked(t, "udp.(*Conn).recvBlocking")
			send(t, c, "a")
			return await(t, rc)
		}},
		{name: "done context, datagram waiting", want: []string{"a"}, run: func(t *testing.T, c *Conn) result {
			send(t, c, "a")
			return recv(done, c)
		}},
		{name: "done context, nothing waiting", wantErr: context.Canceled, run: func(t *testing.T, c *Conn) result {
			return recv(done, c)
		}},
		{name: "cancelled while it waits", wantErr: context.Canceled, run: func(t *testing.T, c *Conn) result {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			rc := make(chan result, 1)
			go func() { rc <- recv(ctx, c) }()
			waitBlocked(t, "udp.(*Conn).recvBlocking")
			cancel()
			return await(t, rc)
		}},
		{name: "deadline while it waits", wantErr: context.DeadlineExceeded, run: func(t *testing.T, c *Conn) result {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			return recv(ctx, c)
		}},
		{name: "closed while it waits", wantErr: transport.ErrClosed, closed: true, run: func(t *testing.T, c *Conn) result {
			rc := make(chan result, 1)
			go func() { rc <- recv(context.Background(), c) }()
			waitBlocked(t, "udp.(*Conn).recvBlocking")
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			return await(t, rc)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := listenT(t, Options{})
			// Empty the socket: one datagram into a batch of four.
			send(t, c, "first")
			if r := recv(context.Background(), c); len(r.got) != 1 || r.err != nil || !c.drained {
				t.Fatalf("first Recv = %q, %v, emptied %v; want [first], nil, true", r.got, r.err, c.drained)
			}
			r := tc.run(t, c)
			if fmt.Sprint(r.got) != fmt.Sprint(tc.want) || !errors.Is(r.err, tc.wantErr) || (tc.wantErr == nil) != (r.err == nil) {
				t.Fatalf("Recv = %q, %v; want %q, %v", r.got, r.err, tc.want, tc.wantErr)
			}
			if tc.closed {
				return
			}
			send(t, c, "next")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if r := recv(ctx, c); fmt.Sprint(r.got) != "[next]" || r.err != nil {
				t.Fatalf("next Recv = %q, %v", r.got, r.err)
			}
		})
	}

	// A Recv that filled its batch leaves the next one on the
	// non-blocking path, which takes the rest.
	c := listenT(t, Options{})
	send(t, c, "a", "b", "c", "d", "e")
	if r := recv(context.Background(), c); len(r.got) != 4 || c.drained {
		t.Fatalf("full batch: %q, emptied %v", r.got, c.drained)
	}
	if r := recv(done, c); fmt.Sprint(r.got) != "[e]" || r.err != nil {
		t.Fatalf("after a full batch: %q, %v", r.got, r.err)
	}
}
