package agent

import (
	"bytes"
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
)

// TestRangesModel: add keeps the set sorted, disjoint and never touching,
// equal to the bytes added, and says whether a fragment brought a byte it
// did not have, for fragments of any size in any order.
func TestRangesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		n := 1 + rng.IntN(400)
		have := make([]bool, n)
		var rs ranges
		for range 3 * n {
			lo := rng.IntN(n)
			hi := lo + 1 + rng.IntN(min(n-lo, 1+rng.IntN(20)))
			fresh := false
			for i := lo; i < hi; i++ {
				fresh = fresh || !have[i]
				have[i] = true
			}
			if got := rs.add(lo, hi); got != fresh {
				t.Fatalf("round %d: add(%d, %d) = %v, want %v (set %v)", round, lo, hi, got, fresh, rs)
			}
			var want ranges
			for i := 0; i < n; i++ {
				if !have[i] {
					continue
				}
				if len(want) > 0 && want[len(want)-1][1] == i {
					want[len(want)-1][1] = i + 1
				} else {
					want = append(want, [2]int{i, i + 1})
				}
			}
			if len(want) != len(rs) {
				t.Fatalf("round %d: after add(%d, %d): %v, want %v", round, lo, hi, rs, want)
			}
			for i := range want {
				if want[i] != rs[i] {
					t.Fatalf("round %d: after add(%d, %d): %v, want %v", round, lo, hi, rs, want)
				}
			}
		}
		if !rs.covers(n) {
			if all := !bytes.Contains(boolBytes(have), []byte{0}); all {
				t.Fatalf("round %d: every byte added, covers(%d) false: %v", round, n, rs)
			}
		}
	}
}

func boolBytes(b []bool) []byte {
	out := make([]byte, len(b))
	for i, v := range b {
		if v {
			out[i] = 1
		}
	}
	return out
}

// TestRangesInPlace: a fragment changes the set in place. Before, add
// copied the whole set for every fragment (the audit's 40 000 one-byte
// fragments at stride 2 cost 11.5 s of CPU under the agent's lock); now a
// set with room takes new holes, merges and fills without allocating.
func TestRangesInPlace(t *testing.T) {
	const n = 4096
	rs := make(ranges, 0, 2*n)
	// The adversarial pattern, backwards so that each piece goes in front.
	for i := n - 1; i >= 0; i-- {
		rs.add(4*i, 4*i+1)
	}
	if len(rs) != n {
		t.Fatalf("%d intervals, want %d", len(rs), n)
	}
	next := 0
	allocs := testing.AllocsPerRun(n/2, func() {
		// A hole in front, then a merge of three into one.
		rs.add(4*n+8*next+2, 4*n+8*next+3)
		rs.add(4*next+1, 4*next+4)
		next++
	})
	if allocs != 0 {
		t.Errorf("add allocates %.1f times per fragment with room in the set: it copies the set", allocs)
	}
}

// sendCounted sends pkts in batches the network queue holds and waits
// until the agent has read each batch.
func sendCounted(t *testing.T, r *rig, cl *rawClient, pkts []transport.Packet) {
	t.Helper()
	for len(pkts) > 0 {
		b := pkts[:min(len(pkts), 512)]
		pkts = pkts[len(b):]
		want := r.agent.Stats().Fragments + uint64(len(b))
		cl.send(b)
		for deadline := time.Now().Add(10 * time.Second); r.agent.Stats().Fragments < want; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the agent read %d of %d fragments", r.agent.Stats().Fragments, want)
			}
		}
	}
}

// drain reads what the DPU sent cl until nothing comes for 100 ms.
func drain(cl *rawClient) {
	buf := make([]transport.Packet, 64)
	for {
		for i := range buf {
			buf[i].Data = make([]byte, 9000)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_, err := cl.ep.Recv(ctx, buf)
		cancel()
		if err != nil {
			return
		}
	}
}

// inputPkt is one input fragment of request id: input[lo:hi].
func inputPkt(cl *rawClient, id uint64, mdl string, input []byte, lo, hi int) transport.Packet {
	in := ingest.Input{ID: id, Total: uint32(len(input)), Offset: uint32(lo), Model: mdl, Data: input[lo:hi]}
	return transport.Packet{Addr: dpuClientAddr, Data: ingest.AppendInput(nil, cl.tenant, &in)}
}

// TestSmallFragmentsAfterInput: tiny fragments of a request whose input
// is complete (its model runs) refuse nothing: they are duplicates, not
// fragment refusals, and the request is answered OK. (Before, each was
// counted as a fragment refusal and a duplicate, and ingest stats said
// that many requests were refused.)
func TestSmallFragmentsAfterInput(t *testing.T) {
	slow := newSlowModel()
	r := newRig(t, rigOptions{models: []ModelConfig{{Name: "slow"}}, hostModels: []*model.Model{slow.model()}})
	t.Cleanup(slow.finish) // before the rig stops: the host waits for its runs
	cl := r.client(0)
	in := randomBytes(1, 4096)
	whole := []transport.Packet{inputPkt(cl, 1, "slow", in, 0, len(in))}
	sendCounted(t, r, cl, whole)
	select {
	case <-slow.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the model never started")
	}
	var tiny []transport.Packet
	for i := range 5 {
		tiny = append(tiny, inputPkt(cl, 1, "slow", in, 10*i, 10*i+10))
	}
	sendCounted(t, r, cl, tiny)
	slow.finish()
	a, err := cl.await(1, nil, 50*time.Millisecond, 10*time.Second)
	want := model.Checksum(in)
	if err != nil || a.status != ingest.StatusOK || !bytes.Equal(a.out, want[:]) {
		t.Fatalf("request: %v, status %v %q; want OK with its checksum", err, a.status, a.text)
	}
	if s := r.agent.Stats(); s.FragmentRefusals != 0 || len(s.Refused) != 0 || s.Duplicates != 5 {
		t.Errorf("%d fragment refusals, refused %v, %d duplicates; want 0, none, 5", s.FragmentRefusals, s.Refused, s.Duplicates)
	}
}

// TestScatteredFragments: a client that cuts its input into tiny
// fragments, or scatters fragments to leave many holes, is refused as
// bad-request with a message, counted, and holds no more than
// maxInputIntervals pieces meanwhile; fragments of any order that a
// client sends still reassemble exactly.
func TestScatteredFragments(t *testing.T) {
	r := newRig(t, rigOptions{})
	cl := r.client(0)
	refused := func(id uint64, what, want string) {
		t.Helper()
		a, err := cl.await(id, nil, 50*time.Millisecond, 5*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if a.status != ingest.StatusBadRequest || !strings.Contains(a.text, want) {
			t.Errorf("%s: %v %q, want bad-request saying %q", what, a.status, a.text, want)
		}
	}

	// The audit's pattern: one-byte fragments at stride 2. The first
	// refuses the request; the others get the same answer from memory
	// (not more of them than the client's queue holds, so that the next
	// answer finds room).
	in := randomBytes(1, 64<<10)
	var pkts []transport.Packet
	for i := range 2048 {
		pkts = append(pkts, inputPkt(cl, 1, "checksum", in, 2*i, 2*i+1))
	}
	sendCounted(t, r, cl, pkts[:1])
	refused(1, "one-byte fragments", "at least 256 bytes")
	sendCounted(t, r, cl, pkts[1:])
	drain(cl)
	if s := r.agent.Stats(); s.FragmentRefusals != 1 || s.Refused["bad-request"] != 1 || s.InFlight != 0 || s.BufferBytes != 0 {
		t.Errorf("after one-byte fragments: %d fragment refusals, refused %v, %d in flight, %d bytes held; want 1, 1 bad-request, 0, 0",
			s.FragmentRefusals, s.Refused, s.InFlight, s.BufferBytes)
	}

	// Fragments of the least size at stride 2: the request holds at
	// most maxInputIntervals pieces, then is refused.
	f := ingest.MinFragment
	in = randomBytes(2, 2*f*(maxInputIntervals+100))
	pkts = pkts[:0]
	for i := 0; i < len(in)/(2*f); i++ {
		pkts = append(pkts, inputPkt(cl, 2, "checksum", in, 2*f*i, 2*f*i+f))
	}
	sendCounted(t, r, cl, pkts[:maxInputIntervals])
	r.agent.mu.Lock()
	req := r.agent.reqs[reqKey{addr: cl.ep.LocalAddr(), id: 2}]
	pieces := -1
	if req != nil {
		pieces = len(req.have)
	}
	r.agent.mu.Unlock()
	if pieces != maxInputIntervals {
		t.Errorf("after %d scattered fragments the request holds %d pieces, want %d", maxInputIntervals, pieces, maxInputIntervals)
	}
	sendCounted(t, r, cl, pkts[maxInputIntervals:])
	refused(2, "scattered fragments", "separate pieces")
	if s := r.agent.Stats(); s.FragmentRefusals != 2 || s.Refused["bad-request"] != 2 || s.InFlight != 0 || s.BufferBytes != 0 {
		t.Errorf("after scattered fragments: %d fragment refusals, refused %v, %d in flight, %d bytes held; want 2, 2 bad-request, 0, 0",
			s.FragmentRefusals, s.Refused, s.InFlight, s.BufferBytes)
	}

	// Out of order, duplicated, the last fragment short and first: exact.
	rng := rand.New(rand.NewPCG(3, 4))
	for id, step := range []int{f, 1000, ingest.MaxFragment(cl.ep.MaxPayload(), "checksum")} {
		id := uint64(10 + id)
		in := randomBytes(id, 300*step+17)
		pkts = pkts[:0]
		for off := 0; off < len(in); off += step {
			pkts = append(pkts, inputPkt(cl, id, "checksum", in, off, min(off+step, len(in))))
		}
		last := pkts[len(pkts)-1]
		rest := pkts[:len(pkts)-1]
		rng.Shuffle(len(rest), func(i, j int) { rest[i], rest[j] = rest[j], rest[i] })
		pkts = append([]transport.Packet{last}, rest...)
		pkts = append(pkts, pkts[:len(pkts)/3]...)
		cl.send(pkts)
		a, err := cl.await(id, nil, 50*time.Millisecond, 10*time.Second)
		want := model.Checksum(in)
		if err != nil || a.status != ingest.StatusOK || !bytes.Equal(a.out, want[:]) {
			t.Errorf("%d-byte fragments shuffled: %v %v %q %x, want %x", step, err, a.status, a.text, a.out, want)
		}
	}
	if s := r.agent.Stats(); s.FragmentRefusals != 2 || s.Completed != 3 {
		t.Errorf("after ordinary fragments: %d fragment refusals (want 2), %d completed (want 3)", s.FragmentRefusals, s.Completed)
	}
}
