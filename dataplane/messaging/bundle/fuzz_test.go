package bundle

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// FuzzBundle: the record reader never panics on any records region, state
// and flag; what it accepts re-encodes to the same bytes, its summary agrees
// with the records it returned, and what it rejects wraps one of the
// sentinels. The seed corpus is in testdata/fuzz/FuzzBundle.
func FuzzBundle(f *testing.F) {
	f.Add(cat(rec(1, "a"), AppendHead(nil, 7, 10, []byte("abcd"))), true, uint32(0))
	f.Fuzz(func(t *testing.T, records []byte, more bool, pending uint32) {
		info, err := Validate(records, more, pending)
		r := NewReader(records, more, pending)
		var enc []byte
		var n, msgs int
		for {
			rec, ok := r.Next()
			if !ok {
				break
			}
			if rec.Offset != len(enc) {
				t.Fatalf("record %d at offset %d, want %d", n, rec.Offset, len(enc))
			}
			n++
			switch rec.Kind {
			case Whole:
				msgs++
				if int(rec.Size) != len(rec.Data) || rec.Rank == ContinuationRank {
					t.Fatalf("whole record %+v", rec)
				}
				enc = AppendRecord(enc, rec.Rank, rec.Data)
			case Head:
				msgs++
				if int(rec.Size) <= len(rec.Data) || len(rec.Data) == 0 || !more {
					t.Fatalf("head %+v, more %v", rec, more)
				}
				enc = AppendHead(enc, rec.Rank, rec.Size, rec.Data)
			case Continuation:
				if n != 1 || pending == 0 || len(rec.Data) == 0 || rec.Orphan != (pending == Unknown) {
					t.Fatalf("continuation %+v as record %d, pending %d", rec, n, pending)
				}
				enc = AppendContinuation(enc, rec.Data)
			default:
				t.Fatalf("kind %v", rec.Kind)
			}
		}
		if (err == nil) != (r.Err() == nil) {
			t.Fatalf("Validate: %v; Reader: %v", err, r.Err())
		}
		if err != nil {
			if !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrOverrun) && !errors.Is(err, ErrContinuation) && !errors.Is(err, ErrFlagMore) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		if !bytes.Equal(enc, records) {
			t.Fatalf("re-encoded:\n got % x\nwant % x", enc, records)
		}
		if info.Records != n || info.Messages != msgs || info.Pending != r.Pending() {
			t.Fatalf("info %+v; reader saw %d records, %d messages, pending %d", info, n, msgs, r.Pending())
		}
		if more && info.Pending == 0 {
			t.Fatalf("accepted the more flag with nothing pending")
		}
		if !more && info.Pending != 0 && info.Pending != Unknown {
			t.Fatalf("accepted %d pending bytes without the more flag", info.Pending)
		}
	})
}

// FuzzPack: any sequence of messages packed into bundles of any size by
// AppendMessage comes back, in order and intact, through the Reader.
func FuzzPack(f *testing.F) {
	f.Add([]byte("\x00\x05\x01\x90\x00\x00\x10\x00"), uint16(200))
	f.Fuzz(func(t *testing.T, spec []byte, limit16 uint16) {
		limit := Overhead + RecordHeaderLen + 1 + int(limit16)%4096
		var msgs [][]byte
		var ranks []uint32
		for i := 0; i+2 <= len(spec) && len(msgs) < 64; i += 2 {
			n := int(binary.BigEndian.Uint16(spec[i:])) % (3 * limit)
			m := bytes.Repeat([]byte{byte(i)}, n)
			msgs, ranks = append(msgs, m), append(ranks, uint32(i))
		}
		bundles, more := pack(msgs, ranks, limit)
		got, gotRanks := unpack(t, bundles, more)
		if len(got) != len(msgs) {
			t.Fatalf("%d messages back, want %d", len(got), len(msgs))
		}
		for i := range msgs {
			if !bytes.Equal(got[i], msgs[i]) || gotRanks[i] != ranks[i] {
				t.Fatalf("message %d differs", i)
			}
		}
	})
}

// FuzzCredit: ParseCredit never panics and round-trips what it accepts.
func FuzzCredit(f *testing.F) {
	f.Add(Credit{Session: 1, Limit: 8, SACK: 5}.AppendTo(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseCredit(b)
		if err != nil {
			if !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrSession) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		if !bytes.Equal(c.AppendTo(nil), b[:CreditLen]) {
			t.Fatalf("credit %+v does not re-encode to % x", c, b[:CreditLen])
		}
	})
}
