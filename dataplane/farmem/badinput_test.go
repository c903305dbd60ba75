package farmem

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// rawPeer sends hand-made datagrams and reads the replies.
type rawPeer struct {
	t  *testing.T
	tr transport.Transport
	to netip.AddrPort
}

func (p rawPeer) send(b []byte) {
	p.t.Helper()
	if _, err := p.tr.Send([]transport.Packet{{Addr: p.to, Data: b}}); err != nil {
		p.t.Fatal(err)
	}
}

// reply waits for one reply record.
func (p rawPeer) reply() Record {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pkts := []transport.Packet{{Data: make([]byte, 65536)}}
	if _, err := p.tr.Recv(ctx, pkts); err != nil {
		p.t.Fatalf("no reply: %v", err)
	}
	h, _, recs, err := Decode(pkts[0].Data, nil)
	if err != nil || h.Type != wire.TypeMemReply || len(recs) == 0 {
		p.t.Fatalf("bad reply %v %v", h, err)
	}
	return recs[0]
}

// TestBadInput: unknown regions, offsets past the end, oversize and
// malformed requests and a wrong tenant get clear errors and counters, and
// harm nothing: a well-behaved client works throughout.
func TestBadInput(t *testing.T) {
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	agent, _ := startAgent(t, listen(t, loopback), []netip.AddrPort{srv.Addr()}, nil)
	ctx := context.Background()
	good := newClient(t, agent.Addr(), 4)
	r, err := good.Alloc(ctx, 256<<10)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{0xa5}, 100<<10)
	if _, err := r.WriteAt(want, 1000); err != nil {
		t.Fatal(err)
	}

	ro, err := good.Create(ctx, 64<<10, CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("client errors", func(t *testing.T) {
		other := newClient(t, agent.Addr(), 5)
		for _, tc := range []struct {
			name string
			err  error
			do   func() error
		}{
			{"unknown region", ErrUnknownRegion, func() error { _, err := good.Open(ctx, 9999, false); return err }},
			{"wrong tenant open", ErrWrongTenant, func() error { _, err := other.Open(ctx, r.ID(), false); return err }},
			{"wrong tenant free", ErrWrongTenant, func() error { return other.Free(ctx, r.ID()) }},
			{"write past the end", ErrOutOfRange, func() error { _, err := r.WriteAt(want, r.Size()-10); return err }},
			{"read past the end", io.EOF, func() error { _, err := r.ReadAt(want, r.Size()); return err }},
			{"over capacity", ErrNoSpace, func() error { _, err := good.Create(ctx, 1<<40, CreateOptions{}); return err }},
			{"preload path longer than a datagram", ErrBadRequest, func() error {
				_, err := good.Create(ctx, 0, CreateOptions{Preload: strings.Repeat("x", 10000)})
				return err
			}},
			{"empty region", ErrBadRequest, func() error { _, err := good.Create(ctx, 0, CreateOptions{}); return err }},
			{"missing preload", ErrBadRequest, func() error {
				_, err := good.Create(ctx, 0, CreateOptions{Preload: "/nonexistent/file"})
				return err
			}},
			{"writer on read-only", ErrReadOnly, func() error {
				ri, err := good.Create(ctx, 4096, CreateOptions{})
				if err != nil {
					return err
				}
				_, err = good.Open(ctx, ri.ID, true)
				return err
			}},
			// Last: it fills the server.
			{"full to the byte", ErrNoSpace, func() error {
				st := srv.Stats()
				if _, err := good.Create(ctx, st.Capacity-st.Used, CreateOptions{}); err != nil {
					return err // the rest of the capacity must still fit
				}
				_, err := good.Create(ctx, 1, CreateOptions{})
				return err
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if err := tc.do(); !errors.Is(err, tc.err) {
					t.Fatalf("got %v, want %v", err, tc.err)
				}
			})
		}
		if l, err := other.List(ctx); err != nil || len(l) != 0 {
			t.Fatalf("tenant 5 lists %+v, %v; want nothing", l, err)
		}
	})

	t.Run("raw requests to the server", func(t *testing.T) {
		p := rawPeer{t, listen(t, loopback), srv.Addr()}
		hdr := func(typ wire.Type) wire.Header { return wire.Header{Type: typ, Tenant: 4, Dst: r.ID()} }
		before := srv.Stats()
		for _, tc := range []struct {
			name   string
			typ    wire.Type
			rec    Record
			status Status
		}{
			{"read past the end", wire.TypeMemRead, Record{Op: OpRead, Region: r.ID(), ID: 1, Offset: uint64(r.Size()), Size: 10}, StatusOutOfRange},
			{"offset overflow", wire.TypeMemRead, Record{Op: OpRead, Region: r.ID(), ID: 2, Offset: 1<<64 - 4, Size: 10}, StatusOutOfRange},
			{"read above the chunk size", wire.TypeMemRead, Record{Op: OpRead, Region: r.ID(), ID: 3, Size: 128 << 10}, StatusBadRequest},
			{"write above the chunk size", wire.TypeMemWrite, Record{Op: OpWrite, Region: r.ID(), ID: 7, Size: 128 << 10, Data: make([]byte, FragUnit)}, StatusBadRequest},
			{"unknown region", wire.TypeMemRead, Record{Op: OpRead, Region: 7777, ID: 4, Size: 10}, StatusUnknownRegion},
			{"write without a lease", wire.TypeMemWrite, Record{Op: OpWrite, Region: r.ID(), ID: 5, Size: 3, Data: []byte("abc")}, StatusNotWriter},
			{"forged lease", wire.TypeMemWrite, Record{Op: OpWrite, Region: r.ID(), ID: 6, Size: 3, Aux: 12345, Data: []byte("abc")}, StatusNotWriter},
			// Before, a write to a read-only region was answered "no
			// valid writer lease", and an open with an aux of neither 0
			// nor 1 was taken for a reader's.
			{"write to a read-only region", wire.TypeMemWrite, Record{Op: OpWrite, Region: ro.ID, ID: 15, Size: 3, Aux: 1, Data: []byte("abc")}, StatusReadOnly},
			{"open with an unknown aux", wire.TypeMemRead, Record{Op: OpOpen, Region: r.ID(), ID: 16, Aux: 7}, StatusBadRequest},
		} {
			t.Run(tc.name, func(t *testing.T) {
				p.send(AppendDatagram(nil, hdr(tc.typ), 0, tc.rec))
				if got := p.reply(); got.Status != tc.status || got.ID != tc.rec.ID {
					t.Fatalf("reply %v id %d, want %v id %d", got.Status, got.ID, tc.status, tc.rec.ID)
				}
			})
		}
		malformed := [][]byte{
			{1, 2, 3},
			AppendDatagram(nil, hdr(wire.TypeMemRead), 0, Record{Op: OpRead, Region: r.ID(), ID: 9, Size: MaxChunk + 1}),
			AppendDatagram(nil, hdr(wire.TypeMemRead), 0, Record{Op: OpWrite, Region: r.ID(), ID: 10, Size: 1, Data: []byte{1}}),
			AppendDatagram(nil, hdr(wire.TypeMemReply), 0, Record{Op: OpRead, Region: r.ID(), ID: 11}),
			AppendDatagram(nil, hdr(wire.TypeMemRead), 0, Record{Op: 200, ID: 12}),
			AppendDatagram(nil, hdr(wire.TypeMemWrite), 0, Record{Op: OpWrite, Region: r.ID(), ID: 13, Size: 2000, Frag: 100, Data: []byte{1}}),
			AppendDatagram(nil, hdr(wire.TypeBundle), 0, Record{Op: OpRead, ID: 14}),
			AppendDatagram(nil, hdr(wire.TypeMemRead), 0)[:wire.HeaderLen+PreambleLen+10],
		}
		for _, b := range malformed {
			p.send(b)
		}
		// A well-formed request sent after them is answered: the server
		// processed (and dropped) everything before it.
		p.send(AppendDatagram(nil, hdr(wire.TypeMemRead), 0, Record{Op: OpRead, Region: r.ID(), ID: 20, Offset: 1000, Size: 16}))
		if got := p.reply(); got.Status != StatusOK || got.ID != 20 || !bytes.Equal(got.Data, want[:16]) {
			t.Fatalf("good read after malformed ones: %+v", got)
		}
		st := srv.Stats()
		if d := st.Link.Malformed - before.Link.Malformed; d != uint64(len(malformed)) {
			t.Errorf("malformed counted %d, want %d", d, len(malformed))
		}
		if st.Errors.OutOfRange < 2 || st.Errors.BadRequest < 2 || st.Errors.NotWriter < 2 || st.Errors.UnknownRegion < 1 {
			t.Errorf("error counters %+v", st.Errors)
		}
	})

	got := make([]byte, len(want))
	if _, err := r.ReadAt(got, 1000); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the good client's data after the bad input: %v", err)
	}
	t.Logf("agent %+v", agent.Stats().Errors)
	t.Logf("server %+v", srv.Stats())
}
