package rules

import (
	"net"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/lovelock-dpu/lovelock/dataplane/wire"
	"github.com/lovelock-dpu/lovelock/dataplane/wire/wirelayer"
)

// pkt describes a test packet; build serializes it with gopacket.
type pkt struct {
	vlan         bool
	src, dst     netip.Addr // invalid: an ARP frame
	proto        uint8      // 6 tcp, 17 udp, 1 icmp, 58 icmpv6; others carry raw bytes
	sport, dport uint16
	ll           *wire.Header // a Lovelock header starts the UDP payload
	payload      []byte
	frag         fragKind
	ext          []uint8 // IPv6 extension headers before L4: 0, 60 or 44 (atomic fragment)
}

type fragKind uint8

const (
	notFrag   fragKind = iota
	firstFrag          // MF set, offset 0
	laterFrag          // offset 1480, MF clear
)

var (
	macA = net.HardwareAddr{2, 0, 0, 0, 0, 1}
	macB = net.HardwareAddr{2, 0, 0, 0, 0, 2}
)

func (p pkt) build(tb testing.TB) []byte {
	tb.Helper()
	eth := &layers.Ethernet{SrcMAC: macA, DstMAC: macB}
	ls := []gopacket.SerializableLayer{eth}
	var l3 layers.EthernetType
	switch {
	case !p.src.IsValid():
		l3 = layers.EthernetTypeARP
	case p.src.Is4():
		l3 = layers.EthernetTypeIPv4
	default:
		l3 = layers.EthernetTypeIPv6
	}
	eth.EthernetType = l3
	if p.vlan {
		eth.EthernetType = layers.EthernetTypeDot1Q
		ls = append(ls, &layers.Dot1Q{VLANIdentifier: 7, Type: l3})
	}
	switch l3 {
	case layers.EthernetTypeARP:
		ls = append(ls, &layers.ARP{
			AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
			Operation: layers.ARPRequest, SourceHwAddress: macA, SourceProtAddress: []byte{10, 0, 0, 1},
			DstHwAddress: make([]byte, 6), DstProtAddress: []byte{10, 0, 0, 2},
		})
		return serialize(tb, ls)
	case layers.EthernetTypeIPv4:
		ip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocol(p.proto),
			SrcIP: p.src.AsSlice(), DstIP: p.dst.AsSlice()}
		switch p.frag {
		case firstFrag:
			ip.Flags = layers.IPv4MoreFragments
		case laterFrag:
			ip.FragOffset = 185
		}
		ls = append(ls, ip)
	default:
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocol(p.proto),
			SrcIP: p.src.AsSlice(), DstIP: p.dst.AsSlice()}
		ext := p.ext
		if p.frag != notFrag {
			ext = append(ext, 44)
		}
		if len(ext) > 0 {
			ip.NextHeader = layers.IPProtocol(ext[0])
		}
		ls = append(ls, ip)
		for i, kind := range ext {
			next := layers.IPProtocol(p.proto)
			if i+1 < len(ext) {
				next = layers.IPProtocol(ext[i+1])
			}
			pad := []*layers.IPv6HopByHopOption{{OptionType: 1, OptionData: make([]byte, 4)}}
			switch kind {
			case 0:
				h := &layers.IPv6HopByHop{Options: pad}
				h.NextHeader = next
				ls = append(ls, h)
			case 60:
				h := &layers.IPv6Destination{Options: []*layers.IPv6DestinationOption{{OptionType: 1, OptionData: make([]byte, 4)}}}
				h.NextHeader = next
				ls = append(ls, h)
			case 44:
				f := &layers.IPv6Fragment{NextHeader: next, Identification: 0x1234}
				if i == len(ext)-1 {
					f.MoreFragments = p.frag == firstFrag
					if p.frag == laterFrag {
						f.FragmentOffset = 185
					}
				}
				ls = append(ls, f)
			}
		}
	}
	switch p.proto {
	case 6:
		ls = append(ls, &layers.TCP{SrcPort: layers.TCPPort(p.sport), DstPort: layers.TCPPort(p.dport), Window: 1024, SYN: true})
	case 17:
		ls = append(ls, &layers.UDP{SrcPort: layers.UDPPort(p.sport), DstPort: layers.UDPPort(p.dport)})
	case 1:
		ls = append(ls, &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 1, Seq: 1})
	case 58:
		ls = append(ls, &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeEchoRequest, 0)})
	}
	if p.ll != nil {
		ls = append(ls, &wirelayer.Lovelock{Header: *p.ll})
	}
	ls = append(ls, gopacket.Payload(p.payload))
	return serialize(tb, ls)
}

func serialize(tb testing.TB, ls []gopacket.SerializableLayer) []byte {
	tb.Helper()
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true}, ls...); err != nil {
		tb.Fatalf("serialize %v: %v", ls, err)
	}
	return buf.Bytes()
}

// llHeader is a valid Lovelock header.
func llHeader(t wire.Type, tenant, rank uint32) *wire.Header {
	return &wire.Header{Version: wire.Version, Type: t, Tenant: tenant, Src: 1, Dst: rank, Seq: 9}
}

// The shorthand fixtures use.
func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func udp(src, dst string, sport, dport uint16) pkt {
	return pkt{src: addr(src), dst: addr(dst), proto: 17, sport: sport, dport: dport, payload: []byte("hello")}
}

func tcp(src, dst string, sport, dport uint16) pkt {
	return pkt{src: addr(src), dst: addr(dst), proto: 6, sport: sport, dport: dport}
}

func lovelock(src, dst string, t wire.Type, tenant, rank uint32) pkt {
	return pkt{src: addr(src), dst: addr(dst), proto: 17, sport: 40000, dport: wire.DefaultPort,
		ll: llHeader(t, tenant, rank), payload: []byte("payload")}
}
