package wire

import (
	"encoding/binary"
	"fmt"
)

// Header sizes and protocol numbers ParseFrame walks; the names follow the
// kernel's (ETH_HLEN, ETH_P_*, IPPROTO_UDP).
const (
	ethHeaderLen  = 14
	vlanHeaderLen = 4
	ipv4MinLen    = 20
	ipv6HeaderLen = 40
	udpHeaderLen  = 8

	etherTypeIPv4 = 0x0800
	etherTypeIPv6 = 0x86dd
	etherTypeVLAN = 0x8100

	protoUDP = 17
)

// ParseFrame walks an Ethernet frame the way the data plane's C parser
// (parse_to_ll in bpf/include/parse.h) does and returns the Lovelock header
// and its offset from the start of the frame. Its verdict, through StatusOf,
// equals the C parser's on every input; cside_test.go checks that.
//
// What it walks, as the C side does: Ethernet with at most one 802.1Q tag;
// IPv4 with options (IHL below 5 is ErrShortBuffer; fragments other than the
// first are ErrNotLovelock) or IPv6 without extension headers (any next
// header but UDP is ErrNotLovelock); UDP with destination port port. The UDP
// length field, not the frame length, gives the payload the Lovelock length
// must match; a UDP length below 8 is ErrBadLength, and bytes after it
// (Ethernet padding) are ignored. Neither the IP version nibble, the IP
// lengths nor the UDP checksum are checked.
//
// Caveat: because the UDP length field is trusted, success does not promise
// that the payload lies within frame. Check
// off+HeaderLen+int(h.Length) <= len(frame) before slicing the payload.
func ParseFrame(frame []byte, port uint16) (h Header, off int, err error) {
	b := frame
	if len(b) < ethHeaderLen {
		return Header{}, 0, truncated("ethernet", ethHeaderLen, len(b))
	}
	proto := binary.BigEndian.Uint16(b[12:])
	off = ethHeaderLen
	if proto == etherTypeVLAN {
		if len(b)-off < vlanHeaderLen {
			return Header{}, 0, truncated("802.1Q", vlanHeaderLen, len(b)-off)
		}
		proto = binary.BigEndian.Uint16(b[off+2:])
		off += vlanHeaderLen
	}

	var l4 uint8
	switch proto {
	case etherTypeIPv4:
		ip := b[off:]
		if len(ip) < ipv4MinLen {
			return Header{}, 0, truncated("ipv4", ipv4MinLen, len(ip))
		}
		ihl := int(ip[0]&0x0f) * 4
		if ihl < ipv4MinLen {
			return Header{}, 0, fmt.Errorf("wire: frame: ipv4 header length %d below %d: %w", ihl, ipv4MinLen, ErrShortBuffer)
		}
		if len(ip) < ihl {
			return Header{}, 0, truncated("ipv4 with options", ihl, len(ip))
		}
		// Only the first fragment carries the UDP header.
		if fragOff := binary.BigEndian.Uint16(ip[6:]) & 0x1fff; fragOff != 0 {
			return Header{}, 0, fmt.Errorf("wire: frame: ipv4 fragment at offset %d: %w", int(fragOff)*8, ErrNotLovelock)
		}
		l4 = ip[9]
		off += ihl
	case etherTypeIPv6:
		ip := b[off:]
		if len(ip) < ipv6HeaderLen {
			return Header{}, 0, truncated("ipv6", ipv6HeaderLen, len(ip))
		}
		l4 = ip[6]
		off += ipv6HeaderLen
	default:
		return Header{}, 0, fmt.Errorf("wire: frame: ethertype %#04x: %w", proto, ErrNotLovelock)
	}
	if l4 != protoUDP {
		return Header{}, 0, fmt.Errorf("wire: frame: ip protocol %d: %w", l4, ErrNotLovelock)
	}

	udp := b[off:]
	if len(udp) < udpHeaderLen {
		return Header{}, 0, truncated("udp", udpHeaderLen, len(udp))
	}
	if dport := binary.BigEndian.Uint16(udp[2:]); dport != port {
		return Header{}, 0, fmt.Errorf("wire: frame: udp port %d, want %d: %w", dport, port, ErrNotLovelock)
	}
	ulen := int(binary.BigEndian.Uint16(udp[4:]))
	if ulen < udpHeaderLen {
		return Header{}, 0, fmt.Errorf("wire: frame: udp length %d below %d: %w", ulen, udpHeaderLen, ErrBadLength)
	}
	off += udpHeaderLen

	// The header is pulled from the frame before the UDP length is looked
	// at, as in parse_ll: a frame too short for it is truncated whatever the
	// UDP length says.
	if len(b)-off < HeaderLen {
		return Header{}, 0, truncated("lovelock", HeaderLen, len(b)-off)
	}
	h, err = check(b[off:], ulen-udpHeaderLen)
	if err != nil {
		return Header{}, 0, fmt.Errorf("wire: frame: %w", err)
	}
	return h, off, nil
}

func truncated(layer string, need, have int) error {
	return fmt.Errorf("wire: frame: %s header needs %d bytes, have %d: %w", layer, need, have, ErrShortBuffer)
}
