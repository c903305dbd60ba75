package messaging

import (
	"bytes"
	"fmt"
	"net/netip"
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging/bundle"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// TestParkedBundleKeepsBuffer: a bundle that finds no free send buffer
// parks in the receive buffer it arrived in (no copy), the worker's
// receive slot gets another buffer, and once a credit frees the next hop
// the parked messages go out intact and the buffer comes back for reuse.
func TestParkedBundleKeepsBuffer(t *testing.T) {
	cfg := oneWorkerConfig()
	cfg.BuffersPerDest = 1
	tr, err := udp.Listen(netip.MustParseAddrPort("127.0.0.1:0"), udp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAgent(cfg, "n0", AgentOptions{Transports: []transport.Transport{tr}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	w := a.workers[0]
	src, dst := uint32(AgentEndpoint(1, 0)), uint32(AgentEndpoint(0, 0))
	// Bundles of 8 messages of 20 bytes for rank 1: one fills the
	// client's only send buffer, the next finds none.
	msg := func(seq, i int) []byte { return []byte(fmt.Sprintf("bundle %2d message %d.", seq, i)) }
	rx := func(seq int) *transport.Packet {
		var recs []byte
		for i := 0; i < 8; i++ {
			recs = bundle.AppendRecord(recs, 1, msg(seq, i))
		}
		buf := make([]byte, w.rxSize)
		n := copy(buf, fakeBundle(0, src, dst, uint32(seq), 0, 7, 0, recs))
		return &transport.Packet{Addr: netip.MustParseAddrPort("127.0.0.1:11"), Data: buf[:n]}
	}
	var parked *transport.Packet
	var orig []byte
	for seq := 0; seq < 3 && len(w.blocked) == 0; seq++ {
		p := rx(seq)
		orig = p.Data[:cap(p.Data)]
		w.handle(p)
		parked = p
	}
	if len(w.blocked) != 1 {
		t.Fatal("no bundle parked")
	}
	l := w.blocked[0]
	if len(l.work) != 1 || l.work[0].buf == nil || &l.work[0].buf[0] != &orig[0] {
		t.Fatalf("the parked bundle does not keep its receive buffer: %d queued", len(l.work))
	}
	if &parked.Data[:1][0] == &orig[0] || cap(parked.Data) < w.rxSize {
		t.Fatal("the receive slot kept the parked bundle's buffer")
	}
	// The next Recv overwrites the slot's new buffer: the parked bundle
	// must not see it.
	for i := range parked.Data[:cap(parked.Data)] {
		parked.Data[:cap(parked.Data)][i] = 'X'
	}
	parkedSeq := int(l.next.Load()) - 1
	// The client acknowledges everything it got: the buffer frees, the
	// blocklist runs, and the parked messages go out.
	out := w.links[w.a.table.lookup(1)]
	// What the worker produced is sent (and dropped: no client listens).
	w.out.reset()
	w.recv.due = w.recv.due[:0]
	for _, l := range w.links {
		l.settle()
	}
	w.now++
	sent := w.out.len()
	w.credit(wire.Header{Version: wire.Version, Type: wire.TypeCredit, Src: out.hdr.Dst, Dst: out.hdr.Src, Seq: out.nextSeq},
		bundle.Credit{Session: out.session, Limit: out.nextSeq + 1}, out.addr, nil, w.now)
	if !w.unblock {
		t.Fatalf("the credit freed nothing: next %d base %d ready %d nbufs %d session %d", out.nextSeq, out.base, len(out.ready), out.nbufs, out.session)
	}
	w.drainBlocklist()
	w.flushAll()
	if len(w.blocked) != 0 || len(w.free) != 1 || &w.free[0][0] != &orig[0] {
		t.Fatalf("after the credit: %d blocked, %d free buffers (want the parked one back)", len(w.blocked), len(w.free))
	}
	var onWire []byte
	for _, p := range w.out.pkts[sent:] {
		onWire = append(onWire, p.Data...)
	}
	for i := 0; i < 8; i++ {
		if !bytes.Contains(onWire, msg(parkedSeq, i)) {
			t.Errorf("message %q of the parked bundle not sent intact", msg(parkedSeq, i))
		}
	}
	if b := w.rxBuf(); &b[0] != &orig[0] {
		t.Error("rxBuf does not reuse the returned buffer")
	}
}
