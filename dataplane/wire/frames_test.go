package wire

import (
	"encoding/binary"
	"fmt"
)

// This file builds Ethernet frames by hand, byte for byte, so that fixtures
// can say exactly which field is wrong. The fixtures drive the Go-only test
// (frame_test.go), the Go/C agreement test and the kernel-backed fuzzer
// (cside_test.go).

// frameOpts describes one frame. Start from udpOpts() and change fields.
type frameOpts struct {
	vlan      bool   // one 802.1Q tag
	vlanProto uint16 // the tag's encapsulated ethertype; 0 picks IPv4 or IPv6
	etherType uint16 // outer ethertype; 0 picks 802.1Q, IPv4 or IPv6
	ipv6      bool
	ipOpts    int    // IPv4 option words (the header grows by 4*ipOpts)
	ihl       int    // IPv4 IHL field; -1 means 5+ipOpts
	fragOff   uint16 // IPv4 flags and fragment offset field, host order
	proto     uint8  // IP protocol or IPv6 next header
	sport     uint16 // UDP source port
	dport     uint16 // UDP destination port
	udpLen    int    // UDP length field; -1 means 8+len(udp payload)
}

func udpOpts() frameOpts {
	return frameOpts{ihl: -1, proto: protoUDP, sport: 40000, dport: DefaultPort, udpLen: -1}
}

// buildFrame returns the frame and the offset of the UDP payload in it (where
// the Lovelock header starts).
func buildFrame(o frameOpts, udpPayload []byte) ([]byte, int) {
	b := make([]byte, 0, 128+len(udpPayload))
	b = append(b, 0x02, 0, 0, 0, 0, 0x02) // dst MAC, locally administered
	b = append(b, 0x02, 0, 0, 0, 0, 0x01) // src MAC
	l3 := uint16(etherTypeIPv4)
	if o.ipv6 {
		l3 = etherTypeIPv6
	}
	outer := o.etherType
	if outer == 0 {
		outer = l3
		if o.vlan {
			outer = etherTypeVLAN
		}
	}
	b = binary.BigEndian.AppendUint16(b, outer)
	if o.vlan {
		inner := o.vlanProto
		if inner == 0 {
			inner = l3
		}
		b = binary.BigEndian.AppendUint16(b, 0x0064) // PCP 0, VLAN 100
		b = binary.BigEndian.AppendUint16(b, inner)
	}
	l4Len := udpHeaderLen + len(udpPayload)
	if o.ipv6 {
		b = append(b, 0x60, 0, 0, 0)
		b = binary.BigEndian.AppendUint16(b, uint16(l4Len))
		b = append(b, o.proto, 64)
		b = append(b, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1) // src
		b = append(b, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2) // dst
	} else {
		ihl := o.ihl
		if ihl < 0 {
			ihl = 5 + o.ipOpts
		}
		hl := ipv4MinLen + 4*o.ipOpts
		b = append(b, 0x40|uint8(ihl&0x0f), 0)
		b = binary.BigEndian.AppendUint16(b, uint16(hl+l4Len))
		b = append(b, 0x12, 0x34) // ID
		b = binary.BigEndian.AppendUint16(b, o.fragOff)
		b = append(b, 64, o.proto, 0, 0) // TTL, protocol, checksum (unchecked)
		b = append(b, 10, 0, 0, 1, 10, 0, 0, 2)
		for range o.ipOpts {
			b = append(b, 0x01, 0x01, 0x01, 0x01) // NOPs
		}
	}
	ulen := o.udpLen
	if ulen < 0 {
		ulen = l4Len
	}
	b = binary.BigEndian.AppendUint16(b, o.sport)
	b = binary.BigEndian.AppendUint16(b, o.dport)
	b = binary.BigEndian.AppendUint16(b, uint16(ulen))
	b = append(b, 0, 0) // checksum: none
	off := len(b)
	return append(b, udpPayload...), off
}

// llBytes is a Lovelock header of type t with a payload of n bytes.
func llBytes(t Type, flags Flags, n int) []byte {
	payload := make([]byte, n)
	for i := range payload {
		payload[i] = byte(i)
	}
	h := Header{Version: Version, Type: t, Flags: flags, Tenant: 7, Src: 0x01020304, Dst: 0xa0b0c0d0, Seq: 42}
	return h.AppendTo(nil, payload)
}

// withByte returns a copy of b with b[i] = v.
func withByte(b []byte, i int, v byte) []byte {
	b = append([]byte(nil), b...)
	b[i] = v
	return b
}

// withU32 returns a copy of b with the big-endian uint32 at i set to v.
func withU32(b []byte, i int, v uint32) []byte {
	b = append([]byte(nil), b...)
	binary.BigEndian.PutUint32(b[i:], v)
	return b
}

type frameCase struct {
	name  string
	frame []byte
	port  uint16
	want  Status
	off   int // header offset when want is StatusOK
}

// frameCases is the fixture table: every encapsulation, type and flag, and
// every way the C parser can reject a frame, each with the verdict parse.h
// gives it.
func frameCases() []frameCase {
	var cs []frameCase
	add := func(name string, o frameOpts, udpPayload []byte, want Status) {
		frame, off := buildFrame(o, udpPayload)
		cs = append(cs, frameCase{name: name, frame: frame, port: DefaultPort, want: want, off: off})
	}
	valid := llBytes(TypePing, 0, 16)

	encaps := []struct {
		name string
		o    frameOpts
	}{
		{"ipv4", udpOpts()},
		{"ipv4-opts1", func() frameOpts { o := udpOpts(); o.ipOpts = 1; return o }()},
		{"ipv4-opts10", func() frameOpts { o := udpOpts(); o.ipOpts = 10; return o }()},
		{"ipv6", func() frameOpts { o := udpOpts(); o.ipv6 = true; return o }()},
		{"vlan-ipv4", func() frameOpts { o := udpOpts(); o.vlan = true; return o }()},
		{"vlan-ipv4-opts3", func() frameOpts { o := udpOpts(); o.vlan = true; o.ipOpts = 3; return o }()},
		{"vlan-ipv6", func() frameOpts { o := udpOpts(); o.vlan = true; o.ipv6 = true; return o }()},
	}
	for _, e := range encaps {
		add(e.name+"/ok", e.o, valid, StatusOK)
		add(e.name+"/ok-empty", e.o, llBytes(TypeCredit, FlagAckReq, 0), StatusOK)
		add(e.name+"/ok-1400", e.o, llBytes(TypeMemReply, 0, 1400), StatusOK)
		o := e.o
		o.dport = DefaultPort + 1
		add(e.name+"/wrong-port", o, valid, StatusNotLovelock)
		o = e.o
		o.sport, o.dport = DefaultPort, 40000
		add(e.name+"/reply-direction", o, valid, StatusNotLovelock)
		o = e.o
		o.proto = 6
		add(e.name+"/tcp", o, make([]byte, 40), StatusNotLovelock)

		// Truncated at every byte boundary below the Lovelock header, in
		// every header, down to the Ethernet header itself.
		full, off := buildFrame(e.o, valid)
		for n := 0; n < off+HeaderLen; n++ {
			cs = append(cs, frameCase{name: fmt.Sprintf("%s/cut-%d", e.name, n), frame: full[:n], port: DefaultPort, want: StatusTruncated})
		}
	}

	for _, t := range Types() {
		add("type-"+t.String(), udpOpts(), llBytes(t, 0, 8), StatusOK)
	}
	for _, f := range []Flags{FlagAckReq, FlagMore, FlagRetransmit, FlagAckReq | FlagMore | FlagRetransmit, 0x8000, 0xfff8, 0xffff} {
		add("flags-"+f.String(), udpOpts(), llBytes(TypeBundle, f, 8), StatusOK)
	}
	o := udpOpts()
	o.dport = 4791
	frame, off := buildFrame(o, valid)
	cs = append(cs, frameCase{name: "configured-port", frame: frame, port: 4791, want: StatusOK, off: off})
	cs = append(cs, frameCase{name: "default-port-on-configured", frame: frame, port: DefaultPort, want: StatusNotLovelock})

	for _, v := range []byte{0, 2, 0xff} {
		add(fmt.Sprintf("version-%d", v), udpOpts(), withByte(valid, OffsetVersion, v), StatusBadVersion)
	}
	for _, t := range []byte{0x00, 0x03, 0x13, 0x23, 0x32, 0xff} {
		add(fmt.Sprintf("type-0x%02x", t), udpOpts(), withByte(valid, OffsetType, t), StatusUnknownType)
	}
	for _, l := range []uint32{0, 15, 17, 1 << 16, 0xffffffff} {
		add(fmt.Sprintf("length-%d", l), udpOpts(), withU32(valid, OffsetLength, l), StatusBadLength)
	}

	// Validation order: the first failing check decides, as in parse_ll.
	add("order/version-before-length", udpOpts(), withByte(withU32(valid, OffsetLength, 99), OffsetVersion, 9), StatusBadVersion)
	add("order/version-before-type", udpOpts(), withByte(withByte(valid, OffsetType, 0xee), OffsetVersion, 9), StatusBadVersion)
	add("order/length-before-type", udpOpts(), withByte(withU32(valid, OffsetLength, 99), OffsetType, 0xee), StatusBadLength)
	trunc, _ := buildFrame(udpOpts(), withByte(valid, OffsetVersion, 9))
	cs = append(cs, frameCase{name: "order/truncated-before-version", frame: trunc[:len(trunc)-len(valid)+HeaderLen-1], port: DefaultPort, want: StatusTruncated})

	// The UDP length, not the frame, gives the payload length.
	o = udpOpts()
	o.udpLen = 7
	add("udp-len-7", o, valid, StatusBadLength)
	o.udpLen = 0
	add("udp-len-0", o, valid, StatusBadLength)
	o.udpLen = udpHeaderLen + HeaderLen - 1
	add("udp-len-no-room", o, valid, StatusBadLength)
	o.udpLen = udpHeaderLen + HeaderLen
	add("udp-len-header-only", o, valid, StatusBadLength)
	add("udp-len-header-only-length-0", o, withU32(valid, OffsetLength, 0), StatusOK)
	o.udpLen = udpHeaderLen + len(valid) + 1
	add("udp-len-past-frame", o, valid, StatusBadLength)
	add("udp-len-past-frame-length-agrees", o, withU32(valid, OffsetLength, 17), StatusOK)
	o.udpLen = 0xffff
	add("udp-len-max-length-agrees", o, withU32(valid, OffsetLength, 0xffff-udpHeaderLen-HeaderLen), StatusOK)
	add("trailing-bytes-inside-udp-len", udpOpts(), append(llBytes(TypePong, 0, 0), 0, 0, 0, 0, 0, 0), StatusBadLength)
	o = udpOpts()
	o.udpLen = udpHeaderLen + HeaderLen
	add("ethernet-padding-after-udp-len", o, append(llBytes(TypePong, 0, 0), 0, 0, 0, 0, 0, 0), StatusOK)
	// A frame shorter than a header is truncated whatever the UDP length.
	frame, _ = buildFrame(udpOpts(), valid[:HeaderLen-1])
	cs = append(cs, frameCase{name: "udp-len-agrees-header-cut", frame: frame, port: DefaultPort, want: StatusTruncated})

	// IPv4 corners.
	for _, ihl := range []int{0, 1, 4} {
		o := udpOpts()
		o.ihl = ihl
		add(fmt.Sprintf("ipv4-ihl-%d", ihl), o, valid, StatusTruncated)
	}
	o = udpOpts()
	o.ihl = 15
	o.ipOpts = 0
	frame, _ = buildFrame(o, valid) // IHL 15 claims 60 bytes; the frame has 82
	cs = append(cs, frameCase{name: "ipv4-ihl-past-frame", frame: frame[:ethHeaderLen+59], port: DefaultPort, want: StatusTruncated})
	o = udpOpts()
	o.fragOff = 0x2000 // MF, offset 0: the first fragment carries UDP
	add("ipv4-first-fragment", o, valid, StatusOK)
	o.fragOff = 0x0001
	add("ipv4-later-fragment", o, valid, StatusNotLovelock)
	o.fragOff = 0x1fff
	add("ipv4-last-offset", o, valid, StatusNotLovelock)
	o.fragOff = 0x4000 // DF only
	add("ipv4-df", o, valid, StatusOK)
	o.fragOff = 0x8000 // reserved bit only
	add("ipv4-evil-bit", o, valid, StatusOK)
	o = udpOpts()
	o.fragOff = 0x0001
	o.ipOpts = 2
	frame, _ = buildFrame(o, valid)
	cs = append(cs, frameCase{name: "ipv4-later-fragment-options-cut", frame: frame[:ethHeaderLen+ipv4MinLen+4], port: DefaultPort, want: StatusTruncated})
	frame, off = buildFrame(udpOpts(), valid)
	frame[ethHeaderLen] = 0x65 // version 6 in an IPv4 ethertype: not checked
	cs = append(cs, frameCase{name: "ipv4-version-nibble-ignored", frame: frame, port: DefaultPort, want: StatusOK, off: off})

	// IPv6 corners: extension headers are not walked.
	for _, nh := range []uint8{0, 43, 44, 59, 58} {
		o := udpOpts()
		o.ipv6 = true
		o.proto = nh
		add(fmt.Sprintf("ipv6-nexthdr-%d", nh), o, valid, StatusNotLovelock)
	}

	// Layer 2 corners.
	o = udpOpts()
	o.etherType = 0x0806
	add("arp", o, make([]byte, 28), StatusNotLovelock)
	o.etherType = 0x88a8
	add("qinq-outer", o, valid, StatusNotLovelock)
	o = udpOpts()
	o.vlan = true
	o.vlanProto = etherTypeVLAN
	add("double-8021q", o, valid, StatusNotLovelock)
	o.vlanProto = 0x0806
	add("vlan-arp", o, valid, StatusNotLovelock)
	o = udpOpts()
	o.etherType = 0x05dc // 802.3 length field
	add("8023-length", o, valid, StatusNotLovelock)
	return cs
}
