package messaging

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
)

// TestVethKernelDrops runs two nodes in two network namespaces joined by a
// veth pair with a 1500-byte MTU, so bundles are capped at 1472 bytes and
// never IP-fragmented, with receive buffers so small that the kernel drops
// datagrams on overflow (RcvbufErrors). Retransmission makes delivery exact
// anyway. Needs root.
func TestVethKernelDrops(t *testing.T) {
	testenv.RequirePriv(t)
	ns := []netns.NsHandle{testenv.NewNetNS(t), testenv.NewNetNS(t)}
	addrs := []netip.Addr{netip.MustParseAddr("10.99.0.1"), netip.MustParseAddr("10.99.0.2")}
	testenv.VethPair(t,
		testenv.VethEnd{NS: ns[0], Name: "msg0", Addr: addrs[0].String() + "/24", MTU: 1500},
		testenv.VethEnd{NS: ns[1], Name: "msg1", Addr: addrs[1].String() + "/24", MTU: 1500})
	before := []int{rcvbufErrors(t, ns[0]), rcvbufErrors(t, ns[1])}
	tc := startCluster(t, spec{mode: ModeDPU, nodes: 2, clientsPerNode: 2, ranksPerClient: 2,
		maxPayload: udp.MaxPayloadForMTU(1500, false), readBuffer: 8 << 10,
		tune: func(c *Config) { c.RetransmitTimeout = Duration(2 * time.Millisecond) },
		listenAgent: func(n int, opts udp.Options, workers int) (g []*udp.Conn, err error) {
			testenv.InNetNS(t, ns[n], func() error {
				g, err = udp.ListenGroup(netip.AddrPortFrom(addrs[n], 0), workers, opts)
				return nil
			})
			return g, err
		},
		listenClient: func(n, _ int, opts udp.Options) (c *udp.Conn, err error) {
			testenv.InNetNS(t, ns[n], func() error {
				c, err = udp.Listen(netip.AddrPortFrom(addrs[n], 0), opts)
				return nil
			})
			return c, err
		}})
	for _, a := range tc.agents {
		if a.TransferSize() != 1472 {
			t.Fatalf("transfer size %d, want 1472 on a 1500-byte MTU", a.TransferSize())
		}
	}
	exchange(t, tc, 1200, 2, 8192, 21)
	drops := rcvbufErrors(t, ns[0]) - before[0] + rcvbufErrors(t, ns[1]) - before[1]
	var retrans uint64
	for _, a := range tc.agents {
		retrans += a.Stats().Sent().Retransmits
	}
	cs, _ := tc.all()
	for _, c := range cs {
		retrans += c.Stats().Sent().Retransmits
	}
	t.Logf("kernel receive-buffer drops %d, retransmissions %d", drops, retrans)
	if drops == 0 || retrans == 0 {
		t.Errorf("kernel drops %d, retransmissions %d: the test did not exercise the loss it is about", drops, retrans)
	}
	tc.noDrops(t)
}

// rcvbufErrors reads Udp RcvbufErrors from /proc/net/snmp in ns.
func rcvbufErrors(t *testing.T, ns netns.NsHandle) int {
	var v int
	testenv.InNetNS(t, ns, func() error {
		f, err := os.Open("/proc/thread-self/net/snmp") // this thread's netns, not the process's
		if err != nil {
			return err
		}
		defer f.Close()
		var head []string
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) == 0 || fields[0] != "Udp:" {
				continue
			}
			if head == nil {
				head = fields
				continue
			}
			for i, h := range head {
				if h == "RcvbufErrors" && i < len(fields) {
					v, err = strconv.Atoi(fields[i])
					return err
				}
			}
		}
		return fmt.Errorf("no Udp RcvbufErrors in /proc/net/snmp")
	})
	return v
}
