package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
)

func TestAppendToLayout(t *testing.T) {
	h := Header{
		Version: Version, Type: TypeMemWrite, Flags: FlagAckReq | 0x8000,
		Tenant: 0x01020304, Src: 0x05060708, Dst: 0x090a0b0c, Seq: 0x0d0e0f10,
		Length: 999, // ignored: AppendTo writes len(payload)
	}
	got := h.AppendTo([]byte{0xaa}, []byte{0xbb, 0xcc})
	want := []byte{
		0xaa, // the prefix AppendTo appends to
		0x01, 0x11, 0x80, 0x01,
		0x01, 0x02, 0x03, 0x04,
		0x05, 0x06, 0x07, 0x08,
		0x09, 0x0a, 0x0b, 0x0c,
		0x0d, 0x0e, 0x0f, 0x10,
		0x00, 0x00, 0x00, 0x02,
		0xbb, 0xcc,
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("AppendTo:\n got % x\nwant % x", got, want)
	}
	// The offset constants name the bytes AppendTo wrote.
	b := got[1:]
	for _, f := range []struct {
		name string
		off  int
		want uint32
	}{
		{"Tenant", OffsetTenant, h.Tenant}, {"Src", OffsetSrc, h.Src}, {"Dst", OffsetDst, h.Dst},
		{"Seq", OffsetSeq, h.Seq}, {"Length", OffsetLength, 2},
	} {
		if v := binary.BigEndian.Uint32(b[f.off:]); v != f.want {
			t.Errorf("%s at %d = %#x, want %#x", f.name, f.off, v, f.want)
		}
	}
	if b[OffsetVersion] != Version || Type(b[OffsetType]) != h.Type || Flags(binary.BigEndian.Uint16(b[OffsetFlags:])) != h.Flags {
		t.Errorf("version/type/flags bytes % x", b[:4])
	}
}

func TestDecode(t *testing.T) {
	valid := llBytes(TypeIngestInput, FlagMore|0x0100, 5)
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"ok", valid, nil},
		{"ok-empty-payload", llBytes(TypePing, 0, 0), nil},
		{"nil", nil, ErrShortBuffer},
		{"one-byte", []byte{1}, ErrShortBuffer},
		{"header-minus-one", valid[:HeaderLen-1], ErrShortBuffer},
		{"bad-version-0", withByte(valid, OffsetVersion, 0), ErrBadVersion},
		{"bad-version-2", withByte(valid, OffsetVersion, 2), ErrBadVersion},
		{"length-short", withU32(valid, OffsetLength, 4), ErrBadLength},
		{"length-long", withU32(valid, OffsetLength, 6), ErrBadLength},
		{"length-huge", withU32(valid, OffsetLength, 0xffffffff), ErrBadLength},
		{"payload-cut", valid[:len(valid)-1], ErrBadLength},
		{"unknown-type", withByte(valid, OffsetType, 0x7f), ErrUnknownType},
		{"version-before-length", withU32(withByte(valid, OffsetVersion, 3), OffsetLength, 0), ErrBadVersion},
		{"length-before-type", withU32(withByte(valid, OffsetType, 0), OffsetLength, 0), ErrBadLength},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, payload, err := Decode(tt.in)
			if !errors.Is(err, tt.want) || (err == nil) != (tt.want == nil) {
				t.Fatalf("Decode: err = %v, want %v", err, tt.want)
			}
			if err != nil {
				if h != (Header{}) || payload != nil {
					t.Errorf("Decode failed but returned %+v, % x", h, payload)
				}
				return
			}
			if got := h.AppendTo(nil, payload); !bytes.Equal(got, tt.in) {
				t.Errorf("re-encoded:\n got % x\nwant % x", got, tt.in)
			}
		})
	}
}

func TestDecodeFields(t *testing.T) {
	in := Header{Version: Version, Type: TypeMemRead, Flags: FlagRetransmit | 0x4000, Tenant: 9, Src: 1, Dst: 2, Seq: 1 << 31}
	h, payload, err := Decode(in.AppendTo(nil, []byte("page")))
	if err != nil {
		t.Fatal(err)
	}
	in.Length = 4
	if h != in || string(payload) != "page" {
		t.Errorf("Decode = %+v, %q; want %+v, %q", h, payload, in, "page")
	}
}

func TestDecodeErrorMessage(t *testing.T) {
	_, _, err := Decode(withU32(llBytes(TypePing, 0, 3), OffsetLength, 10))
	const want = "wire: header claims 10 payload bytes, have 3: bad length"
	if err == nil || err.Error() != want {
		t.Errorf("err = %v, want %q", err, want)
	}
}

func TestStatusOf(t *testing.T) {
	tests := []struct {
		err  error
		want Status
	}{
		{nil, StatusOK},
		{ErrNotLovelock, StatusNotLovelock},
		{fmt.Errorf("ctx: %w", ErrShortBuffer), StatusTruncated},
		{fmt.Errorf("ctx: %w", ErrBadVersion), StatusBadVersion},
		{fmt.Errorf("ctx: %w", ErrBadLength), StatusBadLength},
		{fmt.Errorf("ctx: %w", ErrUnknownType), StatusUnknownType},
		{fmt.Errorf("ctx: %w", ErrBadHeader), StatusBadHeader},
		{errors.New("something else"), StatusNotLovelock},
	}
	for _, tt := range tests {
		if got := StatusOf(tt.err); got != tt.want {
			t.Errorf("StatusOf(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
	// The values are the C enum's (enum ll_status in bpf/include/parse.h).
	for s, want := range map[Status]uint32{StatusOK: 0, StatusNotLovelock: 1, StatusTruncated: 2, StatusBadVersion: 3, StatusBadLength: 4, StatusUnknownType: 5, StatusBadHeader: 6} {
		if uint32(s) != want {
			t.Errorf("%v = %d, want %d", s, s, want)
		}
	}
	if s := Status(9).String(); s != "status(9)" {
		t.Errorf("Status(9) = %q", s)
	}
	for s := range StatusBadHeader + 1 {
		if want := s != StatusOK && s != StatusNotLovelock; s.Malformed() != want {
			t.Errorf("%v.Malformed() = %v", s, !want)
		}
	}
}

func TestTypeAndFlagsString(t *testing.T) {
	names := map[string]bool{}
	for _, ty := range Types() {
		if !ty.Known() {
			t.Errorf("%v not Known", ty)
		}
		names[ty.String()] = true
	}
	if len(names) != len(Types()) {
		t.Errorf("type names not unique: %v", names)
	}
	known := 0
	for v := range 256 {
		if Type(v).Known() {
			known++
		}
	}
	if known != len(Types()) {
		t.Errorf("%d known types, Types() lists %d", known, len(Types()))
	}
	if s := Type(0x7f).String(); s != "type(0x7f)" {
		t.Errorf("Type(0x7f) = %q", s)
	}
	for f, want := range map[Flags]string{
		0:                             "0",
		FlagAckReq:                    "ack-req",
		FlagAckReq | FlagRetransmit:   "ack-req|retransmit",
		FlagMore | 0x8010:             "more|0x8010",
		0xfff8:                        "0xfff8",
		FlagAckReq | FlagMore | 0x100: "ack-req|more|0x100",
	} {
		if got := f.String(); got != want {
			t.Errorf("Flags(%#x) = %q, want %q", uint16(f), got, want)
		}
	}
}

// BenchmarkDecode measures Decode against a baseline in the same run:
// encoding/binary.Read into a struct of the same layout, with no validation.
func BenchmarkDecode(b *testing.B) {
	pkt := llBytes(TypeBundle, FlagAckReq, 256)
	b.Run("wire", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(HeaderLen)
		for b.Loop() {
			if _, _, err := Decode(pkt); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("baseline=binary.Read", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(HeaderLen)
		var raw struct {
			Version, Type               uint8
			Flags                       uint16
			Tenant, Src, Dst, Seq, Size uint32
		}
		for b.Loop() {
			if err := binary.Read(bytes.NewReader(pkt), binary.BigEndian, &raw); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkEncode appends header and payload into a reused buffer, which must
// not allocate, against a baseline copy of the same bytes.
func BenchmarkEncode(b *testing.B) {
	h := Header{Version: Version, Type: TypeBundle, Flags: FlagAckReq, Tenant: 1, Src: 2, Dst: 3, Seq: 4}
	payload := make([]byte, 256)
	buf := make([]byte, 0, 2048)
	b.Run("wire", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(HeaderLen + len(payload)))
		for b.Loop() {
			buf = h.AppendTo(buf[:0], payload)
		}
	})
	pkt := h.AppendTo(nil, payload)
	b.Run("baseline=copy", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(pkt)))
		for b.Loop() {
			buf = append(buf[:0], pkt...)
		}
	})
}

func TestEncodeDoesNotAllocate(t *testing.T) {
	h := Header{Version: Version, Type: TypePing}
	payload := make([]byte, 64)
	buf := make([]byte, 0, 512)
	if n := testing.AllocsPerRun(100, func() { buf = h.AppendTo(buf[:0], payload) }); n != 0 {
		t.Errorf("AppendTo into a reused buffer: %v allocs, want 0", n)
	}
	pkt := h.AppendTo(nil, payload)
	if n := testing.AllocsPerRun(100, func() { _, _, _ = Decode(pkt) }); n != 0 {
		t.Errorf("Decode of a valid header: %v allocs, want 0", n)
	}
}
