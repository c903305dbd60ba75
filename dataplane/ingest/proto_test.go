package ingest

import (
	"bytes"
	"errors"
	"reflect"
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
	})
}
