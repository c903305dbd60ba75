package ingest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

func TestInputRoundTrip(t *testing.T) {
	for _, in := range []Input{
		{ID: 1, Total: 1, Offset: 0, Model: "checksum", Data: []byte{7}},
		{ID: 1<<63 + 5, Total: 1 << 30, Offset: 1<<30 - 3, BudgetUs: 20000, Model: "m", Data: []byte{1, 2, 3}},
		{ID: 9, Total: 100, Offset: 10, Model: string(bytes.Repeat([]byte("x"), MaxModelName)), Data: bytes.Repeat([]byte{0xab}, 90)},
	} {
		b := AppendInput(nil, 42, &in)
		h, payload, err := wire.Decode(b)
		if err != nil || h.Type != wire.TypeIngestInput || h.Tenant != 42 {
			t.Fatalf("header: %+v %v", h, err)
		}
		got, err := DecodeInput(payload)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, in) {
			t.Errorf("round trip: got %+v, want %+v", got, in)
		}
		if want := MaxFragment(len(b)-len(in.Data)+len(in.Data), in.Model); want < len(in.Data) {
			t.Errorf("MaxFragment %d below a fragment that fit", want)
		}
	}
}

func TestInputMalformed(t *testing.T) {
	good := func() []byte {
		b := AppendInput(nil, 1, &Input{ID: 1, Total: 10, Model: "m", Data: make([]byte, 10)})
		return b[wire.HeaderLen:]
	}
	cases := map[string]func(p []byte) []byte{
		"short":          func(p []byte) []byte { return p[:InputHeaderLen-1] },
		"no model":       func(p []byte) []byte { p[20] = 0; return p },
		"long model":     func(p []byte) []byte { p[20] = MaxModelName + 1; return p },
		"model past end": func(p []byte) []byte { p[20] = 60; return p[:InputHeaderLen+5] },
		"empty input":    func(p []byte) []byte { p[8], p[9], p[10], p[11] = 0, 0, 0, 0; return p },
		"past the end":   func(p []byte) []byte { p[15] = 1; return p },
		"no data":        func(p []byte) []byte { return p[:InputHeaderLen+1] },
	}
	for name, f := range cases {
		if _, err := DecodeInput(f(good())); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err %v, want ErrMalformed", name, err)
		}
	}
}

func TestResultAndCtrlRoundTrip(t *testing.T) {
	r := ResultFragment{ID: 3, Total: 10, Offset: 4, Status: StatusOK, GPU: 2, QueuedUs: 5, DeviceUs: 6, Text: "1g.10gb@3", Data: []byte{1, 2, 3}}
	b := AppendResult(nil, 7, &r)
	_, payload, err := wire.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeResult(payload)
	if err != nil || !reflect.DeepEqual(got, r) {
		t.Errorf("result: got %+v %v, want %+v", got, err, r)
	}
	c := Ctrl{Op: OpDoorbell, Status: StatusOK, GPU: 1, Slot: 6, Length: 1 << 20, Epoch: 99, Request: 123, DeviceUs: 4, Tenant: 9, Text: "mlp"}
	b = AppendCtrl(nil, &c)
	_, payload, err = wire.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	gc, err := DecodeCtrl(payload)
	if err != nil || !reflect.DeepEqual(gc, c) {
		t.Errorf("ctrl: got %+v %v, want %+v", gc, err, c)
	}
	payload[0] = 77
	if _, err := DecodeCtrl(payload); !errors.Is(err, ErrMalformed) {
		t.Errorf("unknown op: %v", err)
	}
}

func TestStatusOf(t *testing.T) {
	if s := StatusOf(Errorf(StatusTooLarge, "x")); s != StatusTooLarge {
		t.Errorf("StatusOf(*Error) = %v", s)
	}
	if s := StatusOf(errors.New("x")); s != StatusInternal {
		t.Errorf("StatusOf(plain) = %v", s)
	}
	for _, s := range []Status{StatusOverloaded, StatusHostUnavailable} {
		if !s.Retryable() {
			t.Errorf("%v not retryable", s)
		}
	}
	if StatusBadRequest.Retryable() {
		t.Error("bad-request retryable")
	}
}

// FuzzDecode: no datagram makes a decoder panic, and whatever decodes
// lies within the datagram and encodes back to the same fields.
func FuzzDecode(f *testing.F) {
	f.Add(AppendInput(nil, 1, &Input{ID: 1, Total: 4, Model: "m", Data: []byte{1, 2, 3, 4}})[wire.HeaderLen:])
	f.Add(AppendResult(nil, 1, &ResultFragment{ID: 1, Total: 2, Text: "t", Data: []byte{1, 2}})[wire.HeaderLen:])
	f.Add(AppendCtrl(nil, &Ctrl{Op: OpComplete, Text: "e"})[wire.HeaderLen:])
	b, _ := AppendCtrls(nil, []Ctrl{{Op: OpDoorbell, Request: 1, Text: "checksum"}, {Op: OpComplete, Request: 2}, {Op: OpRunning, Request: 3}}, 9000, true)
	f.Add(b[wire.HeaderLen:])
	f.Fuzz(func(t *testing.T, p []byte) {
		if in, err := DecodeInput(p); err == nil {
			again, err := DecodeInput(AppendInput(nil, 0, &in)[wire.HeaderLen:])
			if err != nil || again.ID != in.ID || !bytes.Equal(again.Data, in.Data) || again.Model != in.Model {
				t.Fatalf("input does not re-encode: %+v", in)
			}
		}
		if r, err := DecodeResult(p); err == nil {
			if uint64(r.Offset)+uint64(len(r.Data)) > uint64(r.Total) {
				t.Fatalf("result fragment past its total: %+v", r)
			}
		}
		if c, err := DecodeCtrl(p); err == nil && len(c.Text) > len(p) {
			t.Fatalf("control text longer than the datagram")
		}
		if cs, err := DecodeCtrls(p, nil); err == nil {
			size, long := 0, false
			for _, c := range cs {
				size += CtrlHeaderLen + len(c.Text)
				long = long || len(c.Text) > maxText
			}
			if size > len(p) {
				t.Fatalf("%d control messages of %d bytes in %d", len(cs), size, len(p))
			}
			if len(cs) > 1 && !long {
				b, n := AppendCtrls(nil, cs, len(p)+wire.HeaderLen+CtrlHeaderLen, true)
				_, payload, _ := wire.Decode(b)
				again, err := DecodeCtrls(payload, nil)
				if n != len(cs) || err != nil || !reflect.DeepEqual(again, cs) {
					t.Fatalf("batch does not re-encode: %d of %d, %v", n, len(cs), err)
				}
			}
		}
	})
}

// TestCtrlBatch: version 2's batches round-trip, split at the payload
// limit, leave out what may not be batched, and are refused whole when
// malformed; the version rides in register and register-ack.
func TestCtrlBatch(t *testing.T) {
	var cs []Ctrl
	for i := range 40 {
		op := []CtrlOp{OpDoorbell, OpComplete, OpRunning}[i%3]
		c := Ctrl{Op: op, Status: Status(i % 2), GPU: uint8(i % 3), Slot: uint8(i % 8), Length: uint32(i << 10),
			Epoch: 77, Request: uint64(1000 + i), DeviceUs: uint32(i), Tenant: uint16(i), Text: strings.Repeat("m", i%5)}
		if op == OpDoorbell {
			// A doorbell has flags where the others have a status.
			c.Status, c.Flags = 0, CtrlFlags(i%2)
		}
		cs = append(cs, c)
	}
	decodeAll := func(b []byte) []Ctrl {
		t.Helper()
		_, payload, err := wire.Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeCtrls(payload, nil)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	// All in one datagram, then split at 300 bytes.
	b, n := AppendCtrls(nil, cs, 9000, true)
	if n != len(cs) || !reflect.DeepEqual(decodeAll(b), cs) {
		t.Fatalf("one batch: %d messages, want %d, or fields differ", n, len(cs))
	}
	var got []Ctrl
	datagrams := 0
	for rest := cs; len(rest) > 0; datagrams++ {
		b, n := AppendCtrls(nil, rest, 300, true)
		if len(b) > 300 {
			t.Fatalf("datagram of %d bytes, limit 300", len(b))
		}
		got = append(got, decodeAll(b)...)
		rest = rest[n:]
	}
	if !reflect.DeepEqual(got, cs) || datagrams < 5 {
		t.Fatalf("split: %d datagrams, fields equal %v", datagrams, reflect.DeepEqual(got, cs))
	}
	// To a version 1 peer: one plain message per datagram, which
	// DecodeCtrl (version 1's decoder) reads.
	b, n = AppendCtrls(nil, cs, 9000, false)
	if _, payload, _ := wire.Decode(b); n != 1 {
		t.Fatalf("unbatched: %d messages", n)
	} else if c, err := DecodeCtrl(payload); err != nil || !reflect.DeepEqual(c, cs[0]) {
		t.Fatalf("unbatched: %+v %v", c, err)
	}
	// Register is never batched: it goes alone, and ends a batch.
	reg := Ctrl{Op: OpRegister, Epoch: 5, Length: 2, Version: CtrlVersion, Text: "/run/x.sock"}
	mixed := []Ctrl{cs[0], cs[1], reg, cs[2]}
	b, n = AppendCtrls(nil, mixed, 9000, true)
	if n != 2 || !reflect.DeepEqual(decodeAll(b), mixed[:2]) {
		t.Fatalf("batch before a register: %d", n)
	}
	b, n = AppendCtrls(nil, mixed[2:], 9000, true)
	if n != 1 || !reflect.DeepEqual(decodeAll(b), []Ctrl{reg}) {
		t.Fatalf("register: %d %+v", n, decodeAll(b))
	}
	// A version 1 register (nothing at offset 30) reads as version 0.
	_, payload, _ := wire.Decode(AppendCtrl(nil, &reg))
	payload[30], payload[31] = 0, 0
	if c, err := DecodeCtrl(payload); err != nil || c.Version != 0 || c.Tenant != 0 {
		t.Fatalf("v1 register: %+v %v", c, err)
	}
	// DecodeCtrl refuses a batch.
	b, _ = AppendCtrls(nil, cs[:3], 9000, true)
	_, payload, _ = wire.Decode(b)
	if _, err := DecodeCtrl(payload); !errors.Is(err, ErrMalformed) {
		t.Errorf("DecodeCtrl of a batch: %v", err)
	}
	// Malformed batches yield nothing.
	bad := map[string][]byte{}
	bad["truncated"] = payload[:len(payload)-3]
	bad["trailing bytes"] = append(append([]byte(nil), payload...), 0, 0)
	more := append([]byte(nil), payload...)
	binary.BigEndian.PutUint32(more[4:], 4)
	bad["count past the end"] = more
	zero := append([]byte(nil), payload...)
	binary.BigEndian.PutUint32(zero[4:], 0)
	bad["empty"] = zero
	nested := append([]byte(nil), payload...)
	nested[CtrlHeaderLen] = uint8(OpBatch)
	bad["nested batch"] = nested
	withReg := AppendCtrl(nil, &Ctrl{Op: OpBatch, Length: 2})[wire.HeaderLen:]
	withReg = appendCtrlBody(withReg, &cs[0])
	withReg = appendCtrlBody(withReg, &reg)
	bad["register inside"] = withReg
	for name, p := range bad {
		if got, err := DecodeCtrls(p, []Ctrl{cs[9]}); !errors.Is(err, ErrMalformed) || len(got) != 1 {
			t.Errorf("%s: %d messages, %v", name, len(got), err)
		}
	}
}

// TestDoorbellFlags: a doorbell's flags (version 3) travel in the byte
// that is the status of other messages, alone or in a batch, so that an
// older host reads a given-up doorbell as a doorbell with a status it
// ignores; other messages keep their status there.
func TestDoorbellFlags(t *testing.T) {
	for _, tc := range []struct {
		name  string
		c     Ctrl
		byte1 uint8
	}{
		{"doorbell given up", Ctrl{Op: OpDoorbell, Flags: FlagGivenUp, Request: 5, Text: "mlp"}, uint8(FlagGivenUp)},
		{"doorbell", Ctrl{Op: OpDoorbell, Request: 5, Text: "mlp"}, 0},
		{"released", Ctrl{Op: OpComplete, Status: StatusReleased, Request: 5, Text: "ran nothing"}, uint8(StatusReleased)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, batch := range []bool{false, true} {
				cs := []Ctrl{tc.c, {Op: OpRunning, Request: 6}}
				b, n := AppendCtrls(nil, cs, 1500, batch)
				_, payload, err := wire.Decode(b)
				if err != nil {
					t.Fatal(err)
				}
				body := payload
				if batch {
					body = payload[CtrlHeaderLen:]
				}
				if body[1] != tc.byte1 {
					t.Errorf("batch %v: byte 1 is %d, want %d", batch, body[1], tc.byte1)
				}
				got, err := DecodeCtrls(payload, nil)
				if err != nil || len(got) != n || !reflect.DeepEqual(got[0], tc.c) {
					t.Errorf("batch %v: decoded %+v %v, want %+v first of %d", batch, got, err, tc.c, n)
				}
			}
		})
	}
}
