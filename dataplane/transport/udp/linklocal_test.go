package udp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
)

// linkLocal turns IPv6 on for the interface name in ns (VethPair turns it
// off) with only the link-local address addr, added without duplicate
// address detection so that it is usable at once.
func linkLocal(t *testing.T, ns netns.NsHandle, name, addr string) {
	t.Helper()
	testenv.InNetNS(t, ns, func() error {
		// No address of the kernel's own (addr_gen_mode 1), no DAD.
		for _, kv := range [][2]string{{"addr_gen_mode", "1"}, {"accept_dad", "0"}, {"disable_ipv6", "0"}} {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/"+kv[0], []byte(kv[1]), 0); err != nil {
				return fmt.Errorf("%s: %s: %w", name, kv[0], err)
			}
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		a, err := netlink.ParseAddr(addr)
		if err != nil {
			return err
		}
		a.Flags = unix.IFA_F_NODAD
		return netlink.AddrAdd(l, a)
	})
}

// TestLinkLocal sends from one namespace over two veth links, A and B, to
// a peer on each; both peers have the link-local address fe80::2, so only
// the zone of the destination tells the kernel which link, and a datagram
// sent out of the wrong one reaches the wrong peer. With and without GSO,
// from a socket bound to the wildcard address or to fe80::1 on the link, to
// the peer named with its link's index or its name (an interface of the
// sender's namespace, which is not the test's): Send carries the zone to
// the kernel, Recv reports the source's zone (the index of the link it came
// in on), and a reply to that source reaches the sender. A zone that names
// no interface is ErrAddr. Needs root.
func TestLinkLocal(t *testing.T) {
	ns := newTestNets(t, 3)
	var idx [2][2]int // link A or B, sender's end or peer's
	for l, name := range []string{"lla", "llb"} {
		idx[l][0], idx[l][1] = testenv.VethPair(t, testenv.VethEnd{NS: ns[0], Name: name + "0"}, testenv.VethEnd{NS: ns[1+l], Name: name + "1"})
		linkLocal(t, ns[0], name+"0", "fe80::1/64")
		linkLocal(t, ns[1+l], name+"1", "fe80::2/64")
	}
	zoned := func(a string, zone int) netip.Addr { return netip.MustParseAddr(a).WithZone(strconv.Itoa(zone)) }
	runs := []run{{0, 8, 1000}, {0, 1, 10}, {0, 3, 500}}
	for _, tc := range []struct {
		name  string
		link  int  // 0: A, 1: B
		bound bool // the sender bound to fe80::1 on the link, else to ::
		named bool // the zone of the peer's address is its link's name, else its index
		gso   bool
	}{
		{"A, wildcard, index", 0, false, false, false},
		{"B, wildcard, index", 1, false, false, false},
		{"B, wildcard, name", 1, false, true, false},
		{"B, wildcard, index, gso", 1, false, false, true},
		{"B, wildcard, name, gso", 1, false, true, true},
		{"A, bound, index, gso", 0, true, false, true},
		{"B, bound, index", 1, true, false, false},
		{"B, bound, index, gso", 1, true, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bind := "[::]:0"
			if tc.bound {
				bind = netip.AddrPortFrom(zoned("fe80::1", idx[tc.link][0]), 0).String()
			}
			a := ns.listen(t, 0, bind, Options{GSO: tc.gso})
			peer := ns.listen(t, 1+tc.link, "[::]:0", Options{})
			dst := netip.AddrPortFrom(zoned("fe80::2", idx[tc.link][0]), peer.LocalAddr().Port())
			if tc.named {
				dst = netip.AddrPortFrom(dst.Addr().WithZone([]string{"lla0", "llb0"}[tc.link]), dst.Port())
			}
			// The other peer listens on the same port, so that what goes
			// out of the wrong link reaches it.
			other := ns.listen(t, 2-tc.link, netip.AddrPortFrom(netip.IPv6Unspecified(), dst.Port()).String(), Options{})
			pkts := makePkts([]netip.AddrPort{dst}, runs)
			if n, err := a.Send(pkts); n != len(pkts) || err != nil {
				t.Fatalf("Send to %v = %d, %v; want %d", dst, n, err, len(pkts))
			}
			if a.GSO() != tc.gso {
				t.Errorf("GSO on: %v, want %v", a.GSO(), tc.gso)
			}
			src := netip.AddrPortFrom(zoned("fe80::1", idx[tc.link][1]), a.LocalAddr().Port())
			for i, p := range recvExact(t, peer, len(pkts)) {
				if p.Addr != src || string(p.Data) != string(pkts[i].Data) {
					t.Fatalf("datagram %d: %d bytes from %v, want %d from %v", i, len(p.Data), p.Addr, len(pkts[i].Data), src)
				}
			}
			checkArrived(t, netip.AddrPort{}, []*Conn{other}, nil)
			// A reply to the source as Recv reported it.
			if n, err := peer.Send([]transport.Packet{{Addr: src, Data: []byte("reply")}}); n != 1 || err != nil {
				t.Fatalf("reply to %v: Send = %d, %v", src, n, err)
			}
			r := recvExact(t, a, 1)
			if want := netip.AddrPortFrom(zoned("fe80::2", idx[tc.link][0]), dst.Port()); r[0].Addr != want || string(r[0].Data) != "reply" {
				t.Fatalf("reply %q from %v, want %q from %v", r[0].Data, r[0].Addr, "reply", want)
			}
		})
	}

	// lla0 (of the sender's namespace) and lla1 (of the peer's) are the first
	// interfaces after lo of their namespaces, so they share an index. Go
	// names zones by one process-wide cache, here filled in the peer's
	// namespace: a socket opened in the sender's and bound to fe80::1%lla1
	// was bound to lla0 and reported its address as fe80::1%lla1, a name its
	// namespace does not have. A bound address's zone is its index, however
	// it was bound; a zone that names no interface of the socket's
	// namespace is ErrAddr.
	t.Run("zone names in the socket's namespace", func(t *testing.T) {
		if idx[0][0] != idx[0][1] {
			t.Fatalf("lla0 has index %d, lla1 %d: the kernel numbers each namespace's interfaces from 1, lo first", idx[0][0], idx[0][1])
		}
		open := map[string]func(netip.AddrPort) ([]*Conn, error){
			"Listen": func(a netip.AddrPort) ([]*Conn, error) {
				c, err := Listen(a, Options{})
				return []*Conn{c}, err
			},
			"ListenGroup": func(a netip.AddrPort) ([]*Conn, error) { return ListenGroup(a, 2, Options{}) },
		}
		for _, tc := range []struct {
			bind string
			ok   bool
		}{
			{"fe80::1%" + strconv.Itoa(idx[0][0]), true},
			{"fe80::1%lla0", true},
			{"fe80::1%lla1", false},
		} {
			for how, open := range open {
				testenv.InNetNS(t, ns[1], func() error {
					// A bind to a zone that names nothing refills
					// Go's cache, here with ns[1]'s names, whenever
					// it was last filled; the bind itself fails.
					if c, err := net.ListenPacket("udp6", "[fe80::1%no-such-zone]:0"); err == nil {
						_ = c.Close()
					}
					return nil
				})
				var conns []*Conn
				var err error
				testenv.InNetNS(t, ns[0], func() error {
					conns, err = open(netip.MustParseAddrPort("[" + tc.bind + "]:0"))
					return nil
				})
				if !tc.ok {
					if err == nil {
						t.Errorf("%s on %s in the sender's namespace = %v, want %v", how, tc.bind, conns[0].LocalAddr(), transport.ErrAddr)
						closeAll(conns)
					} else if !errors.Is(err, transport.ErrAddr) || !strings.Contains(err.Error(), `zone "lla1"`) {
						t.Errorf("%s on %s: %v, want %v naming the zone", how, tc.bind, err, transport.ErrAddr)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s on %s: %v", how, tc.bind, err)
				}
				want := netip.AddrPortFrom(zoned("fe80::1", idx[0][0]), conns[0].LocalAddr().Port())
				for i, c := range conns {
					if got := c.LocalAddr(); got != want {
						t.Errorf("%s on %s: socket %d's LocalAddr = %v, want %v", how, tc.bind, i, got, want)
					}
				}
				closeAll(conns)
			}
		}
	})

	t.Run("zone of no interface", func(t *testing.T) {
		a := ns.listen(t, 0, "[::]:0", Options{GSO: true})
		bad := netip.AddrPortFrom(netip.MustParseAddr("fe80::2%nosuch0"), 5000)
		if n, err := a.Send(makePkts([]netip.AddrPort{bad}, runs)); n != 0 || !errors.Is(err, transport.ErrAddr) {
			t.Fatalf("Send to %v = %d, %v; want 0, %v", bad, n, err, transport.ErrAddr)
		}
	})
}
