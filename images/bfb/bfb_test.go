package bfb

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
)

// golden is a stream computed independently (a few lines of Python packing
// the header words as mlx-mkbfb does) for boot-args v0 "abc", boot-args v2
// "xy" and image "0123456789".
const golden = "426602132120303b03000000745f2aeb00000000000000486162630000000000" +
	"426602132100323b02000000b4c0676300000000000000407879000000000000" +
	"426602132100303e0a0000007f688892000000000000000030313233343536373839000000000000"

func goldenImages() []Image {
	return []Image{
		{ID: IDBootArgs, Version: 0, Data: []byte("abc")},
		{ID: IDBootArgs, Version: 2, Data: []byte("xy")},
		{ID: IDImage, Data: []byte("0123456789")},
	}
}

func TestWriteGolden(t *testing.T) {
	got, err := Marshal(goldenImages())
	if err != nil {
		t.Fatal(err)
	}
	if h := hex.EncodeToString(got); h != golden {
		t.Fatalf("stream differs from the golden vector\n got %s\nwant %s", h, golden)
	}
	if int64(len(got)) != Size(goldenImages()) {
		t.Fatalf("Size = %d, stream has %d bytes", Size(goldenImages()), len(got))
	}
}

func TestHeaderFields(t *testing.T) {
	b, _ := hex.DecodeString(golden)
	h, err := ParseHeader(b)
	if err != nil {
		t.Fatal(err)
	}
	want := Header{Major: 1, Minor: 2, ID: IDBootArgs, Version: 0, NextVersion: 2, Length: 3,
		CRC: 0xeb2a5f74, Following: 1<<IDBootArgs | 1<<IDImage}
	if h != want {
		t.Fatalf("header\n got %+v\nwant %+v", h, want)
	}
	again, err := h.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, b[:HeaderLen]) {
		t.Fatalf("re-encoded header %x, want %x", again, b[:HeaderLen])
	}
}

func TestRoundTrip(t *testing.T) {
	big := bytes.Repeat([]byte{0xa5, 0x5a, 0x01}, 100_003)
	tests := []struct {
		name   string
		images []Image
	}{
		{"golden", goldenImages()},
		{"one empty image", []Image{{ID: IDInfo}}},
		{"lengths 0-9", func() []Image {
			var out []Image
			for n := range 10 {
				out = append(out, Image{ID: ID(50 + n), Data: bytes.Repeat([]byte{byte(n)}, n)})
			}
			return out
		}()},
		{"os stream", OS{Kernel: big, Initramfs: big[:77], Description: "d", ArgsBF2: "a", ArgsBF3: "b"}.Images()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stream, err := Marshal(tt.images)
			if err != nil {
				t.Fatal(err)
			}
			if len(stream)%8 != 0 {
				t.Fatalf("stream length %d is not a multiple of 8", len(stream))
			}
			got, err := ReadValid(bytes.NewReader(stream))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.images) {
				t.Fatalf("read %d images, wrote %d", len(got), len(tt.images))
			}
			for i := range got {
				w := tt.images[i]
				if got[i].ID != w.ID || got[i].Version != w.Version || !bytes.Equal(got[i].Data, w.Data) || !got[i].CRCOK {
					t.Fatalf("image %d: got %s v%d %d bytes crc ok %v, want %s v%d %d bytes",
						i, got[i].ID, got[i].Version, len(got[i].Data), got[i].CRCOK, w.ID, w.Version, len(w.Data))
				}
			}
			last := got[len(got)-1].Header
			if last.Following != 0 || last.NextVersion != 0 {
				t.Fatalf("last header: following %#x next version %d, want 0 and 0", last.Following, last.NextVersion)
			}
			again, err := Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again, stream) {
				t.Fatal("writing what was read changed the stream")
			}
		})
	}
}

func TestCorruptCRCRejected(t *testing.T) {
	stream, _ := hex.DecodeString(golden)
	// Flip a bit of the second image's data ("xy" at 32+24).
	stream[32+24] ^= 0x01
	images, err := Read(bytes.NewReader(stream))
	if err != nil {
		t.Fatalf("Read must report CRC per image, not fail: %v", err)
	}
	if !images[0].CRCOK || images[1].CRCOK || !images[2].CRCOK {
		t.Fatalf("CRC status = %v %v %v, want true false true", images[0].CRCOK, images[1].CRCOK, images[2].CRCOK)
	}
	if err := Validate(images); !errors.Is(err, ErrCRC) {
		t.Fatalf("Validate = %v, want ErrCRC", err)
	}
	if _, err := ReadValid(bytes.NewReader(stream)); !errors.Is(err, ErrCRC) {
		t.Fatalf("ReadValid = %v, want ErrCRC", err)
	}

	// Padding is covered by the CRC too.
	stream, _ = hex.DecodeString(golden)
	stream[24+3] = 1 // first padding byte after "abc"
	if _, err := ReadValid(bytes.NewReader(stream)); !errors.Is(err, ErrCRC) {
		t.Fatalf("non-zero padding: ReadValid = %v, want ErrCRC", err)
	}
}

func TestTruncatedRejected(t *testing.T) {
	stream, _ := hex.DecodeString(golden)
	for _, n := range []int{1, 8, 23, 24 + 2, 32, 32 + 10, len(stream) - 1, len(stream) - 20} {
		if _, err := Read(bytes.NewReader(stream[:n])); !errors.Is(err, ErrTruncated) {
			t.Errorf("first %d of %d bytes: err = %v, want ErrTruncated", n, len(stream), err)
		}
	}
	if _, err := Read(bytes.NewReader(nil)); !errors.Is(err, ErrEmpty) {
		t.Errorf("empty stream: err = %v, want ErrEmpty", err)
	}
}

func TestBadHeaderRejected(t *testing.T) {
	tests := []struct {
		name string
		mod  func(b []byte)
		want error
	}{
		{"magic", func(b []byte) { b[0] ^= 0xff }, ErrBadMagic},
		{"major 2", func(b []byte) { b[4] = b[4]&0xf0 | 2 }, ErrVersion},
		{"minor 3", func(b []byte) { b[4] = b[4]&0x0f | 3<<4 }, ErrVersion},
		{"header length 4 words", func(b []byte) { b[6] = b[6]&0x0f | 4<<4 }, ErrVersion},
		{"trailing garbage", nil, ErrBadMagic},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stream, _ := hex.DecodeString(golden)
			if tt.mod != nil {
				tt.mod(stream)
			} else {
				stream = append(stream, bytes.Repeat([]byte{0xee}, HeaderLen)...)
			}
			if _, err := Read(bytes.NewReader(stream)); !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestBitmapChecked(t *testing.T) {
	// Concatenating two streams leaves the first one's last header saying
	// nothing follows: the firmware would stop there.
	cat := append(must(Marshal(goldenImages()[:1])), must(Marshal(goldenImages()[2:]))...)
	images, err := Read(bytes.NewReader(cat))
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(images); !errors.Is(err, ErrBitmap) {
		t.Fatalf("concatenated streams: Validate = %v, want ErrBitmap", err)
	}
}

func TestMerge(t *testing.T) {
	firmware := []Image{
		{ID: IDBL2, Data: []byte("bl2")},
		{ID: IDBL31, Data: []byte("bl31")},
		{ID: IDBL33, Data: []byte("uefi")},
		{ID: IDBootArgs, Version: 1, Data: []byte("firmware args")},
		{ID: IDCapsule, Data: []byte("capsule")},
		{ID: 200, Data: []byte("unknown")},
	}
	osImages := OS{Kernel: []byte("k"), Initramfs: []byte("i"), Description: "d", ArgsBF2: "a2", ArgsBF3: "a3"}.Images()
	got := Merge(firmware, osImages)
	var names []string
	for _, img := range got {
		names = append(names, img.ID.String()+"-v"+string('0'+rune(img.Version)))
	}
	want := []string{"bl2-v0", "bl31-v0", "bl33-v0", "capsule-v0", "boot-desc-v0", "boot-path-v0",
		"boot-args-v0", "boot-args-v2", "image-v0", "initramfs-v0", "id-200-v0"}
	if len(names) != len(want) {
		t.Fatalf("merged = %v, want %v", names, want)
	}
	for i := range want {
		if names[i] != want[i] {
			t.Fatalf("merged = %v, want %v", names, want)
		}
	}
	if !HasFirmware(got) || HasFirmware(osImages) {
		t.Fatal("HasFirmware wrong")
	}
	stream := must(Marshal(got))
	if _, err := ReadValid(bytes.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
}

func TestIDNames(t *testing.T) {
	for id, name := range map[ID]string{62: "image", 63: "initramfs", 59: "boot-args", 58: "boot-path",
		57: "boot-desc", 52: "capsule", 50: "info", 1: "bl2", 99: "id-99"} {
		if id.String() != name {
			t.Errorf("ID(%d) = %q, want %q", id, id.String(), name)
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestLovelockVersion(t *testing.T) {
	for _, tc := range []struct {
		desc, want string
		ok         bool
	}{
		{LovelockDescription("v1.2-3-gabc-dirty"), "v1.2-3-gabc-dirty", true},
		{LovelockDescription("dev") + "\x00\x00", "dev", true},
		{"DOCA BlueField OS", "", false},
		{"Lovelock  from rshim", "", false},
		{"Lovelock v1 from eMMC", "", false},
	} {
		if got, ok := LovelockVersion(tc.desc); got != tc.want || ok != tc.ok {
			t.Errorf("LovelockVersion(%q) = %q, %v; want %q, %v", tc.desc, got, ok, tc.want, tc.ok)
		}
	}
}
