package xsk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

var frameSizes = []int{60, 61, 64, 100, 128, 511, 1000, 1514}

// TestReceive: frames sent into the peer arrive on the socket, byte for byte.
func TestReceive(t *testing.T) {
	n := newTestNet(t)
	xa, xb := n.veth(t, "xa", "xb", 1)
	s := n.open(t, xa, 0, nil, nil)
	t.Logf("bound xa queue 0 in %s mode (zero-copy refused with: %v)", s.Mode(), s.ZeroCopyErr())
	setSlot(t, n.redirect(t, xa), s)
	pk := n.packetSock(t, xb)

	var want [][]byte
	for i, size := range frameSizes {
		f := testFrame(uint64(i), size)
		want = append(want, f)
		if _, err := unix.Write(pk, f); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var got [][]byte
	err := s.Receive(ctx, func(f []byte) {
		if _, ok := frameSeq(f); ok {
			got = append(got, bytes.Clone(f))
			if len(got) == len(want) {
				cancel()
			}
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Receive: %v (got %d of %d frames)", err, len(got), len(want))
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Errorf("frame %d: got %d bytes % x..., want %d bytes % x...", i, len(got[i]), got[i][:26], len(want[i]), want[i][:26])
		}
	}
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.RXPackets < uint64(len(want)) || st.RXDropped != 0 || st.RXRingFull != 0 {
		t.Errorf("stats %+v", st)
	}
	if fs := s.UMEM().Frames(); fs.User != 0 || fs.Free+fs.Fill != fs.Total {
		t.Errorf("frames after Receive: %+v", fs)
	}
}

// TestTransmit: frames transmitted on the socket arrive at the peer.
func TestTransmit(t *testing.T) {
	n := newTestNet(t)
	xa, xb := n.veth(t, "xa", "xb", 1)
	s := n.open(t, xa, 0, nil, nil)
	pk := n.packetSock(t, xb)

	var frames [][]byte
	for i := range 32 {
		frames = append(frames, testFrame(uint64(i), frameSizes[i%len(frameSizes)]))
	}
	sent, err := s.Transmit(frames)
	if err != nil || sent != len(frames) {
		t.Fatalf("Transmit: %d, %v", sent, err)
	}
	buf := make([]byte, 4096)
	for i, want := range frames {
		got, err := recvPacket(pk, buf, 2*time.Second)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("frame %d: got %d bytes, want %d", i, len(got), len(want))
		}
	}
	u := s.UMEM()
	if !waitFor(2*time.Second, func() bool { s.Reclaim(); return u.Frames().TX == 0 }) {
		t.Fatalf("TX frames never completed: %+v", u.Frames())
	}
	st, _ := s.Stats()
	t.Logf("32 frames: %d sendto calls, stats %+v", st.TXWakeups, st)
	if st.TXInvalidDescs != 0 {
		t.Errorf("kernel rejected %d TX descriptors", st.TXInvalidDescs)
	}

	if _, err := s.Transmit([][]byte{make([]byte, u.FrameSize()+1)}); !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("oversized frame: %v", err)
	}
	if _, err := s.Transmit([][]byte{{}}); !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("empty frame: %v", err)
	}
	if _, err := s.TransmitDescs([]Desc{{Addr: 0, Len: 60}}); !errors.Is(err, ErrInvalidDesc) {
		t.Errorf("TransmitDescs of a frame not held: %v", err)
	}
	if fs := u.Frames(); fs.User != 0 || fs.TX != 0 || fs.Free+fs.Fill != fs.Total || u.FrameErrors() != 1 {
		t.Errorf("frames %+v, frame errors %d (want the one refused descriptor)", fs, u.FrameErrors())
	}
}

// TestTransmitDescsMultiBuffer forwards received multi-buffer packets
// (MTU 9000, an xdp.frags program; a 6000-byte frame arrives as two
// descriptors chained by XDP_PKT_CONTD) with TransmitDescs: the peer gets
// each packet whole, and a packet that cannot go whole (the ring fills in
// its middle, descs ends in its middle, or the socket is not MultiBuffer)
// is not submitted at all and stays the caller's. Before, TransmitDescs
// dropped the flag, so the peer got the first 3840 bytes as a packet of
// their own and never the rest.
func TestTransmitDescsMultiBuffer(t *testing.T) {
	n := newTestNet(t)
	xa, xb := n.jumboVeth(t, "xa", "xb")
	m := n.redirectFrags(t, xa)
	u := newUMEM(t, nil)
	// A 2-descriptor TX ring: a 1-descriptor packet and a 2-descriptor one
	// do not fit together.
	sg := n.newSocket(t, u, xa, 0, &SocketConfig{MultiBuffer: true, TXSize: 2})
	if !sg.MultiBuffer() {
		t.Fatal("socket bound without XDP_USE_SG")
	}
	single := n.newSocket(t, u, xa, 0, &SocketConfig{TXSize: 2}) // shares the UMEM: never MultiBuffer
	setSlot(t, m, sg)
	pk := n.packetSock(t, xb)

	type step struct {
		s        *Socket
		from, to int // descriptors descs[from:to]
		want     int
		wantErr  error
	}
	tests := []struct {
		name  string
		sizes []int // frames sent into xa, forwarded back out, in order
		steps []step
	}{
		{"whole packet", []int{6000}, []step{{sg, 0, 2, 2, nil}}},
		{"slice ends inside a packet", []int{6000}, []step{{sg, 0, 1, 0, ErrInvalidDesc}, {sg, 0, 2, 2, nil}}},
		{"ring full inside a packet", []int{100, 6000}, []step{{sg, 0, 3, 1, ErrRingFull}, {sg, 1, 3, 2, nil}}},
		{"socket without MultiBuffer", []int{6000}, []step{{single, 0, 2, 0, ErrInvalidDesc}, {sg, 0, 2, 2, nil}}},
		{"single-buffer packets", []int{60, 1514}, []step{{sg, 0, 2, 2, nil}}},
	}
	buf := make([]byte, 10000)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			frames := sendFrames(t, pk, uint64(100*i), tt.sizes)
			descs := recvPackets(t, sg, len(frames))
			got := len(descs)
			// 6000 bytes reach XDP on veth in two buffers (3840 + 2160 on 6.18).
			if want := len(frames) + 1; tt.sizes[len(tt.sizes)-1] == 6000 && got != want {
				t.Fatalf("received %d descriptors, want %d: %+v", got, want, descs[:got])
			}
			for _, st := range tt.steps {
				k, err := st.s.TransmitDescs(descs[st.from:st.to])
				if k != st.want || !errors.Is(err, st.wantErr) {
					t.Fatalf("TransmitDescs(descs[%d:%d]) on the %s socket: %d, %v; want %d, %v",
						st.from, st.to, map[bool]string{true: "MultiBuffer", false: "single-buffer"}[st.s.MultiBuffer()],
						k, err, st.want, st.wantErr)
				}
			}
			// Every packet arrives whole, in order; a part of one sent as a
			// packet of its own would arrive first.
			for j, f := range frames {
				p, err := recvPacket(pk, buf, 2*time.Second)
				if err != nil {
					t.Fatalf("frame %d (%d bytes): %v", j, len(f), err)
				}
				if !bytes.Equal(p, f) {
					seq, _ := frameSeq(p)
					t.Fatalf("frame %d: peer got %d bytes (seq %d), want the %d-byte frame", j, len(p), seq, len(f))
				}
			}
			if !waitFor(2*time.Second, func() bool { sg.Reclaim(); return u.Frames().TX == 0 }) {
				t.Fatalf("TX frames never completed: %+v", u.Frames())
			}
			if fs := u.Frames(); fs.User != 0 || u.FrameErrors() != 0 {
				t.Errorf("frames %+v, frame errors %d", fs, u.FrameErrors())
			}
		})
	}
	if p, err := recvPacket(pk, buf, 100*time.Millisecond); err == nil {
		t.Errorf("peer got a packet more: %d bytes", len(p))
	}
}

// TestRecvPacketsLimit: RecvPackets returns the descriptors of at most
// packets packets, on a MultiBuffer socket (a 6000-byte frame is two
// descriptors) and on a single-buffer one; a count below one takes nothing
// and leaves the ring as it was. Before, -1 panicked slicing descs on a
// single-buffer socket, and 0 on a MultiBuffer socket returned the batch.
func TestRecvPacketsLimit(t *testing.T) {
	n := newTestNet(t)
	tests := []struct {
		name  string
		multi bool
		sizes []int
		steps []struct{ packets, want int } // descriptors wanted
	}{
		{"multi-buffer", true, []int{100, 6000, 200}, []struct{ packets, want int }{{0, 0}, {-1, 0}, {1, 1}, {2, 3}}},
		{"single-buffer", false, []int{100, 1000, 200}, []struct{ packets, want int }{{0, 0}, {-1, 0}, {1, 1}, {2, 2}}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, pk := n.fragsSocket(t, fmt.Sprintf("ra%d", i), fmt.Sprintf("rb%d", i),
				&SocketConfig{MultiBuffer: tt.multi})
			total := 0 // descriptors: 6000 bytes take two
			for _, st := range tt.steps {
				total += st.want
			}
			sendFrames(t, pk, 0, tt.sizes)
			waitRXQueued(t, s, total)
			descs := make([]Desc, 16)
			got := 0
			for _, st := range tt.steps {
				k, err := s.RecvPackets(descs[got:], st.packets)
				if err != nil || k != st.want {
					t.Fatalf("RecvPackets(%d packets): %d, %v; want %d", st.packets, k, err, st.want)
				}
				got += k
			}
			if got != total {
				t.Errorf("took %d descriptors, want %d", got, total)
			}
			if err := s.Recycle(descs[:got]); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRecvWholePackets: on a MultiBuffer socket RecvBatch and RecvPackets
// hand out whole packets only (an 8000-byte frame at MTU 9000 arrives in
// copy mode as three descriptors, 3840 + 3840 + 320). A packet whose chain
// does not fit what is left of descs stays on the ring for the next call;
// when descs cannot hold even the first packet's chain, the call takes
// nothing and returns ErrShortBatch. TryReceive, whose batch is
// SocketConfig.BatchSize descriptors, grows it to the packet's chain. Before,
// a 1- or 2-descriptor slice got the first descriptors of the packet, and the
// next call returned the rest as if it began a packet.
func TestRecvWholePackets(t *testing.T) {
	n := newTestNet(t)
	const try = -1 // step.packets: TryReceive
	type step struct {
		packets int // RecvPackets with this count; 0: RecvBatch; try: TryReceive
		descs   int // len(descs)
		want    int // descriptors taken
		wantErr error
	}
	tests := []struct {
		name  string
		batch int // SocketConfig.BatchSize
		sizes []int
		steps []step
	}{
		{"RecvBatch, 1 descriptor", 0, []int{8000}, []step{{0, 1, 0, ErrShortBatch}, {0, 3, 3, nil}}},
		{"RecvBatch, 2 descriptors", 0, []int{8000}, []step{{0, 2, 0, ErrShortBatch}, {0, 2, 0, ErrShortBatch}, {0, 16, 3, nil}}},
		{"RecvPackets, 2 descriptors", 0, []int{8000}, []step{{1, 2, 0, ErrShortBatch}, {1, 3, 3, nil}}},
		{"packet after a whole one", 0, []int{100, 8000, 200}, []step{{0, 2, 1, nil}, {0, 2, 0, ErrShortBatch}, {0, 3, 3, nil}, {0, 3, 1, nil}}},
		{"packets count", 0, []int{100, 8000, 200}, []step{{2, 3, 1, nil}, {2, 4, 4, nil}}},
		{"TryReceive, batch of 1", 1, []int{8000, 100}, []step{{try, 0, 3, nil}, {try, 0, 1, nil}}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, pk := n.fragsSocket(t, fmt.Sprintf("wa%d", i), fmt.Sprintf("wb%d", i),
				&SocketConfig{MultiBuffer: true, Mode: ModeCopy, BatchSize: tt.batch})
			frames := sendFrames(t, pk, 0, tt.sizes)
			total := 0 // descriptors: 3840 bytes a frame in copy mode
			for _, size := range tt.sizes {
				total += (size + 3839) / 3840
			}
			waitRXQueued(t, s, total)
			var got []Desc
			var joined [][]byte // the packets taken, their descriptors joined
			taken := 0
			for k, st := range tt.steps {
				descs := make([]Desc, st.descs)
				var m int
				var err error
				switch st.packets {
				case try:
					// Each step takes one packet: join what fn gets.
					var pkt []byte
					m, err = s.TryReceive(func(f []byte) { pkt = append(pkt, f...) })
					joined = append(joined, pkt)
				case 0:
					m, err = s.RecvBatch(descs)
				default:
					m, err = s.RecvPackets(descs, st.packets)
				}
				if m != st.want || !errors.Is(err, st.wantErr) {
					t.Fatalf("step %d: %d packets, %d descriptors: took %d, %v; want %d, %v (%+v)", k, st.packets, st.descs, m, err, st.want, st.wantErr, descs[:min(m, len(descs))])
				}
				if st.packets != try && m > 0 && descs[m-1].Options&unix.XDP_PKT_CONTD != 0 {
					t.Fatalf("step %d: the last descriptor taken continues a packet: %+v", k, descs[:m])
				}
				if st.packets != try {
					got = append(got, descs[:m]...)
					var pkt []byte
					for _, d := range descs[:m] {
						pkt = append(pkt, s.Frame(d)...)
						if d.Options&unix.XDP_PKT_CONTD == 0 {
							joined = append(joined, pkt)
							pkt = nil
						}
					}
				}
				taken += m
				if left := total - taken; rxQueued(s) != left {
					t.Fatalf("step %d: %d descriptors left on the RX ring, want %d", k, rxQueued(s), left)
				}
			}
			// The descriptors taken join into the frames sent, in order.
			if len(joined) != len(frames) {
				t.Fatalf("took %d packets, want %d", len(joined), len(frames))
			}
			for j := range frames {
				if !bytes.Equal(joined[j], frames[j]) {
					t.Errorf("packet %d: %d bytes, want the %d-byte frame", j, len(joined[j]), len(frames[j]))
				}
			}
			if err := s.Recycle(got); err != nil {
				t.Fatal(err)
			}
			if fs := s.UMEM().Frames(); fs.User != 0 || s.UMEM().FrameErrors() != 0 {
				t.Errorf("frames %+v, frame errors %d", fs, s.UMEM().FrameErrors())
			}
		})
	}
}

// TestReceiveDescsPacketEnds: on a MultiBuffer socket TryReceiveDescs and
// ReceiveDescs give fn each frame's descriptor, whose More() marks a packet
// that goes on in the next frame, so that the frames join into the packets
// sent (an 8000-byte frame arrives in copy mode as three descriptors, a
// 6000-byte one as two); More() reads the same on RecvBatch's descriptors.
// Before, TryReceive and Receive called fn with the frame alone, once a
// descriptor, and nothing marked where a packet ended.
func TestReceiveDescsPacketEnds(t *testing.T) {
	n := newTestNet(t)
	sizes := []int{8000, 100, 6000, 200}
	for i, tt := range []struct {
		how   string
		batch int // SocketConfig.BatchSize
	}{
		{"TryReceiveDescs", 0},
		{"TryReceiveDescs", 1}, // grows to each chain
		{"ReceiveDescs", 0},
		{"RecvBatch", 0},
	} {
		t.Run(fmt.Sprintf("%s, batch %d", tt.how, tt.batch), func(t *testing.T) {
			s, pk := n.fragsSocket(t, fmt.Sprintf("ea%d", i), fmt.Sprintf("eb%d", i),
				&SocketConfig{MultiBuffer: true, Mode: ModeCopy, BatchSize: tt.batch})
			frames := sendFrames(t, pk, 0, sizes)
			var joined [][]byte
			var pkt []byte // the packet being joined
			descs := 0
			add := func(d Desc, f []byte) {
				descs++
				pkt = append(pkt, f...)
				if !d.More() {
					joined, pkt = append(joined, pkt), nil
				}
			}
			switch tt.how {
			case "TryReceiveDescs":
				waitFor(2*time.Second, func() bool {
					if _, err := s.TryReceiveDescs(add); err != nil {
						t.Fatal(err)
					}
					return len(joined) == len(frames)
				})
			case "ReceiveDescs":
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				err := s.ReceiveDescs(ctx, func(d Desc, f []byte) {
					if add(d, f); len(joined) == len(frames) {
						cancel()
					}
				})
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("ReceiveDescs: %v after %d packets, want %v", err, len(joined), context.Canceled)
				}
			case "RecvBatch":
				got := recvPackets(t, s, len(frames))
				for _, d := range got {
					add(d, s.Frame(d))
				}
				if err := s.Recycle(got); err != nil {
					t.Fatal(err)
				}
			}
			if len(joined) != len(frames) || pkt != nil || descs != 3+1+2+1 {
				t.Fatalf("%d packets and %d bytes of one unended, in %d descriptors; want %d packets in 7", len(joined), len(pkt), descs, len(frames))
			}
			for j := range frames {
				if !bytes.Equal(joined[j], frames[j]) {
					t.Errorf("packet %d: %d bytes, want the %d-byte frame", j, len(joined[j]), len(frames[j]))
				}
			}
			if fs := s.UMEM().Frames(); fs.User != 0 || s.UMEM().FrameErrors() != 0 {
				t.Errorf("frames %+v, frame errors %d", fs, s.UMEM().FrameErrors())
			}
		})
	}
}

// TestRecvRefusedInChain: a frame refused partway through a MultiBuffer
// packet's chain (here one the caller is taken to hold already, as after a
// double hand-out; never expected of the kernel) drops the whole packet:
// its other frames go back to the fill ring, and the packets around it come
// out whole. Before, the rest of the chain came out on its own: refusing the
// first frame made its second and third a packet, refusing the last ran the
// first two on into the next packet.
func TestRecvRefusedInChain(t *testing.T) {
	n := newTestNet(t)
	sizes := []int{100, 8000, 200} // 1 + 3 + 1 descriptors
	for refused := range 3 {       // which descriptor of the 8000-byte frame's chain
		t.Run(fmt.Sprintf("descriptor %d of 3", refused+1), func(t *testing.T) {
			s, pk := n.fragsSocket(t, fmt.Sprintf("fa%d", refused), fmt.Sprintf("fb%d", refused),
				&SocketConfig{MultiBuffer: true, Mode: ModeCopy})
			frames := sendFrames(t, pk, 0, sizes)
			waitRXQueued(t, s, 5)
			u := s.UMEM()
			bad := *s.rx.at(atomic.LoadUint32(s.rx.consumer) + 1 + uint32(refused))
			if !u.state[bad.Addr>>u.shift].CompareAndSwap(kernelState(frameFill, s.q.id), frameUser) {
				t.Fatalf("frame of %+v not in fill state", bad)
			}
			got := recvPackets(t, s, 2)
			if len(got) != 2 || !bytes.Equal(s.Frame(got[0]), frames[0]) || !bytes.Equal(s.Frame(got[1]), frames[2]) {
				t.Fatalf("took %+v, want the 100- and 200-byte frames' descriptors alone", got)
			}
			if st, _ := s.Stats(); st.RXPackets != 2 || u.FrameErrors() != 1 {
				t.Errorf("RXPackets %d, frame errors %d; want 2 and 1", st.RXPackets, u.FrameErrors())
			}
			if err := s.Recycle(append(got, bad)); err != nil {
				t.Fatal(err)
			}
			if fs := u.Frames(); fs.User != 0 || fs.Free+fs.Fill != fs.Total {
				t.Errorf("frames %+v, want every one free or in the fill ring", fs)
			}
			// The socket goes on: the next 8000-byte frame comes whole.
			f := testFrame(9, 8000)
			if _, err := unix.Write(pk, f); err != nil {
				t.Fatal(err)
			}
			got = recvPackets(t, s, 1)
			var p []byte
			for _, d := range got {
				p = append(p, s.Frame(d)...)
			}
			if !bytes.Equal(p, f) {
				t.Errorf("next packet: %d bytes in %d descriptors, want the 8000-byte frame", len(p), len(got))
			}
			if err := s.Recycle(got); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPacketCounters: Stats.RXPackets and TXPackets count packets, on a
// MultiBuffer socket too, where a packet may take several descriptors (an
// 8000-byte frame takes three, a 6000-byte one two): what RecvBatch took,
// what TransmitDescs forwarded and what Transmit copied. Before, RXPackets
// and TransmitDescs's TXPackets counted descriptors while Transmit's
// counted packets (RX +6 and TX +6+3 for these three packets).
func TestPacketCounters(t *testing.T) {
	n := newTestNet(t)
	tests := []struct {
		name  string
		multi bool
		sizes []int
	}{
		{"multi-buffer", true, []int{8000, 100, 6000}},
		{"single-buffer", false, []int{100, 1514, 3000}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, pk := n.fragsSocket(t, fmt.Sprintf("ca%d", i), fmt.Sprintf("cb%d", i),
				&SocketConfig{MultiBuffer: tt.multi, Mode: ModeCopy})
			frames := sendFrames(t, pk, 0, tt.sizes)
			descs := recvPackets(t, s, len(frames))
			got := len(descs)
			st, err := s.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if st.RXPackets != uint64(len(frames)) {
				t.Errorf("RXPackets %d after %d packets in %d descriptors, want %d", st.RXPackets, len(frames), got, len(frames))
			}
			if k, err := s.TransmitDescs(descs[:got]); k != got || err != nil {
				t.Fatalf("TransmitDescs: %d, %v", k, err)
			}
			if st, _ = s.Stats(); st.TXPackets != uint64(len(frames)) {
				t.Errorf("TXPackets %d after TransmitDescs of %d packets in %d descriptors, want %d", st.TXPackets, len(frames), got, len(frames))
			}
			if k, err := s.Transmit(frames); k != len(frames) || err != nil {
				t.Fatalf("Transmit: %d, %v", k, err)
			}
			if st, _ = s.Stats(); st.TXPackets != 2*uint64(len(frames)) {
				t.Errorf("TXPackets %d after Transmit of %d more packets, want %d", st.TXPackets, len(frames), 2*len(frames))
			}
			buf := make([]byte, 10000)
			for j := range 2 * len(frames) {
				p, err := recvPacket(pk, buf, 2*time.Second)
				if err != nil || !bytes.Equal(p, frames[j%len(frames)]) {
					t.Fatalf("peer, packet %d: %d bytes, %v; want the %d-byte frame", j, len(p), err, len(frames[j%len(frames)]))
				}
			}
		})
	}
}

// TestCloseReturnsUnsentTX: frames left on a socket's TX ring (submitted
// while the interface was down: the wakeup fails with ENETDOWN) go back to
// the free list when the socket closes, whether or not another socket
// keeps its queue open. Before, with the queue shared, they stayed in TX
// state for as long as the other socket lived.
func TestCloseReturnsUnsentTX(t *testing.T) {
	tests := []struct {
		name  string
		queue uint32 // of the socket that stays open
	}{
		{"queue shared with a socket that stays", 0},
		{"last socket of its queue", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newTestNet(t)
			xa, xb := n.veth(t, "xa", "xb", 2)
			u := newUMEM(t, &UMEMConfig{FrameCount: 512, FillSize: 128, CompletionSize: 128})
			a := n.newSocket(t, u, xa, 0, smallRings)
			b := n.newSocket(t, u, xa, tt.queue, smallRings)
			setLink := func(up bool) {
				n.do(t, func() error {
					l, err := netlink.LinkByIndex(xa)
					if err != nil {
						return err
					}
					if up {
						return netlink.LinkSetUp(l)
					}
					return netlink.LinkSetDown(l)
				})
			}
			setLink(false)
			if k, err := a.Transmit([][]byte{testFrame(1, 100), testFrame(2, 100)}); k != 2 || !errors.Is(err, unix.ENETDOWN) {
				t.Fatalf("Transmit with the link down: %d, %v; want 2 queued and ENETDOWN", k, err)
			}
			if fs := u.Frames(); fs.TX != 2 {
				t.Fatalf("frames before Close: %+v, want 2 in TX", fs)
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if fs := u.Frames(); fs.TX != 0 || fs.User != 0 || fs.Free+fs.Fill != fs.Total || u.FrameErrors() != 0 {
				t.Errorf("frames after Close: %+v, frame errors %d; want none in TX", fs, u.FrameErrors())
			}
			// The socket that stayed still sends, and its frame comes back.
			setLink(true)
			pk := n.packetSock(t, xb)
			if k, err := b.Transmit([][]byte{testFrame(3, 100)}); k != 1 {
				t.Fatalf("Transmit on the socket that stayed: %d, %v", k, err)
			}
			buf := make([]byte, 2048)
			if f, err := recvPacket(pk, buf, 2*time.Second); err != nil {
				t.Fatal(err)
			} else if seq, _ := frameSeq(f); seq != 3 {
				t.Fatalf("peer got seq %d, want 3", seq)
			}
			if !waitFor(2*time.Second, func() bool { b.Reclaim(); return u.Frames().TX == 0 }) {
				t.Errorf("frames: %+v", u.Frames())
			}
		})
	}
}

// smallRings are 64-descriptor rings over 256 frames: 10× the ring size is
// only 640 packets, and every index wraps many times.
var (
	smallUMEM  = &UMEMConfig{FrameCount: 256, FillSize: 64, CompletionSize: 64}
	smallRings = &SocketConfig{RXSize: 64, TXSize: 64, BatchSize: 16}
)

// TestRingWrapAround pushes 20× the ring size through 64-entry rings in
// both directions; every sequence number arrives exactly once, in order.
func TestRingWrapAround(t *testing.T) {
	const total, window = 20 * 64, 32
	n := newTestNet(t)
	xa, xb := n.veth(t, "xa", "xb", 1)
	s := n.open(t, xa, 0, smallUMEM, smallRings)
	setSlot(t, n.redirect(t, xa), s)
	pk := n.packetSock(t, xb)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	t.Run("RX", func(t *testing.T) {
		next, expect := 0, uint64(0)
		var bad error
		for expect < total {
			for ; next < total && next-int(expect) < window; next++ {
				if _, err := unix.Write(pk, testFrame(uint64(next), 60+next%200)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Poll(ctx, 100*time.Millisecond); err != nil {
				t.Fatalf("Poll after %d frames: %v", expect, err)
			}
			_, err := s.TryReceive(func(f []byte) {
				seq, ok := frameSeq(f)
				if !ok {
					return
				}
				if seq != expect && bad == nil {
					bad = errors.New("out of order")
					t.Errorf("got sequence %d, want %d", seq, expect)
				}
				if !bytes.Equal(f, testFrame(seq, 60+int(seq)%200)) && bad == nil {
					bad = errors.New("corrupt")
					t.Errorf("frame %d corrupt", seq)
				}
				expect++
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("TX", func(t *testing.T) {
		sent, recvd := 0, 0
		buf := make([]byte, 4096)
		for recvd < total {
			if end := min(total, recvd+window, sent+16); sent < end {
				var batch [][]byte
				for i := sent; i < end; i++ {
					batch = append(batch, testFrame(uint64(i), 60+i%200))
				}
				n, err := s.Transmit(batch)
				sent += n
				if err != nil && !errors.Is(err, ErrRingFull) && !errors.Is(err, ErrNoFrames) {
					t.Fatalf("Transmit: %v", err)
				}
			}
			f, err := recvPacket(pk, buf, 2*time.Second)
			if err != nil {
				t.Fatalf("after %d of %d frames: %v (frames %+v)", recvd, total, err, s.UMEM().Frames())
			}
			if seq, _ := frameSeq(f); seq != uint64(recvd) || !bytes.Equal(f, testFrame(seq, 60+int(seq)%200)) {
				t.Fatalf("got sequence %d, want %d", seq, recvd)
			}
			recvd++
		}
	})
	st, _ := s.Stats()
	t.Logf("stats %+v", st)
	if st.RXRingFull != 0 || st.RXDropped != 0 || st.TXInvalidDescs != 0 {
		t.Errorf("drops: %+v", st)
	}
}

// TestFrameAccountingUnderLoad reflects received frames back out without
// copying while a second goroutine transmits copies, over a UMEM too small
// for the load, and then checks that every frame is back with exactly one
// owner: none lost, none in two places.
func TestFrameAccountingUnderLoad(t *testing.T) {
	const total, extra = 5000, 3000
	n := newTestNet(t)
	xa, xb := n.veth(t, "xa", "xb", 1)
	s := n.open(t, xa, 0, &UMEMConfig{FrameCount: 128, FillSize: 64, CompletionSize: 64}, smallRings)
	setSlot(t, n.redirect(t, xa), s)
	pk := n.packetSock(t, xb)
	u := s.UMEM()

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var reflected, notReflected, arrived, extraSent atomic.Int64
	wg.Go(func() { // RX side: reflect with TransmitDescs, recycle what does not fit
		descs := make([]Desc, 16)
		for ctx.Err() == nil {
			k, err := s.RecvBatch(descs)
			if err != nil {
				t.Errorf("RecvBatch: %v", err)
				return
			}
			if k == 0 {
				s.Poll(ctx, 10*time.Millisecond)
				continue
			}
			w, err := s.TransmitDescs(descs[:k])
			if err != nil && !errors.Is(err, ErrRingFull) {
				t.Errorf("TransmitDescs: %v", err)
			}
			if err := s.Recycle(descs[w:k]); err != nil {
				t.Errorf("Recycle: %v", err)
			}
			reflected.Add(int64(w))
			notReflected.Add(int64(k - w))
		}
	})
	wg.Go(func() { // a second TX user, copying, on the same socket
		for i := 0; i < extra && ctx.Err() == nil; {
			k, err := s.Transmit([][]byte{testFrame(1<<40+uint64(i), 64), testFrame(1<<40+uint64(i+1), 64)})
			if err != nil && !errors.Is(err, ErrRingFull) && !errors.Is(err, ErrNoFrames) {
				t.Errorf("Transmit: %v", err)
				return
			}
			i += k
			extraSent.Add(int64(k))
			if k == 0 {
				runtime.Gosched()
			}
		}
	})
	wg.Go(func() { // the peer counts what comes back
		buf := make([]byte, 4096)
		for ctx.Err() == nil {
			if f, err := recvPacket(pk, buf, 20*time.Millisecond); err == nil {
				if seq, ok := frameSeq(f); ok && seq < 1<<40 {
					arrived.Add(1)
				}
			}
		}
	})

	deadline := time.Now().Add(15 * time.Second)
	for sent := 0; sent < total; {
		// Keep at most 48 in flight; after 200 ms without progress send
		// anyway, so a lost packet cannot stall the test.
		stall := time.Now().Add(200 * time.Millisecond)
		for int64(sent)-arrived.Load()-notReflected.Load() >= 48 && time.Now().Before(stall) {
			time.Sleep(50 * time.Microsecond)
		}
		if _, err := unix.Write(pk, testFrame(uint64(sent), 64+sent%64)); err != nil {
			t.Fatal(err)
		}
		sent++
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d sent in time", sent, total)
		}
	}
	waitFor(3*time.Second, func() bool {
		return arrived.Load()+notReflected.Load() >= total && extraSent.Load() >= extra
	})
	cancel()
	wg.Wait()

	// Take everything back: completions, and any packet still on the RX ring.
	descs := make([]Desc, 64)
	waitFor(2*time.Second, func() bool {
		s.Reclaim()
		if k, _ := s.RecvBatch(descs); k > 0 {
			s.Recycle(descs[:k])
		}
		return u.Frames().TX == 0
	})
	st, _ := s.Stats()
	fs := u.Frames()
	t.Logf("sent %d, reflected %d (%d arrived), recycled unreflected %d, extra copies %d; frames %+v; stats %+v",
		total, reflected.Load(), arrived.Load(), notReflected.Load(), extraSent.Load(), fs, st)
	if fs.User != 0 || fs.TX != 0 || fs.Free+fs.Fill != fs.Total || u.FrameErrors() != 0 {
		t.Fatalf("frames %+v, frame errors %d", fs, u.FrameErrors())
	}
	if reflected.Load() < total/2 {
		t.Errorf("only %d of %d frames reflected", reflected.Load(), total)
	}

	// Look inside: the free list and the fill ring hold distinct frames,
	// each in the state that says so, and together all of them.
	seen := make(map[uint32]string)
	u.allocMu.Lock()
	free := append([]uint32(nil), u.free...)
	u.allocMu.Unlock()
	for _, fi := range free {
		if seen[fi] != "" || u.state[fi].Load() != frameFree {
			t.Fatalf("frame %d on the free list twice or not free (state %#x)", fi, u.state[fi].Load())
		}
		seen[fi] = "free"
	}
	q := s.q
	prod, cons := atomic.LoadUint32(q.fill.producer), atomic.LoadUint32(q.fill.consumer)
	for i := cons; i != prod; i++ {
		fi := uint32(*q.fill.at(i) >> u.shift)
		if seen[fi] != "" || u.state[fi].Load() != kernelState(frameFill, q.id) {
			t.Fatalf("fill ring frame %d also %q (state %#x)", fi, seen[fi], u.state[fi].Load())
		}
		seen[fi] = "fill"
	}
	// In copy mode a frame whose packet met a full RX ring waits in the
	// kernel's own free list for the next packet, outside the fill ring.
	if inRing := int(prod - cons); inRing != fs.Fill && (st.RXRingFull == 0 && st.RXDropped == 0) {
		t.Fatalf("fill ring holds %d frames, %d in fill state, and the kernel dropped nothing", inRing, fs.Fill)
	}
	if len(free) != fs.Free {
		t.Fatalf("free list %d, free frames %d", len(free), fs.Free)
	}
}

// TestModeFallback: on veth, ModeAuto asks for zero-copy and falls back to
// copy; ModeZeroCopy fails (unless veth grew zero-copy support, which the
// test reports); ModeCopy gets copy.
func TestModeFallback(t *testing.T) {
	n := newTestNet(t)
	xa, _ := n.veth(t, "xa", "xb", 1)
	var mode Mode
	var zcErr, forced error
	n.do(t, func() error {
		s, err := Open(xa, 0, smallUMEM, smallRings)
		if err != nil {
			return err
		}
		mode, zcErr = s.Mode(), s.ZeroCopyErr()
		if err := s.Close(); err != nil {
			return err
		}
		z, err := Open(xa, 0, smallUMEM, &SocketConfig{Mode: ModeZeroCopy})
		if err == nil {
			z.Close()
		}
		forced = err
		c, err := Open(xa, 0, smallUMEM, &SocketConfig{Mode: ModeCopy})
		if err != nil {
			return err
		}
		defer c.Close()
		if c.Mode() != ModeCopy || c.ZeroCopyErr() != nil {
			t.Errorf("ModeCopy: got %s, %v", c.Mode(), c.ZeroCopyErr())
		}
		return nil
	})
	t.Logf("veth: ModeAuto bound %s (zero-copy: %v); forced zero-copy: %v", mode, zcErr, forced)
	switch mode {
	case ModeCopy:
		if zcErr == nil || forced == nil {
			t.Errorf("fell back to copy but zero-copy reported no error (auto: %v, forced: %v)", zcErr, forced)
		}
		if !errors.Is(forced, unix.EOPNOTSUPP) {
			t.Logf("note: forced zero-copy failed with %v, not EOPNOTSUPP", forced)
		}
	case ModeZeroCopy:
		t.Logf("this kernel's veth does zero-copy; copy mode was checked by forcing it")
	default:
		t.Errorf("mode %s", mode)
	}
}

// TestCloseUnmaps: Close unmaps every ring and the UMEM (checked in
// /proc/self/maps), closing twice is safe, and every call after Close
// fails with ErrClosed.
func TestCloseUnmaps(t *testing.T) {
	n := newTestNet(t)
	xa, _ := n.veth(t, "xa", "xb", 2)
	before := readMaps(t)
	u, err := NewUMEM(smallUMEM)
	if err != nil {
		t.Fatal(err)
	}
	a := n.newSocket(t, u, xa, 0, smallRings)
	b := n.newSocket(t, u, xa, 0, smallRings) // shares a's fill and completion rings
	c := n.newSocket(t, u, xa, 1, smallRings) // has its own
	type region struct {
		what       string
		start, end uint64
	}
	var regions []region
	add := func(what string, mem []byte) {
		start := uint64(uintptrOf(mem))
		regions = append(regions, region{what, start, start + uint64(len(mem))})
	}
	add("UMEM", u.area)
	for i, s := range []*Socket{a, b, c} {
		add("RX "+string(rune('a'+i)), s.rxMem)
		add("TX "+string(rune('a'+i)), s.txMem)
	}
	add("fill q0", a.q.fillMem)
	add("completion q0", a.q.compMem)
	add("fill q1", c.q.fillMem)
	add("completion q1", c.q.compMem)
	if b.q != a.q || c.q == a.q {
		t.Fatal("queue ring pairs not shared as expected")
	}
	covered := func(maps []mapping, r region) *mapping {
		for i, m := range maps {
			if m.start <= r.start && r.start < m.end {
				return &maps[i]
			}
		}
		return nil
	}
	during := readMaps(t)
	for _, r := range regions {
		m := covered(during, r)
		if m == nil {
			t.Fatalf("%s at %#x not mapped while open", r.what, r.start)
		}
		if r.what != "UMEM" {
			t.Logf("%s mapped as %q", r.what, m.path)
		}
	}

	for range 2 {
		if err := a.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
	checkClosed(t, a)
	// b still works on the ring pair a created.
	if k, err := b.Transmit([][]byte{testFrame(1, 60)}); k != 1 || err != nil {
		t.Fatalf("Transmit on b after closing a: %d, %v", k, err)
	}
	for range 2 {
		if err := u.Close(); err != nil {
			t.Fatalf("UMEM Close: %v", err)
		}
	}
	for _, s := range []*Socket{b, c} {
		checkClosed(t, s)
	}
	if fs := u.Frames(); fs.Free != fs.Total {
		t.Errorf("frames after closing every socket: %+v", fs)
	}

	after := readMaps(t)
	for _, r := range regions {
		for _, m := range after {
			if m.start == r.start && m.end == r.end {
				t.Errorf("%s [%#x,%#x) still mapped after Close", r.what, r.start, r.end)
			}
			if m.start <= r.start && r.start < m.end && m.path != "" && m.path == pathOf(during, r.start) {
				t.Errorf("%s still mapped as %q after Close", r.what, m.path)
			}
		}
	}
	if nb, na := countXSKMaps(before), countXSKMaps(after); nb != na {
		t.Errorf("socket mappings: %d before, %d after", nb, na)
	}
}

func checkClosed(t *testing.T, s *Socket) {
	t.Helper()
	ctx := context.Background()
	descs := make([]Desc, 4)
	for name, err := range map[string]error{
		"RecvBatch":     second(s.RecvBatch(descs)),
		"Recycle":       s.Recycle(descs[:1]),
		"TryReceive":    second(s.TryReceive(func([]byte) {})),
		"Receive":       s.Receive(ctx, func([]byte) {}),
		"Transmit":      second(s.Transmit([][]byte{testFrame(0, 60)})),
		"TransmitDescs": second(s.TransmitDescs(descs[:1])),
		"Reclaim":       second(s.Reclaim()),
		"Poll":          second(s.Poll(ctx, time.Second)),
		"Stats":         second(s.Stats()),
	} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v", name, err)
		}
	}
	if s.FD() != -1 {
		t.Errorf("FD after Close = %d", s.FD())
	}
}

func second[T any](_ T, err error) error { return err }

func pathOf(maps []mapping, addr uint64) string {
	for _, m := range maps {
		if m.start <= addr && addr < m.end {
			return m.path
		}
	}
	return ""
}

func countXSKMaps(maps []mapping) int {
	n := 0
	for _, m := range maps {
		if len(m.path) > 0 && (m.path[0] != '/' && m.path[0] != '[') {
			n++ // sockets show as "socket:[inode]" or "XDP:[inode]"
		}
	}
	return n
}

// TestSharedUMEM: two sockets on one queue share its fill and completion
// rings, a third on another queue has its own, all inherit the first one's
// mode, a conflicting mode request is refused, and closing the socket that
// created a shared ring pair leaves it working for the other.
func TestSharedUMEM(t *testing.T) {
	n := newTestNet(t)
	xa, xb := n.veth(t, "xa", "xb", 2)
	u := newUMEM(t, &UMEMConfig{FrameCount: 512, FillSize: 128, CompletionSize: 128})
	a := n.newSocket(t, u, xa, 0, smallRings)
	b := n.newSocket(t, u, xa, 0, smallRings)
	c := n.newSocket(t, u, xa, 1, smallRings)
	if b.q != a.q || c.q == a.q {
		t.Fatalf("ring pairs: a %d, b %d, c %d", a.q.id, b.q.id, c.q.id)
	}
	if b.Mode() != a.Mode() || c.Mode() != a.Mode() {
		t.Fatalf("modes %s %s %s", a.Mode(), b.Mode(), c.Mode())
	}
	other := ModeZeroCopy
	if a.Mode() == ModeZeroCopy {
		other = ModeCopy
	}
	n.do(t, func() error {
		if s, err := u.NewSocket(xa, 0, &SocketConfig{Mode: other}); err == nil {
			s.Close()
			t.Errorf("shared socket asking for %s mode accepted", other)
		} else {
			t.Logf("shared socket asking for %s: %v", other, err)
		}
		return nil
	})

	m := n.redirect(t, xa)
	pk := n.packetSock(t, xb)
	buf := make([]byte, 4096)
	receive := func(s *Socket, from uint64) {
		t.Helper()
		setSlot(t, m, s)
		for i := range uint64(8) {
			if _, err := unix.Write(pk, testFrame(from+i, 100)); err != nil {
				t.Fatal(err)
			}
		}
		want := from
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		err := s.Receive(ctx, func(f []byte) {
			if seq, ok := frameSeq(f); ok {
				if seq != want {
					t.Errorf("got %d, want %d", seq, want)
				}
				if want++; want == from+8 {
					cancel()
				}
			}
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("receive %d..%d: %v at %d", from, from+8, err, want)
		}
	}
	transmit := func(s *Socket, seq uint64) {
		t.Helper()
		if k, err := s.Transmit([][]byte{testFrame(seq, 80)}); k != 1 {
			t.Fatalf("Transmit on queue %d: %v", s.Queue(), err)
		}
		f, err := recvPacket(pk, buf, 2*time.Second)
		if got, _ := frameSeq(f); err != nil || got != seq {
			t.Fatalf("from queue %d: %d, %v", s.Queue(), got, err)
		}
	}
	receive(a, 100)
	receive(b, 200)
	transmit(a, 1)
	transmit(b, 2)
	transmit(c, 3)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	receive(b, 300) // on the fill ring a created
	transmit(b, 4)
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	if fs := u.Frames(); fs.Free != fs.Total || u.FrameErrors() != 0 {
		t.Errorf("frames after Close: %+v, errors %d", fs, u.FrameErrors())
	}
}

// TestXSKMapSlots: an empty slot falls back to XDP_PASS, and a socket
// bound to another interface gets nothing (the kernel drops the packet).
func TestXSKMapSlots(t *testing.T) {
	n := newTestNet(t)
	xa, _ := n.veth(t, "xa", "xb", 1)
	ya, yb := n.veth(t, "ya", "yb", 1)
	s := n.open(t, xa, 0, smallUMEM, smallRings)
	m := n.redirect(t, ya)
	atYA := n.packetSock(t, ya)
	fromYB := n.packetSock(t, yb)
	buf := make([]byte, 4096)

	send := func(seq uint64) {
		t.Helper()
		if _, err := unix.Write(fromYB, testFrame(seq, 60)); err != nil {
			t.Fatal(err)
		}
	}
	send(1)
	if f, err := recvPacket(atYA, buf, 2*time.Second); err != nil {
		t.Fatalf("empty slot: packet not passed to the stack: %v", err)
	} else if seq, _ := frameSeq(f); seq != 1 {
		t.Fatalf("empty slot: got %d", seq)
	}

	setSlot(t, m, s) // slot 0 of ya's map, socket bound to xa
	send(2)
	if _, err := recvPacket(atYA, buf, 200*time.Millisecond); err == nil {
		t.Error("packet for a socket of another interface was passed")
	}
	if ok, _ := s.Poll(context.Background(), 100*time.Millisecond); ok {
		t.Error("socket bound to xa received a packet that arrived on ya")
	}
}

// TestPollAndContext: Poll honours its timeout and the context, Receive
// stops with the context, and Close wakes a blocked Poll.
func TestPollAndContext(t *testing.T) {
	n := newTestNet(t)
	xa, _ := n.veth(t, "xa", "xb", 1)
	s := n.open(t, xa, 0, smallUMEM, smallRings)
	ctx := context.Background()

	start := time.Now()
	if ok, err := s.Poll(ctx, 30*time.Millisecond); ok || err != nil || time.Since(start) < 30*time.Millisecond {
		t.Errorf("Poll 30ms: %v, %v after %v", ok, err, time.Since(start))
	}
	if ok, err := s.Poll(ctx, 0); ok || err != nil {
		t.Errorf("Poll 0: %v, %v", ok, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(20*time.Millisecond, cancel)
	if _, err := s.Poll(cctx, -1); !errors.Is(err, context.Canceled) {
		t.Errorf("Poll until cancel: %v", err)
	}
	dctx, cancel2 := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel2()
	if err := s.Receive(dctx, func([]byte) {}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Receive until deadline: %v", err)
	}

	done := make(chan error)
	go func() { done <- s.Receive(ctx, func([]byte) {}) }()
	time.Sleep(20 * time.Millisecond)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("Receive after Close: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not wake Receive")
	}
}

// TestReopen: a socket closed and reopened on the same queue at once binds
// (the kernel frees the queue asynchronously; bind waits for it), while a
// queue held by a live socket stays busy.
func TestReopen(t *testing.T) {
	n := newTestNet(t)
	xa, _ := n.veth(t, "xa", "xb", 1)
	n.do(t, func() error {
		start := time.Now()
		for range 10 {
			s, err := Open(xa, 0, smallUMEM, smallRings)
			if err != nil {
				return err
			}
			if err := s.Close(); err != nil {
				return err
			}
		}
		t.Logf("10 close/reopen cycles in %v", time.Since(start))

		s, err := Open(xa, 0, smallUMEM, smallRings)
		if err != nil {
			return err
		}
		defer s.Close()
		start = time.Now()
		busy := &SocketConfig{RXSize: 64, TXSize: 64, BusyTimeout: 50 * time.Millisecond}
		if o, err := Open(xa, 0, smallUMEM, busy); !errors.Is(err, unix.EBUSY) {
			if o != nil {
				o.Close()
			}
			t.Errorf("second UMEM on a held queue: %v", err)
		}
		if d := time.Since(start); d < 50*time.Millisecond || d > time.Second {
			t.Errorf("busy bind gave up after %v, want about 50ms", d)
		}
		return nil
	})
}

// TestInterfaceGone: when the interface is deleted under a socket, Receive
// returns ENETDOWN instead of waiting for ever, and Transmit fails.
func TestInterfaceGone(t *testing.T) {
	n := newTestNet(t)
	xa, _ := n.veth(t, "xa", "xb", 1)
	s := n.open(t, xa, 0, smallUMEM, smallRings)
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() { done <- s.Receive(ctx, func([]byte) {}) }()
	time.Sleep(20 * time.Millisecond)
	n.do(t, func() error {
		l, err := netlink.LinkByIndex(xa)
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	})
	if err := <-done; !errors.Is(err, unix.ENETDOWN) {
		t.Errorf("Receive after the interface went away: %v", err)
	}
	if _, err := s.Transmit([][]byte{testFrame(0, 60)}); err == nil || errors.Is(err, ErrClosed) {
		t.Errorf("Transmit after the interface went away: %v", err)
	} else {
		t.Logf("Transmit: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// TestNoAllocs: a batch sent or received costs no heap allocation.
func TestNoAllocs(t *testing.T) {
	n := newTestNet(t)
	xa, xb := n.veth(t, "xa", "xb", 1)
	tx := n.open(t, xa, 0, nil, &SocketConfig{NoRX: true})
	rx := n.open(t, xb, 0, nil, &SocketConfig{NoTX: true})
	setSlot(t, n.redirect(t, xb), rx)
	batch := make([][]byte, 64)
	for i := range batch {
		batch[i] = testFrame(uint64(i), 64)
	}
	count := 0
	fn := func([]byte) { count++ }
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := tx.Transmit(batch); err != nil && !errors.Is(err, ErrRingFull) && !errors.Is(err, ErrNoFrames) {
			t.Fatal(err)
		}
		for {
			k, err := rx.TryReceive(fn)
			if err != nil {
				t.Fatal(err)
			}
			if k == 0 {
				break
			}
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per 64-frame batch", allocs)
	}
	if count == 0 {
		t.Error("nothing received")
	}
}
