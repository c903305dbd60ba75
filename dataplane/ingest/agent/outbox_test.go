package agent

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/memnet"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// TestOutboxBatches: control messages queued together go out batched per
// address to a version 2 host, one per datagram to a version 1 host and
// for what may not be batched, in the order queued.
func TestOutboxBatches(t *testing.T) {
	nw := memnet.New(memnet.Options{Seed: 1, MaxPayload: 1000})
	me := netip.MustParseAddrPort("10.1.0.2:1")
	v2 := netip.MustParseAddrPort("10.1.0.1:1")
	v1 := netip.MustParseAddrPort("10.1.0.3:1")
	tr, _ := nw.Listen(me)
	h2, _ := nw.Listen(v2)
	h1, _ := nw.Listen(v1)
	defer tr.Close()
	defer h2.Close()
	defer h1.Close()
	var errs atomic.Uint64
	o := newOutbox(tr, "host", slog.Default(), nil, &errs)
	// Queued before the sender runs: one flush sends them all.
	for i := range 60 {
		c := ingest.Ctrl{Op: ingest.OpDoorbell, Epoch: 7, Request: uint64(i), Text: "checksum"}
		o.pushCtrl(v2, &c, true)
		o.pushCtrl(v1, &c, false)
		if i == 30 {
			o.pushCtrl(v2, &ingest.Ctrl{Op: ingest.OpRegisterAck, Epoch: 7, Version: ingest.CtrlVersion}, false)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { o.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	read := func(ep *memnet.Endpoint, want int) (msgs []ingest.Ctrl, datagrams int) {
		t.Helper()
		pkts := []transport.Packet{{Data: make([]byte, 2000)}}
		for len(msgs) < want {
			rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
			n, err := ep.Recv(rctx, pkts)
			rcancel()
			if err != nil || n != 1 {
				t.Fatalf("got %d of %d messages: %v", len(msgs), want, err)
			}
			_, payload, err := wire.Decode(pkts[0].Data)
			if err != nil {
				t.Fatal(err)
			}
			if msgs, err = ingest.DecodeCtrls(payload, msgs); err != nil {
				t.Fatal(err)
			}
			datagrams++
			pkts[0].Data = pkts[0].Data[:cap(pkts[0].Data)]
		}
		return msgs, datagrams
	}
	m2, d2 := read(h2, 61)
	m1, d1 := read(h1, 60)
	if d1 != 60 {
		t.Errorf("v1 host: %d datagrams for 60 doorbells", d1)
	}
	// 1000-byte datagrams hold 21 doorbells; the ack goes alone.
	if d2 < 4 || d2 > 6 {
		t.Errorf("v2 host: %d datagrams for 61 messages", d2)
	}
	next := uint64(0)
	for i, c := range m2 {
		if i == 31 {
			if c.Op != ingest.OpRegisterAck || c.Version != ingest.CtrlVersion {
				t.Errorf("message 31: %+v", c)
			}
			continue
		}
		if c.Request != next {
			t.Fatalf("v2 host: message %d is request %d, want %d", i, c.Request, next)
		}
		next++
	}
	for i, c := range m1 {
		if c.Request != uint64(i) {
			t.Fatalf("v1 host: message %d is request %d", i, c.Request)
		}
	}
	if errs.Load() != 0 {
		t.Errorf("%d send errors", errs.Load())
	}
}

// scriptedSend is a transport whose Send answers from a script: each call
// takes the next step, which says how many of the datagrams it was handed
// count as sent and with what error; past the script everything is sent.
type scriptedSend struct {
	transport.Transport // only Send and MaxPayload are called
	steps               []sendStep
	sent                []transport.Packet
}

type sendStep struct {
	n   func(handed int) int
	err error
}

func (s *scriptedSend) Send(pkts []transport.Packet) (int, error) {
	if len(s.steps) == 0 {
		s.sent = append(s.sent, pkts...)
		return len(pkts), nil
	}
	st := s.steps[0]
	s.steps = s.steps[1:]
	n := st.n(len(pkts))
	s.sent = append(s.sent, pkts[:n]...)
	return n, st.err
}

func (s *scriptedSend) MaxPayload() int { return 1500 }

// TestOutboxSendErrors: the outbox takes a transport's partial sends as
// the Transport contract says (pkts[n] was refused, the rest goes again),
// and a Send that reports every datagram sent together with an error (as
// transport.SendAll allows) ends the flush; before, that indexed out[n]
// past the batch and panicked the agent's sender.
func TestOutboxSendErrors(t *testing.T) {
	boom := errors.New("send failed")
	all := func(h int) int { return h }
	first := func(int) int { return 1 }
	for _, tc := range []struct {
		name     string
		steps    []sendStep
		wantSent []int // the packets' indexes that went out
		wantErrs uint64
	}{
		{"all sent, with an error", []sendStep{{all, boom}}, []int{0, 1, 2, 3}, 1},
		{"second refused", []sendStep{{first, boom}}, []int{0, 2, 3}, 1},
		{"second refused, then all sent with an error", []sendStep{{first, boom}, {all, boom}}, []int{0, 2, 3}, 2},
		{"closed", []sendStep{{first, transport.ErrClosed}}, []int{0}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := &scriptedSend{steps: tc.steps}
			var sent, errs atomic.Uint64
			o := newOutbox(tr, "clients", slog.New(slog.DiscardHandler), &sent, &errs)
			to := netip.MustParseAddrPort("10.0.0.100:1")
			for i := range 4 {
				o.push(transport.Packet{Addr: to, Data: []byte{byte(i)}})
			}
			o.flush(nil)
			var got []int
			for _, p := range tr.sent {
				got = append(got, int(p.Data[0]))
			}
			if !slices.Equal(got, tc.wantSent) || sent.Load() != uint64(len(tc.wantSent)) || errs.Load() != tc.wantErrs {
				t.Errorf("sent %v (counted %d), %d errors; want %v, %d", got, sent.Load(), errs.Load(), tc.wantSent, tc.wantErrs)
			}
		})
	}
}
