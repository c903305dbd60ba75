package client

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/client/clienttest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/memnet"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

var (
	dpuAddr    = netip.MustParseAddrPort("10.77.0.12:61440")
	clientAddr = netip.MustParseAddrPort("10.77.0.30:0")
)

// rig is a client and a stand-in DPU on one memnet network.
type rig struct {
	net *memnet.Network
	c   *Client
	dpu *clienttest.DPU
	ep  *memnet.Endpoint // the client's
}

func newRig(t *testing.T, no memnet.Options, co Options, do clienttest.Options) *rig {
	t.Helper()
	n := memnet.New(no)
	dep, err := n.Listen(dpuAddr)
	if err != nil {
		t.Fatal(err)
	}
	cep, err := n.Listen(clientAddr)
	if err != nil {
		t.Fatal(err)
	}
	d := clienttest.Start(dep, do)
	c, err := New(cep, dpuAddr, co)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		d.Close()
		cep.Close()
		dep.Close()
	})
	return &rig{net: n, c: c, dpu: d, ep: cep}
}

// quiesce waits until the DPU has taken every datagram sent to it and then
// stops it, so that its counters are final.
func (r *rig) quiesce() clienttest.Counters {
	for r.net.InFlight() > 0 {
		runtime.Gosched()
	}
	r.dpu.Close()
	return r.dpu.Counters()
}

// echoOrReference answers model "echo" with the input reversed (a large,
// position-sensitive output) and the built-in models with their reference.
func echoOrReference(r *clienttest.Request) clienttest.Answer {
	if r.Model != "echo" {
		return clienttest.Reference(r)
	}
	out := make([]byte, len(r.Input))
	for i, b := range r.Input {
		out[len(out)-1-i] = b
	}
	return clienttest.Answer{Status: ingest.StatusOK, Text: "echo@1", Output: out, GPU: 1}
}

func randomBytes(seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func checkResult(t *testing.T, modelName string, in []byte, res *ingest.Result) {
	t.Helper()
	switch modelName {
	case "checksum":
		want := model.Checksum(in)
		if !bytes.Equal(res.Output, want[:]) {
			t.Errorf("%d bytes: checksum %x, want %x", len(in), res.Output, want)
		}
		if res.Slice != "ref@0" || res.Queued != time.Microsecond || res.Device != 2*time.Microsecond {
			t.Errorf("result placement %q %v %v, want ref@0 1µs 2µs", res.Slice, res.Queued, res.Device)
		}
	case "echo":
		if len(res.Output) != len(in) {
			t.Errorf("echo of %d bytes: %d back", len(in), len(res.Output))
			return
		}
		for i := range in {
			if res.Output[len(in)-1-i] != in[i] {
				t.Errorf("echo of %d bytes: byte %d wrong", len(in), i)
				return
			}
		}
		if res.GPU != 1 || res.Slice != "echo@1" {
			t.Errorf("echo placement GPU %d %q", res.GPU, res.Slice)
		}
	}
}

// TestInferSizes sends inputs from 1 B to several MiB, through datagrams
// of jumbo and of Ethernet size, and checks every result byte.
func TestInferSizes(t *testing.T) {
	for _, payload := range []int{9000, 1472} {
		frag := ingest.MaxFragment(payload, "checksum")
		sizes := []int{1, 2, 100, frag - 1, frag, frag + 1, 3*frag + 7, 1 << 20, 5<<20 + 3}
		for _, m := range []string{"checksum", "echo"} {
			t.Run(fmt.Sprintf("%s/%d", m, payload), func(t *testing.T) {
				r := newRig(t, memnet.Options{MaxPayload: payload, Queue: 8192}, Options{Timeout: time.Second},
					clienttest.Options{Handle: echoOrReference})
				for i, n := range sizes {
					if payload < 9000 && n > 1<<20 && m == "echo" {
						n = 1 << 20 // keep the 1472-byte run's datagram count within the queue
					}
					in := randomBytes(uint64(i), n)
					res, err := r.c.Infer(context.Background(), m, in, 0)
					if err != nil {
						t.Fatalf("%d bytes: %v", n, err)
					}
					checkResult(t, m, in, res)
				}
				st := r.c.Stats()
				if st.OK != uint64(len(sizes)) || st.Results != st.OK || len(st.Errors) != 0 {
					t.Errorf("stats %+v", st)
				}
				if ctr := r.quiesce(); ctr.Executions != uint64(len(sizes)) || ctr.Malformed != 0 {
					t.Errorf("DPU %+v", ctr)
				}
			})
		}
	}
}

// TestConcurrentFaults runs many concurrent requests over links that lose,
// duplicate and reorder datagrams both ways: every result is exact and
// every request ran once.
func TestConcurrentFaults(t *testing.T) {
	for _, tc := range []struct {
		name   string
		faults memnet.Faults
	}{
		{"clean", memnet.Faults{}},
		{"dup+reorder", memnet.Faults{Dup: 0.2, Reorder: 0.3}},
		{"loss", memnet.Faults{Drop: 0.05}},
		{"all", memnet.Faults{Drop: 0.05, Dup: 0.1, Reorder: 0.2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, memnet.Options{Seed: 3, MaxPayload: 4000, Faults: tc.faults},
				Options{Timeout: 5 * time.Millisecond, MaxTimeout: 50 * time.Millisecond, Retries: 100},
				clienttest.Options{Handle: echoOrReference})
			const workers, each = 16, 8
			var wg sync.WaitGroup
			errs := make(chan error, workers*each)
			for w := range workers {
				wg.Go(func() {
					for j := range each {
						seed := uint64(w*each + j)
						in := randomBytes(seed, 1+int(seed*7919%40000))
						m := []string{"checksum", "echo"}[j%2]
						res, err := r.c.Infer(context.Background(), m, in, 0)
						if err != nil {
							errs <- err
							continue
						}
						checkResult(t, m, in, res)
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			ctr := r.quiesce()
			if ctr.Executions != workers*each || r.dpu.MaxExecutions() != 1 {
				t.Errorf("%d executions (most for one request %d), want %d, once each", ctr.Executions, r.dpu.MaxExecutions(), workers*each)
			}
			if st := r.c.Stats(); st.OK != workers*each || st.Attempts != workers*each {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// TestRetransmit loses the DPU's first answer, whole or in part: the
// client sends the request again (all of it when nothing came back, one
// fragment when part of the result did), the DPU answers from memory, and
// the model runs once.
func TestRetransmit(t *testing.T) {
	const payload = 2000
	in := randomBytes(9, 10_000) // 6 input fragments; the echo comes back in 6 too
	frags := uint64((len(in) + ingest.MaxFragment(payload, "echo") - 1) / ingest.MaxFragment(payload, "echo"))
	for _, tc := range []struct {
		name string
		drop func(clienttest.Sent) bool
		// sent is how many datagrams the client sends for retx
		// retransmissions.
		sent func(retx uint64) uint64
	}{
		{"first answer lost", func(s clienttest.Sent) bool { return s.Answer == 0 },
			func(retx uint64) uint64 { return frags * (1 + retx) }},
		{"first two answers lost", func(s clienttest.Sent) bool { return s.Answer < 2 },
			func(retx uint64) uint64 { return frags * (1 + retx) }},
		{"part of the first answer lost", func(s clienttest.Sent) bool { return s.Answer == 0 && s.Fragment == 2 },
			func(retx uint64) uint64 { return frags + retx }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The timeout leaves the stand-in DPU, which answers in
			// microseconds, ample time to get its first answer out before
			// the first retransmission: "part" counts on it.
			r := newRig(t, memnet.Options{MaxPayload: payload}, Options{Timeout: 20 * time.Millisecond, Retries: 1000},
				clienttest.Options{Handle: echoOrReference, Drop: tc.drop})
			res, err := r.c.Infer(context.Background(), "echo", in, 0)
			if err != nil {
				t.Fatal(err)
			}
			checkResult(t, "echo", in, res)
			st := r.c.Stats()
			if st.Retransmissions == 0 || st.TxDatagrams != tc.sent(st.Retransmissions) {
				t.Errorf("%d retransmissions, %d datagrams sent, want %d", st.Retransmissions, st.TxDatagrams, tc.sent(st.Retransmissions))
			}
			if ctr := r.quiesce(); ctr.Executions != 1 || ctr.Answers < 2 {
				t.Errorf("DPU %+v: want one execution, answered again from memory", ctr)
			}
		})
	}
}

// TestRetransmitAfterForget: part of the first answer is lost and the
// DPU has dropped its kept result by the time the client asks for the
// rest. The client's lone-fragment ask cannot complete there, so its next
// retransmission sends the whole input again, which runs again.
func TestRetransmitAfterForget(t *testing.T) {
	const payload = 2000
	in := randomBytes(10, 10_000)
	var dropped atomic.Bool // fragment 2 of the very first answer only
	r := newRig(t, memnet.Options{MaxPayload: payload}, Options{Timeout: 20 * time.Millisecond, Retries: 6},
		clienttest.Options{Handle: echoOrReference, Forget: true,
			Drop: func(s clienttest.Sent) bool { return s.Fragment == 2 && dropped.CompareAndSwap(false, true) }})
	res, err := r.c.Infer(context.Background(), "echo", in, 0)
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, "echo", in, res)
	if ctr := r.quiesce(); ctr.Executions != 2 {
		t.Errorf("DPU %+v: want the request run again once it forgot the first result", ctr)
	}
}

// TestStatuses: retryable statuses are retried as new attempts up to
// Retries, the others come back at once as *ingest.Error with the DPU's
// message.
func TestStatuses(t *testing.T) {
	for _, tc := range []struct {
		name     string
		model    string
		statuses []ingest.Status // the answers of the attempts in turn; the last repeats
		retries  int
		want     ingest.Status
		attempts uint64
	}{
		{"overloaded twice then ok", "checksum", []ingest.Status{ingest.StatusOverloaded, ingest.StatusOverloaded, ingest.StatusOK}, 5, ingest.StatusOK, 3},
		{"host unavailable then ok", "checksum", []ingest.Status{ingest.StatusHostUnavailable, ingest.StatusOK}, 5, ingest.StatusOK, 2},
		{"overloaded past the retries", "checksum", []ingest.Status{ingest.StatusOverloaded}, 2, ingest.StatusOverloaded, 3},
		{"no retries", "checksum", []ingest.Status{ingest.StatusHostUnavailable}, -1, ingest.StatusHostUnavailable, 1},
		{"not granted", "checksum", []ingest.Status{ingest.StatusNotGranted}, 5, ingest.StatusNotGranted, 1},
		{"too large", "checksum", []ingest.Status{ingest.StatusTooLarge}, 5, ingest.StatusTooLarge, 1},
		{"deadline", "checksum", []ingest.Status{ingest.StatusDeadline}, 5, ingest.StatusDeadline, 1},
		{"model failed", "checksum", []ingest.Status{ingest.StatusModelFailed}, 5, ingest.StatusModelFailed, 1},
		{"unknown model", "resnet", []ingest.Status{ingest.StatusOK}, 5, ingest.StatusUnknownModel, 1},
		{"bad input", "mlp", []ingest.Status{ingest.StatusOK}, 5, ingest.StatusBadRequest, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			n := 0
			handle := func(req *clienttest.Request) clienttest.Answer {
				mu.Lock()
				s := tc.statuses[min(n, len(tc.statuses)-1)]
				n++
				mu.Unlock()
				if s == ingest.StatusOK {
					return clienttest.Reference(req)
				}
				return clienttest.Answer{Status: s, Text: "because " + s.String()}
			}
			r := newRig(t, memnet.Options{}, Options{Retries: tc.retries, Backoff: time.Millisecond}, clienttest.Options{Handle: handle})
			in := []byte("some input")
			res, err := r.c.Infer(context.Background(), tc.model, in, 0)
			st := r.c.Stats()
			if st.Attempts != tc.attempts || st.StatusRetries != tc.attempts-1 {
				t.Errorf("%d attempts, %d status retries; want %d", st.Attempts, st.StatusRetries, tc.attempts)
			}
			if tc.want == ingest.StatusOK {
				if err != nil {
					t.Fatal(err)
				}
				checkResult(t, tc.model, in, res)
				return
			}
			var ie *ingest.Error
			if !errors.As(err, &ie) || ie.Status != tc.want {
				t.Fatalf("err = %v, want status %v", err, tc.want)
			}
			if tc.model == "checksum" && ie.Msg != "because "+tc.want.String() {
				t.Errorf("message %q lost", ie.Msg)
			}
			if st.Errors[tc.want.String()] != 1 || st.OK != 0 {
				t.Errorf("stats errors %v", st.Errors)
			}
		})
	}
}

// TestDeadlineBudget: the deadline (Infer's, or ctx's when earlier) goes
// to the DPU as a budget in µs that never exceeds it and never reads as
// "none".
func TestDeadlineBudget(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deadline time.Duration
		ctx      time.Duration // 0: no ctx deadline
		max      uint32        // 0: want no budget
	}{
		{"none", 0, 0, 0},
		{"deadline", 50 * time.Millisecond, 0, 50_000},
		{"ctx", 0, 30 * time.Second, 30_000_000},
		{"ctx earlier", time.Hour, 30 * time.Second, 30_000_000},
		{"deadline earlier", 40 * time.Second, time.Hour, 40_000_000},
		{"beyond 32 bits", 100 * time.Hour, 0, math.MaxUint32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			budgets := make(chan uint32, 1)
			r := newRig(t, memnet.Options{}, Options{}, clienttest.Options{Handle: func(req *clienttest.Request) clienttest.Answer {
				budgets <- req.BudgetUs
				return clienttest.Reference(req)
			}})
			ctx := context.Background()
			if tc.ctx > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.ctx)
				defer cancel()
			}
			if _, err := r.c.Infer(ctx, "checksum", []byte{1, 2, 3}, tc.deadline); err != nil {
				t.Fatal(err)
			}
			b := <-budgets
			if tc.max == 0 && b != 0 || tc.max != 0 && (b == 0 || b > tc.max) {
				t.Errorf("budget %d µs, want %s", b, map[bool]string{true: "none", false: fmt.Sprintf("1..%d", tc.max)}[tc.max == 0])
			}
		})
	}
}

// TestDeadlinePassed: a deadline gone before the request could be sent
// fails locally with the deadline status, sending nothing.
func TestDeadlinePassed(t *testing.T) {
	r := newRig(t, memnet.Options{}, Options{}, clienttest.Options{})
	_, err := r.c.Infer(context.Background(), "checksum", []byte{1}, time.Nanosecond)
	if ingest.StatusOf(err) != ingest.StatusDeadline {
		t.Fatalf("err = %v, want the deadline status", err)
	}
	if st := r.c.Stats(); st.TxDatagrams != 0 || st.Errors["deadline"] != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestBudgetUs(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, tc := range []struct {
		due  time.Time
		want uint32
	}{
		{time.Time{}, 0},
		{now.Add(time.Second), 1_000_000},
		{now.Add(1500 * time.Nanosecond), 2},
		{now.Add(time.Nanosecond), 1},
		{now, 1},
		{now.Add(-time.Hour), 1},
		{now.Add(2 * time.Hour), math.MaxUint32},
	} {
		if got := budgetUs(tc.due, now); got != tc.want {
			t.Errorf("budget for %v: %d, want %d", tc.due.Sub(now), got, tc.want)
		}
	}
}

// TestPatchOffsets holds the offsets the client patches to proto.go's
// layout.
func TestPatchOffsets(t *testing.T) {
	r := newRig(t, memnet.Options{MaxPayload: 200}, Options{}, clienttest.Options{})
	pkts := r.c.packets("checksum", randomBytes(1, 1000), ingest.MaxFragment(200, "checksum"))
	for _, p := range pkts {
		binary.BigEndian.PutUint64(p.Data[offID:], 0x0123456789abcdef)
	}
	setBudget(pkts, time.Now().Add(time.Hour))
	off := 0
	for i, p := range pkts {
		if len(p.Data) > 200 {
			t.Fatalf("datagram %d: %d bytes", i, len(p.Data))
		}
		in, err := ingest.DecodeInput(p.Data[wire.HeaderLen:])
		if err != nil {
			t.Fatal(err)
		}
		if in.ID != 0x0123456789abcdef || in.BudgetUs < 3_000_000_000 || in.Total != 1000 || int(in.Offset) != off || in.Model != "checksum" {
			t.Errorf("datagram %d: %+v", i, in)
		}
		off += len(in.Data)
	}
	if off != 1000 {
		t.Errorf("fragments cover %d bytes", off)
	}
}

// TestMalformedIgnored: datagrams that are not results for this client's
// requests are counted and dropped, and the client goes on working.
func TestMalformedIgnored(t *testing.T) {
	r := newRig(t, memnet.Options{}, Options{Tenant: 4}, clienttest.Options{})
	res := func(tenant uint32, f ingest.ResultFragment) []byte { return ingest.AppendResult(nil, tenant, &f) }
	good := res(4, ingest.ResultFragment{ID: 77, Total: 1, Data: []byte{1}})
	textOverrun := bytes.Clone(good)
	binary.BigEndian.PutUint16(textOverrun[wire.HeaderLen+18:], 500)
	pastTotal := bytes.Clone(good)
	binary.BigEndian.PutUint32(pastTotal[wire.HeaderLen+12:], 5)
	badVersion := bytes.Clone(good)
	badVersion[0] = 9
	for _, tc := range []struct {
		name string
		data []byte
		want string // the counter it lands in
	}{
		{"empty", nil, "malformed"},
		{"short", []byte{1, 0x21, 0}, "malformed"},
		{"bad version", badVersion, "malformed"},
		{"bad length", good[:len(good)-1], "malformed"},
		{"short result header", wire.Header{Version: wire.Version, Type: wire.TypeIngestResult, Tenant: 4}.AppendTo(nil, make([]byte, 10)), "malformed"},
		{"text overrun", textOverrun, "malformed"},
		{"fragment past total", pastTotal, "malformed"},
		{"an input", ingest.AppendInput(nil, 4, &ingest.Input{ID: 1, Total: 1, Model: "m", Data: []byte{1}}), "ignored"},
		{"another tenant", res(5, ingest.ResultFragment{ID: 77, Total: 1, Data: []byte{1}}), "ignored"},
		{"a ping", wire.Header{Version: wire.Version, Type: wire.TypePing, Tenant: 4}.AppendTo(nil, nil), "ignored"},
		// Sent from elsewhere than the DPU, a valid result is foreign
		// before it is stale.
		{"no such request", good, "foreign"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep, err := r.net.Listen(netip.MustParseAddrPort("10.77.0.99:0"))
			if err != nil {
				t.Fatal(err)
			}
			defer ep.Close()
			before := r.c.Stats()
			if _, err := ep.Send([]transport.Packet{{Addr: r.ep.LocalAddr(), Data: tc.data}}); err != nil {
				t.Fatal(err)
			}
			// memnet queues in order, so the datagram is handled before
			// this request's result.
			in := []byte(tc.name)
			out, err := r.c.Infer(context.Background(), "checksum", in, 0)
			if err != nil {
				t.Fatal(err)
			}
			checkResult(t, "checksum", in, out)
			after := r.c.Stats()
			got := map[string]uint64{"malformed": after.Malformed - before.Malformed, "ignored": after.Ignored - before.Ignored,
				"stale": after.Stale - before.Stale, "foreign": after.Foreign - before.Foreign}
			for k, v := range got {
				if want := map[bool]uint64{true: 1}[k == tc.want]; v != want {
					t.Errorf("%s counted %d, want %d", k, v, want)
				}
			}
		})
	}
}

// TestCallAdd feeds one call result fragments in awkward orders.
func TestCallAdd(t *testing.T) {
	frag := func(total, off uint32, data string) ingest.ResultFragment {
		return ingest.ResultFragment{ID: 1, Total: total, Offset: off, Data: []byte(data), Text: "s"}
	}
	for _, tc := range []struct {
		name  string
		frags []ingest.ResultFragment
		want  []fragVerdict
		out   string
	}{
		{"in order", []ingest.ResultFragment{frag(6, 0, "abc"), frag(6, 3, "def")}, []fragVerdict{fragNew, fragDone}, "abcdef"},
		{"reversed", []ingest.ResultFragment{frag(6, 3, "def"), frag(6, 0, "abc")}, []fragVerdict{fragNew, fragDone}, "abcdef"},
		{"duplicate", []ingest.ResultFragment{frag(6, 0, "abc"), frag(6, 0, "abc"), frag(6, 3, "def"), frag(6, 3, "def")},
			[]fragVerdict{fragNew, fragDup, fragDone, fragDup}, "abcdef"},
		{"cut differently", []ingest.ResultFragment{frag(6, 0, "ab"), frag(6, 1, "bcd"), frag(6, 2, "cdef")},
			[]fragVerdict{fragNew, fragNew, fragDone}, "abcdef"},
		{"total changes", []ingest.ResultFragment{frag(6, 0, "abc"), frag(7, 3, "defg"), frag(6, 3, "def")},
			[]fragVerdict{fragNew, fragBad, fragDone}, "abcdef"},
		{"status changes", []ingest.ResultFragment{frag(6, 0, "abc"), {ID: 1, Status: ingest.StatusInternal}, frag(6, 3, "def")},
			[]fragVerdict{fragNew, fragBad, fragDone}, "abcdef"},
		// Over max: the call ends with ErrOutputTooLarge (out "!").
		{"too large", []ingest.ResultFragment{frag(1<<20, 0, "abc"), frag(3, 0, "abc")}, []fragVerdict{fragDone, fragDup}, "!"},
		{"empty output", []ingest.ResultFragment{frag(0, 0, "")}, []fragVerdict{fragDone}, ""},
		{"failure", []ingest.ResultFragment{{ID: 1, Status: ingest.StatusNotGranted, Text: "no"}, {ID: 1, Status: ingest.StatusNotGranted}},
			[]fragVerdict{fragDone, fragDup}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := &call{id: 1, max: 1000, done: make(chan struct{})}
			for i, f := range tc.frags {
				if v := k.add(&f); v != tc.want[i] {
					t.Errorf("fragment %d: verdict %d, want %d", i, v, tc.want[i])
				}
			}
			res, err := k.result()
			switch {
			case tc.out == "!":
				if !errors.Is(err, ErrOutputTooLarge) {
					t.Errorf("result %v, %v; want ErrOutputTooLarge", res, err)
				}
			case k.status == ingest.StatusOK && (err != nil || string(res.Output) != tc.out):
				t.Errorf("result %v, %v; want %q", res, err, tc.out)
			case k.status != ingest.StatusOK && ingest.StatusOf(err) != k.status:
				t.Errorf("err %v", err)
			}
		})
	}
}

// TestStop: Close, a cancelled context and a closed transport each
// unblock an Infer waiting for a result that never comes.
func TestStop(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(r *rig, cancel context.CancelFunc)
		want error
	}{
		{"close", func(r *rig, _ context.CancelFunc) { r.c.Close() }, ErrClosed},
		{"cancel", func(_ *rig, cancel context.CancelFunc) { cancel() }, context.Canceled},
		{"transport closed", func(r *rig, _ context.CancelFunc) { r.ep.Close() }, ErrClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			arrived := make(chan struct{}, 1)
			r := newRig(t, memnet.Options{}, Options{Timeout: time.Hour}, clienttest.Options{
				Drop:    func(clienttest.Sent) bool { return true },
				OnInput: func(netip.AddrPort, *ingest.Input) { arrived <- struct{}{} },
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := r.c.Infer(ctx, "checksum", []byte{1}, 0)
				done <- err
			}()
			<-arrived
			tc.stop(r, cancel)
			if err := <-done; !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			if tc.want == ErrClosed {
				if _, err := r.c.Infer(context.Background(), "checksum", []byte{1}, 0); !errors.Is(err, ErrClosed) {
					t.Errorf("Infer after stop: %v", err)
				}
			}
			r.c.Close() // again: harmless
		})
	}
}

// TestInvalid: requests that cannot be sent are refused before sending.
func TestInvalid(t *testing.T) {
	r := newRig(t, memnet.Options{MaxPayload: 100}, Options{}, clienttest.Options{})
	for _, tc := range []struct {
		model string
		in    []byte
	}{
		{"", []byte{1}},
		{"checksum", nil},
		{string(make([]byte, 65)), []byte{1}},
		{string(bytes.Repeat([]byte{'m'}, 60)), []byte{1}}, // no room left in a 100-byte datagram
		{"checksum", make([]byte, 200)},                    // fragments under ingest.MinFragment, which the DPU refuses
	} {
		if _, err := r.c.Infer(context.Background(), tc.model, tc.in, 0); !errors.Is(err, ErrInvalid) {
			t.Errorf("model %q, %d bytes: err = %v, want ErrInvalid", tc.model, len(tc.in), err)
		}
	}
	if st := r.c.Stats(); st.TxDatagrams != 0 || st.Errors["invalid"] != 5 {
		t.Errorf("stats %+v", st)
	}
}

func TestSpans(t *testing.T) {
	var s spans
	for _, tc := range []struct {
		lo, hi, added, covered uint64
	}{
		{10, 20, 10, 10}, {0, 5, 5, 15}, {5, 10, 5, 20}, {0, 20, 0, 20}, {15, 30, 10, 30}, {40, 40, 0, 30}, {35, 45, 10, 40}, {0, 50, 10, 50},
	} {
		if a := s.add(tc.lo, tc.hi); a != tc.added || s.covered != tc.covered {
			t.Errorf("add [%d,%d): added %d covered %d, want %d %d (%v)", tc.lo, tc.hi, a, s.covered, tc.added, tc.covered, s.s)
		}
	}
	if len(s.s) != 1 {
		t.Errorf("spans %v, want one", s.s)
	}
}

// TestResultOverMaxOutput: a result larger than MaxOutput fails the call
// at once, with an error naming its size and MaxOutput, after one
// transmission; before, every fragment was counted malformed and the
// call retransmitted until it ended as ErrTimeout.
func TestResultOverMaxOutput(t *testing.T) {
	r := newRig(t, memnet.Options{}, Options{MaxOutput: 1000, Timeout: 20 * time.Millisecond, Retries: 3},
		clienttest.Options{Handle: echoOrReference})
	in := randomBytes(3, 1001)
	_, err := r.c.Infer(context.Background(), "echo", in, 0)
	if !errors.Is(err, ErrOutputTooLarge) || !strings.Contains(err.Error(), "1001 bytes") || !strings.Contains(err.Error(), "MaxOutput 1000") {
		t.Fatalf("Infer: %v, want ErrOutputTooLarge naming 1001 bytes and MaxOutput 1000", err)
	}
	st := r.c.Stats()
	if st.Retransmissions != 0 || st.Malformed != 0 || st.Errors["output-too-large"] != 1 {
		t.Errorf("%d retransmissions, %d malformed, errors %v; want 0, 0, output-too-large 1", st.Retransmissions, st.Malformed, st.Errors)
	}
	// One byte less fits.
	if res, err := r.c.Infer(context.Background(), "echo", in[:1000], 0); err != nil {
		t.Fatal(err)
	} else {
		checkResult(t, "echo", in[:1000], res)
	}
}

// TestResultFromElsewhere: a result datagram naming a request in progress
// (its tenant and ID guessed, or seen on the wire) is taken only from the
// DPU the request went to: one from any other address, even the DPU's
// host on another port, is refused and counted, and the DPU's own result
// is the one returned. Before, the first result to arrive won, whoever
// sent it.
func TestResultFromElsewhere(t *testing.T) {
	for _, from := range []string{"10.77.0.99:61440", "10.77.0.12:61441"} {
		t.Run(from, func(t *testing.T) {
			n := memnet.New(memnet.Options{})
			rogue, err := n.Listen(netip.MustParseAddrPort(from))
			if err != nil {
				t.Fatal(err)
			}
			dep, err := n.Listen(dpuAddr)
			if err != nil {
				t.Fatal(err)
			}
			cep, err := n.Listen(clientAddr)
			if err != nil {
				t.Fatal(err)
			}
			// Before the DPU answers an input, the rogue answers it first
			// with a forged output.
			forged := func(_ netip.AddrPort, in *ingest.Input) {
				f := ingest.ResultFragment{ID: in.ID, Total: 8, Data: []byte("forged!!"), Text: "x@0"}
				if _, err := rogue.Send([]transport.Packet{{Addr: cep.LocalAddr(), Data: ingest.AppendResult(nil, 6, &f)}}); err != nil {
					t.Error(err)
				}
			}
			d := clienttest.Start(dep, clienttest.Options{OnInput: forged})
			c, err := New(cep, dpuAddr, Options{Tenant: 6})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				c.Close()
				d.Close()
				for _, ep := range []*memnet.Endpoint{cep, dep, rogue} {
					ep.Close()
				}
			})
			in := randomBytes(5, 100)
			res, err := c.Infer(context.Background(), "checksum", in, 0)
			if err != nil {
				t.Fatal(err)
			}
			checkResult(t, "checksum", in, res)
			if st := c.Stats(); st.Foreign != 1 || st.Results != 1 {
				t.Errorf("%d datagrams refused as foreign, %d results; want 1, 1", st.Foreign, st.Results)
			}
		})
	}
}
