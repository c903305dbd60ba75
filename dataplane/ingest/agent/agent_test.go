package agent

import (
	"bytes"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/memnet"
)

func randomBytes(seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func mlpInput(seed uint64, rows int) []byte {
	rng := rand.New(rand.NewPCG(seed, 9))
	var b []byte
	for range rows * model.MLPIn {
		b = appendF32(b, rng.Float32()*2-1)
	}
	return b
}

func reference(t *testing.T, name string, in []byte) []byte {
	t.Helper()
	m, err := model.Builtin(name)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, m.OutputSize(len(in)))
	return out[:m.Reference(in, out)]
}

// TestExactBytes: every input the DPU writes is byte-equal where the
// model runs (the checksum is computed on the slot's buffer), and every
// MLP result equals the CPU reference, for sizes from 1 byte to several
// MiB, from several clients of several tenants at once.
func TestExactBytes(t *testing.T) {
	r := newRig(t, rigOptions{gpus: 2})
	sizes := []int{1, 2, 255, 8900, 8947, 8948, 65536, 1 << 20, 5<<20 + 3}
	var wg sync.WaitGroup
	for c := range 4 {
		cl := r.client(uint32(c % 2))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, n := range sizes {
				in := randomBytes(uint64(c*100+i), n)
				a := cl.infer("checksum", in, 0)
				want := model.Checksum(in)
				if a.status != ingest.StatusOK || !bytes.Equal(a.out, want[:]) {
					t.Errorf("client %d, %d bytes: status %v %q, checksum %x, want %x", c, n, a.status, a.text, a.out, want)
				}
			}
			for rows := 1; rows <= 4096; rows *= 8 {
				in := mlpInput(uint64(c*10+rows), rows)
				a := cl.infer("mlp", in, 0)
				if a.status != ingest.StatusOK || !bytes.Equal(a.out, reference(t, "mlp", in)) {
					t.Errorf("client %d, mlp %d rows: status %v %q, output differs from the CPU reference", c, rows, a.status, a.text)
				}
			}
		}()
	}
	wg.Wait()
	s := r.agent.Stats()
	want := uint64(4 * (len(sizes) + 5))
	if s.Completed != want || len(s.Refused) != 0 || s.InFlight != 0 || s.BufferBytes != 0 {
		t.Errorf("stats: completed %d (want %d), refused %v, in flight %d, buffered %d", s.Completed, want, s.Refused, s.InFlight, s.BufferBytes)
	}
	// Doorbells may be rung again when the host is slow; no model runs
	// twice.
	if hs := r.host.Stats(); hs.Completed != want {
		t.Errorf("host ran %d requests (want %d)", hs.Completed, want)
	}
}

// TestLossyFabric: with loss, duplication and reordering between clients
// and the DPU, every request completes with the right bytes and no model
// runs twice.
func TestLossyFabric(t *testing.T) {
	r := newRig(t, rigOptions{faults: memnet.Faults{Drop: 0.05, Dup: 0.05, Reorder: 0.1}})
	cl := r.client(0)
	for i, n := range []int{1, 9000, 100000, 1 << 20} {
		in := randomBytes(uint64(i), n)
		a := cl.infer("checksum", in, 0)
		want := model.Checksum(in)
		if a.status != ingest.StatusOK || !bytes.Equal(a.out, want[:]) {
			t.Fatalf("%d bytes: %v %q %x want %x", n, a.status, a.text, a.out, want)
		}
	}
	s, hs := r.agent.Stats(), r.host.Stats()
	if hs.Completed != 4 {
		t.Errorf("host ran %d models for 4 requests (duplicates must not run again)", hs.Completed)
	}
	t.Logf("duplicates %d, results resent %d, doorbells rerung %d, host repeats %d", s.Duplicates, s.Resent, s.Rerings, hs.Repeats)
}

// TestRefusals: each bad request gets its status and a message, is
// counted, and harms no other request.
func TestRefusals(t *testing.T) {
	r := newRig(t, rigOptions{
		gpus:    2,
		pools:   map[string][]int{"a": {0}, "b": {1}},
		tenants: []TenantConfig{{ID: 1, Models: []string{"checksum", "mlp"}, Pool: "a"}, {ID: 2, Models: []string{"checksum"}, Pool: "b"}},
		models:  []ModelConfig{{Name: "checksum", MaxInput: 1 << 20}, {Name: "mlp"}},
	})
	ok1, ok2 := r.client(1), r.client(2)
	cases := []struct {
		name   string
		tenant uint32
		model  string
		input  []byte
		budget time.Duration
		want   ingest.Status
	}{
		{"model not granted", 2, "mlp", mlpInput(1, 1), 0, ingest.StatusNotGranted},
		{"unknown tenant", 9, "checksum", []byte{1}, 0, ingest.StatusNotGranted},
		{"unknown model", 1, "resnet", []byte{1}, 0, ingest.StatusUnknownModel},
		{"oversize", 1, "checksum", make([]byte, 1<<20+1), 0, ingest.StatusTooLarge},
		{"truncated tensor", 1, "mlp", make([]byte, model.MLPIn*4-4), 0, ingest.StatusBadRequest},
		{"expired deadline", 1, "checksum", make([]byte, 512<<10), time.Microsecond, ingest.StatusDeadline},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cl := r.client(tc.tenant)
			a := cl.infer(tc.model, tc.input, tc.budget)
			if a.status != tc.want || a.text == "" {
				t.Errorf("status %v %q, want %v with a message", a.status, a.text, tc.want)
			}
			// Others are unharmed.
			for _, c := range []*rawClient{ok1, ok2} {
				in := randomBytes(uint64(c.tenant), 5000)
				want := model.Checksum(in)
				if a := c.infer("checksum", in, 0); a.status != ingest.StatusOK || !bytes.Equal(a.out, want[:]) {
					t.Errorf("tenant %d after %s: %v %q", c.tenant, tc.name, a.status, a.text)
				}
			}
		})
	}
	s := r.agent.Stats()
	for _, st := range []ingest.Status{ingest.StatusNotGranted, ingest.StatusUnknownModel, ingest.StatusTooLarge, ingest.StatusBadRequest, ingest.StatusDeadline} {
		if s.Refused[st.String()] == 0 {
			t.Errorf("no %s refusal counted: %v", st, s.Refused)
		}
	}
}

// TestPoolsIsolateTenants: a tenant's requests land only on its pool's
// GPUs.
func TestPoolsIsolateTenants(t *testing.T) {
	r := newRig(t, rigOptions{
		gpus:    2,
		pools:   map[string][]int{"a": {0}, "b": {1}},
		tenants: []TenantConfig{{ID: 1, Models: []string{"checksum"}, Pool: "a"}, {ID: 2, Models: []string{"checksum"}, Pool: "b"}},
	})
	for tenant, gpu := range map[uint32]int{1: 0, 2: 1} {
		var wg sync.WaitGroup
		for i := range 20 {
			cl := r.client(tenant)
			wg.Add(1)
			go func() {
				defer wg.Done()
				a := cl.infer("checksum", randomBytes(uint64(i), 1000), 0)
				if a.status != ingest.StatusOK || a.gpu != gpu {
					t.Errorf("tenant %d: ran on GPU %d (%v %q), its pool has GPU %d only", tenant, a.gpu, a.status, a.text, gpu)
				}
			}()
		}
		wg.Wait()
	}
}

// TestClientVanishes: a client that stops mid-request leaves nothing
// behind once the reassembly timeout passes, and nobody else notices.
func TestClientVanishes(t *testing.T) {
	r := newRig(t, rigOptions{})
	gone := r.client(0)
	pkts := gone.fragments(1, "checksum", make([]byte, 100000), 0)
	gone.send(pkts[:len(pkts)/2])
	ok := r.client(0)
	in := randomBytes(3, 70000)
	want := model.Checksum(in)
	if a := ok.infer("checksum", in, 0); a.status != ingest.StatusOK || !bytes.Equal(a.out, want[:]) {
		t.Fatalf("other client: %v %q", a.status, a.text)
	}
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if s := r.agent.Stats(); s.ReassemblyTimeouts == 1 && s.InFlight == 0 && s.BufferBytes == 0 {
			return
		}
	}
	t.Fatalf("half-sent request not dropped: %+v", r.agent.Stats())
}

// TestHostRestart: the host agent restarts (new epoch, new buffers); the
// DPU drops the old mappings, maps the new ones, and requests work again.
// A request rung on the old host fails as retryable, not silently.
func TestHostRestart(t *testing.T) {
	r := newRig(t, rigOptions{})
	cl := r.client(0)
	in := randomBytes(1, 4096)
	want := model.Checksum(in)
	if a := cl.infer("checksum", in, 0); a.status != ingest.StatusOK {
		t.Fatalf("before restart: %v %q", a.status, a.text)
	}
	old := r.host.Epoch()
	r.stopHost()
	// With the host silent, requests are refused as retryable once the
	// DPU gives it up.
	for end := time.Now().Add(10 * time.Second); r.agent.Stats().Host != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("DPU never noticed the host stopped")
		}
	}
	if a := cl.infer("checksum", in, 0); a.status != ingest.StatusHostUnavailable || !a.status.Retryable() {
		t.Errorf("with no host: %v %q, want a retryable host-unavailable", a.status, a.text)
	}
	r.startHost(0)
	r.waitRegistered()
	if r.host.Epoch() == old {
		t.Fatal("restarted host kept its epoch")
	}
	if a := cl.infer("checksum", in, 0); a.status != ingest.StatusOK || !bytes.Equal(a.out, want[:]) {
		t.Errorf("after restart: %v %q", a.status, a.text)
	}
	s := r.agent.Stats()
	if s.Registrations != 2 || s.HostLost != 1 {
		t.Errorf("registrations %d (want 2), host lost %d (want 1)", s.Registrations, s.HostLost)
	}
}

// TestAgentRestart: a restarted DPU agent keeps using the host agent that
// ran its predecessor's requests (same epoch). Its request numbers must
// not repeat the old ones, or the host answers a new request with an old
// request's completion from memory and the client gets that output as OK.
func TestAgentRestart(t *testing.T) {
	r := newRig(t, rigOptions{})
	before, after := randomBytes(1, 4096), randomBytes(2, 4096)
	for i, in := range [][]byte{before, after} {
		if i == 1 {
			r.stopAgent()
			r.startAgent()
			r.waitRegistered()
		}
		want := model.Checksum(in)
		if a := r.client(0).infer("checksum", in, 0); a.status != ingest.StatusOK || !bytes.Equal(a.out, want[:]) {
			t.Fatalf("agent %d: %v %q, checksum %x, want %x", i+1, a.status, a.text, a.out, want)
		}
	}
	if hs := r.host.Stats(); hs.Completed != 2 {
		t.Errorf("host ran %d requests, want 2 (one per agent)", hs.Completed)
	}
}

// TestCompletionOnAnotherSlot: a completion naming a request but another
// GPU or slot than the request was placed on is not its run: the agent
// ignores it (a protocol error) instead of reading the request's slot.
func TestCompletionOnAnotherSlot(t *testing.T) {
	r := newRig(t, rigOptions{gpus: 2, tweak: noReRing})
	a := r.agent
	req := runningRequest(a, 1, 3)
	for _, c := range []struct{ gpu, slot uint8 }{{1, 0}, {0, 3}} {
		a.complete(ingest.Ctrl{Op: ingest.OpComplete, Epoch: req.host.epoch, Request: req.seq, GPU: c.gpu, Slot: c.slot, Length: 8})
	}
	a.mu.Lock()
	open := a.bySeq[req.seq] == req
	a.failLocked(req, ingest.Errorf(ingest.StatusInternal, "test over"))
	a.mu.Unlock()
	if s := a.Stats(); !open || s.ProtocolErrors != 2 || s.Completed != 0 {
		t.Errorf("request still open %v (want true), protocol errors %d (want 2), completed %d (want 0)", open, s.ProtocolErrors, s.Completed)
	}
}

// runningRequest puts a request on gpu and slot into a's state, as if its
// doorbell were rung just now, for tests that play the host's answers.
// Their rigs take noReRing: a real doorbell would make the host run the
// request's empty input and answer before the test does.
func runningRequest(a *Agent, gpu, slot int) *request {
	a.mu.Lock()
	defer a.mu.Unlock()
	req := &request{key: reqKey{id: 1}, seq: 1, model: a.models["checksum"], host: a.host, state: running, gpu: gpu, slot: slot,
		rungAt: time.Now(), done: make(chan *outcome, 1)}
	a.reqs[req.key], a.bySeq[req.seq] = req, req
	return req
}

// noReRing keeps the agent from ringing a test's doorbell again while the
// test plays the host.
func noReRing(c *Config) { c.DoorbellTimeout = time.Hour }

// TestImpossibleOutputLength: a completion whose output would not fit the
// slot's output buffer, or of another length than the built-in model
// gives (which the agent's metadata promises its front ends), fails the
// request as internal, counted so and not as completed, and no byte is
// counted as read from the device. Before, a checksum of 4 bytes was
// delivered and counted completed, and the gRPC front end then failed it.
func TestImpossibleOutputLength(t *testing.T) {
	r := newRig(t, rigOptions{tweak: noReRing})
	a := r.agent
	for i, tc := range []struct {
		name   string
		length func(h *host) int
	}{
		{"beyond the slot's buffer", func(h *host) int { return h.slotOut(0) + 1 }},
		{"not the model's", func(*host) int { return model.ChecksumLen / 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := runningRequest(a, 0, 0)
			a.complete(ingest.Ctrl{Op: ingest.OpComplete, Epoch: req.host.epoch, Request: req.seq, Length: uint32(tc.length(req.host))})
			o := <-req.done
			if s := a.Stats(); ingest.StatusOf(o.err) != ingest.StatusInternal || s.BytesFromDevice != 0 || s.Completed != 0 || s.Refused["internal"] != uint64(i+1) {
				t.Errorf("%v, %d bytes from the device, completed %d, refused %v; want an internal error, 0 bytes, 0 completed, %d internal",
					o.err, s.BytesFromDevice, s.Completed, s.Refused, i+1)
			}
		})
	}
}
