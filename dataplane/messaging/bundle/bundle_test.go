package bundle

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
)

func rec(rank uint32, payload string) []byte { return AppendRecord(nil, rank, []byte(payload)) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func TestValidate(t *testing.T) {
	head := AppendHead(nil, 7, 10, []byte("abcd"))
	cont := func(s string) []byte { return AppendContinuation(nil, []byte(s)) }
	for _, tc := range []struct {
		name    string
		records []byte
		more    bool
		pending uint32
		want    error
		info    Info
	}{
		{"empty", nil, false, 0, nil, Info{}},
		{"one", rec(1, "hi"), false, 0, nil, Info{1, 1, 0}},
		{"zero-length message", rec(1, ""), false, 0, nil, Info{1, 1, 0}},
		{"three", cat(rec(1, "a"), rec(2, ""), rec(3, "ccc")), false, 0, nil, Info{3, 3, 0}},
		{"head last", cat(rec(1, "a"), head), true, 0, nil, Info{2, 2, 6}},
		{"continuation ends message", cat(cont("efghij"), rec(2, "x")), false, 6, nil, Info{2, 1, 0}},
		{"continuation goes on", cont("ef"), true, 6, nil, Info{1, 0, 4}},
		{"continuation then head", cat(cont("ef"), head), true, 2, nil, Info{2, 1, 6}},
		{"orphan continuation", cat(cont("zz"), rec(1, "a")), false, Unknown, nil, Info{2, 1, 0}},
		{"orphan goes on", cont("zz"), true, Unknown, nil, Info{1, 0, Unknown}},
		{"fresh link, no orphan", rec(1, "a"), false, Unknown, nil, Info{1, 1, 0}},
		{"fresh link, empty", nil, false, Unknown, nil, Info{0, 0, Unknown}},

		{"short header", []byte{0, 0, 0, 1, 0, 0, 0}, false, 0, ErrTruncated, Info{}},
		{"short header after record", cat(rec(1, "a"), []byte{0}), false, 0, ErrTruncated, Info{}},
		{"overrun", cat(rec(1, "a"), []byte{0, 0, 0, 9, 0, 0, 0, 1, 'x'}), false, 0, ErrOverrun, Info{}},
		{"head without payload", []byte{0, 0, 0, 9, 0, 0, 0, 1}, true, 0, ErrOverrun, Info{}},
		{"huge size", []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 'x'}, false, 0, ErrOverrun, Info{}},
		{"more without head", rec(1, "a"), true, 0, ErrFlagMore, Info{}},
		{"more on empty", nil, true, 0, ErrFlagMore, Info{}},
		{"more on empty fresh", nil, true, Unknown, ErrFlagMore, Info{}},
		{"unexpected continuation", cont("ab"), false, 0, ErrContinuation, Info{}},
		{"continuation not first", cat(rec(1, "a"), cont("ab")), false, 3, ErrContinuation, Info{}},
		{"missing continuation", rec(1, "a"), false, 3, ErrContinuation, Info{}},
		{"missing continuation, empty", nil, false, 3, ErrContinuation, Info{}},
		{"continuation too long", cont("abcd"), false, 3, ErrContinuation, Info{}},
		{"continuation empty", cont(""), false, 3, ErrContinuation, Info{}},
		{"continuation overruns", []byte{0, 0, 0, 5, 0xff, 0xff, 0xff, 0xff, 'a'}, true, 9, ErrContinuation, Info{}},
		{"unfinished continuation without more", cont("ab"), false, 3, ErrContinuation, Info{}},
		{"unfinished continuation not last", cat(cont("ab"), rec(1, "")), true, 3, ErrContinuation, Info{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info, err := Validate(tc.records, tc.more, tc.pending)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Validate = %v, want %v", err, tc.want)
			}
			if info != tc.info {
				t.Fatalf("info %+v, want %+v", info, tc.info)
			}
		})
	}
}

func TestPreambleAndCredit(t *testing.T) {
	b := make([]byte, PreambleLen+3)
	Preamble{Session: 0xdeadbeef, Base: 42}.Put(b)
	p, rest, err := ParsePreamble(b)
	if err != nil || p != (Preamble{0xdeadbeef, 42}) || len(rest) != 3 {
		t.Fatalf("ParsePreamble = %+v, %d bytes, %v", p, len(rest), err)
	}
	if _, _, err := ParsePreamble(b[:7]); !errors.Is(err, ErrTruncated) {
		t.Errorf("short preamble: %v", err)
	}
	if _, _, err := ParsePreamble(make([]byte, 8)); !errors.Is(err, ErrSession) {
		t.Errorf("session 0: %v", err)
	}

	c := Credit{Session: 9, Limit: 1 << 31, SACK: 0x8000000000000001}
	enc := c.AppendTo(nil)
	if len(enc) != CreditLen {
		t.Fatalf("credit is %d bytes", len(enc))
	}
	got, err := ParseCredit(append(enc, 1, 2)) // trailing bytes are ignored
	if err != nil || got != c {
		t.Fatalf("ParseCredit = %+v, %v", got, err)
	}
	if _, err := ParseCredit(enc[:15]); !errors.Is(err, ErrTruncated) {
		t.Errorf("short credit: %v", err)
	}
	if _, err := ParseCredit(make([]byte, 16)); !errors.Is(err, ErrSession) {
		t.Errorf("credit session 0: %v", err)
	}
}

// pack packs msgs into bundles of at most limit bytes (records region
// starting after Overhead, as a sender does) and returns each bundle's
// records and FlagMore.
func pack(msgs [][]byte, ranks []uint32, limit int) (bundles [][]byte, more []bool) {
	room := limit - Overhead
	b := make([]byte, Overhead, limit)
	emit := func(m bool) {
		bundles = append(bundles, bytes.Clone(b[Overhead:]))
		more = append(more, m)
		b = b[:Overhead]
	}
	for i, m := range msgs {
		done := 0
		for {
			var n int
			var cont bool
			b, n, cont = AppendMessage(b, limit, room, ranks[i], m, done)
			if n < 0 {
				emit(false) // start over in an empty bundle
				continue
			}
			done += n
			if cont {
				emit(true)
				continue
			}
			break
		}
	}
	if len(b) > Overhead {
		emit(false)
	}
	return bundles, more
}

// unpack reads bundles in order and reassembles the messages.
func unpack(t testing.TB, bundles [][]byte, more []bool) (msgs [][]byte, ranks []uint32) {
	pending := uint32(0)
	var cur []byte
	var curRank uint32
	for i, b := range bundles {
		r := NewReader(b, more[i], pending)
		for {
			rec, ok := r.Next()
			if !ok {
				break
			}
			switch rec.Kind {
			case Whole:
				msgs = append(msgs, bytes.Clone(rec.Data))
				ranks = append(ranks, rec.Rank)
			case Head:
				cur, curRank = bytes.Clone(rec.Data), rec.Rank
			case Continuation:
				cur = append(cur, rec.Data...)
			}
			if rec.Kind != Whole && r.Pending() == 0 {
				msgs = append(msgs, cur)
				ranks = append(ranks, curRank)
				cur = nil
			}
		}
		if err := r.Err(); err != nil {
			t.Fatalf("bundle %d of %d: %v", i, len(bundles), err)
		}
		pending = r.Pending()
	}
	if pending != 0 {
		t.Fatalf("%d bytes still pending after the last bundle", pending)
	}
	return msgs, ranks
}

func TestPackRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, limit := range []int{Overhead + RecordHeaderLen + 1, 64, 100, 1472, 4096} {
		var msgs [][]byte
		var ranks []uint32
		for i := range 300 {
			n := rng.IntN(3 * limit)
			if i%5 == 0 {
				n = rng.IntN(8)
			}
			m := make([]byte, n)
			for j := range m {
				m[j] = byte(rng.Uint32())
			}
			msgs, ranks = append(msgs, m), append(ranks, rng.Uint32N(1000))
		}
		bundles, more := pack(msgs, ranks, limit)
		for i, b := range bundles {
			if Overhead+len(b) > limit {
				t.Fatalf("limit %d: bundle %d is %d bytes", limit, i, Overhead+len(b))
			}
		}
		got, gotRanks := unpack(t, bundles, more)
		if len(got) != len(msgs) {
			t.Fatalf("limit %d: %d messages back, want %d", limit, len(got), len(msgs))
		}
		for i := range msgs {
			if !bytes.Equal(got[i], msgs[i]) || gotRanks[i] != ranks[i] {
				t.Fatalf("limit %d: message %d differs", limit, i)
			}
		}
	}
}

// TestSplitOnlyWhenNeeded: a message that fits an empty bundle is never
// split, it moves to the next bundle whole.
func TestSplitOnlyWhenNeeded(t *testing.T) {
	limit := 100
	room := limit - Overhead // 68: a record of up to 60 payload bytes fits
	b := AppendRecord(make([]byte, Overhead, limit), 1, make([]byte, 30))
	if _, n, _ := AppendMessage(b, limit, room, 2, make([]byte, 60), 0); n != -1 {
		t.Fatalf("a 60-byte message was split (%d bytes written) instead of moving to an empty bundle", n)
	}
	b2, n, more := AppendMessage(b, limit, room, 2, make([]byte, 61), 0)
	if n != limit-len(b)-RecordHeaderLen || !more || len(b2) != limit {
		t.Fatalf("a 61-byte message: %d bytes written, more %v, bundle %d bytes", n, more, len(b2))
	}
	full := b2
	if _, n, _ := AppendMessage(full, limit, room, 3, nil, 0); n != -1 {
		t.Fatalf("wrote into a full bundle")
	}
}

// TestPeekWhole: PeekWhole reports a record exactly when Next would return
// it as a whole record following a whole record or a finished message, and
// SkipWhole leaves the Reader where Next would.
func TestPeekWhole(t *testing.T) {
	head := AppendHead(nil, 9, 10, []byte("abc"))
	tests := []struct {
		name    string
		records []byte
		more    bool
		pending uint32
		want    []bool // PeekWhole's ok before each Next after the first
	}{
		{"wholes", cat(rec(1, "a"), rec(2, ""), rec(3, "ccc")), false, 0, []bool{true, true, false}},
		{"then a head", cat(rec(1, "a"), head), true, 0, []bool{false, false}},
		{"after a finished continuation", cat(AppendContinuation(nil, []byte("xy")), rec(4, "d")), false, 2, []bool{true, false}},
		{"after an orphan", cat(AppendContinuation(nil, []byte("xy")), rec(4, "d")), false, Unknown, []bool{true, false}},
		{"overrun", cat(rec(1, "a"), []byte{0, 0, 0, 9, 0, 0, 0, 1, 'x'}), false, 0, []bool{false}},
		{"truncated header", cat(rec(1, "a"), []byte{0, 0, 0}), false, 0, []bool{false}},
		{"continuation rank", cat(rec(1, "a"), rec(ContinuationRank, "z")), false, 0, []bool{false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Next alone, for the reference.
			ref := NewReader(tt.records, tt.more, tt.pending)
			var refRecs []Record
			for {
				r, ok := ref.Next()
				if !ok {
					break
				}
				refRecs = append(refRecs, r)
			}
			r := NewReader(tt.records, tt.more, tt.pending)
			if _, _, ok := r.PeekWhole(); ok {
				t.Fatal("PeekWhole before the first Next reported a record")
			}
			if _, ok := r.Next(); !ok {
				t.Fatalf("no first record: %v", r.Err())
			}
			for i, want := range tt.want {
				rank, size, ok := r.PeekWhole()
				if ok != want {
					t.Fatalf("record %d: PeekWhole ok %v, want %v", i+1, ok, want)
				}
				if !ok {
					break
				}
				next := refRecs[i+1]
				if next.Kind != Whole || next.Rank != rank || next.Size != size || next.Offset != r.Offset() {
					t.Fatalf("record %d: PeekWhole (%d, %d) at %d, Next gave %+v", i+1, rank, size, r.Offset(), next)
				}
				r.SkipWhole(size)
			}
		})
	}
}
