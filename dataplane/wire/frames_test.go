package wire

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
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
	ext       []ext6 // IPv6 extension headers, in order, before the L4 header
	ipOpts    int    // IPv4 option words (the header grows by 4*ipOpts)
	ihl       int    // IPv4 IHL field; -1 means 5+ipOpts
	fragOff   uint16 // IPv4 flags and fragment offset field, host order
	proto     uint8  // IP protocol, or the next header after the last extension header
	sport     uint16 // UDP (or TCP) source port
	dport     uint16 // UDP (or TCP) destination port
	udpLen    int    // UDP length field; -1 means 8+len(udp payload)
}

// ext6 is one IPv6 extension header. Its size follows from kind and hdrLen
// as the kernel computes it: (hdrLen+1)*8 bytes for hop-by-hop, routing and
// destination options, (hdrLen+2)*4 for AH, 8 for a fragment header (whose
// hdrLen byte is reserved).
type ext6 struct {
	kind   uint8  // protoHopOpts, protoRouting, protoDstOpts, protoAH or protoFragment
	hdrLen uint8  // the header's length byte
	frag   uint16 // fragment header: offset, reserved bits and M flag
}

func (e ext6) size() int {
	switch e.kind {
	case protoFragment:
		return ipv6FragLen
	case protoAH:
		return (int(e.hdrLen) + 2) * 4
	}
	return (int(e.hdrLen) + 1) * 8
}

// Addresses buildFrame writes.
var (
	src4 = netip.MustParseAddr("10.0.0.1")
	dst4 = netip.MustParseAddr("10.0.0.2")
	src6 = netip.MustParseAddr("fd00::1")
	dst6 = netip.MustParseAddr("fd00::2")
)

func udpOpts() frameOpts {
	return frameOpts{ihl: -1, proto: protoUDP, sport: 40000, dport: DefaultPort, udpLen: -1}
}

// buildFrame returns the frame and the offset of the UDP payload in it (where
// the Lovelock header starts). The L4 header is always written as a UDP
// header: for TCP its first four bytes are the ports, as in a TCP header.
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
		extLen := 0
		for _, e := range o.ext {
			extLen += e.size()
		}
		next := o.proto
		if len(o.ext) > 0 {
			next = o.ext[0].kind
		}
		b = append(b, 0x60, 0, 0, 0)
		b = binary.BigEndian.AppendUint16(b, uint16(extLen+l4Len))
		b = append(b, next, 64)
		b = append(b, src6.AsSlice()...)
		b = append(b, dst6.AsSlice()...)
		for i, e := range o.ext {
			next = o.proto
			if i+1 < len(o.ext) {
				next = o.ext[i+1].kind
			}
			h := make([]byte, e.size())
			h[0], h[1] = next, e.hdrLen
			if e.kind == protoFragment {
				h[1] = 0
				binary.BigEndian.PutUint16(h[2:], e.frag)
				binary.BigEndian.PutUint32(h[4:], 0xabcd) // identification
			} else {
				for j := 2; j < len(h); j++ {
					h[j] = 0x01 // filler: neither parser reads option contents
				}
			}
			b = append(b, h...)
		}
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
		b = append(b, src4.AsSlice()...)
		b = append(b, dst4.AsSlice()...)
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
	off   int   // header offset when want is StatusOK
	flow  *Flow // the flow ParseFrame must return, when the case names one
	// gso, when not 0, makes the frame a GSO super-packet with that
	// segment size, as a TC hook sees one: ParseGSOFrame, and the C
	// parser's TC program with gso_size set.
	gso uint16
}

// withU16 returns a copy of b with the big-endian uint16 at i set to v.
func withU16(b []byte, i int, v uint16) []byte {
	b = append([]byte(nil), b...)
	binary.BigEndian.PutUint16(b[i:], v)
	return b
}

// hexFrame decodes a frame written as hex, as tcpdump -xx or a capture
// tool prints it.
func hexFrame(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

// Flows of the frames buildFrame makes from udpOpts() and llBytes.
var (
	flow4 = Flow{Family: 4, Proto: protoUDP, Src: src4, Dst: dst4, Sport: 40000, Dport: DefaultPort}
	flow6 = Flow{Family: 6, Proto: protoUDP, Src: src6, Dst: dst6, Sport: 40000, Dport: DefaultPort}
)

// withLL returns f with the Lovelock fields llBytes writes.
func withLL(f Flow, t Type) Flow {
	f.Type, f.Tenant, f.Rank = t, 7, 0xa0b0c0d0
	return f
}

// frameCases is the fixture table: every encapsulation, type and flag, and
// every way the C parser can reject a frame, each with the verdict parse.h
// gives it and, for many, the flow key it extracts.
func frameCases() []frameCase {
	var cs []frameCase
	add := func(name string, o frameOpts, udpPayload []byte, want Status) {
		frame, off := buildFrame(o, udpPayload)
		if want != StatusOK {
			off = 0
		}
		cs = append(cs, frameCase{name: name, frame: frame, port: DefaultPort, want: want, off: off})
	}
	// expect sets the flow the last case added must yield.
	expect := func(f Flow) { cs[len(cs)-1].flow = &f }
	valid := llBytes(TypePing, 0, 16)
	v6 := func(ext ...ext6) frameOpts {
		o := udpOpts()
		o.ipv6, o.ext = true, ext
		return o
	}
	hop := ext6{kind: protoHopOpts}
	dstOpts := ext6{kind: protoDstOpts, hdrLen: 1}
	routing := ext6{kind: protoRouting, hdrLen: 2}
	ah := ext6{kind: protoAH, hdrLen: 4}
	atomicFrag := ext6{kind: protoFragment} // offset 0, M clear: not a fragment (RFC 6946)

	encaps := []struct {
		name string
		o    frameOpts
		flow Flow
	}{
		{"ipv4", udpOpts(), flow4},
		{"ipv4-opts1", func() frameOpts { o := udpOpts(); o.ipOpts = 1; return o }(), flow4},
		{"ipv4-opts10", func() frameOpts { o := udpOpts(); o.ipOpts = 10; return o }(), flow4},
		{"ipv6", v6(), flow6},
		{"ipv6-ext4", v6(hop, routing, atomicFrag, dstOpts), flow6},
		{"ipv6-ah", v6(ah), flow6},
		{"vlan-ipv4", func() frameOpts { o := udpOpts(); o.vlan = true; return o }(), flow4},
		{"vlan-ipv4-opts3", func() frameOpts { o := udpOpts(); o.vlan = true; o.ipOpts = 3; return o }(), flow4},
		{"vlan-ipv6", func() frameOpts { o := v6(); o.vlan = true; return o }(), flow6},
		{"vlan-ipv6-ext2", func() frameOpts { o := v6(dstOpts, ah); o.vlan = true; return o }(), flow6},
	}
	for _, e := range encaps {
		add(e.name+"/ok", e.o, valid, StatusOK)
		expect(withLL(e.flow, TypePing))
		add(e.name+"/ok-empty", e.o, llBytes(TypeCredit, FlagAckReq, 0), StatusOK)
		expect(withLL(e.flow, TypeCredit))
		add(e.name+"/ok-1400", e.o, llBytes(TypeMemReply, 0, 1400), StatusOK)
		o := e.o
		o.dport = DefaultPort + 1
		add(e.name+"/wrong-port", o, valid, StatusNotLovelock)
		f := e.flow
		f.Dport = DefaultPort + 1
		expect(f)
		o = e.o
		o.sport, o.dport = DefaultPort, 40000
		add(e.name+"/reply-direction", o, valid, StatusNotLovelock)
		f = e.flow
		f.Sport, f.Dport = DefaultPort, 40000
		expect(f)
		o = e.o
		o.proto = protoTCP
		add(e.name+"/tcp", o, make([]byte, 40), StatusNotLovelock)
		f = e.flow
		f.Proto = protoTCP
		expect(f)
		add(e.name+"/tcp-header-only", o, make([]byte, tcpMinLen-udpHeaderLen), StatusNotLovelock)
		add(e.name+"/tcp-cut", o, make([]byte, tcpMinLen-udpHeaderLen-1), StatusTruncated)
		f.Sport, f.Dport = 0, 0
		expect(f)
		o.proto = 1
		add(e.name+"/icmp", o, make([]byte, 40), StatusNotLovelock)
		f.Proto = 1
		expect(f)
		o = e.o
		o.udpLen = 7
		add(e.name+"/udp-len-7", o, valid, StatusBadHeader)
		expect(e.flow) // what the parser saw; the data plane zeroes it

		// Truncated at every byte boundary, in every header and in the
		// payload, down to the Ethernet header itself: the UDP datagram
		// must lie within the frame.
		full, _ := buildFrame(e.o, valid)
		for n := range len(full) {
			cs = append(cs, frameCase{name: fmt.Sprintf("%s/cut-%d", e.name, n), frame: full[:n], port: DefaultPort, want: StatusTruncated})
		}
	}

	for _, t := range Types() {
		add("type-"+t.String(), udpOpts(), llBytes(t, 0, 8), StatusOK)
		expect(withLL(flow4, t))
	}
	for _, f := range []Flags{FlagAckReq, FlagMore, FlagRetransmit, FlagAckReq | FlagMore | FlagRetransmit, 0x8000, 0xfff8, 0xffff} {
		add("flags-"+f.String(), udpOpts(), llBytes(TypeBundle, f, 8), StatusOK)
	}
	o := udpOpts()
	o.dport = 4791
	frame, off := buildFrame(o, valid)
	cs = append(cs, frameCase{name: "configured-port", frame: frame, port: 4791, want: StatusOK, off: off})
	cs = append(cs, frameCase{name: "default-port-on-configured", frame: frame, port: DefaultPort, want: StatusNotLovelock})

	// Header faults: the flow keeps the ports but no Lovelock fields.
	for _, v := range []byte{0, 2, 0xff} {
		add(fmt.Sprintf("version-%d", v), udpOpts(), withByte(valid, OffsetVersion, v), StatusBadVersion)
		expect(flow4)
	}
	for _, t := range []byte{0x00, 0x03, 0x13, 0x23, 0x32, 0xff} {
		add(fmt.Sprintf("type-0x%02x", t), udpOpts(), withByte(valid, OffsetType, t), StatusUnknownType)
		expect(flow4)
	}
	for _, l := range []uint32{0, 15, 17, 1 << 16, 0xffffffff} {
		add(fmt.Sprintf("length-%d", l), udpOpts(), withU32(valid, OffsetLength, l), StatusBadLength)
		expect(flow4)
	}

	// Validation order: the first failing check decides, as in parse_ll.
	add("order/version-before-length", udpOpts(), withByte(withU32(valid, OffsetLength, 99), OffsetVersion, 9), StatusBadVersion)
	add("order/version-before-type", udpOpts(), withByte(withByte(valid, OffsetType, 0xee), OffsetVersion, 9), StatusBadVersion)
	add("order/length-before-type", udpOpts(), withByte(withU32(valid, OffsetLength, 99), OffsetType, 0xee), StatusBadLength)
	trunc, _ := buildFrame(udpOpts(), withByte(valid, OffsetVersion, 9))
	cs = append(cs, frameCase{name: "order/truncated-before-version", frame: trunc[:len(trunc)-len(valid)+HeaderLen-1], port: DefaultPort, want: StatusTruncated})
	o = udpOpts()
	o.udpLen = 7
	o.dport = 9
	add("order/udp-len-before-port", o, valid, StatusBadHeader)
	o.udpLen = 0xffff
	add("order/udp-past-frame-before-port", o, valid, StatusTruncated)
	o = udpOpts()
	o.fragOff = 0x2000
	o.udpLen = 3
	add("order/fragment-before-udp-len", o, valid, StatusNotLovelock)
	expect(Flow{Family: 4, Proto: protoUDP, Src: src4, Dst: dst4})

	// The UDP length delimits the datagram, which must lie within the
	// frame; the Lovelock checks run on its payload exactly as Decode.
	o = udpOpts()
	o.udpLen = 7
	add("udp-len-7", o, valid, StatusBadHeader)
	o.udpLen = 0
	add("udp-len-0", o, valid, StatusBadHeader)
	o.udpLen = udpHeaderLen
	add("udp-len-8", o, valid, StatusTruncated)
	o.udpLen = udpHeaderLen + HeaderLen - 1
	add("udp-len-no-room", o, valid, StatusTruncated)
	o.udpLen = udpHeaderLen + HeaderLen
	add("udp-len-header-only", o, valid, StatusBadLength)
	add("udp-len-header-only-length-0", o, withU32(valid, OffsetLength, 0), StatusOK)
	o.udpLen = udpHeaderLen + len(valid) + 1
	add("udp-len-past-frame", o, valid, StatusTruncated)
	add("udp-len-past-frame-length-agrees", o, withU32(valid, OffsetLength, 17), StatusTruncated)
	expect(flow4)
	o.udpLen = 0xffff
	add("udp-len-max-length-agrees", o, withU32(valid, OffsetLength, 0xffff-udpHeaderLen-HeaderLen), StatusTruncated)
	add("trailing-bytes-inside-udp-len", udpOpts(), append(llBytes(TypePong, 0, 0), 0, 0, 0, 0, 0, 0), StatusBadLength)
	o = udpOpts()
	o.udpLen = udpHeaderLen + HeaderLen
	add("ethernet-padding-after-udp-len", o, append(llBytes(TypePong, 0, 0), 0, 0, 0, 0, 0, 0), StatusOK)
	expect(withLL(flow4, TypePong))
	frame, _ = buildFrame(udpOpts(), valid[:HeaderLen-1])
	cs = append(cs, frameCase{name: "udp-len-agrees-header-cut", frame: frame, port: DefaultPort, want: StatusTruncated})
	o.udpLen = udpHeaderLen + HeaderLen - 1
	add("udp-len-no-room-padding", o, append(valid, make([]byte, 30)...), StatusTruncated)

	cs = append(cs, ipLengthCases(valid)...)
	cs = append(cs, gsoRunCases()...)

	// IPv4 corners.
	for _, ihl := range []int{0, 1, 4} {
		o := udpOpts()
		o.ihl = ihl
		add(fmt.Sprintf("ipv4-ihl-%d", ihl), o, valid, StatusBadHeader)
		expect(Flow{})
	}
	o = udpOpts()
	o.ihl = 15
	o.ipOpts = 0
	frame, _ = buildFrame(o, valid) // IHL 15 claims 60 bytes; the frame has 82
	cs = append(cs, frameCase{name: "ipv4-ihl-past-frame", frame: frame[:ethHeaderLen+59], port: DefaultPort, want: StatusTruncated, flow: &Flow{}})
	for _, c := range []struct {
		name string
		frag uint16
		want Status
	}{
		{"ipv4-first-fragment", 0x2000, StatusNotLovelock}, // MF, offset 0
		{"ipv4-later-fragment", 0x0001, StatusNotLovelock},
		{"ipv4-last-fragment", 0x0100, StatusNotLovelock}, // MF clear, offset set
		{"ipv4-max-offset", 0x1fff, StatusNotLovelock},
		{"ipv4-df", 0x4000, StatusOK},
		{"ipv4-evil-bit", 0x8000, StatusOK},
		{"ipv4-df-mf", 0x6000, StatusNotLovelock},
	} {
		o := udpOpts()
		o.fragOff = c.frag
		add(c.name, o, valid, c.want)
		if c.want == StatusNotLovelock {
			expect(Flow{Family: 4, Proto: protoUDP, Src: src4, Dst: dst4}) // no ports
		}
		// A fragment's ports are not looked at, so a cut TCP header does
		// not matter; in a whole datagram it does.
		o.proto = protoTCP
		want := StatusNotLovelock
		if c.want == StatusOK {
			want = StatusTruncated
		}
		add(c.name+"-tcp-cut", o, make([]byte, 4), want)
	}
	o = udpOpts()
	o.fragOff = 0x0001
	o.ipOpts = 2
	frame, _ = buildFrame(o, valid)
	cs = append(cs, frameCase{name: "ipv4-later-fragment-options-cut", frame: frame[:ethHeaderLen+ipv4MinLen+4], port: DefaultPort, want: StatusTruncated, flow: &Flow{}})
	for _, v := range []byte{0x65, 0x05, 0xf5} {
		frame, _ = buildFrame(udpOpts(), valid)
		frame[ethHeaderLen] = v
		cs = append(cs, frameCase{name: fmt.Sprintf("ipv4-version-%d", v>>4), frame: frame, port: DefaultPort, want: StatusBadHeader, flow: &Flow{}})
	}

	// IPv6 corners: extension headers are walked, at most four.
	for _, nh := range []uint8{59, 58, 1, 4} {
		o := v6()
		o.proto = nh
		add(fmt.Sprintf("ipv6-nexthdr-%d", nh), o, valid, StatusNotLovelock)
		expect(Flow{Family: 6, Proto: nh, Src: src6, Dst: dst6})
	}
	for _, v := range []byte{0x40, 0x00, 0x70} {
		frame, _ = buildFrame(v6(), valid)
		frame[ethHeaderLen] = v
		cs = append(cs, frameCase{name: fmt.Sprintf("ipv6-version-%d", v>>4), frame: frame, port: DefaultPort, want: StatusBadHeader, flow: &Flow{}})
	}
	for _, c := range []struct {
		name string
		ext  []ext6
		want Status
		// proto is the flow's protocol when it is not UDP: a fragment
		// stops the walk at its fragment header, whose next header it is.
		proto uint8
	}{
		{"ipv6-hop", []ext6{hop}, StatusOK, 0},
		{"ipv6-routing-2", []ext6{routing}, StatusOK, 0},
		{"ipv6-dstopts-max", []ext6{{kind: protoDstOpts, hdrLen: 30}}, StatusOK, 0},
		{"ipv6-ah-0", []ext6{{kind: protoAH}}, StatusOK, 0},
		{"ipv6-atomic-fragment", []ext6{atomicFrag}, StatusOK, 0},
		{"ipv6-fragment-m", []ext6{{kind: protoFragment, frag: 0x0001}}, StatusNotLovelock, 0},
		{"ipv6-fragment-offset", []ext6{{kind: protoFragment, frag: 0x0008}}, StatusNotLovelock, 0},
		{"ipv6-fragment-reserved-bits", []ext6{{kind: protoFragment, frag: 0x0006}}, StatusOK, 0},
		{"ipv6-fragment-then-dstopts", []ext6{{kind: protoFragment, frag: 0x0001}, dstOpts}, StatusNotLovelock, protoDstOpts},
		{"ipv6-ext-4", []ext6{hop, dstOpts, routing, ah}, StatusOK, 0},
		{"ipv6-ext-4-fragments", []ext6{atomicFrag, atomicFrag, atomicFrag, atomicFrag}, StatusOK, 0},
		{"ipv6-ext-5", []ext6{hop, dstOpts, routing, ah, dstOpts}, StatusBadHeader, 0},
		// The fragment header ends the walk before the limit is reached.
		{"ipv6-ext-5-fragment", []ext6{{kind: protoFragment, frag: 0x0001}, dstOpts, dstOpts, dstOpts, dstOpts}, StatusNotLovelock, protoDstOpts},
	} {
		add(c.name, v6(c.ext...), valid, c.want)
		switch c.want {
		case StatusOK:
			expect(withLL(flow6, TypePing))
		case StatusNotLovelock:
			proto := uint8(protoUDP)
			if c.proto != 0 {
				proto = c.proto
			}
			expect(Flow{Family: 6, Proto: proto, Src: src6, Dst: dst6})
		case StatusBadHeader:
			expect(Flow{Family: 6, Src: src6, Dst: dst6}) // no protocol: the walk failed
		}
		o := v6(c.ext...)
		o.proto = 59 // no next header
		want := StatusNotLovelock
		if c.want == StatusBadHeader {
			want = StatusBadHeader
		}
		add(c.name+"-none", o, valid, want)
	}
	// The first and a later fragment of one datagram whose fragment header
	// names an extension header next: the walk stops at the fragment
	// header, so both are NOT_LOVELOCK with that header's protocol and go
	// the same way (the later piece's data is never read as headers).
	o = v6(ext6{kind: protoFragment, frag: 0x0040})
	o.proto = protoDstOpts
	add("ipv6-later-fragment-dstopts", o, llBytes(TypePing, 0, 64), StatusNotLovelock)
	expect(Flow{Family: 6, Proto: protoDstOpts, Src: src6, Dst: dst6})
	add("ipv6-first-fragment-dstopts", v6(ext6{kind: protoFragment, frag: 0x0001}, ext6{kind: protoDstOpts}), llBytes(TypePing, 0, 64), StatusNotLovelock)
	expect(Flow{Family: 6, Proto: protoDstOpts, Src: src6, Dst: dst6})

	// A header cut inside an extension header: the flow has the addresses,
	// not the protocol.
	frame, _ = buildFrame(v6(hop, ext6{kind: protoRouting, hdrLen: 10}), valid)
	cs = append(cs, frameCase{name: "ipv6-ext-cut", frame: frame[:ethHeaderLen+ipv6HeaderLen+8+40], port: DefaultPort, want: StatusTruncated,
		flow: &Flow{Family: 6, Src: src6, Dst: dst6}})
	frame, _ = buildFrame(v6(ext6{kind: protoFragment}), valid)
	cs = append(cs, frameCase{name: "ipv6-fragment-cut", frame: frame[:ethHeaderLen+ipv6HeaderLen+7], port: DefaultPort, want: StatusTruncated})
	frame, _ = buildFrame(v6(ext6{kind: protoAH, hdrLen: 255}), valid)
	cs = append(cs, frameCase{name: "ipv6-ah-past-frame", frame: frame[:200], port: DefaultPort, want: StatusTruncated})

	// Layer 2 corners: not IP, no flow.
	o = udpOpts()
	o.etherType = 0x0806
	add("arp", o, make([]byte, 28), StatusNotLovelock)
	expect(Flow{})
	o.etherType = 0x88a8
	add("qinq-outer", o, valid, StatusNotLovelock)
	expect(Flow{})
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

// ipLengthCases are the fixtures of the IP length: it bounds the datagram
// (RFC 791 total length, RFC 8200 payload length; the kernel's ip_rcv and
// ip6_rcv trim the packet to it), so bytes after it are Ethernet padding and
// a UDP length past it is a short datagram the kernel drops (UdpInErrors,
// RFC 768). Under GSO (a TC hook's super-packets) a length of 0 means "to the
// end": BIG TCP writes IPv4 total length 0 and IPv6 payload length 0, UDP
// tunnels UDP length 0.
func ipLengthCases(valid []byte) []frameCase {
	var cs []frameCase
	add := func(name string, frame []byte, want Status, flow *Flow, gso uint16) {
		c := frameCase{name: name, frame: frame, port: DefaultPort, want: want, flow: flow, gso: gso}
		if want == StatusOK {
			c.off = len(frame) - len(valid)
		}
		cs = append(cs, c)
	}
	l3 := func(fam uint8, proto uint8) *Flow {
		if fam == 6 {
			return &Flow{Family: 6, Proto: proto, Src: src6, Dst: dst6}
		}
		return &Flow{Family: 4, Proto: proto, Src: src4, Dst: dst4}
	}
	ports := func(f *Flow, sport, dport uint16) *Flow {
		f.Sport, f.Dport = sport, dport
		return f
	}
	const (
		tot4  = ethHeaderLen + 2           // IPv4 total length
		plen6 = ethHeaderLen + 4           // IPv6 payload length
		ulen4 = ethHeaderLen + 20 + 4      // UDP length over IPv4 without options
		ulen6 = ethHeaderLen + 40 + 4      // UDP length over IPv6 without extension headers
		n4    = ethHeaderLen + 20 + 8 + 40 // the size of v4 below (valid is 40 bytes)
	)
	v4, _ := buildFrame(udpOpts(), valid)
	o := udpOpts()
	o.ipv6 = true
	v6, _ := buildFrame(o, valid)
	pad := make([]byte, 20)
	padded4 := append(append([]byte(nil), v4...), pad...)
	padded6 := append(append([]byte(nil), v6...), pad...)

	// Issue 10 (a), a real capture: IPv4 total length 28 (IP and UDP
	// header only), UDP length 32 with a Lovelock header after the IP
	// datagram. It was accepted and steered.
	add("issue10a-udp-past-ipv4-datagram",
		hexFrame("02000000000202000000000108004500001c00000000401100000a0000010a00000203e8f00000200000013000000000000100000000000000070000000000000000"),
		StatusTruncated, ports(l3(4, protoUDP), 1000, DefaultPort), 0)
	// The same over IPv6: payload length 8 (the UDP header), UDP length 48.
	add("udp-past-ipv6-datagram", withU16(v6, plen6, udpHeaderLen), StatusTruncated, &flow6, 0)
	// Issue 10 (b), a real capture: total length 19, below the 20-byte
	// header. Its ports were matched.
	add("issue10b-ipv4-total-below-header",
		hexFrame("02000000000202000000000108004500001300000000401100000a0000010a00000203e8003500080000"),
		StatusBadHeader, l3(4, protoUDP), 0)
	add("ipv4-total-0", withU16(v4, tot4, 0), StatusBadHeader, l3(4, protoUDP), 0)
	add("ipv4-total-past-frame", withU16(v4, tot4, n4-ethHeaderLen+1), StatusTruncated, l3(4, protoUDP), 0)
	add("ipv4-total-header-only", withU16(v4, tot4, 20), StatusTruncated, l3(4, protoUDP), 0)
	add("ipv4-total-udp-header-cut", withU16(v4, tot4, 27), StatusTruncated, l3(4, protoUDP), 0)
	f := *l3(4, protoTCP)
	o = udpOpts()
	o.proto = protoTCP
	tcp4, _ := buildFrame(o, make([]byte, 40))
	add("ipv4-tcp-header-past-datagram", withU16(tcp4, tot4, 20+tcpMinLen-1), StatusTruncated, &f, 0)
	add("ipv6-payload-past-frame", withU16(v6, plen6, udpHeaderLen+40+1), StatusTruncated, l3(6, 0), 0)
	add("ipv6-payload-0", withU16(v6, plen6, 0), StatusTruncated, l3(6, protoUDP), 0)
	o = udpOpts()
	o.ipv6, o.ext = true, []ext6{{kind: protoDstOpts, hdrLen: 1}}
	ext6, _ := buildFrame(o, valid)
	add("ipv6-ext-past-datagram", withU16(ext6, plen6, 15), StatusTruncated, l3(6, 0), 0)

	// Ethernet padding after the IP datagram is not the UDP datagram's.
	add("ipv4-padding-after-datagram", padded4, StatusOK, nil, 0)
	cs[len(cs)-1].off = len(v4) - len(valid)
	add("ipv6-padding-after-datagram", padded6, StatusOK, nil, 0)
	cs[len(cs)-1].off = len(v6) - len(valid)
	add("ipv4-udp-len-into-padding", withU16(padded4, ulen4, udpHeaderLen+40+1), StatusTruncated, &flow4, 0)
	add("ipv6-udp-len-into-padding", withU16(padded6, ulen6, udpHeaderLen+40+1), StatusTruncated, &flow6, 0)

	// GSO super-packets (issue 10 (c)): lengths of 0 run to the end of the
	// frame. The same frames outside GSO are malformed.
	big4 := withU16(v4, tot4, 0)
	add("gso-ipv4-total-0", big4, StatusOK, nil, 1448)
	cs[len(cs)-1].off = len(v4) - len(valid)
	tunnel := withU16(withU16(big4, ulen4, 0), ethHeaderLen+20+2, 4789) // VXLAN
	add("gso-ipv4-tunnel", tunnel, StatusNotLovelock, ports(l3(4, protoUDP), 40000, 4789), 1448)
	add("no-gso-ipv4-tunnel", tunnel, StatusBadHeader, l3(4, protoUDP), 0)
	bigTCP := withU16(tcp4, tot4, 0)
	add("gso-ipv4-big-tcp", bigTCP, StatusNotLovelock, ports(l3(4, protoTCP), 40000, DefaultPort), 1448)
	add("gso-ipv6-payload-0", withU16(v6, plen6, 0), StatusOK, nil, 1448)
	cs[len(cs)-1].off = len(v6) - len(valid)
	add("gso-ipv6-tunnel", withU16(withU16(withU16(v6, plen6, 0), ulen6, 0), ethHeaderLen+40+2, 4789), StatusNotLovelock,
		ports(l3(6, protoUDP), 40000, 4789), 1448)
	add("gso-udp-len-0", withU16(v4, ulen4, 0), StatusOK, nil, 1448)
	cs[len(cs)-1].off = len(v4) - len(valid)
	add("gso-udp-len-0-runs-to-ip-end", withU16(padded4, ulen4, 0), StatusOK, nil, 1448)
	cs[len(cs)-1].off = len(v4) - len(valid)
	// Lengths that are not 0 are checked as ever.
	add("gso-ipv4-total-below-header", withU16(v4, tot4, 19), StatusBadHeader, l3(4, protoUDP), 1448)
	add("gso-ipv4-total-past-frame", withU16(v4, tot4, n4-ethHeaderLen+1), StatusTruncated, l3(4, protoUDP), 1448)
	add("gso-udp-len-7", withU16(v4, ulen4, 7), StatusBadHeader, &flow4, 1448)
	add("gso-udp-past-datagram", withU16(v4, ulen4, udpHeaderLen+40+1), StatusTruncated, &flow4, 1448)
	return cs
}

// gsoRun is the UDP payload of a UDP GSO run as far memory's kernel sockets
// send it (udp.Options.GSO, UDP_SEGMENT): datagrams of segment bytes and a
// last one of last bytes, each a Lovelock ping with its own header, whose
// length is that datagram's payload less the header (a datagram too short
// for a header holds zeros).
func gsoRun(segment, n, last int) []byte {
	var run []byte
	for i := range n {
		size := segment
		if i == n-1 {
			size = last
		}
		if size < HeaderLen {
			run = append(run, make([]byte, size)...) // no room for a header
			continue
		}
		run = append(run, llBytes(TypePing, 0, size-HeaderLen)...)
	}
	return run
}

// gsoRunCases are the fixtures of UDP GSO runs: a TC hook sees a run as one
// GSO super-packet whose UDP length is the whole run's, with gso_size the
// datagrams' payload size, and checks the first datagram's Lovelock header
// against the first gso_size bytes of the payload, as the datagram will be
// once the kernel segments the run. Outside GSO (XDP: a run never reaches
// it) the same bytes are one datagram whose header length is wrong.
func gsoRunCases() []frameCase {
	var cs []frameCase
	add := func(name string, o frameOpts, udpPayload []byte, want Status, flow Flow, gso uint16) {
		frame, off := buildFrame(o, udpPayload)
		c := frameCase{name: name, frame: frame, port: DefaultPort, want: want, flow: &flow, gso: gso}
		if want == StatusOK {
			c.off = off
		}
		cs = append(cs, c)
	}
	v6 := udpOpts()
	v6.ipv6 = true
	run := gsoRun(100, 3, 60) // 100 + 100 + 60 bytes
	add("gso-udp-run", udpOpts(), run, StatusOK, withLL(flow4, TypePing), 100)
	add("gso-udp-run-ipv6", v6, run, StatusOK, withLL(flow6, TypePing), 100)
	add("gso-udp-run-last-full", udpOpts(), gsoRun(100, 3, 100), StatusOK, withLL(flow4, TypePing), 100)
	// Only the first datagram is checked: a last one too short for a
	// Lovelock header does not matter.
	add("gso-udp-run-last-1", udpOpts(), gsoRun(100, 3, 1), StatusOK, withLL(flow4, TypePing), 100)
	o := udpOpts()
	o.udpLen = 0 // a UDP length of 0 runs to the end of the IP datagram
	add("gso-udp-run-udp-len-0", o, run, StatusOK, withLL(flow4, TypePing), 100)
	// The run's payload is one segment or less: an ordinary datagram,
	// checked against its payload.
	add("gso-udp-run-one-segment", udpOpts(), gsoRun(100, 1, 100), StatusOK, withLL(flow4, TypePing), 100)
	add("gso-udp-run-below-segment", udpOpts(), gsoRun(100, 1, 60), StatusOK, withLL(flow4, TypePing), 100)
	// A run whose segment is not what its first header says.
	add("gso-udp-run-other-segment", udpOpts(), run, StatusBadLength, flow4, 101)
	add("gso-udp-run-other-segment-below", udpOpts(), run, StatusBadLength, flow4, 99)
	// A first header that claims the whole run, as if it were one
	// datagram: once segmented, its datagram holds a segment only.
	add("gso-udp-run-one-header", udpOpts(), withU32(run, OffsetLength, uint32(len(run)-HeaderLen)), StatusBadLength, flow4, 100)
	add("gso-udp-run-length-5", udpOpts(), withU32(run, OffsetLength, 5), StatusBadLength, flow4, 100)
	// Only the first header is checked.
	add("gso-udp-run-second-bad", udpOpts(), withU32(run, 100+OffsetLength, 5), StatusOK, withLL(flow4, TypePing), 100)
	// The first header's other checks run on the segment as ever.
	add("gso-udp-run-bad-version", udpOpts(), withByte(run, OffsetVersion, 2), StatusBadVersion, flow4, 100)
	add("gso-udp-run-unknown-type", udpOpts(), withByte(run, OffsetType, 0xff), StatusUnknownType, flow4, 100)
	// A segment shorter than the Lovelock header holds none.
	add("gso-udp-run-segment-below-header", udpOpts(), run, StatusTruncated, flow4, HeaderLen-1)
	add("gso-udp-run-segment-header-only", udpOpts(), run, StatusBadLength, flow4, HeaderLen)
	// The same run outside GSO: one datagram whose header says 76.
	add("no-gso-udp-run", udpOpts(), run, StatusBadLength, flow4, 0)
	return cs
}
