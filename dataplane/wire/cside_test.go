package wire

// The Go/C agreement tests. TestCLayout compares struct layouts and needs
// nothing; the others load the data plane's C parser (bpf/include/parse.h,
// through bpf/wirecheck) and run frames through it with
// BPF_PROG_TEST_RUN, so they need root: testenv.RequirePriv skips them
// otherwise, or fails them under LOVELOCK_REQUIRE_PRIV=1.

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
	"unsafe"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/bpf/wirecheck"
	"github.com/lovelock-dpu/lovelock/control/testenv"
)

var (
	randomFrames = flag.Int("wire.frames", 25000, "mutated frames TestCParserRandom compares")
	randomSeed   = flag.Uint64("wire.seed", 0, "seed for TestCParserRandom (0: from the clock)")
)

// BPF_PROG_TEST_RUN rejects XDP data shorter than an Ethernet header with
// EINVAL, so shorter frames are left to TestParseFrame. Beyond one page less
// headroom and skb_shared_info (4096-256-320 = 3520 bytes on x86-64 and
// arm64 with 4 KiB pages) it puts the data into fragments the program cannot
// see. The parser now reads as far as the UDP length says (the datagram must
// lie within the linear data) and IPv6 extension headers may push the UDP
// header far in, so frames compared with the kernel stay within that linear
// limit, where the C parser sees what ParseFrame sees.
const (
	minTestRunLen = ethHeaderLen
	maxTestRunLen = 3520
)

func newChecker(tb testing.TB, port uint16) *wirecheck.Checker {
	tb.Helper()
	testenv.RequirePriv(tb)
	w, err := wirecheck.New(port)
	if err != nil {
		tb.Fatalf("wire checker: %v", err)
	}
	tb.Cleanup(func() { w.Close() })
	return w
}

// disagreement runs frame through the C parser and ParseFrame and describes
// how their results differ, or returns "" when they agree: same status, same
// flow key (as far as either parser got, for every status), the same say on
// whether only the Lovelock header was bad, and for a valid header the same
// offset and header bytes.
//
// gso, when not 0, runs frame as a GSO super-packet with that segment size
// through the TC program (wirecheck.Checker.CheckGSO) and ParseGSOFrame.
func disagreement(tb testing.TB, w *wirecheck.Checker, frame []byte, port, gso uint16) string {
	tb.Helper()
	res, err := check(w, frame, gso)
	if err != nil {
		tb.Fatalf("C parser on %d-byte frame: %v", len(frame), err)
	}
	fr, goErr := parseFrame(frame, port, gso)
	cs, gs := Status(res.Status), StatusOf(goErr)
	switch gk := cKey(fr.Flow); {
	case cs != gs:
		return fmt.Sprintf("C says %v, Go says %v (%v)", cs, gs, goErr)
	case res.Key != gk:
		return fmt.Sprintf("both say %v; C key %+v, Go key %+v", cs, res.Key, gk)
	case res.BadLovelock != fr.BadLovelock:
		return fmt.Sprintf("both say %v; C bad_ll %v, Go BadLovelock %v", cs, res.BadLovelock, fr.BadLovelock)
	case gs != StatusOK:
		return ""
	case int(res.Offset) != fr.Offset:
		return fmt.Sprintf("C finds the header at %d, Go at %d", res.Offset, fr.Offset)
	case !bytes.Equal(res.Header[:], fr.Header.append(nil)):
		return fmt.Sprintf("C header % x, Go header % x", res.Header, fr.Header.append(nil))
	case !bytes.Equal(res.Header[:], frame[fr.Offset:fr.Offset+HeaderLen]):
		return fmt.Sprintf("C header % x, frame has % x", res.Header, frame[fr.Offset:fr.Offset+HeaderLen])
	}
	return ""
}

// check runs frame through the C parser as XDP sees it, or for gso != 0 as
// TC sees a GSO super-packet.
func check(w *wirecheck.Checker, frame []byte, gso uint16) (wirecheck.Result, error) {
	if gso != 0 {
		return w.CheckGSO(frame, gso)
	}
	return w.Check(frame)
}

// cKey is f as the C parser lays out struct flow_key: ifindex 0 (the
// wirecheck program sets none), addresses in network order with IPv4 in the
// first four bytes, numbers in host order.
func cKey(f Flow) bpf.FlowKey {
	k := bpf.FlowKey{
		Family: f.Family, Proto: f.Proto, LlType: uint8(f.Type),
		Sport: f.Sport, Dport: f.Dport, Tenant: f.Tenant, Rank: f.Rank,
	}
	if f.Src.IsValid() {
		copy(k.Src[:], f.Src.AsSlice())
	}
	if f.Dst.IsValid() {
		copy(k.Dst[:], f.Dst.AsSlice())
	}
	return k
}

// TestCLayout checks struct ll_hdr, as bpf2go generated it from the
// object's BTF, against the Go encoder's size and offsets, and the C verdicts
// against Status.
func TestCLayout(t *testing.T) {
	var c wirecheck.Header
	if n := unsafe.Sizeof(c); n != HeaderLen {
		t.Errorf("sizeof(struct ll_hdr) = %d, HeaderLen = %d", n, HeaderLen)
	}
	fields := []struct {
		name         string
		cOff, goOff  uintptr
		cSize, goLen uintptr
	}{
		{"Version", unsafe.Offsetof(c.Version), OffsetVersion, unsafe.Sizeof(c.Version), 1},
		{"Type", unsafe.Offsetof(c.Type), OffsetType, unsafe.Sizeof(c.Type), 1},
		{"Flags", unsafe.Offsetof(c.Flags), OffsetFlags, unsafe.Sizeof(c.Flags), 2},
		{"Tenant", unsafe.Offsetof(c.Tenant), OffsetTenant, unsafe.Sizeof(c.Tenant), 4},
		{"Src", unsafe.Offsetof(c.Src), OffsetSrc, unsafe.Sizeof(c.Src), 4},
		{"Dst", unsafe.Offsetof(c.Dst), OffsetDst, unsafe.Sizeof(c.Dst), 4},
		{"Seq", unsafe.Offsetof(c.Seq), OffsetSeq, unsafe.Sizeof(c.Seq), 4},
		{"Length", unsafe.Offsetof(c.Length), OffsetLength, unsafe.Sizeof(c.Length), 4},
	}
	for _, f := range fields {
		if f.cOff != f.goOff || f.cSize != f.goLen {
			t.Errorf("%s: C offset %d size %d, Go offset %d size %d", f.name, f.cOff, f.cSize, f.goOff, f.goLen)
		}
	}
	// Every named field of the C struct is covered above.
	named := 0
	for f := range reflect.TypeFor[wirecheck.Header]().Fields() {
		if f.Name != "_" {
			named++
		}
	}
	if named != len(fields) {
		t.Errorf("struct ll_hdr has %d fields, the test knows %d", named, len(fields))
	}
	if unsafe.Sizeof(wirecheck.Result{}.Header) != HeaderLen {
		t.Errorf("wirecheck.Result.Header is %d bytes", unsafe.Sizeof(wirecheck.Result{}.Header))
	}
	for c, g := range map[wirecheck.Status]Status{
		wirecheck.OK: StatusOK, wirecheck.NotLovelock: StatusNotLovelock, wirecheck.Truncated: StatusTruncated,
		wirecheck.BadVersion: StatusBadVersion, wirecheck.BadLength: StatusBadLength, wirecheck.UnknownType: StatusUnknownType,
		wirecheck.BadHeader: StatusBadHeader,
	} {
		if uint32(c) != uint32(g) {
			t.Errorf("C status %d, Go %v = %d", c, g, g)
		}
	}
}

// TestCParserFixtures runs the fixture table through the C parser: each
// frame must get the verdict the table expects, and the same as ParseFrame.
func TestCParserFixtures(t *testing.T) {
	checkers := map[uint16]*wirecheck.Checker{}
	compared := 0
	for _, c := range frameCases() {
		if len(c.frame) < minTestRunLen {
			continue // the kernel will not run it; TestParseFrame covers Go
		}
		if len(c.frame) > maxTestRunLen {
			t.Fatalf("%s: %d-byte frame is too long for BPF_PROG_TEST_RUN", c.name, len(c.frame))
		}
		w := checkers[c.port]
		if w == nil {
			w = newChecker(t, c.port)
			checkers[c.port] = w
		}
		res, err := check(w, c.frame, c.gso)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := Status(res.Status); got != c.want {
			t.Errorf("%s: C says %v, want %v", c.name, got, c.want)
		} else if c.want == StatusOK && int(res.Offset) != c.off {
			t.Errorf("%s: C finds the header at %d, want %d", c.name, res.Offset, c.off)
		}
		if c.flow != nil && res.Key != cKey(*c.flow) {
			t.Errorf("%s: C key %+v, want %+v", c.name, res.Key, cKey(*c.flow))
		}
		if d := disagreement(t, w, c.frame, c.port, c.gso); d != "" {
			t.Errorf("%s: %s\nframe % x", c.name, d, c.frame)
		}
		compared++
	}
	t.Logf("%d fixture frames compared", compared)
}

// TestCParserRandom compares the parsers on mutated frames: valid frames of
// every encapsulation with one to four fields set to values chosen to hit
// each check's edges, random bytes overwritten, cut short or extended.
func TestCParserRandom(t *testing.T) {
	w := newChecker(t, DefaultPort)
	seed := *randomSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay with -wire.seed=%d)", seed, seed)
	r := rand.New(rand.NewPCG(seed, 0))

	var count [StatusBadHeader + 1]int
	start := time.Now()
	for i := range *randomFrames {
		frame := randomFrame(r)
		// One frame in eight as TC sees a GSO super-packet, where
		// lengths of 0 mean "to the end", half of them with a segment
		// size below most frames' UDP payload: a UDP GSO run, whose
		// first datagram's Lovelock header is checked.
		// (The kernel's TC test run refuses an IP ethertype without a
		// whole IP header after it, so short frames run as XDP only.)
		var gso uint16
		if len(frame) >= ethHeaderLen+ipv6HeaderLen && r.IntN(8) == 0 {
			gso = 1448
			if r.IntN(2) == 0 {
				gso = uint16(1 + r.IntN(2*HeaderLen+48))
			}
		}
		if d := disagreement(t, w, frame, DefaultPort, gso); d != "" {
			t.Fatalf("frame %d (gso %d): %s\nframe: %#v", i, gso, d, frame)
		}
		_, err := parseFrame(frame, DefaultPort, gso)
		count[StatusOf(err)]++
	}
	t.Logf("%d frames in %v, zero disagreements; by status:", *randomFrames, time.Since(start).Round(time.Millisecond))
	for s, n := range count {
		t.Logf("  %-13v %6d", Status(s), n)
	}
	// A generator that stopped reaching some verdict would make the
	// comparison hollow.
	if *randomFrames >= 20000 {
		for s, n := range count {
			if n < *randomFrames/200 {
				t.Errorf("only %d of %d frames got %v", n, *randomFrames, Status(s))
			}
		}
	}
}

// randomFrame builds a valid frame and mutates it.
func randomFrame(r *rand.Rand) []byte {
	o := udpOpts()
	o.vlan = r.IntN(4) == 0
	o.ipv6 = r.IntN(3) == 0
	if o.ipv6 && r.IntN(2) == 0 {
		o.ext = randomExt(r, 1+r.IntN(MaxIPv6ExtHeaders+1))
	}
	if !o.ipv6 && r.IntN(3) == 0 {
		o.ipOpts = 1 + r.IntN(10)
	}
	if r.IntN(10) == 0 {
		o.proto = protoTCP
	}
	n := r.IntN(48)
	if r.IntN(20) == 0 {
		n = r.IntN(1500)
	}
	types := Types()
	frame, off := buildFrame(o, llBytes(types[r.IntN(len(types))], Flags(r.Uint32()), n))
	for range 1 + r.IntN(4) {
		frame = mutate(r, frame, off)
	}
	if len(frame) < minTestRunLen {
		frame = frame[:minTestRunLen]
	}
	return frame[:min(len(frame), maxTestRunLen)]
}

// ipv6ExtKinds are the extension headers both parsers skip.
var ipv6ExtKinds = []uint8{protoHopOpts, protoRouting, protoDstOpts, protoAH, protoFragment}

// randomExt returns n extension headers of random kinds and small sizes;
// fragment headers get fragment fields at the edges of the check.
func randomExt(r *rand.Rand, n int) []ext6 {
	ext := make([]ext6, n)
	for i := range ext {
		ext[i] = ext6{kind: ipv6ExtKinds[r.IntN(len(ipv6ExtKinds))], hdrLen: uint8(r.IntN(4))}
		if ext[i].kind == protoFragment && r.IntN(2) == 0 {
			ext[i].frag = []uint16{1, 6, 8, 0xfff8, 0xffff, uint16(r.Uint32())}[r.IntN(6)]
		}
	}
	return ext
}

// mutate changes one field of frame, whose Lovelock header starts at off
// (so its UDP header at off-8 and its IP header at 14 or 18, and IPv6
// extension headers, if any, from the IP header's end to the UDP header).
func mutate(r *rand.Rand, frame []byte, off int) []byte {
	pick := func(vs ...int) int {
		if r.IntN(len(vs)+1) == 0 {
			return r.IntN(1 << 16)
		}
		return vs[r.IntN(len(vs))]
	}
	put8 := func(i, v int) {
		if i < len(frame) {
			frame[i] = byte(v)
		}
	}
	put16 := func(i, v int) {
		if i+2 <= len(frame) {
			binary.BigEndian.PutUint16(frame[i:], uint16(v))
		}
	}
	put32 := func(i int, v uint32) {
		if i+4 <= len(frame) {
			binary.BigEndian.PutUint32(frame[i:], v)
		}
	}
	l3 := ethHeaderLen
	if len(frame) >= ethHeaderLen && binary.BigEndian.Uint16(frame[12:]) == etherTypeVLAN {
		l3 += vlanHeaderLen
	}
	udp := off - udpHeaderLen
	udpLen := func() int {
		if udp+6 <= len(frame) {
			return int(binary.BigEndian.Uint16(frame[udp+4:]))
		}
		return 0
	}
	ethertypes := []int{etherTypeIPv4, etherTypeIPv6, etherTypeVLAN, 0x0806, 0x88a8}

	switch r.IntN(16) {
	case 0: // any byte
		if len(frame) > 0 {
			frame[r.IntN(len(frame))] = byte(r.Uint32())
		}
	case 1: // cut short, often inside the headers
		cut := r.IntN(len(frame) + 1)
		if r.IntN(2) == 0 {
			cut = min(len(frame), off-udpHeaderLen+r.IntN(udpHeaderLen+HeaderLen+1))
		}
		frame = frame[:cut]
	case 2:
		put16(12, pick(ethertypes...))
	case 3:
		put16(16, pick(ethertypes...))
	case 4: // IPv4 version and IHL
		put8(l3, 0x40|r.IntN(16))
	case 5: // IPv4 flags and fragment offset
		put16(l3+6, pick(0, 0x2000, 0x4000, 0x8000, 1, 0x1fff, 0x2001))
	case 6: // IPv4 protocol or IPv6 next header
		i := l3 + 9
		if len(frame) > l3 && frame[l3]>>4 == 6 {
			i = l3 + 6
		}
		put8(i, pick(protoUDP, 6, 0, 43, 44, 58))
	case 7:
		put16(udp+2, pick(DefaultPort, DefaultPort-1, DefaultPort+1, 0xf000^0x00ff))
	case 8: // UDP length around every boundary
		actual := len(frame) - udp
		put16(udp+4, pick(0, 1, 7, 8, 9, 31, 32, 33, actual, actual-1, actual+1, actual+100, 0xffff))
	case 9:
		put8(off+OffsetVersion, pick(0, 1, 1, 2, 0xff))
	case 10:
		put8(off+OffsetType, pick(0, 3, 0x13, 0x23, 0x30, 0x31, 0x01, 0xff))
	case 11: // Lovelock length around the right value
		want := udpLen() - udpHeaderLen - HeaderLen
		put32(off+OffsetLength, uint32(pick(want, want-1, want+1, 0, -1, 1<<16)))
	case 12: // trailing bytes, as Ethernet padding
		for range 1 + r.IntN(32) {
			frame = append(frame, byte(r.Uint32()))
		}
	case 13: // make the Lovelock length agree with the UDP length again
		put32(off+OffsetLength, uint32(udpLen()-udpHeaderLen-HeaderLen))
	case 15: // the IPv4 total length or IPv6 payload length around every boundary
		if len(frame) > l3 && frame[l3]>>4 == 6 {
			actual := len(frame) - l3 - ipv6HeaderLen
			put16(l3+4, pick(0, actual, actual-1, actual+1, udp-l3-ipv6HeaderLen+udpHeaderLen-1, 0xffff))
		} else {
			actual := len(frame) - l3
			put16(l3+2, pick(0, actual, actual-1, actual+1, 19, 20, udp-l3+udpHeaderLen-1, 0xffff))
		}
	case 14: // a byte of the IPv6 extension headers, or the first next header
		if ext := l3 + ipv6HeaderLen; udp > ext && len(frame) > l3 && frame[l3]>>4 == 6 {
			i := ext + r.IntN(udp-ext)
			if r.IntN(2) == 0 {
				put8(i, pick(protoHopOpts, protoRouting, protoDstOpts, protoAH, protoFragment, protoUDP, protoTCP, 59))
			} else {
				put8(i, r.IntN(256))
			}
		} else {
			put8(l3+6, pick(protoHopOpts, protoRouting, protoDstOpts, protoAH, protoFragment))
		}
	}
	return frame
}

// FuzzFrame builds Ethernet frames from its arguments, mutated by the fuzzer,
// and checks that the C parser and ParseFrame agree on each. With mode bit 2
// set, udpPayload is used as the whole frame instead. For IPv4, ipOpts gives
// option words or (bit 7) a raw IHL; for IPv6 its low three bits give a
// number of extension headers and the rest their kinds, with fragOff as the
// fragment headers' field. The seed corpus is in testdata/fuzz/FuzzFrame.
func FuzzFrame(f *testing.F) {
	w := newChecker(f, DefaultPort)
	f.Add(byte(0), byte(0), byte(protoUDP), uint16(0), uint16(DefaultPort), int16(0), uint16(0), llBytes(TypePing, 0, 4))
	f.Fuzz(func(t *testing.T, mode, ipOpts, proto byte, fragOff, dport uint16, udpLenDelta int16, cut uint16, udpPayload []byte) {
		frame := udpPayload
		if mode&4 == 0 {
			o := udpOpts()
			o.vlan = mode&1 != 0
			o.ipv6 = mode&2 != 0
			if mode&8 != 0 {
				o.etherType = 0x0806
			}
			switch {
			case o.ipv6:
				o.ext = fuzzExt(ipOpts, fragOff)
			case ipOpts&0x80 != 0:
				o.ihl = int(ipOpts & 0x0f) // a raw IHL, options not added
			default:
				o.ipOpts = int(ipOpts) % 11
			}
			o.proto, o.fragOff, o.dport = proto, fragOff, dport
			o.udpLen = int(uint16(udpHeaderLen + len(udpPayload) + int(udpLenDelta)))
			frame, _ = buildFrame(o, udpPayload)
			frame = frame[:len(frame)-int(cut)%(len(frame)+1)]
		}
		if len(frame) < minTestRunLen || len(frame) > maxTestRunLen {
			return
		}
		if d := disagreement(t, w, frame, DefaultPort, 0); d != "" {
			t.Fatalf("%s\nframe % x", d, frame)
		}
	})
}

// fuzzExt derives up to seven IPv6 extension headers from one byte: the
// count in bits 0-2, the kinds from bits 3-7. Header i has length byte i.
func fuzzExt(b byte, frag uint16) []ext6 {
	ext := make([]ext6, b&7)
	for i := range ext {
		ext[i] = ext6{kind: ipv6ExtKinds[(int(b>>3)+i*(1+int(b>>6)))%len(ipv6ExtKinds)], hdrLen: uint8(i), frag: frag}
	}
	return ext
}
