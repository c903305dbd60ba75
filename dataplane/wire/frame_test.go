package wire

import (
	"bytes"
	"errors"
	"testing"
)

// isSentinel reports whether err wraps one of the package's sentinels.
func isSentinel(err error) bool {
	for _, s := range []error{ErrShortBuffer, ErrBadVersion, ErrBadLength, ErrUnknownType, ErrBadHeader, ErrNotLovelock} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// TestParseFrame holds the Go frame parser to the verdicts and flows parse.h
// gives the fixtures; cside_test.go runs the same fixtures through the C
// parser.
func TestParseFrame(t *testing.T) {
	for _, c := range frameCases() {
		t.Run(c.name, func(t *testing.T) {
			fr, err := parseFrame(c.frame, c.port, c.gso)
			if got := StatusOf(err); got != c.want {
				t.Fatalf("status %v (%v), want %v", got, err, c.want)
			}
			if c.flow != nil && fr.Flow != *c.flow {
				t.Errorf("flow\n got %+v\nwant %+v", fr.Flow, *c.flow)
			}
			checkFlowInvariants(t, fr, err)
			if err != nil {
				if !isSentinel(err) {
					t.Errorf("error %v wraps no sentinel", err)
				}
				return
			}
			if fr.Offset != c.off {
				t.Errorf("offset %d, want %d", fr.Offset, c.off)
			}
			if got := fr.Header.append(nil); !bytes.Equal(got, c.frame[fr.Offset:fr.Offset+HeaderLen]) {
				t.Errorf("header re-encodes as % x, frame has % x", got, c.frame[fr.Offset:fr.Offset+HeaderLen])
			}
			// Success promises the payload is there.
			if end := fr.Offset + HeaderLen + int(fr.Header.Length); end > len(c.frame) {
				t.Errorf("payload ends at %d, past the %d-byte frame", end, len(c.frame))
			}
		})
	}
}

// checkFlowInvariants checks what ParseFrame promises of every result.
func checkFlowInvariants(t *testing.T, fr Frame, err error) {
	t.Helper()
	f := fr.Flow
	switch f.Family {
	case 0:
		if f != (Flow{}) {
			t.Errorf("non-IP flow has fields: %+v", f)
		}
	case 4:
		if !f.Src.Is4() || !f.Dst.Is4() {
			t.Errorf("IPv4 flow with addresses %v, %v", f.Src, f.Dst)
		}
	case 6:
		if !f.Src.Is6() || !f.Dst.Is6() {
			t.Errorf("IPv6 flow with addresses %v, %v", f.Src, f.Dst)
		}
	default:
		t.Errorf("family %d", f.Family)
	}
	if err != nil {
		if fr.Header != (Header{}) || fr.Offset != 0 || f.Type != 0 || f.Tenant != 0 || f.Rank != 0 {
			t.Errorf("failed parse (%v) returned Lovelock fields: %+v", err, fr)
		}
		return
	}
	if f.Type != fr.Header.Type || f.Tenant != fr.Header.Tenant || f.Rank != fr.Header.Dst || f.Proto != protoUDP {
		t.Errorf("flow %+v disagrees with header %+v", f, fr.Header)
	}
}

func TestParseFrameErrors(t *testing.T) {
	valid := llBytes(TypePing, 0, 16)
	frame, _ := buildFrame(udpOpts(), withU32(valid, OffsetLength, 3))
	cut, _ := buildFrame(udpOpts(), valid)
	o := udpOpts()
	o.ipv6, o.ext = true, []ext6{{kind: protoHopOpts}, {kind: protoHopOpts}, {kind: protoHopOpts}, {kind: protoHopOpts}, {kind: protoHopOpts}}
	ext5, _ := buildFrame(o, valid)
	for _, c := range []struct {
		frame []byte
		want  string
	}{
		{frame, "wire: frame: lovelock header claims 3 payload bytes, have 16: bad length"},
		{cut[:len(cut)-1], "wire: frame: ipv4 total length 68, frame has 67: short buffer"},
		{withU16(cut, ethHeaderLen+20+4, 49), "wire: frame: udp datagram of 49 bytes, ip datagram has 48: short buffer"},
		{withU16(cut, ethHeaderLen+2, 19), "wire: frame: ipv4 total length 19 below its header length 20: bad l3/l4 header"},
		{cut[:20], "wire: frame: ipv4 header needs 20 bytes, have 6: short buffer"},
		{ext5, "wire: frame: more than 4 ipv6 extension headers: bad l3/l4 header"},
	} {
		if _, err := ParseFrame(c.frame, DefaultPort); err == nil || err.Error() != c.want {
			t.Errorf("err = %v, want %q", err, c.want)
		}
	}
}

func TestParseFrameDoesNotAllocate(t *testing.T) {
	o := udpOpts()
	o.ipv6, o.ext = true, []ext6{{kind: protoHopOpts}, {kind: protoFragment}}
	frame, _ := buildFrame(o, llBytes(TypeBundle, 0, 64))
	if n := testing.AllocsPerRun(100, func() { _, _ = ParseFrame(frame, DefaultPort) }); n != 0 {
		t.Errorf("ParseFrame of a valid frame: %v allocs, want 0", n)
	}
}

// BenchmarkParseFrame measures the Go frame parser. wirelayer's
// BenchmarkParseFrame runs it against gopacket's DecodingLayerParser in the
// same run.
func BenchmarkParseFrame(b *testing.B) {
	o := udpOpts()
	o.vlan = true
	frame, _ := buildFrame(o, llBytes(TypeBundle, 0, 256))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseFrame(frame, DefaultPort); err != nil {
			b.Fatal(err)
		}
	}
}

// TestParseFrameBadLovelock checks Frame.BadLovelock: set exactly when the
// L3/L4 headers passed and the Lovelock header of a datagram to the port
// failed, with the flow's L3/L4 fields filled (the data plane classifies
// on them) and its Lovelock fields zero. cside_test.go holds the C
// parser's bad_ll to it on every fixture.
func TestParseFrameBadLovelock(t *testing.T) {
	valid := llBytes(TypePing, 0, 16)
	short := udpOpts()
	short.udpLen = udpHeaderLen + 4
	cutUDP := udpOpts()
	cutUDP.udpLen = udpHeaderLen + len(valid) + 1
	v6 := udpOpts()
	v6.ipv6 = true
	frame := func(o frameOpts, payload []byte) []byte { f, _ := buildFrame(o, payload); return f }
	for _, c := range []struct {
		name  string
		frame []byte
		want  Status
		bad   bool
	}{
		{"valid", frame(udpOpts(), valid), StatusOK, false},
		{"payload shorter than the header", frame(short, valid), StatusTruncated, true},
		{"dns-like payload", frame(udpOpts(), []byte{0x12, 0x34, 0x81, 0x80}), StatusTruncated, true},
		{"bad version", frame(udpOpts(), withByte(valid, OffsetVersion, 9)), StatusBadVersion, true},
		{"bad length", frame(udpOpts(), withU32(valid, OffsetLength, 3)), StatusBadLength, true},
		{"unknown type", frame(udpOpts(), withByte(valid, OffsetType, 0x7f)), StatusUnknownType, true},
		{"ipv6 bad version", frame(v6, withByte(valid, OffsetVersion, 9)), StatusBadVersion, true},
		{"udp datagram past the ip datagram", frame(cutUDP, valid), StatusTruncated, false},
		{"ip datagram past the frame", frame(udpOpts(), valid)[:60], StatusTruncated, false},
		{"another port", frame(func() frameOpts { o := udpOpts(); o.dport = 53; return o }(), valid[:4]), StatusNotLovelock, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			fr, err := ParseFrame(c.frame, DefaultPort)
			if got := StatusOf(err); got != c.want {
				t.Fatalf("status %v (%v), want %v", got, err, c.want)
			}
			if fr.BadLovelock != c.bad {
				t.Errorf("BadLovelock = %v, want %v", fr.BadLovelock, c.bad)
			}
			if !c.bad {
				return
			}
			f := fr.Flow
			if f.Proto != protoUDP || f.Sport != 40000 || f.Dport != DefaultPort || !f.Src.IsValid() || !f.Dst.IsValid() {
				t.Errorf("flow %+v: want its L3/L4 fields", f)
			}
			if f.Type != 0 || f.Tenant != 0 || f.Rank != 0 {
				t.Errorf("flow %+v: want no Lovelock fields", f)
			}
		})
	}
}
