// Package bundle owns the payload formats of Lovelock messaging, the bytes
// that follow the Lovelock header (dataplane/wire) in its two datagram
// types: the bundle (wire.TypeBundle), a preamble and then application
// messages packed back to back, each behind an 8-byte record header {payload
// size, destination rank}; and the credit (wire.TypeCredit), the receiver's
// acknowledgement and flow-control grant. It encodes, validates and iterates
// them, including the fragmentation of messages larger than one bundle. It
// holds no state; the protocol that uses these formats lives in
// dataplane/messaging, and docs/messaging.md draws the layouts.
//
// Nothing here trusts its input: every decoder checks lengths before it
// reads and returns an error wrapping one of the sentinels instead of
// panicking.
package bundle

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// Sizes of the fixed parts.
const (
	// RecordHeaderLen is the size of a record header {u32 size, u32 rank}.
	RecordHeaderLen = 8
	// PreambleLen is the size of a bundle's preamble {u32 session, u32 base}.
	PreambleLen = 8
	// Overhead is the bytes of a bundle datagram before its first record:
	// the Lovelock header and the preamble.
	Overhead = wire.HeaderLen + PreambleLen
	// CreditLen is the size of a credit payload.
	CreditLen = 16
)

// ContinuationRank is the rank field of a continuation record, which carries
// further bytes of a message an earlier bundle began. It is therefore not a
// valid application rank.
const ContinuationRank = ^uint32(0)

// Unknown is the fragmentation state of a link whose earlier bundles the
// reader never saw (a receiver that starts in the middle of a sender's
// stream): a leading continuation is accepted and reported as an orphan.
// No real state equals it, since every head carries at least one byte.
const Unknown = ^uint32(0)

// Sentinel errors. Every validation error wraps exactly one of them.
var (
	// ErrTruncated: the bundle ends inside a preamble, record header or
	// credit.
	ErrTruncated = errors.New("truncated")
	// ErrOverrun: a record claims more bytes than the bundle has, and is
	// not a valid head (not last, no FlagMore, or no payload byte).
	ErrOverrun = errors.New("record overruns the bundle")
	// ErrContinuation: a continuation record where none may be, none where
	// one must be, or one of the wrong size.
	ErrContinuation = errors.New("bad continuation")
	// ErrFlagMore: FlagMore on a bundle whose last record is complete.
	ErrFlagMore = errors.New("more flag without an unfinished message")
	// ErrSession: a preamble or credit with session 0.
	ErrSession = errors.New("session 0")
)

// Preamble starts every bundle's payload.
type Preamble struct {
	// Session identifies the sending end of the link in this life of the
	// sender: random, never 0, new whenever the sender starts. Receivers
	// key link state by (source endpoint, session), so a restarted sender
	// is never confused with its previous life.
	Session uint32
	// Base is the sender's oldest unacknowledged sequence number when it
	// sent this bundle. A receiver that meets the link for the first time
	// starts expecting Base, not the first sequence number it sees.
	Base uint32
}

// Put writes p into b[:PreambleLen].
func (p Preamble) Put(b []byte) {
	_ = b[PreambleLen-1]
	binary.BigEndian.PutUint32(b, p.Session)
	binary.BigEndian.PutUint32(b[4:], p.Base)
}

// ParsePreamble splits a bundle payload into its preamble and its records.
func ParsePreamble(payload []byte) (Preamble, []byte, error) {
	if len(payload) < PreambleLen {
		return Preamble{}, nil, fmt.Errorf("bundle: preamble needs %d bytes, have %d: %w", PreambleLen, len(payload), ErrTruncated)
	}
	p := Preamble{Session: binary.BigEndian.Uint32(payload), Base: binary.BigEndian.Uint32(payload[4:])}
	if p.Session == 0 {
		return Preamble{}, nil, fmt.Errorf("bundle: preamble: %w", ErrSession)
	}
	return p, payload[PreambleLen:], nil
}

// PutRecordHeader writes a record header into b[:RecordHeaderLen].
func PutRecordHeader(b []byte, size, rank uint32) {
	_ = b[RecordHeaderLen-1]
	binary.BigEndian.PutUint32(b, size)
	binary.BigEndian.PutUint32(b[4:], rank)
}

// AppendRecord appends a whole message: its header and payload.
func AppendRecord(b []byte, rank uint32, payload []byte) []byte {
	var h [RecordHeaderLen]byte
	PutRecordHeader(h[:], uint32(len(payload)), rank)
	return append(append(b, h[:]...), payload...)
}

// AppendHead appends the first fragment of a message of size bytes, of which
// part follows here. The bundle must end with it and carry FlagMore.
func AppendHead(b []byte, rank, size uint32, part []byte) []byte {
	var h [RecordHeaderLen]byte
	PutRecordHeader(h[:], size, rank)
	return append(append(b, h[:]...), part...)
}

// AppendContinuation appends a continuation record carrying part.
func AppendContinuation(b []byte, part []byte) []byte {
	var h [RecordHeaderLen]byte
	PutRecordHeader(h[:], uint32(len(part)), ContinuationRank)
	return append(append(b, h[:]...), part...)
}

// AppendMessage appends to b, a bundle datagram being filled that may grow
// to limit bytes, the part of message (rank, payload) after its first done
// payload bytes, following the fragmentation rules:
//
//   - done == 0 and the whole record fits: a whole record.
//   - done == 0, the record does not fit, but it would fit a bundle's empty
//     record area of room bytes: nothing; the caller sends b and starts the
//     message in an empty bundle, so that only messages too large for any
//     bundle are ever split.
//   - done == 0 and the message is larger than room: a head with as many
//     payload bytes as fit, if at least one does.
//   - done > 0: a continuation with as many of the remaining bytes as fit,
//     if at least one does.
//
// It returns the extended buffer, the payload bytes this call wrote (-1 when
// it wrote nothing) and whether the message continues in a later bundle, in
// which case b is complete and must be sent with FlagMore.
func AppendMessage(b []byte, limit, room int, rank uint32, payload []byte, done int) (_ []byte, n int, more bool) {
	free := limit - len(b) - RecordHeaderLen
	rest := len(payload) - done
	switch {
	case done < 0 || rest < 0 || done > 0 && rest == 0:
		return b, -1, false
	case done == 0 && rest <= free:
		return AppendRecord(b, rank, payload), rest, false
	case done == 0 && RecordHeaderLen+len(payload) <= room:
		return b, -1, false
	case free < 1:
		return b, -1, false
	case done == 0:
		return AppendHead(b, rank, uint32(len(payload)), payload[:free]), free, true
	}
	n = min(rest, free)
	return AppendContinuation(b, payload[done:done+n]), n, n < rest
}

// Kind is what a record holds.
type Kind uint8

// The record kinds.
const (
	// Whole: a complete message.
	Whole Kind = iota
	// Head: the first bytes of a message that later bundles continue;
	// Record.Size is the whole message's size.
	Head
	// Continuation: more bytes of the message an earlier bundle began.
	Continuation
)

// String names the kind.
func (k Kind) String() string {
	switch k {
	case Whole:
		return "whole"
	case Head:
		return "head"
	case Continuation:
		return "continuation"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Record is one record of a bundle.
type Record struct {
	Kind Kind
	// Rank is the destination rank; ContinuationRank for a continuation.
	Rank uint32
	// Size is a Whole or Head record's message size; a continuation's
	// byte count.
	Size uint32
	// Data are the payload bytes in this bundle; they alias its buffer.
	Data []byte
	// Orphan marks a continuation whose head the reader never saw (the
	// state was Unknown).
	Orphan bool
	// Offset is where the record's header starts in the records region.
	Offset int
}

// Reader iterates the records of one bundle, validating as it goes. The
// zero Reader has no records.
type Reader struct {
	b       []byte
	off     int
	pending uint32
	more    bool
	started bool
	done    bool
	err     error
}

// NewReader returns a Reader over records, a bundle's records region (the
// payload after the preamble). more is the datagram's FlagMore; pending is
// the link's fragmentation state before this bundle: the bytes still missing
// of a message an earlier bundle began, 0, or Unknown.
func NewReader(records []byte, more bool, pending uint32) Reader {
	return Reader{b: records, more: more, pending: pending}
}

// Next returns the next record. It returns false at the end of the bundle
// and on an error, which Err then reports.
func (r *Reader) Next() (Record, bool) {
	if r.err != nil {
		return Record{}, false
	}
	first := !r.started
	r.started = true
	left := len(r.b) - r.off
	if left == 0 {
		switch {
		case r.done:
		case first && r.pending != 0 && r.pending != Unknown:
			r.err = fmt.Errorf("bundle: %d bytes of a message pending, but no continuation: %w", r.pending, ErrContinuation)
		case r.more && (r.pending == 0 || first):
			r.err = fmt.Errorf("bundle: %w", ErrFlagMore)
		}
		r.done = true
		return Record{}, false
	}
	if left < RecordHeaderLen {
		r.err = fmt.Errorf("bundle: record header at offset %d needs %d bytes, have %d: %w", r.off, RecordHeaderLen, left, ErrTruncated)
		return Record{}, false
	}
	at := r.off
	size := binary.BigEndian.Uint32(r.b[at:])
	rank := binary.BigEndian.Uint32(r.b[at+4:])
	left -= RecordHeaderLen
	data := r.b[at+RecordHeaderLen:]
	if rank == ContinuationRank {
		return r.continuation(first, at, size, left, data)
	}
	if first && r.pending != 0 && r.pending != Unknown {
		r.err = fmt.Errorf("bundle: %d bytes of a message pending, but the bundle starts with a new message: %w", r.pending, ErrContinuation)
		return Record{}, false
	}
	r.pending = 0
	if uint64(size) <= uint64(left) {
		r.off = at + RecordHeaderLen + int(size)
		return Record{Kind: Whole, Rank: rank, Size: size, Data: data[:size], Offset: at}, true
	}
	if !r.more || left < 1 {
		r.err = fmt.Errorf("bundle: record at offset %d claims %d bytes, %d left: %w", at, size, left, ErrOverrun)
		return Record{}, false
	}
	r.off = len(r.b)
	r.pending = size - uint32(left)
	return Record{Kind: Head, Rank: rank, Size: size, Data: data, Offset: at}, true
}

func (r *Reader) continuation(first bool, at int, n uint32, left int, data []byte) (Record, bool) {
	switch {
	case !first || r.pending == 0:
		r.err = fmt.Errorf("bundle: continuation at offset %d, but no message is pending: %w", at, ErrContinuation)
		return Record{}, false
	case n < 1 || uint64(n) > uint64(left):
		r.err = fmt.Errorf("bundle: continuation of %d bytes, %d left: %w", n, left, ErrContinuation)
		return Record{}, false
	case r.pending != Unknown && n > r.pending:
		r.err = fmt.Errorf("bundle: continuation of %d bytes, but only %d pending: %w", n, r.pending, ErrContinuation)
		return Record{}, false
	}
	r.off = at + RecordHeaderLen + int(n)
	end := r.off == len(r.b)
	rec := Record{Kind: Continuation, Rank: ContinuationRank, Size: n, Data: data[:n], Offset: at}
	if r.pending == Unknown {
		rec.Orphan = true
		if !(end && r.more) {
			r.pending = 0
		}
		return rec, true
	}
	r.pending -= n
	if r.pending > 0 && !(end && r.more) {
		r.err = fmt.Errorf("bundle: continuation leaves %d bytes pending but the bundle does not end with it under the more flag: %w", r.pending, ErrContinuation)
		return Record{}, false
	}
	return rec, true
}

// PeekWhole reports the rank and size of the next record when it is a whole
// message that follows a whole message (the case in which Next would
// return it with Kind Whole and change no fragmentation state), without
// reading it; ok is false in every other case, including the end of the
// bundle. SkipWhole then passes over it. Together they let a router move a
// run of whole records to one next hop in one copy (Offset marks the run's
// ends) with the checks Next makes.
func (r *Reader) PeekWhole() (rank, size uint32, ok bool) {
	if r.err != nil || !r.started || r.pending != 0 {
		return 0, 0, false
	}
	left := len(r.b) - r.off - RecordHeaderLen
	if left < 0 {
		return 0, 0, false
	}
	size = binary.BigEndian.Uint32(r.b[r.off:])
	rank = binary.BigEndian.Uint32(r.b[r.off+4:])
	if rank == ContinuationRank || uint64(size) > uint64(left) {
		return 0, 0, false
	}
	return rank, size, true
}

// SkipWhole passes over the whole record of size payload bytes that
// PeekWhole reported.
func (r *Reader) SkipWhole(size uint32) { r.off += RecordHeaderLen + int(size) }

// Offset is where the next record starts in the records region.
func (r *Reader) Offset() int { return r.off }

// Rebase points the Reader at records, which must hold the same bytes as
// the region it was created over (a copy taken out of a receive buffer), and
// keeps its position. It reports false, and changes nothing, when the
// lengths differ.
func (r *Reader) Rebase(records []byte) bool {
	if len(records) != len(r.b) {
		return false
	}
	r.b = records
	return true
}

// Bytes returns the records region the Reader reads.
func (r *Reader) Bytes() []byte { return r.b }

// Err returns the validation error that stopped Next, if any.
func (r *Reader) Err() error { return r.err }

// Pending returns the fragmentation state after the records read so far;
// after the last record, the state the next bundle of the link starts in.
func (r *Reader) Pending() uint32 { return r.pending }

// Info summarises a valid bundle.
type Info struct {
	Records  int    // records, continuations included
	Messages int    // messages that begin here: whole records and heads
	Pending  uint32 // the fragmentation state after the bundle
}

// Validate reads a whole bundle (see NewReader for the arguments) and
// returns its summary or the first error.
func Validate(records []byte, more bool, pending uint32) (Info, error) {
	if pending == 0 && !more {
		// The usual bundle holds whole records only: one header read per
		// record. Anything else is validated again from the start below,
		// which also finds the error to report.
		off, n := 0, 0
		for off < len(records) {
			left := len(records) - off - RecordHeaderLen
			if left < 0 {
				break
			}
			size := binary.BigEndian.Uint32(records[off:])
			if binary.BigEndian.Uint32(records[off+4:]) == ContinuationRank || uint64(size) > uint64(left) {
				break
			}
			off += RecordHeaderLen + int(size)
			n++
		}
		if off == len(records) {
			return Info{Records: n, Messages: n}, nil
		}
	}
	r := NewReader(records, more, pending)
	var info Info
	for {
		rec, ok := r.Next()
		if !ok {
			break
		}
		info.Records++
		if rec.Kind != Continuation {
			info.Messages++
		}
	}
	if err := r.Err(); err != nil {
		return Info{}, err
	}
	info.Pending = r.Pending()
	return info, nil
}

// Credit is the payload of a wire.TypeCredit datagram, which a receiver
// sends to acknowledge bundles and to grant room for more. The header's Seq
// carries the cumulative acknowledgement: every sequence number below it has
// arrived. A credit with wire.FlagAckReq set goes the other way: it is a
// sender's probe asking the receiver for a fresh credit, and only its
// Session counts.
type Credit struct {
	// Session is the preamble session of the bundles acknowledged.
	Session uint32
	// Limit: the sender may send sequence numbers below Limit (modulo
	// 2^32).
	Limit uint32
	// SACK has bit i set when sequence number ack+1+i arrived although ack
	// has not (selective acknowledgement of what the receiver holds out of
	// order).
	SACK uint64
}

// AppendTo appends the encoded credit to b.
func (c Credit) AppendTo(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, c.Session)
	b = binary.BigEndian.AppendUint32(b, c.Limit)
	return binary.BigEndian.AppendUint64(b, c.SACK)
}

// ParseCredit decodes a credit payload. Bytes after the first CreditLen are
// ignored, so that a later version may extend the credit.
func ParseCredit(b []byte) (Credit, error) {
	if len(b) < CreditLen {
		return Credit{}, fmt.Errorf("credit: needs %d bytes, have %d: %w", CreditLen, len(b), ErrTruncated)
	}
	c := Credit{
		Session: binary.BigEndian.Uint32(b),
		Limit:   binary.BigEndian.Uint32(b[4:]),
		SACK:    binary.BigEndian.Uint64(b[8:]),
	}
	if c.Session == 0 {
		return Credit{}, fmt.Errorf("credit: %w", ErrSession)
	}
	return c, nil
}
