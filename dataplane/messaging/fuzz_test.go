package messaging

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging/bundle"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// FuzzAgent feeds an agent worker any sequence of datagrams (the input
// split at 2-byte length prefixes) and runs its timers in between: the
// receive path, sequencing, reassembly, routing, blocklist and credits
// never panic, and the worker's invariants hold. The seed corpus is in
// testdata/fuzz/FuzzAgent.
func FuzzAgent(f *testing.F) {
	cfg := oneWorkerConfig()
	cfg.BuffersPerDest = 2
	cfg.MaxMessageSize = 4096
	tr, err := udp.Listen(netip.MustParseAddrPort("127.0.0.1:0"), udp.Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = tr.Close() })

	dg := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = binary.BigEndian.AppendUint16(b, uint16(len(p)))
			b = append(b, p...)
		}
		return b
	}
	src := uint32(ClientEndpoint(0, 0, 0))
	dst := uint32(AgentEndpoint(0, 0))
	big := make([]byte, 600)
	var frag [][]byte
	{
		b := make([]byte, bundle.Overhead, 256)
		done := 0
		for seq := uint32(0); ; seq++ {
			var n int
			var more bool
			b, n, more = bundle.AppendMessage(b, 256, 256-bundle.Overhead, 5, big, done)
			done += n
			flags := wire.Flags(0)
			if more {
				flags = wire.FlagMore
			}
			frag = append(frag, fakeBundle(0, src, dst, seq, flags, 77, 0, b[bundle.Overhead:]))
			b = b[:bundle.Overhead]
			if !more {
				break
			}
		}
	}
	f.Add(dg(fakeBundle(0, src, dst, 0, 0, 1, 0, bundle.AppendRecord(nil, 5, []byte("hi")))))
	f.Add(dg(frag...))
	f.Add(dg(frag[1], frag[0], frag[2]))
	f.Add(dg(fakeBundle(0, src, dst, 1, 0, 1, 0, bundle.AppendRecord(nil, 1, []byte("x"))),
		fakeBundle(0, src, dst, 0, 0, 1, 0, bundle.AppendRecord(nil, 1, nil)),
		fakeCredit(0, uint32(ClientEndpoint(0, 0, 0)), dst, 1, 0, bundle.Credit{Session: 1, Limit: 3, SACK: 1}.AppendTo(nil)),
		fakeCredit(0, src, dst, 0, wire.FlagAckReq, bundle.Credit{Session: 1}.AppendTo(nil))))
	f.Fuzz(func(t *testing.T, in []byte) {
		a, err := NewAgent(cfg, "n0", AgentOptions{Transports: []transport.Transport{nopClose{tr}}})
		if err != nil {
			t.Fatal(err)
		}
		w := a.workers[0]
		for len(in) >= 2 {
			n := int(binary.BigEndian.Uint16(in))
			in = in[2:]
			n = min(n, len(in))
			w.now += int64(cfg.RetransmitTimeout) / 3
			w.handle(&transport.Packet{Addr: netip.MustParseAddrPort("127.0.0.1:5"), Data: in[:n:n]})
			in = in[n:]
			w.drainMail()
			if w.unblock {
				w.drainBlocklist()
			}
			w.timers()
			for _, l := range w.links {
				if l.nextSeq-l.base > l.window || l.nbufs > int(l.window) {
					t.Fatalf("link %s: %d in flight, %d buffers, window %d", l.name, l.nextSeq-l.base, l.nbufs, l.window)
				}
			}
			for _, l := range w.recv.in {
				if seqDiff(l.next.Load(), l.consumed.Load()) < 0 || l.next.Load()-l.consumed.Load() > l.window {
					t.Fatalf("in link: next %d consumed %d", l.next.Load(), l.consumed.Load())
				}
			}
			// Drop what would be sent: the fuzzer's datagrams go nowhere.
			w.out.reset()
			w.recv.due = w.recv.due[:0]
			for _, l := range w.links {
				l.settle()
			}
			for _, l := range w.recv.in {
				l.creditDue = false
			}
		}
	})
}

// nopClose keeps a shared transport open when a fuzzed agent is dropped.
type nopClose struct{ transport.Transport }

func (nopClose) Close() error { return nil }

// oneWorkerConfig is a host-mode cluster of two nodes, n0 (ranks 0-3) and
// n1 (ranks 4-7), with one worker and 256-byte transfers, for tests that
// drive agent n0's worker by hand; the addresses are never dialled.
func oneWorkerConfig() Config {
	cfg := Defaults()
	cfg.Mode = ModeHost
	cfg.Workers = 1
	cfg.TransferSize = 256
	cfg.Nodes = []Node{
		{Name: "n0", Agent: netip.MustParseAddrPort("127.0.0.1:9"), Clients: []ClientSpec{
			{Name: "c0", Addr: netip.MustParseAddrPort("127.0.0.1:10"), Ranks: Range(0, 3)},
		}},
		{Name: "n1", Agent: netip.MustParseAddrPort("127.0.0.1:11"), Clients: []ClientSpec{
			{Name: "c0", Addr: netip.MustParseAddrPort("127.0.0.1:12"), Ranks: Range(4, 7)},
		}},
	}
	return cfg
}
