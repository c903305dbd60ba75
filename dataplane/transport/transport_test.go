package transport

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
)

// refuser is a Transport whose Send refuses packets with Data "bad" and
// stops at "close"; the other methods are unused.
type refuser struct {
	Transport
	sent []string
}

func (r *refuser) Send(pkts []Packet) (int, error) {
	for i, p := range pkts {
		switch string(p.Data) {
		case "bad":
			return i, fmt.Errorf("refused: %w", ErrTooBig)
		case "close":
			return i, fmt.Errorf("gone: %w", ErrClosed)
		}
		r.sent = append(r.sent, string(p.Data))
	}
	return len(pkts), nil
}

func (*refuser) Recv(context.Context, []Packet) (int, error) { return 0, ErrClosed }

func TestSendAll(t *testing.T) {
	pk := func(s ...string) []Packet {
		var p []Packet
		for _, d := range s {
			p = append(p, Packet{Addr: netip.MustParseAddrPort("127.0.0.1:1"), Data: []byte(d)})
		}
		return p
	}
	r := &refuser{}
	var refused []string
	n, err := SendAll(r, pk("a", "bad", "b", "bad", "bad", "c"), func(p Packet, err error) {
		if !errors.Is(err, ErrTooBig) {
			t.Errorf("onErr got %v", err)
		}
		refused = append(refused, string(p.Data))
	})
	if n != 3 || err != nil || fmt.Sprint(r.sent) != "[a b c]" || len(refused) != 3 {
		t.Fatalf("SendAll = %d, %v; sent %v, refused %v", n, err, r.sent, refused)
	}
	r = &refuser{}
	n, err = SendAll(r, pk("a", "close", "b"), nil)
	if n != 1 || !errors.Is(err, ErrClosed) {
		t.Fatalf("SendAll on a closing transport = %d, %v", n, err)
	}
	if n, err := SendAll(r, nil, nil); n != 0 || err != nil {
		t.Fatalf("empty SendAll = %d, %v", n, err)
	}
}
