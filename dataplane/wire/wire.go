// Package wire owns the Lovelock wire format: the fixed 24-byte header that
// starts the UDP payload of every service packet, its encoder and validating
// decoder, and a frame parser that mirrors the data plane's C parser
// (bpf/include/parse.h) verdict for verdict and flow key for flow key. No
// other Go package encodes or decodes the header. Its gopacket layer, for
// captures and tests, is the subpackage wirelayer, so that programs which
// never decode captures (lovelockd) link no gopacket.
//
// The C definition lives in bpf/include/lovelock_wire.h; cside_test.go holds
// the two in step and docs/wire.md draws the layout.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// HeaderLen is the size of the Lovelock header in bytes (LL_HDR_LEN).
const HeaderLen = 24

// Version is the only header version this package and the C parser accept
// (LL_WIRE_VERSION).
const Version = 1

// DefaultPort is the UDP destination port of Lovelock traffic unless
// configured otherwise (LL_DEFAULT_PORT). 61440 (0xF000) lies in IANA's
// dynamic range, which is never assigned, and above Linux's default ephemeral
// range (32768-60999), so no kernel-chosen source port collides with it.
const DefaultPort = 61440

// Byte offsets of the header fields, equal to offsetof() in struct ll_hdr.
// All multi-byte fields are big-endian (network byte order).
const (
	OffsetVersion = 0  // uint8
	OffsetType    = 1  // uint8
	OffsetFlags   = 2  // uint16
	OffsetTenant  = 4  // uint32
	OffsetSrc     = 8  // uint32
	OffsetDst     = 12 // uint32
	OffsetSeq     = 16 // uint32
	OffsetLength  = 20 // uint32
)

// Type is the message type in the header (enum ll_type). Types not listed
// below are malformed: Decode rejects them with ErrUnknownType.
type Type uint8

// The message types, equal to enum ll_type.
const (
	TypeBundle       Type = 0x01 // messaging: aggregated small messages
	TypeCredit       Type = 0x02 // messaging: flow-control credit and ack
	TypeMemRead      Type = 0x10 // far memory: page read request
	TypeMemWrite     Type = 0x11 // far memory: page write request
	TypeMemReply     Type = 0x12 // far memory: reply to a read or write
	TypeIngestInput  Type = 0x20 // accelerator ingest: client input
	TypeIngestResult Type = 0x21 // accelerator ingest: result to client
	TypeIngestCtrl   Type = 0x22 // accelerator ingest: host/DPU control
	TypePing         Type = 0x30 // liveness probe
	TypePong         Type = 0x31 // liveness reply
)

// Types lists every known message type in ascending order.
func Types() []Type {
	return []Type{
		TypeBundle, TypeCredit,
		TypeMemRead, TypeMemWrite, TypeMemReply,
		TypeIngestInput, TypeIngestResult, TypeIngestCtrl,
		TypePing, TypePong,
	}
}

// Known reports whether t is a defined message type (ll_type_known in C).
func (t Type) Known() bool {
	return typeName(t) != ""
}

// String returns the type's name, or "type(0xNN)" for an unknown type.
func (t Type) String() string {
	if s := typeName(t); s != "" {
		return s
	}
	return fmt.Sprintf("type(0x%02x)", uint8(t))
}

func typeName(t Type) string {
	switch t {
	case TypeBundle:
		return "bundle"
	case TypeCredit:
		return "credit"
	case TypeMemRead:
		return "mem-read"
	case TypeMemWrite:
		return "mem-write"
	case TypeMemReply:
		return "mem-reply"
	case TypeIngestInput:
		return "ingest-input"
	case TypeIngestResult:
		return "ingest-result"
	case TypeIngestCtrl:
		return "ingest-ctrl"
	case TypePing:
		return "ping"
	case TypePong:
		return "pong"
	}
	return ""
}

// Flags is the header's flag word (LL_FLAG_*). Bits not defined here are
// carried through encode and decode untouched, never interpreted or rejected.
type Flags uint16

// The defined flag bits, equal to LL_FLAG_*.
const (
	FlagAckReq     Flags = 0x0001 // sender wants an acknowledgement
	FlagMore       Flags = 0x0002 // more fragments of this message follow
	FlagRetransmit Flags = 0x0004 // this packet is a retransmission
)

// String returns the set flags joined by "|", undefined bits as one hex
// number, and "0" when no bit is set.
func (f Flags) String() string {
	if f == 0 {
		return "0"
	}
	var parts []string
	for _, d := range [...]struct {
		bit  Flags
		name string
	}{{FlagAckReq, "ack-req"}, {FlagMore, "more"}, {FlagRetransmit, "retransmit"}} {
		if f&d.bit != 0 {
			parts = append(parts, d.name)
			f &^= d.bit
		}
	}
	if f != 0 {
		parts = append(parts, "0x"+strconv.FormatUint(uint64(f), 16))
	}
	return strings.Join(parts, "|")
}

// Header is the Lovelock header (struct ll_hdr) in host representation.
type Header struct {
	Version uint8  // Version for every valid header
	Type    Type   // message type
	Flags   Flags  // flag bits, undefined ones included
	Tenant  uint32 // tenant ID, 0 = infrastructure
	Src     uint32 // source rank or region
	Dst     uint32 // destination rank or region
	Seq     uint32 // per-flow sequence number
	// Length is the number of payload bytes after the header; a valid header's
	// Length equals the rest of the UDP payload exactly.
	Length uint32
}

// AppendTo appends the encoded header followed by payload to b and returns
// the extended slice. The Length written is len(payload); h.Length is
// ignored, so the result always satisfies the length rule. Every other field
// is written as is, unknown types and versions included, which lets tests
// build malformed packets. With enough capacity in b it does not allocate.
//
// A payload of 4 GiB or more cannot be described by the 32-bit length field
// and is truncated modulo 2^32 there; no UDP datagram comes close.
func (h Header) AppendTo(b, payload []byte) []byte {
	h.Length = uint32(len(payload))
	b = h.append(b)
	return append(b, payload...)
}

// append appends the 24 header bytes with every field, Length included, as is.
func (h Header) append(b []byte) []byte {
	n := len(b)
	b = slices.Grow(b, HeaderLen)[:n+HeaderLen]
	h.Put(b[n:])
	return b
}

// Put writes the 24 header bytes with every field, Length included, as is
// into b[:HeaderLen] (it panics when b is shorter). Unlike AppendTo it
// writes h.Length unchanged, which lets tests build headers with a wrong
// length; the gopacket layer (wirelayer) writes with it.
func (h Header) Put(b []byte) {
	_ = b[HeaderLen-1] // one bounds check for all the writes below
	b[OffsetVersion] = h.Version
	b[OffsetType] = uint8(h.Type)
	binary.BigEndian.PutUint16(b[OffsetFlags:], uint16(h.Flags))
	binary.BigEndian.PutUint32(b[OffsetTenant:], h.Tenant)
	binary.BigEndian.PutUint32(b[OffsetSrc:], h.Src)
	binary.BigEndian.PutUint32(b[OffsetDst:], h.Dst)
	binary.BigEndian.PutUint32(b[OffsetSeq:], h.Seq)
	binary.BigEndian.PutUint32(b[OffsetLength:], h.Length)
}

// Sentinel errors. Decode and ParseFrame wrap them with context; test for
// them with errors.Is, or map them to the C parser's verdicts with StatusOf.
var (
	// ErrShortBuffer: a header (Lovelock, or in ParseFrame any lower one)
	// ends past the end of the buffer; in ParseFrame also: the UDP datagram
	// runs past the end of the frame, or its payload is too short for a
	// Lovelock header.
	ErrShortBuffer = errors.New("short buffer")
	// ErrBadVersion: the header's version is not Version.
	ErrBadVersion = errors.New("bad version")
	// ErrBadLength: the length field does not equal the payload bytes after
	// the header.
	ErrBadLength = errors.New("bad length")
	// ErrUnknownType: the header's type is not a known Type.
	ErrUnknownType = errors.New("unknown type")
	// ErrBadHeader: ParseFrame found an invalid L3 or L4 header: an IP
	// version that disagrees with the ethertype, an IPv4 header length below
	// 20 bytes, a UDP length below 8, or more than MaxIPv6ExtHeaders IPv6
	// extension headers. Decode never returns it.
	ErrBadHeader = errors.New("bad l3/l4 header")
	// ErrNotLovelock: ParseFrame found a well-formed frame that is not a
	// Lovelock packet: not IP, not UDP to the Lovelock port, or an IP
	// fragment. Decode never returns it.
	ErrNotLovelock = errors.New("not lovelock")
)

// Decode parses b, a whole UDP payload, into its header and payload. The
// payload aliases b. Checks run in the C parser's order, and the first that
// fails decides the error: ErrShortBuffer (fewer than HeaderLen bytes),
// ErrBadVersion, ErrBadLength (Length differs from len(b)-HeaderLen),
// ErrUnknownType. Unknown flag bits are accepted and kept.
func Decode(b []byte) (Header, []byte, error) {
	h, err := decode(b)
	if err != nil {
		return Header{}, nil, fmt.Errorf("wire: %w", err)
	}
	return h, b[HeaderLen:], nil
}

// decode is Decode without the payload and the "wire:" prefix on errors, so
// that ParseFrame can add its own context. It runs parse_ll's checks in
// parse_ll's order: size, version, length, type.
func decode(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		return Header{}, fmt.Errorf("header needs %d bytes, have %d: %w", HeaderLen, len(b), ErrShortBuffer)
	}
	h := Header{
		Version: b[OffsetVersion],
		Type:    Type(b[OffsetType]),
		Flags:   Flags(binary.BigEndian.Uint16(b[OffsetFlags:])),
		Tenant:  binary.BigEndian.Uint32(b[OffsetTenant:]),
		Src:     binary.BigEndian.Uint32(b[OffsetSrc:]),
		Dst:     binary.BigEndian.Uint32(b[OffsetDst:]),
		Seq:     binary.BigEndian.Uint32(b[OffsetSeq:]),
		Length:  binary.BigEndian.Uint32(b[OffsetLength:]),
	}
	if h.Version != Version {
		return Header{}, fmt.Errorf("header version %d, want %d: %w", h.Version, Version, ErrBadVersion)
	}
	if int64(h.Length) != int64(len(b)-HeaderLen) {
		return Header{}, fmt.Errorf("header claims %d payload bytes, have %d: %w", h.Length, len(b)-HeaderLen, ErrBadLength)
	}
	if !h.Type.Known() {
		return Header{}, fmt.Errorf("header type %v: %w", h.Type, ErrUnknownType)
	}
	return h, nil
}

// Status is a parse verdict, numerically equal to the C parser's enum
// ll_status so that counters and test results from both sides compare
// directly.
type Status uint32

// The verdicts, equal to LL_OK ... LL_BAD_HEADER. Every status but StatusOK
// and StatusNotLovelock marks a malformed frame (Malformed).
const (
	StatusOK          Status = 0 // a valid Lovelock packet
	StatusNotLovelock Status = 1 // well-formed, but not a Lovelock packet (ErrNotLovelock)
	StatusTruncated   Status = 2 // a header ends past the buffer (ErrShortBuffer)
	StatusBadVersion  Status = 3 // ErrBadVersion
	StatusBadLength   Status = 4 // ErrBadLength
	StatusUnknownType Status = 5 // ErrUnknownType
	StatusBadHeader   Status = 6 // an invalid L3/L4 header (ErrBadHeader)
)

// Malformed reports whether s marks a malformed frame (ll_malformed in C):
// the data plane gives such frames the default action, whatever the rules.
func (s Status) Malformed() bool {
	return s != StatusOK && s != StatusNotLovelock
}

// String returns the verdict's name in lower case, or "status(N)".
func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusNotLovelock:
		return "not-lovelock"
	case StatusTruncated:
		return "truncated"
	case StatusBadVersion:
		return "bad-version"
	case StatusBadLength:
		return "bad-length"
	case StatusUnknownType:
		return "unknown-type"
	case StatusBadHeader:
		return "bad-header"
	}
	return "status(" + strconv.FormatUint(uint64(s), 10) + ")"
}

// StatusOf maps an error from Decode or ParseFrame to the C parser's verdict:
// nil is StatusOK, each sentinel its own status. Every error this package
// returns wraps a sentinel; any other non-nil error maps to
// StatusNotLovelock, since it describes no valid Lovelock packet either.
func StatusOf(err error) Status {
	switch {
	case err == nil:
		return StatusOK
	case errors.Is(err, ErrShortBuffer):
		return StatusTruncated
	case errors.Is(err, ErrBadVersion):
		return StatusBadVersion
	case errors.Is(err, ErrBadLength):
		return StatusBadLength
	case errors.Is(err, ErrUnknownType):
		return StatusUnknownType
	case errors.Is(err, ErrBadHeader):
		return StatusBadHeader
	}
	return StatusNotLovelock
}
