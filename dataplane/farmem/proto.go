package farmem

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// Payload layout after the 24-byte Lovelock header (docs/farmem.md):
//
//	preamble  floor u64: the sender's lowest request ID still outstanding
//	record*   one or more, each a 40-byte record header and its data:
//	  0 op u8, 1 status u8, 2 flags u16 (zero), 4 region u32, 8 id u64,
//	  16 offset u64, 24 size u32, 28 frag u32, 32 aux u32, 36 dlen u32,
//	  40 data[dlen]
const (
	PreambleLen  = 8
	RecordHdrLen = 40
	// FragUnit is the alignment of fragments: a record's data starts at a
	// multiple of it within its request and, unless it is the last, is a
	// multiple of it long, so that receivers track what arrived with one
	// bit per unit whatever datagram size each hop uses.
	FragUnit = 512
	// MaxChunk is the protocol's largest read or write (Config.ChunkSize
	// is at most this): it bounds a reassembly bitmap to 2048 bits.
	MaxChunk = 1 << 20
	// MinDatagram is the smallest transport MaxPayload the protocol
	// works over: header, preamble, record header and one FragUnit.
	MinDatagram = wire.HeaderLen + PreambleLen + RecordHdrLen + FragUnit
)

// Op is a record's operation.
type Op uint8

// The operations. Reads and control operations travel in mem-read
// datagrams, writes in mem-write datagrams, every reply in mem-reply ones.
const (
	OpRead    Op = 1 // region, offset, size → data
	OpWrite   Op = 2 // region, offset, size, aux=lease, data fragments → status
	OpCreate  Op = 3 // offset=size, aux=CreateFlags, region<<32|size=nonce, data=preload path → region, offset=size
	OpOpen    Op = 4 // region, aux=1 for a writer, size=its lapsed lease (OpOpen's retake), offset=nonce → offset=size, aux=lease, size=flags
	OpRenew   Op = 5 // region, aux=lease → status
	OpRelease Op = 6 // region, aux=lease → status
	OpFree    Op = 7 // region → status
	OpList    Op = 8 // region=first ID → data=RegionInfo entries, aux=1 when more follow
	OpSync    Op = 9 // region → status, after the backing file is on disk
	// OpHint names ranges the application will read soon: data = Range
	// entries (16 bytes: offset u64, size u64); aux = 0, or a
	// Prefetcher + 1 to set the region's prefetcher, plus HintDynamic
	// when data is the dynamic cache's new scope instead of hints. Reply:
	// aux = entry fills the DPU agent started (a memory node answers 0).
	OpHint Op = 10
	// OpStatic loads ranges into the DPU agent's static cache: data =
	// Range entries (size 0: the whole region). Reply after they are
	// loaded: aux = ranges loaded (a memory node answers 0). With aux =
	// StaticDrop it drops them instead.
	OpStatic Op = 11
	// OpFreed is a notice, not a reply: a memory node sends it,
	// unsolicited and in mem-reply datagrams of its own (ID 0), to the
	// peers whose reads asked for it (ReadCaches) when it frees their
	// region, so that a DPU agent drops the region's cached bytes at once
	// (docs/farmem.md, "Coherence"): region = the freed region, aux =
	// NoticeVersion, no data. It is sent a few times against loss and never
	// answered. A receiver acts only on a version it knows with that
	// version's data length, and only from the memory node that serves the
	// region. Peers that predate it reject the datagram as malformed (an
	// unknown op); a memory node sends it only to peers that asked.
	OpFreed Op = 12
)

// OpOpen's retake: a writer whose lease lapsed or was lost to a restart
// asks for it back with the old lease in the request's size (0: a new
// writer). The memory node gives it back only if no other writer was
// granted the region since (it keeps the last lease granted in
// leases.json); otherwise it answers StatusWriterBusy, which the client
// reports as ErrLeaseLost. Memory nodes that predate it ignore the size
// and grant the lease whenever no other writer holds it.

// Nonces: a client gives each create and each writer's open a random
// non-zero 64-bit nonce, the same in every retransmission of it (an open:
// in offset; a create: the high half in region, the low half in size), and
// the memory node keeps it with the region it made or the lease it granted
// (regions.json, leases.json). A repeat that its reply cache cannot answer
// (the memory node restarted, or a restarted DPU agent forwards it again
// under a new ID) gets the first answer: the same region, the same lease.
// 0 is no nonce (peers that predate it, which send zeros there; memory
// nodes that predate it ignore it). A create's header dst stays 0.

// nonce returns a create's or open's nonce, 0 for other ops.
func (r *Record) nonce() uint64 {
	switch r.Op {
	case OpCreate:
		return uint64(r.Region)<<32 | uint64(r.Size)
	case OpOpen:
		return r.Offset
	}
	return 0
}

// setNonce puts n into a create or open request.
func (r *Record) setNonce(n uint64) {
	switch r.Op {
	case OpCreate:
		r.Region, r.Size = uint32(n>>32), uint32(n)
	case OpOpen:
		r.Offset = n
	}
}

// newNonce returns a random non-zero nonce.
func newNonce() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:])
		if n := binary.BigEndian.Uint64(b[:]); n != 0 {
			return n
		}
	}
}

// ReadCaches, in an OpRead's aux, says that the requester keeps the bytes
// (a DPU agent's entry fill or static load): the memory node then sends it
// OpFreed when it frees the region. Memory nodes that predate it ignore it.
const ReadCaches uint32 = 1

// NoticeVersion is the version of OpFreed notices this package sends and
// acts on (in the record's aux); version 1 carries no data.
const NoticeVersion uint32 = 1

func (o Op) known() bool { return o >= OpRead && o <= OpFreed }

// StaticDrop, in an OpStatic's aux, asks the DPU agent to drop the static
// ranges named (exactly as loaded) that the same tenant loaded, with their
// budget: a client's LoadStatic that took several requests undoes those
// that succeeded when a later one fails. Reply: aux = ranges dropped. A
// memory node answers 0, as to a load.
const StaticDrop uint32 = 1

// HintDynamic, in an OpHint's aux, makes its ranges the only ones of the
// region that the DPU agent's dynamic cache holds (no ranges: all of it).
// The low byte of aux still sets the prefetcher.
const HintDynamic uint32 = 1 << 8

// String names the op.
func (o Op) String() string {
	names := [...]string{"", "read", "write", "create", "open", "renew", "release", "free", "list", "sync", "hint", "static", "freed"}
	if o.known() {
		return names[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// requestType is the header type of a request datagram that carries op.
func (o Op) requestType() wire.Type {
	if o == OpWrite {
		return wire.TypeMemWrite
	}
	return wire.TypeMemRead
}

// Status is a reply record's outcome.
type Status uint8

// The statuses; each but StatusOK maps to a sentinel error (Status.Err).
const (
	StatusOK            Status = 0
	StatusUnknownRegion Status = 1
	StatusOutOfRange    Status = 2
	StatusWrongTenant   Status = 3
	StatusWriterBusy    Status = 4
	StatusNotWriter     Status = 5
	StatusReadOnly      Status = 6
	StatusNoSpace       Status = 7
	StatusBadRequest    Status = 8
	StatusIO            Status = 9
	StatusUnavailable   Status = 10
	StatusNoServer      Status = 11
	numStatus                  = 12
)

var statusErr = [numStatus]error{nil, ErrUnknownRegion, ErrOutOfRange, ErrWrongTenant, ErrWriterBusy,
	ErrNotWriter, ErrReadOnly, ErrNoSpace, ErrBadRequest, ErrIO, ErrUnavailable, ErrNoServer}

// Err returns the sentinel error of s, nil for StatusOK.
func (s Status) Err() error {
	if int(s) < len(statusErr) {
		return statusErr[s]
	}
	return fmt.Errorf("%w: status %d", ErrBadRequest, s)
}

// statusOf maps an error to the status that carries it back.
func statusOf(err error) Status {
	for i, e := range statusErr {
		if e != nil && errors.Is(err, e) {
			return Status(i)
		}
	}
	if err == nil {
		return StatusOK
	}
	return StatusIO
}

// CreateFlags are OpCreate's aux bits.
const (
	CreateWritable = 1 << 0 // the region accepts a writer
)

// Record is one request or reply record, or one fragment of one. Data
// aliases the datagram it was decoded from.
type Record struct {
	Op     Op
	Status Status
	Region uint32
	ID     uint64
	Offset uint64
	Size   uint32 // bytes the read or write covers
	Frag   uint32 // offset of Data within those bytes
	Aux    uint32
	Data   []byte
}

// ErrMalformed wraps every decode failure of a payload.
var ErrMalformed = errors.New("farmem: malformed payload")

// Decode checks a whole UDP payload and returns its header and floor and
// appends its records to recs. It rejects (with an error wrapping
// wire's sentinel or ErrMalformed) a bad Lovelock header, a type other than
// the three far-memory ones, a short preamble, a truncated record, an unknown
// op, an op that does not belong in the header's type, a read or write larger
// than MaxChunk, a fragment past its size or not FragUnit-aligned, and a
// payload without records. Records alias b.
func Decode(b []byte, recs []Record) (wire.Header, uint64, []Record, error) {
	h, p, err := wire.Decode(b)
	if err != nil {
		return h, 0, recs, err
	}
	switch h.Type {
	case wire.TypeMemRead, wire.TypeMemWrite, wire.TypeMemReply:
	default:
		return h, 0, recs, fmt.Errorf("%w: type %v is not far memory", ErrMalformed, h.Type)
	}
	if len(p) < PreambleLen+RecordHdrLen {
		return h, 0, recs, fmt.Errorf("%w: %d payload bytes, need %d", ErrMalformed, len(p), PreambleLen+RecordHdrLen)
	}
	floor := binary.BigEndian.Uint64(p)
	p = p[PreambleLen:]
	n0 := len(recs)
	for len(p) > 0 {
		if len(p) < RecordHdrLen {
			return h, 0, recs[:n0], fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(p))
		}
		r := Record{
			Op:     Op(p[0]),
			Status: Status(p[1]),
			Region: binary.BigEndian.Uint32(p[4:]),
			ID:     binary.BigEndian.Uint64(p[8:]),
			Offset: binary.BigEndian.Uint64(p[16:]),
			Size:   binary.BigEndian.Uint32(p[24:]),
			Frag:   binary.BigEndian.Uint32(p[28:]),
			Aux:    binary.BigEndian.Uint32(p[32:]),
		}
		dlen := binary.BigEndian.Uint32(p[36:])
		if uint64(dlen) > uint64(len(p)-RecordHdrLen) {
			return h, 0, recs[:n0], fmt.Errorf("%w: record claims %d data bytes, %d left", ErrMalformed, dlen, len(p)-RecordHdrLen)
		}
		r.Data = p[RecordHdrLen : RecordHdrLen+int(dlen)]
		p = p[RecordHdrLen+int(dlen):]
		if err := r.check(h.Type); err != nil {
			return h, 0, recs[:n0], err
		}
		recs = append(recs, r)
	}
	return h, floor, recs, nil
}

// check validates one record against the datagram's type.
func (r *Record) check(t wire.Type) error {
	if !r.Op.known() {
		return fmt.Errorf("%w: %v", ErrMalformed, r.Op)
	}
	if t != wire.TypeMemReply && (r.Op.requestType() != t || r.Op == OpFreed) {
		return fmt.Errorf("%w: %v request in a %v datagram", ErrMalformed, r.Op, t)
	}
	fragmented := r.Op == OpWrite && t != wire.TypeMemReply || r.Op == OpRead && t == wire.TypeMemReply && r.Status == StatusOK
	if r.Op == OpRead || r.Op == OpWrite {
		if r.Size > MaxChunk {
			return fmt.Errorf("%w: %v of %d bytes, at most %d", ErrMalformed, r.Op, r.Size, MaxChunk)
		}
	}
	if !fragmented {
		if r.Frag != 0 {
			return fmt.Errorf("%w: %v record with fragment offset %d", ErrMalformed, r.Op, r.Frag)
		}
		return nil
	}
	end := uint64(r.Frag) + uint64(len(r.Data))
	switch {
	case end > uint64(r.Size):
		return fmt.Errorf("%w: fragment %d+%d past size %d", ErrMalformed, r.Frag, len(r.Data), r.Size)
	case r.Frag%FragUnit != 0:
		return fmt.Errorf("%w: fragment offset %d not a multiple of %d", ErrMalformed, r.Frag, FragUnit)
	case end != uint64(r.Size) && len(r.Data)%FragUnit != 0:
		return fmt.Errorf("%w: inner fragment of %d bytes not a multiple of %d", ErrMalformed, len(r.Data), FragUnit)
	case len(r.Data) == 0 && r.Size != 0:
		return fmt.Errorf("%w: empty fragment", ErrMalformed)
	}
	return nil
}

// putRecordHdr writes r's 40-byte header with dlen data bytes into b.
func putRecordHdr(b []byte, r *Record, dlen int) {
	_ = b[RecordHdrLen-1]
	b[0] = byte(r.Op)
	b[1] = byte(r.Status)
	b[2], b[3] = 0, 0
	binary.BigEndian.PutUint32(b[4:], r.Region)
	binary.BigEndian.PutUint64(b[8:], r.ID)
	binary.BigEndian.PutUint64(b[16:], r.Offset)
	binary.BigEndian.PutUint32(b[24:], r.Size)
	binary.BigEndian.PutUint32(b[28:], r.Frag)
	binary.BigEndian.PutUint32(b[32:], r.Aux)
	binary.BigEndian.PutUint32(b[36:], uint32(dlen))
}

// AppendDatagram encodes one datagram with the given header fields, floor
// and records onto b; the header's Length is computed. Tests and tools use
// it; the services pack through packer, which also fragments.
func AppendDatagram(b []byte, h wire.Header, floor uint64, recs ...Record) []byte {
	p := binary.BigEndian.AppendUint64(nil, floor)
	for i := range recs {
		var hdr [RecordHdrLen]byte
		putRecordHdr(hdr[:], &recs[i], len(recs[i].Data))
		p = append(append(p, hdr[:]...), recs[i].Data...)
	}
	h.Version = wire.Version
	return h.AppendTo(b, p)
}

// RangeLen is the encoded size of one Range in OpHint and OpStatic data
// and in an agent's open reply (the region's static ranges).
const RangeLen = 16

// appendRanges encodes rs (offset u64, size u64 each).
func appendRanges(b []byte, rs []Range) []byte {
	for _, r := range rs {
		b = binary.BigEndian.AppendUint64(b, r.Offset)
		b = binary.BigEndian.AppendUint64(b, r.Size)
	}
	return b
}

// parseRanges decodes what appendRanges wrote.
func parseRanges(b []byte) ([]Range, error) {
	if len(b)%RangeLen != 0 {
		return nil, fmt.Errorf("%w: %d bytes of ranges", ErrMalformed, len(b))
	}
	out := make([]Range, 0, len(b)/RangeLen)
	for ; len(b) > 0; b = b[RangeLen:] {
		out = append(out, Range{binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:])})
	}
	return out, nil
}
