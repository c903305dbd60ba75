// Package bfb owns BlueField boot streams (.bfb): the format that NVIDIA's
// BlueField DPUs boot from when a stream is pushed into the rshim boot device.
// It writes, merges, reads and validates streams; it knows nothing about
// what the images inside mean beyond their IDs.
//
// A stream is a sequence of images, each a 24-byte header, the image data, and
// zero padding to a multiple of 8 bytes. The header is three little-endian
// 64-bit words, as written by NVIDIA's open-source mlx-mkbfb (bfscripts):
//
//	w0  bits  0-31  magic 0x13026642
//	    bits 32-35  major version (1)
//	    bits 36-39  minor version (2)
//	    bits 44-47  version of the next image with the same ID (0: none)
//	    bits 48-51  this image's version
//	    bits 52-55  header length in 8-byte words (3)
//	    bits 56-63  image ID
//	w1  bits  0-31  data length in bytes, padding excluded
//	    bits 32-63  CRC-32 (IEEE) over data and padding
//	w2  bitmap of the IDs of the images still to come (the last image has 0)
package bfb

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
)

// Format constants.
const (
	// Magic is the low word of every header ("Bf^B^S").
	Magic = 0x13026642
	// HeaderLen is the length of a header in bytes.
	HeaderLen = 24
	// MajorVersion and MinorVersion are the format version this package
	// writes; it reads minor versions up to MinorVersion.
	MajorVersion = 1
	MinorVersion = 2
	// MaxImageVersion is the highest per-image version mlx-mkbfb accepts.
	MaxImageVersion = 2
)

// Errors that callers test for. Errors returned by this package wrap them.
var (
	ErrBadMagic  = errors.New("bad magic")
	ErrVersion   = errors.New("unsupported header version")
	ErrTruncated = errors.New("stream truncated")
	ErrCRC       = errors.New("CRC mismatch")
	ErrBitmap    = errors.New("following-images bitmap inconsistent")
	ErrEmpty     = errors.New("stream holds no image")
)

// ID identifies what an image is to the card's firmware. The values are
// those of mlx-mkbfb's image table (ATF's tbbr IDs and UEFI's BfbFs IDs).
type ID uint8

// Image IDs the Lovelock image uses or that inspect names. The full table is
// in ids.
const (
	IDBL2       ID = 1  // ATF BL2: present in every firmware stream
	IDBL31      ID = 3  // ATF BL31
	IDBL33      ID = 5  // UEFI
	IDInfo      ID = 50 // free-form description of the stream
	IDCapsule   ID = 52 // UEFI capsule (firmware update)
	IDRamdisk   ID = 54 // RAM disk image
	IDBootACPI  ID = 55 // name of the ACPI table
	IDBootDTB   ID = 56 // name of the device tree
	IDBootDesc  ID = 57 // boot menu description of the OS entry
	IDBootPath  ID = 58 // UEFI device path of the kernel
	IDBootArgs  ID = 59 // kernel command line (version 0: BF1/BF2, version 2: BF3)
	IDTimeout   ID = 60 // boot menu timeout
	IDUEFITests ID = 61 // UEFI self-tests to run
	IDImage     ID = 62 // the kernel: an uncompressed arm64 Image
	IDInitramfs ID = 63 // the initramfs
)

// ids is mlx-mkbfb's image table, in the order it emits images.
var ids = []struct {
	id   ID
	name string
	desc string
}{
	{36, "psc-bl", "PSC bootloader image"},
	{37, "psc-fw", "PSC framework image"},
	{31, "bl2r-cert", "RIoT Core (BL2R) content certificate"},
	{30, "bl2r", "RIoT Core (BL2R) bin"},
	{6, "bl2-cert", "Trusted Boot Firmware BL2 certificate"},
	{1, "bl2", "Trusted Boot Firmware BL2 bin"},
	{29, "sys", "Running system's part number or PSID"},
	{38, "ddr-cert", "DDR Images Content Certificate"},
	{32, "ddr_ini", "DDR (pseudo SPD) parameters"},
	{33, "snps_images", "Combined SNPS images for all DIMM types"},
	{34, "ddr_ate_imem", "Analog Test Engine instructions"},
	{35, "ddr_ate_dmem", "Analog Test Engine data"},
	{8, "bl30-key-cert", "SCP Firmware BL3-0 key certificate"},
	{12, "bl30-cert", "SCP Firmware BL3-0 certificate"},
	{2, "bl30", "SCP Firmware BL3-0"},
	{7, "trusted-key-cert", "Trusted key certificate"},
	{9, "bl31-key-cert", "EL3 Runtime Firmware BL3-1 key certificate"},
	{13, "bl31-cert", "EL3 Runtime Firmware BL3-1 content certificate"},
	{3, "bl31", "EL3 Runtime Firmware BL3-1 bin"},
	{39, "psc-app", "PSC application image"},
	{10, "bl32-key-cert", "Secure Payload BL3-2 key certificate"},
	{14, "bl32-cert", "Secure Payload BL3-2 content certificate"},
	{4, "bl32", "Secure Payload BL3-2 bin"},
	{11, "bl33-key-cert", "Non-Trusted Firmware BL3-3 key certificate"},
	{15, "bl33-cert", "Non-Trusted Firmware BL3-3 content certificate"},
	{5, "bl33", "Non-Trusted Firmware BL3-3 bin (UEFI)"},
	{50, "info", "Stream information"},
	{52, "capsule", "UEFI capsule image"},
	{55, "boot-acpi", "Name of the ACPI table"},
	{56, "boot-dtb", "Name of the dtb file"},
	{57, "boot-desc", "Default boot menu item description"},
	{58, "boot-path", "Boot image path"},
	{59, "boot-args", "Arguments for boot image"},
	{60, "boot-timeout", "Boot menu timeout"},
	{61, "uefi-tests", "UEFI tests to run"},
	{54, "ramdisk", "RAM disk image"},
	{62, "image", "Boot image (kernel)"},
	{63, "initramfs", "In-memory filesystem"},
}

// String returns mlx-mkbfb's name for the ID ("image", "boot-args"), or
// "id-N" for an ID it does not know.
func (id ID) String() string {
	for _, e := range ids {
		if e.id == id {
			return e.name
		}
	}
	return fmt.Sprintf("id-%d", id)
}

// Description returns a one-line description of what the ID holds.
func (id ID) Description() string {
	for _, e := range ids {
		if e.id == id {
			return e.desc
		}
	}
	return "unknown image type"
}

// order is the position of id in mlx-mkbfb's emit order; unknown IDs sort
// last.
func (id ID) order() int {
	for i, e := range ids {
		if e.id == id {
			return i
		}
	}
	return len(ids) + int(id)
}

// Header is one decoded image header.
type Header struct {
	Major, Minor uint8
	// ID says what the image is.
	ID ID
	// Version is this image's version; several versions of one ID may
	// follow each other (boot-args v0 for BF2, v2 for BF3).
	Version uint8
	// NextVersion is the version of the next image with the same ID, 0 if
	// none follows.
	NextVersion uint8
	// Length of the data in bytes, padding excluded.
	Length uint32
	// CRC is CRC-32 (IEEE) over the data and its padding.
	CRC uint32
	// Following is the bitmap of the IDs of the images after this one.
	Following uint64
}

// MarshalBinary encodes h as the 24 bytes of a stream header.
func (h Header) MarshalBinary() ([]byte, error) {
	if h.Version > 15 || h.NextVersion > 15 || h.Major > 15 || h.Minor > 15 {
		return nil, fmt.Errorf("header %s: version field over 4 bits: %w", h.ID, ErrVersion)
	}
	w0 := uint64(Magic) |
		uint64(h.Major&0xf)<<32 |
		uint64(h.Minor&0xf)<<36 |
		uint64(h.NextVersion&0xf)<<44 |
		uint64(h.Version&0xf)<<48 |
		uint64(HeaderLen/8)<<52 |
		uint64(h.ID)<<56
	w1 := uint64(h.Length) | uint64(h.CRC)<<32
	b := make([]byte, HeaderLen)
	binary.LittleEndian.PutUint64(b[0:], w0)
	binary.LittleEndian.PutUint64(b[8:], w1)
	binary.LittleEndian.PutUint64(b[16:], h.Following)
	return b, nil
}

// ParseHeader decodes the 24 bytes of a stream header. It rejects a wrong
// magic, a major version other than 1, a minor version over 2 and a header
// length other than 3 words.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		return Header{}, fmt.Errorf("header: %d of %d bytes: %w", len(b), HeaderLen, ErrTruncated)
	}
	w0 := binary.LittleEndian.Uint64(b[0:])
	w1 := binary.LittleEndian.Uint64(b[8:])
	h := Header{
		Major:     uint8(w0 >> 32 & 0xf),
		Minor:     uint8(w0 >> 36 & 0xf),
		ID:        ID(w0 >> 56),
		Length:    uint32(w1),
		CRC:       uint32(w1 >> 32),
		Following: binary.LittleEndian.Uint64(b[16:]),
	}
	if m := uint32(w0); m != Magic {
		return h, fmt.Errorf("header: magic %#08x, want %#08x: %w", m, Magic, ErrBadMagic)
	}
	if h.Major != MajorVersion || h.Minor > MinorVersion {
		return h, fmt.Errorf("header: format %d.%d, want %d.0-%d.%d: %w",
			h.Major, h.Minor, MajorVersion, MajorVersion, MinorVersion, ErrVersion)
	}
	if l := w0 >> 52 & 0xf; l != HeaderLen/8 {
		return h, fmt.Errorf("header: length %d words, want %d: %w", l, HeaderLen/8, ErrVersion)
	}
	// The per-image version fields exist from minor version 2 on.
	if h.Minor >= 2 {
		h.NextVersion = uint8(w0 >> 44 & 0xf)
		h.Version = uint8(w0 >> 48 & 0xf)
	}
	return h, nil
}

// Image is one image of a stream.
type Image struct {
	// ID and Version select what the image is.
	ID      ID
	Version uint8
	// Data is the image's content, without padding.
	Data []byte
	// Header is the header the image was read with (zero for images built
	// in memory); Write computes fresh headers.
	Header Header
	// Offset is where the header starts in the stream it was read from.
	Offset int64
	// CRCOK reports whether the data matched the header's CRC when read.
	CRCOK bool
}

// padding returns the number of zero bytes that follow n bytes of data.
func padding(n int) int { return (8 - n%8) % 8 }

// Checksum returns the CRC a header carries for data: CRC-32 (IEEE) over
// the data and its zero padding.
func Checksum(data []byte) uint32 {
	crc := crc32.ChecksumIEEE(data)
	var pad [8]byte
	return crc32.Update(crc, crc32.IEEETable, pad[:padding(len(data))])
}

// Headers computes the headers Write emits for images, in this order: the
// current format version, lengths, CRCs, the bitmap of the IDs still to come
// and the version of the next image with the same ID.
func Headers(images []Image) ([]Header, error) {
	hs := make([]Header, len(images))
	var following uint64
	for i := len(images) - 1; i >= 0; i-- {
		img := images[i]
		if img.Version > MaxImageVersion {
			return nil, fmt.Errorf("image %d (%s): version %d over %d: %w", i, img.ID, img.Version, MaxImageVersion, ErrVersion)
		}
		if len(img.Data) > 0xffffffff {
			return nil, fmt.Errorf("image %d (%s): %d bytes is over the 32-bit length field", i, img.ID, len(img.Data))
		}
		h := Header{
			Major:     MajorVersion,
			Minor:     MinorVersion,
			ID:        img.ID,
			Version:   img.Version,
			Length:    uint32(len(img.Data)),
			CRC:       Checksum(img.Data),
			Following: following,
		}
		for _, later := range images[i+1:] {
			if later.ID == img.ID {
				h.NextVersion = later.Version
				break
			}
		}
		hs[i] = h
		following |= 1 << img.ID
	}
	return hs, nil
}

// Write writes images as a stream, in the order given. See Headers for what
// it computes.
func Write(w io.Writer, images []Image) error {
	if len(images) == 0 {
		return ErrEmpty
	}
	hs, err := Headers(images)
	if err != nil {
		return err
	}
	var pad [8]byte
	for i, img := range images {
		b, err := hs[i].MarshalBinary()
		if err != nil {
			return err
		}
		if _, err := w.Write(b); err != nil {
			return fmt.Errorf("image %d (%s): write header: %w", i, img.ID, err)
		}
		if _, err := w.Write(img.Data); err != nil {
			return fmt.Errorf("image %d (%s): write data: %w", i, img.ID, err)
		}
		if _, err := w.Write(pad[:padding(len(img.Data))]); err != nil {
			return fmt.Errorf("image %d (%s): write padding: %w", i, img.ID, err)
		}
	}
	return nil
}

// Size returns the number of bytes Write produces for images.
func Size(images []Image) int64 {
	var n int64
	for _, img := range images {
		n += HeaderLen + int64(len(img.Data)+padding(len(img.Data)))
	}
	return n
}

// Merge lays osImages over the images of base (a firmware stream such as
// the card's default.bfb) and returns them in mlx-mkbfb's emit order: by ID
// in its table order, then by version. Every ID present in osImages replaces
// all versions of that ID in base, so a firmware stream's own boot arguments or
// kernel never mix with the OS's. (mlx-mkbfb replaces per version; replacing
// per ID is stricter and what an OS image wants.)
func Merge(base, osImages []Image) []Image {
	replaced := make(map[ID]bool)
	for _, img := range osImages {
		replaced[img.ID] = true
	}
	var out []Image
	for _, img := range base {
		if !replaced[img.ID] {
			out = append(out, img)
		}
	}
	out = append(out, osImages...)
	slices.SortStableFunc(out, func(a, b Image) int {
		if c := a.ID.order() - b.ID.order(); c != 0 {
			return c
		}
		return int(a.Version) - int(b.Version)
	})
	return out
}

// Read reads a whole stream. It fails on structural damage (a bad header,
// a truncated image, trailing bytes that are not a header) and records a
// CRC mismatch in each image's CRCOK instead of failing, so that inspect can
// show every image; Validate turns mismatches into errors.
func Read(r io.Reader) ([]Image, error) {
	var (
		images []Image
		off    int64
		hdr    = make([]byte, HeaderLen)
	)
	for {
		n, err := io.ReadFull(r, hdr)
		if err == io.EOF {
			break
		}
		if err == io.ErrUnexpectedEOF {
			return images, fmt.Errorf("offset %d: header: %d of %d bytes: %w", off, n, HeaderLen, ErrTruncated)
		}
		if err != nil {
			return images, fmt.Errorf("offset %d: read header: %w", off, err)
		}
		h, err := ParseHeader(hdr)
		if err != nil {
			return images, fmt.Errorf("offset %d: %w", off, err)
		}
		total := int(h.Length) + padding(int(h.Length))
		buf := make([]byte, total)
		if n, err := io.ReadFull(r, buf); err != nil {
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				return images, fmt.Errorf("offset %d: image %s: %d of %d bytes: %w", off, h.ID, n, total, ErrTruncated)
			}
			return images, fmt.Errorf("offset %d: image %s: read: %w", off, h.ID, err)
		}
		images = append(images, Image{
			ID:      h.ID,
			Version: h.Version,
			Data:    buf[:h.Length:h.Length],
			Header:  h,
			Offset:  off,
			CRCOK:   crc32.ChecksumIEEE(buf) == h.CRC,
		})
		off += HeaderLen + int64(total)
	}
	if len(images) == 0 {
		return nil, ErrEmpty
	}
	// A stream cut at an image boundary parses; its last header still
	// names the images that should have followed.
	if last := images[len(images)-1].Header; last.Following != 0 {
		return images, fmt.Errorf("offset %d: stream ends after image %s, but its header says images %s follow: %w",
			off, last.ID, bitmapString(last.Following), ErrTruncated)
	}
	return images, nil
}

// bitmapString lists the IDs set in a following-images bitmap.
func bitmapString(m uint64) string {
	var b bytes.Buffer
	for id := range 64 {
		if m&(1<<id) != 0 {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			b.WriteString(ID(id).String())
		}
	}
	return b.String()
}

// Validate checks images as Read returned them: every CRC matches, and every
// header's bitmap of following IDs and next version agree with the images
// that actually follow (the firmware stops reading when the bitmap says
// nothing more comes).
func Validate(images []Image) error {
	if len(images) == 0 {
		return ErrEmpty
	}
	var errs []error
	for i, img := range images {
		if !img.CRCOK {
			errs = append(errs, fmt.Errorf("image %d (%s v%d) at offset %d: header CRC %#08x, data %#08x: %w",
				i, img.ID, img.Version, img.Offset, img.Header.CRC, Checksum(img.Data), ErrCRC))
		}
	}
	want, err := Headers(images)
	if err != nil {
		return err
	}
	for i, img := range images {
		if img.Header.Following != want[i].Following {
			errs = append(errs, fmt.Errorf("image %d (%s v%d): following %#x, images after it give %#x: %w",
				i, img.ID, img.Version, img.Header.Following, want[i].Following, ErrBitmap))
		}
		if img.Header.Minor >= 2 && img.Header.NextVersion != want[i].NextVersion {
			errs = append(errs, fmt.Errorf("image %d (%s v%d): next version %d, images after it give %d: %w",
				i, img.ID, img.Version, img.Header.NextVersion, want[i].NextVersion, ErrBitmap))
		}
	}
	return errors.Join(errs...)
}

// ReadValid reads a stream and validates it; it is Read followed by
// Validate.
func ReadValid(r io.Reader) ([]Image, error) {
	images, err := Read(r)
	if err != nil {
		return nil, err
	}
	if err := Validate(images); err != nil {
		return nil, err
	}
	return images, nil
}

// Marshal returns the stream Write produces for images.
func Marshal(images []Image) ([]byte, error) {
	var b bytes.Buffer
	b.Grow(int(Size(images)))
	if err := Write(&b, images); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Find returns the first image with the given ID and version.
func Find(images []Image, id ID, version uint8) (Image, bool) {
	for _, img := range images {
		if img.ID == id && img.Version == version {
			return img, true
		}
	}
	return Image{}, false
}

// HasFirmware reports whether images carry the boot firmware (ATF BL2) that
// the card needs to boot a stream from reset.
func HasFirmware(images []Image) bool {
	for _, img := range images {
		if img.ID == IDBL2 {
			return true
		}
	}
	return false
}
