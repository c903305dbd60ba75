package wire

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// Header sizes and protocol numbers ParseFrame walks; the names follow the
// kernel's (ETH_HLEN, ETH_P_*, IPPROTO_*).
const (
	ethHeaderLen  = 14
	vlanHeaderLen = 4
	ipv4MinLen    = 20
	ipv6HeaderLen = 40
	udpHeaderLen  = 8
	tcpMinLen     = 20
	ipv6FragLen   = 8

	etherTypeIPv4 = 0x0800
	etherTypeIPv6 = 0x86dd
	etherTypeVLAN = 0x8100

	protoHopOpts  = 0
	protoTCP      = 6
	protoUDP      = 17
	protoRouting  = 43
	protoFragment = 44
	protoAH       = 51
	protoDstOpts  = 60
)

// MaxIPv6ExtHeaders is how many IPv6 extension headers ParseFrame, like the
// C parser (MAX_IPV6_EXT_HDRS), skips before it calls a frame malformed
// (ErrBadHeader).
const MaxIPv6ExtHeaders = 4

// Flow is what steering rules match on, as the data plane extracts it. It is
// struct flow_key of bpf/include/parse.h without the ingress interface, which
// the hook, not the frame, supplies.
type Flow struct {
	Family       uint8      // 4, 6, or 0 for non-IP
	Proto        uint8      // IP protocol (after IPv6 extension headers)
	Src, Dst     netip.Addr // zero Addr when Family == 0
	Sport, Dport uint16     // 0 for fragments and protocols without ports
	Type         Type       // Lovelock type; 0 unless the frame is a valid Lovelock packet
	Tenant       uint32     // Lovelock tenant (valid Lovelock packets only)
	Rank         uint32     // Lovelock destination rank or region (valid Lovelock packets only)
}

// Frame is what ParseFrame found.
type Frame struct {
	// Header is the Lovelock header; zero unless ParseFrame returned nil.
	Header Header
	// Offset is where Header starts in the frame; 0 unless ParseFrame
	// returned nil.
	Offset int
	// Flow holds the fields rules match on, filled as far as the parser got
	// (on every error too; see ParseFrame).
	Flow Flow
	// BadLovelock is set when the L3/L4 headers are valid and only the
	// Lovelock header of a UDP datagram to the Lovelock port failed its
	// checks (ErrShortBuffer, ErrBadVersion, ErrBadLength or
	// ErrUnknownType from Decode; pkt_meta.bad_ll in C). The frame is
	// malformed, but it may be another protocol's datagram that uses the
	// port, so the data plane classifies it on Flow's L3/L4 fields, whose
	// Lovelock fields are zero.
	BadLovelock bool
}

// ParseFrame walks an Ethernet frame the way the data plane's C parser
// (parse_packet in bpf/include/parse.h) does, and returns the Lovelock header,
// its offset from the start of the frame and the flow key. Its verdict,
// through StatusOf, and its flow equal the C parser's on every input;
// cside_test.go checks that. docs/wire.md lists the rules both follow.
//
// The error is nil for a valid Lovelock packet, wraps ErrNotLovelock for a
// well-formed frame that is not one (another ethertype or protocol, another
// port, any IP fragment), and otherwise wraps the sentinel of the first check
// that failed: ErrShortBuffer, ErrBadHeader, ErrBadVersion, ErrBadLength or
// ErrUnknownType. The Lovelock checks are exactly Decode's, on the UDP payload
// as the UDP length delimits it (ParseGSOFrame: of a UDP GSO run, its first
// datagram's); that payload always lies within frame.
//
// Frame.Flow is filled on every error as far as the parser got, field for
// field like the C parser's key before the data plane looks at the verdict
// (bpf/wirecheck reports that key): the IP fields once the IP header (and
// for IPv6 the extension headers, for the protocol) passed, the ports once
// the TCP or UDP header was present. The data plane does not trust the fields
// of a malformed frame (Status.Malformed) and gives it the default action
// with an all-zero key; callers that classify must not match on Flow then,
// except when Frame.BadLovelock is set: then only the Lovelock header was
// bad, and the data plane matches rules on Flow's L3/L4 fields.
//
// ParseFrame sees the whole frame. The C parser sees the linear part of the
// packet only, which is the whole frame for single-buffer XDP; the tests keep
// to frames BPF_PROG_TEST_RUN keeps linear. ParseFrame does not allocate for
// a valid Lovelock packet.
func ParseFrame(frame []byte, port uint16) (Frame, error) {
	return parseFrame(frame, port, 0)
}

// ParseGSOFrame is ParseFrame on a GSO super-packet of segment size gsoSize,
// as a TC hook sees the host's own TSO/GSO traffic on egress or GRO'd
// traffic on ingress (the C parser's gso_size argument, skb->gso_size;
// skb_is_gso). An IPv4 total length, IPv6 payload length or UDP length of 0
// then means "to the end of the frame" (BIG TCP, UDP tunnels under GSO)
// instead of a broken header. A UDP payload longer than gsoSize is a UDP GSO
// run (a UDP_SEGMENT send, or datagrams GRO merged): datagrams of gsoSize
// payload bytes, the last maybe shorter, each with its own Lovelock header,
// under one UDP header with the whole run's length. The Lovelock checks then
// run on the first datagram's payload, its first gsoSize bytes, and
// Frame.Header is its header. XDP never sees such a packet. A gsoSize of 0
// is no GSO packet: ParseFrame.
func ParseGSOFrame(frame []byte, port uint16, gsoSize uint16) (Frame, error) {
	return parseFrame(frame, port, gsoSize)
}

func parseFrame(frame []byte, port uint16, gsoSize uint16) (Frame, error) {
	gso := gsoSize != 0
	var f Frame
	// The IP length bounds the datagram: the headers after the IP header
	// and the UDP datagram must end within b, and bytes after it are
	// Ethernet padding. Until the IP header is read, b is the frame.
	b := frame
	if len(b) < ethHeaderLen {
		return f, truncated("ethernet", ethHeaderLen, len(b))
	}
	proto := binary.BigEndian.Uint16(b[12:])
	off := ethHeaderLen
	if proto == etherTypeVLAN {
		if len(b)-off < vlanHeaderLen {
			return f, truncated("802.1Q", vlanHeaderLen, len(b)-off)
		}
		proto = binary.BigEndian.Uint16(b[off+2:])
		off += vlanHeaderLen
	}

	var (
		l4   uint8
		frag bool
	)
	switch proto {
	case etherTypeIPv4:
		ip := b[off:]
		if len(ip) < ipv4MinLen {
			return f, truncated("ipv4", ipv4MinLen, len(ip))
		}
		if v := ip[0] >> 4; v != 4 {
			return f, fmt.Errorf("wire: frame: ip version %d in an ipv4 ethertype: %w", v, ErrBadHeader)
		}
		ihl := int(ip[0]&0x0f) * 4
		if ihl < ipv4MinLen {
			return f, fmt.Errorf("wire: frame: ipv4 header length %d below %d: %w", ihl, ipv4MinLen, ErrBadHeader)
		}
		if len(ip) < ihl {
			return f, truncated("ipv4 with options", ihl, len(ip))
		}
		f.Flow.Family = 4
		f.Flow.Proto = ip[9]
		f.Flow.Src = netip.AddrFrom4([4]byte(ip[12:16]))
		f.Flow.Dst = netip.AddrFrom4([4]byte(ip[16:20]))
		if tot := int(binary.BigEndian.Uint16(ip[2:])); tot != 0 || !gso {
			if tot < ihl {
				return f, fmt.Errorf("wire: frame: ipv4 total length %d below its header length %d: %w", tot, ihl, ErrBadHeader)
			}
			if tot > len(ip) {
				return f, fmt.Errorf("wire: frame: ipv4 total length %d, frame has %d: %w", tot, len(ip), ErrShortBuffer)
			}
			b = b[:off+tot]
		}
		// More-fragments flag or an offset: any fragment.
		frag = binary.BigEndian.Uint16(ip[6:])&0x3fff != 0
		l4 = ip[9]
		off += ihl
	case etherTypeIPv6:
		ip := b[off:]
		if len(ip) < ipv6HeaderLen {
			return f, truncated("ipv6", ipv6HeaderLen, len(ip))
		}
		if v := ip[0] >> 4; v != 6 {
			return f, fmt.Errorf("wire: frame: ip version %d in an ipv6 ethertype: %w", v, ErrBadHeader)
		}
		f.Flow.Family = 6
		f.Flow.Src = netip.AddrFrom16([16]byte(ip[8:24]))
		f.Flow.Dst = netip.AddrFrom16([16]byte(ip[24:40]))
		// A payload length of 0 outside GSO (a jumbogram, which no
		// Ethernet frame here carries) leaves no room for headers.
		if plen := int(binary.BigEndian.Uint16(ip[4:])); plen != 0 || !gso {
			if ipv6HeaderLen+plen > len(ip) {
				return f, fmt.Errorf("wire: frame: ipv6 payload length %d, frame has %d: %w", plen, len(ip)-ipv6HeaderLen, ErrShortBuffer)
			}
			b = b[:off+ipv6HeaderLen+plen]
		}
		off += ipv6HeaderLen
		var err error
		if off, l4, frag, err = skipIPv6Ext(b, off, ip[6]); err != nil {
			return f, err
		}
		f.Flow.Proto = l4
	default:
		return f, fmt.Errorf("wire: frame: ethertype %#04x: %w", proto, ErrNotLovelock)
	}

	// Fragments are classified on L3 alone, so that all pieces of a
	// datagram go the same way.
	if frag {
		return f, fmt.Errorf("wire: frame: ip fragment: %w", ErrNotLovelock)
	}
	if l4 == protoTCP {
		tcp := b[off:]
		if len(tcp) < tcpMinLen {
			return f, truncated("tcp", tcpMinLen, len(tcp))
		}
		f.Flow.Sport = binary.BigEndian.Uint16(tcp[0:])
		f.Flow.Dport = binary.BigEndian.Uint16(tcp[2:])
		return f, fmt.Errorf("wire: frame: tcp: %w", ErrNotLovelock)
	}
	if l4 != protoUDP {
		return f, fmt.Errorf("wire: frame: ip protocol %d: %w", l4, ErrNotLovelock)
	}

	udp := b[off:]
	if len(udp) < udpHeaderLen {
		return f, truncated("udp", udpHeaderLen, len(udp))
	}
	f.Flow.Sport = binary.BigEndian.Uint16(udp[0:])
	f.Flow.Dport = binary.BigEndian.Uint16(udp[2:])
	ulen := int(binary.BigEndian.Uint16(udp[4:]))
	switch {
	case ulen == 0 && gso:
		ulen = len(udp) // to the end of the IP datagram
	case ulen < udpHeaderLen:
		return f, fmt.Errorf("wire: frame: udp length %d below %d: %w", ulen, udpHeaderLen, ErrBadHeader)
	case ulen > len(udp):
		// The datagram must lie within the IP datagram (the kernel
		// drops it otherwise, UdpInErrors); bytes after it are padding.
		return f, fmt.Errorf("wire: frame: udp datagram of %d bytes, ip datagram has %d: %w", ulen, len(udp), ErrShortBuffer)
	}
	if f.Flow.Dport != port {
		return f, fmt.Errorf("wire: frame: udp port %d, want %d: %w", f.Flow.Dport, port, ErrNotLovelock)
	}
	payload := udp[udpHeaderLen:ulen]
	if gso && len(payload) > int(gsoSize) {
		payload = payload[:gsoSize] // a UDP GSO run: its first datagram's
	}
	h, err := decode(payload)
	if err != nil {
		f.BadLovelock = true
		return f, fmt.Errorf("wire: frame: lovelock %w", err)
	}
	f.Header = h
	f.Offset = off + udpHeaderLen
	f.Flow.Type = h.Type
	f.Flow.Tenant = h.Tenant
	f.Flow.Rank = h.Dst
	return f, nil
}

// isIPv6Ext reports whether nh names an extension header the parser skips
// (ipv6_ext in parse.h).
func isIPv6Ext(nh uint8) bool {
	switch nh {
	case protoHopOpts, protoRouting, protoDstOpts, protoFragment, protoAH:
		return true
	}
	return false
}

// skipIPv6Ext skips up to MaxIPv6ExtHeaders extension headers starting at
// off with next header nh, as skip_ipv6_ext does, and returns the offset and
// protocol of what follows them and whether a fragment header marked the
// packet as a fragment (an offset or the M flag). The walk stops at such a
// fragment header, whose next header is then the protocol: in later pieces
// what follows is datagram data, so every piece gets the same protocol.
func skipIPv6Ext(b []byte, off int, nh uint8) (int, uint8, bool, error) {
	for range MaxIPv6ExtHeaders {
		if !isIPv6Ext(nh) {
			return off, nh, false, nil
		}
		if len(b)-off < 2 {
			return off, nh, false, truncatedExt(nh, 2, len(b)-off)
		}
		var n int
		switch nh {
		case protoFragment:
			n = ipv6FragLen
		case protoAH:
			n = (int(b[off+1]) + 2) * 4
		default:
			n = (int(b[off+1]) + 1) * 8
		}
		if len(b)-off < n {
			return off, nh, false, truncatedExt(nh, n, len(b)-off)
		}
		isFrag := nh == protoFragment && binary.BigEndian.Uint16(b[off+2:])&0xfff9 != 0
		nh = b[off]
		off += n
		if isFrag {
			return off, nh, true, nil
		}
	}
	if isIPv6Ext(nh) {
		return off, nh, false, fmt.Errorf("wire: frame: more than %d ipv6 extension headers: %w", MaxIPv6ExtHeaders, ErrBadHeader)
	}
	return off, nh, false, nil
}

func truncated(layer string, need, have int) error {
	return fmt.Errorf("wire: frame: %s header needs %d bytes, have %d: %w", layer, need, have, ErrShortBuffer)
}

func truncatedExt(nh uint8, need, have int) error {
	return fmt.Errorf("wire: frame: ipv6 extension header %d needs %d bytes, have %d: %w", nh, need, have, ErrShortBuffer)
}
