package cli

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	ucli "github.com/urfave/cli/v2"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/control/testbed"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
	"github.com/lovelock-dpu/lovelock/dataplane/wire/wirelayer"
)

// trafficClass is one kind of packet `testbed traffic` sends.
type trafficClass struct {
	name string
	// build returns the L3-and-up layers of one packet; garbage classes
	// return raw bytes to put after the Ethernet header instead.
	build func(src, dst netip.Addr, seq int) ([]gopacket.SerializableLayer, []byte)
}

func lovelockUDP(typ wire.Type, tenant, dstRank uint32) func(src, dst netip.Addr, seq int) ([]gopacket.SerializableLayer, []byte) {
	return func(src, dst netip.Addr, seq int) ([]gopacket.SerializableLayer, []byte) {
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		udp := &layers.UDP{SrcPort: 40000, DstPort: layers.UDPPort(wire.DefaultPort)}
		udp.SetNetworkLayerForChecksum(ip)
		ll := &wirelayer.Lovelock{Header: wire.Header{Version: wire.Version, Type: typ, Tenant: tenant, Src: 1, Dst: dstRank, Seq: uint32(seq)}}
		return []gopacket.SerializableLayer{ip, udp, ll, gopacket.Payload(fmt.Appendf(nil, "demo payload %d", seq))}, nil
	}
}

// trafficMix is the demo's mixed traffic: service packets of several
// tenants and types, plain IP, and garbage.
var trafficMix = []trafficClass{
	{"bundle tenant 7", lovelockUDP(wire.TypeBundle, 7, 3)},
	{"mem-read tenant 3 region 5", lovelockUDP(wire.TypeMemRead, 3, 5)},
	{"mem-read tenant 3 region 40", lovelockUDP(wire.TypeMemRead, 3, 40)},
	{"ping tenant 9", lovelockUDP(wire.TypePing, 9, 0)},
	{"ingress-input tenant 1", lovelockUDP(wire.TypeIngestInput, 1, 0)},
	{"plain udp :5000", func(src, dst netip.Addr, seq int) ([]gopacket.SerializableLayer, []byte) {
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		udp := &layers.UDP{SrcPort: 40001, DstPort: 5000}
		udp.SetNetworkLayerForChecksum(ip)
		return []gopacket.SerializableLayer{ip, udp, gopacket.Payload("plain")}, nil
	}},
	{"tcp syn :23", func(src, dst netip.Addr, seq int) ([]gopacket.SerializableLayer, []byte) {
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		tcp := &layers.TCP{SrcPort: 40002, DstPort: 23, SYN: true, Seq: uint32(seq), Window: 1024}
		tcp.SetNetworkLayerForChecksum(ip)
		return []gopacket.SerializableLayer{ip, tcp}, nil
	}},
	{"garbage: bad lovelock version", func(src, dst netip.Addr, seq int) ([]gopacket.SerializableLayer, []byte) {
		l, _ := lovelockUDP(wire.TypePing, 1, 0)(src, dst, seq)
		l[2] = &wirelayer.Lovelock{Header: wire.Header{Version: 9, Type: wire.TypePing}}
		return l, nil
	}},
	{"garbage: truncated ipv4", func(src, dst netip.Addr, seq int) ([]gopacket.SerializableLayer, []byte) {
		return nil, []byte{0x45, 0x00, 0x00, 0x40, 0x12, 0x34}
	}},
}

func trafficCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "traffic",
		Usage:     "send the demo's mixed traffic from a host node into its DPU",
		ArgsUsage: "NODE",
		Description: "Sends raw Ethernet frames out of NODE's eth0 (an AF_PACKET socket inside the node) to the\n" +
			"DPU at the other end: Lovelock service packets of several tenants and types, plain UDP and\n" +
			"TCP, and malformed frames. Prints what it sent, class by class, so 'lovelock stats' can be\n" +
			"read against it.",
		Flags: []ucli.Flag{
			testbedPrefixFlag(),
			&ucli.IntFlag{Name: "count", Aliases: []string{"c"}, Value: 10, Usage: "packets of each class"},
		},
		Action: traffic,
	}
}

func traffic(c *ucli.Context) error {
	if c.NArg() != 1 {
		return errors.New("testbed traffic: want the sending node, e.g. host0")
	}
	spec := testbedSpec(c)
	from := c.Args().First()
	if _, err := spec.Node(from); err != nil {
		return err
	}
	var me, peer testbed.Endpoint
	for _, l := range spec.Links {
		switch {
		case l.A.Node == from && l.A.Iface == "eth0":
			me, peer = l.A, l.B
		case l.B.Node == from && l.B.Iface == "eth0":
			me, peer = l.B, l.A
		}
	}
	if me.Node == "" || len(me.Addrs) == 0 || len(peer.Addrs) == 0 {
		return fmt.Errorf("testbed traffic: %s has no eth0 facing a DPU", from)
	}
	src, dst := me.Addrs[0].Addr(), peer.Addrs[0].Addr()
	count := c.Int("count")
	if count <= 0 {
		return fmt.Errorf("--count %d: must be positive", count)
	}

	tw := newTable(c.App.Writer)
	fmt.Fprintf(tw, "CLASS\tSENT\t(%s %s -> %s %s)\n", me, src, peer, dst)
	err := spec.Run(from, func() error {
		l, err := netlink.LinkByName(me.Iface)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{Ifindex: l.Attrs().Index, Halen: 6}
		copy(to.Addr[:], testbed.MAC(peer.Node, peer.Iface))
		eth := &layers.Ethernet{SrcMAC: testbed.MAC(me.Node, me.Iface), DstMAC: testbed.MAC(peer.Node, peer.Iface), EthernetType: layers.EthernetTypeIPv4}
		opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
		for _, class := range trafficMix {
			for i := 0; i < count; i++ {
				ls, raw := class.build(src, dst, i)
				var frame []byte
				if raw != nil {
					// gopacket pads frames to Ethernet's minimum, which
					// would repair the garbage: write it by hand.
					frame = append(append(append([]byte{}, eth.DstMAC...), eth.SrcMAC...), 0x08, 0x00)
					frame = append(frame, raw...)
				} else {
					buf := gopacket.NewSerializeBuffer()
					if err := gopacket.SerializeLayers(buf, opts, append([]gopacket.SerializableLayer{eth}, ls...)...); err != nil {
						return fmt.Errorf("%s: build: %w", class.name, err)
					}
					frame = buf.Bytes()
				}
				if err := unix.Sendto(fd, frame, 0, to); err != nil {
					return fmt.Errorf("%s: send: %w", class.name, err)
				}
			}
			fmt.Fprintf(tw, "%s\t%d\t\n", class.name, count)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("testbed traffic from %s: %w", from, err)
	}
	return tw.Flush()
}
