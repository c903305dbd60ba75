package hostagent

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/hostagent/workertest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/internal/fdpass"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/memnet"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

var (
	testHost = netip.MustParseAddrPort("10.1.0.1:61441")
	testDPU  = netip.MustParseAddrPort("10.1.0.2:61441")
)

const (
	rowBytes = 16 * 4 // 16 float32 or int32 per row, as testdata/worker.py reads them
	slotIn   = 256 * rowBytes
	slotOut  = 256 * rowBytes
)

// extRig is a host agent with a shared-memory GPU of two slots and the
// external models of testdata/worker.py, on an in-process network where
// the test plays the DPU: it maps the slot buffers, writes inputs, rings
// doorbells and reads completions and outputs. A tweak may give it a CUDA
// device instead (external_gpu_test.go).
type extRig struct {
	t        *testing.T
	agent    *Agent
	dpu      *memnet.Endpoint
	workers  string
	slots    [][2]slotMem // in, out
	mappings []devmem.Mapping
	cancel   context.CancelFunc
	done     chan error

	mu    sync.Mutex
	ids   uint64
	stash map[uint64]ingest.Ctrl
}

func newExtRig(t *testing.T, tweak func(*Config)) *extRig {
	t.Helper()
	nw := memnet.New(memnet.Options{Seed: 1, MaxPayload: 8972})
	hostEP, err := nw.Listen(testHost)
	if err != nil {
		t.Fatal(err)
	}
	dpuEP, err := nw.Listen(testDPU)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ck, _ := model.Builtin("checksum")
	cfg := Config{Transport: hostEP, DPU: testDPU, Devices: []devmem.Device{devmem.NewShm(devmem.Info{Index: 0})}, Cards: []string{"H100-80GB"},
		SlotInput: slotIn, SlotOutput: slotOut, Slots: 2, HandleSocket: filepath.Join(dir, "handles.sock"), WorkerSocket: filepath.Join(dir, "workers.sock"),
		Models: []*model.Model{ck,
			model.NewExternal("affine", rowBytes, func(n int) int { return n }),
			model.NewExternal("rowsum", rowBytes, func(n int) int { return n / rowBytes * 4 }),
			model.NewExternal("idle", 1, func(int) int { return 8 }),
			model.NewExternal("wide", rowBytes, func(n int) int { return 2 * n }),
			model.NewExternal("late", 1, func(n int) int { return n }),
		}}
	if tweak != nil {
		tweak(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &extRig{t: t, agent: a, dpu: dpuEP, workers: cfg.WorkerSocket, cancel: cancel, done: make(chan error, 1), stash: map[uint64]ingest.Ctrl{}}
	go func() { r.done <- a.Run(ctx) }()
	t.Cleanup(func() {
		r.stop()
		hostEP.Close()
		dpuEP.Close()
		for _, m := range r.mappings {
			m.Close()
		}
	})
	// The first register says the sockets are open.
	r.next(func(c ingest.Ctrl) bool { return c.Op == ingest.OpRegister })
	fctx, fcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer fcancel()
	l, hs, err := FetchLayout(fctx, cfg.HandleSocket, a.Epoch())
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 4 || !contains(l.Models, "affine") {
		t.Fatalf("layout %+v with %d handles", l, len(hs))
	}
	for i := 0; i < len(hs); i += 2 {
		if hs[i].Kind != devmem.HandleMemfd {
			// CUDA legacy IPC handles: the driver opens no process's
			// own, and this test is the host agent's process. The DPU
			// side goes through the agent's buffers (cuMemcpy in the
			// agent's context): like the DPU's import in another
			// process, that sees a worker's writes only once the
			// worker synchronized before answering done, so the
			// ordering the DPU relies on is what is tested.
			for k := range 2 {
				if hs[i+k].FD >= 0 {
					unix.Close(hs[i+k].FD)
				}
			}
			s := &a.gpus[0].slots[i/2]
			r.slots = append(r.slots, [2]slotMem{s.in, s.out})
			continue
		}
		in, err := devmem.ShmImporter{}.Import(hs[i])
		if err != nil {
			t.Fatal(err)
		}
		out, err := devmem.ShmImporter{}.Import(hs[i+1])
		if err != nil {
			t.Fatal(err)
		}
		r.mappings = append(r.mappings, in, out)
		r.slots = append(r.slots, [2]slotMem{in, out})
	}
	return r
}

// slotMem is a slot buffer as the rig reaches it: a devmem.Mapping the
// DPU side imported, or the host agent's own devmem.Buffer.
type slotMem interface {
	ReadAt(p []byte, off int) error
	WriteAt(p []byte, off int) error
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func (r *extRig) stop() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	if err := <-r.done; err != nil {
		r.t.Errorf("host agent: %v", err)
	}
	r.cancel = nil
}

// next returns the next control message from the host that match
// accepts, stashing completions it passes over.
func (r *extRig) next(match func(ingest.Ctrl) bool) ingest.Ctrl {
	r.t.Helper()
	pkts := make([]transport.Packet, 8)
	deadline := time.Now().Add(20 * time.Second)
	for {
		r.mu.Lock()
		for id, c := range r.stash {
			if match(c) {
				delete(r.stash, id)
				r.mu.Unlock()
				return c
			}
		}
		r.mu.Unlock()
		if time.Now().After(deadline) {
			r.t.Fatal("no expected control message from the host agent in 20s")
		}
		for i := range pkts {
			pkts[i].Data = make([]byte, 9000)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		n, err := r.dpu.Recv(ctx, pkts)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			continue
		}
		if err != nil {
			r.t.Fatal(err)
		}
		for _, p := range pkts[:n] {
			h, payload, err := wire.Decode(p.Data)
			if err != nil || h.Type != wire.TypeIngestCtrl {
				r.t.Fatalf("bad datagram from the host agent: %v", err)
			}
			c, err := ingest.DecodeCtrl(payload)
			if err != nil {
				r.t.Fatal(err)
			}
			if c.Op == ingest.OpRegister {
				r.send(ingest.Ctrl{Op: ingest.OpRegisterAck, Epoch: c.Epoch})
			}
			if c.Op == ingest.OpComplete {
				r.mu.Lock()
				r.stash[c.Request] = c
				r.mu.Unlock()
			} else if match(c) {
				return c
			}
		}
	}
}

func (r *extRig) send(c ingest.Ctrl) {
	r.t.Helper()
	if _, err := r.dpu.Send([]transport.Packet{{Addr: testHost, Data: ingest.AppendCtrl(nil, &c)}}); err != nil {
		r.t.Fatal(err)
	}
}

// ring writes input into slot's input buffer, as the DPU's DMA would, and
// rings the doorbell.
func (r *extRig) ring(slot int, mdl string, input []byte) uint64 {
	r.t.Helper()
	if err := r.slots[slot][0].WriteAt(input, 0); err != nil {
		r.t.Fatal(err)
	}
	r.mu.Lock()
	r.ids++
	id := r.ids
	r.mu.Unlock()
	r.send(ingest.Ctrl{Op: ingest.OpDoorbell, Epoch: r.agent.Epoch(), Request: id, Slot: uint8(slot), Length: uint32(len(input)), Text: mdl})
	return id
}

func (r *extRig) complete(id uint64) ingest.Ctrl {
	r.t.Helper()
	return r.next(func(c ingest.Ctrl) bool { return c.Op == ingest.OpComplete && c.Request == id })
}

func (r *extRig) read(slot, k, n int) []byte {
	r.t.Helper()
	b := make([]byte, n)
	if err := r.slots[slot][k].ReadAt(b, 0); err != nil {
		r.t.Fatal(err)
	}
	return b
}

// run rings and waits for the completion.
func (r *extRig) run(slot int, mdl string, input []byte) ingest.Ctrl {
	r.t.Helper()
	return r.complete(r.ring(slot, mdl, input))
}

// worker starts testdata/worker.py for mdl, with more arguments if
// given, and waits until the agent has want workers of it.
func (r *extRig) worker(mdl string, want int, more ...string) *workertest.Process {
	r.t.Helper()
	return r.script("worker.py", mdl, want, more...)
}

// script is worker with another script of testdata.
func (r *extRig) script(script, mdl string, want int, more ...string) *workertest.Process {
	r.t.Helper()
	p := workertest.Start(r.t, filepath.Join("testdata", script), append([]string{mdl, r.workers}, more...)...)
	r.waitWorkers(mdl, want, p)
	return p
}

func (r *extRig) waitWorkers(mdl string, want int, p *workertest.Process) {
	r.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if r.agent.Stats().Workers[mdl] == want {
			return
		}
		if p != nil && p.Exited() {
			r.t.Fatalf("worker for %s exited:\n%s", mdl, p.Output())
		}
	}
	r.t.Fatalf("%d workers of %s attached, want %d", r.agent.Stats().Workers[mdl], mdl, want)
}

// affineInput is rows of 16 float32 values whose 2x+1 is exact; seed
// keeps it off the worker's misbehaviour triggers (-1..-4).
func affineInput(rows, seed int) []byte {
	b := make([]byte, 0, rows*rowBytes)
	for i := range rows * 16 {
		v := float32((i*7+seed*13)%4001)/8 - 250.125
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

func affineWant(in []byte) []byte {
	out := make([]byte, len(in))
	for i := 0; i < len(in); i += 4 {
		x := math.Float32frombits(binary.LittleEndian.Uint32(in[i:]))
		binary.LittleEndian.PutUint32(out[i:], math.Float32bits(float32(x*2)+1))
	}
	return out
}

func trigger(v float32, rows int) []byte {
	b := affineInput(rows, 1)
	binary.LittleEndian.PutUint32(b, math.Float32bits(v))
	return b
}

func rowsumInput(rows, seed int) []byte {
	b := make([]byte, 0, rows*rowBytes)
	x := uint32(seed*2654435761 + 1)
	for range rows * 16 {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b = binary.LittleEndian.AppendUint32(b, x) // sums wrap, in numpy's int32 as in Go's
	}
	return b
}

func rowsumWant(in []byte) []byte {
	var out []byte
	for r := 0; r < len(in); r += rowBytes {
		var s int32
		for k := 0; k < rowBytes; k += 4 {
			s += int32(binary.LittleEndian.Uint32(in[r+k:]))
		}
		out = binary.LittleEndian.AppendUint32(out, uint32(s))
	}
	return out
}

func wantOK(t *testing.T, c ingest.Ctrl, n int) {
	t.Helper()
	if c.Status != ingest.StatusOK || int(c.Length) != n {
		t.Fatalf("request %d: %s %q, %d bytes; want ok with %d bytes", c.Request, c.Status, c.Text, c.Length, n)
	}
}

func wantFailure(t *testing.T, c ingest.Ctrl, st ingest.Status, texts ...string) {
	t.Helper()
	if c.Status != st || c.Length != 0 {
		t.Fatalf("request %d: %s %q, %d bytes; want %s", c.Request, c.Status, c.Text, c.Length, st)
	}
	for _, s := range texts {
		if !strings.Contains(c.Text, s) {
			t.Errorf("request %d: message %q does not say %q", c.Request, c.Text, s)
		}
	}
}

// TestExternalModel runs both test models through Python workers on
// inputs from one row to a full slot, on both slots, one by one and
// concurrently, and checks every output byte. The affine worker computes
// in place in its NumPy view of the input: the DPU side then reads 2x+1
// in the input buffer too, which only a view of the same pages can cause.
func TestExternalModel(t *testing.T) {
	r := newExtRig(t, nil)
	affine := r.worker("affine", 1)
	r.worker("rowsum", 1)
	runs := checkAffineRowsum(t, r)
	in0, in1 := affineInput(3, 5), affineInput(4, 6)
	id0, id1 := r.ring(0, "affine", in0), r.ring(1, "affine", in1)
	wantOK(t, r.complete(id0), len(in0))
	wantOK(t, r.complete(id1), len(in1))
	if !bytes.Equal(r.read(0, 1, len(in0)), affineWant(in0)) || !bytes.Equal(r.read(1, 1, len(in1)), affineWant(in1)) {
		t.Fatal("one worker, two slots: wrong output")
	}
	runs += 2
	// Not a whole number of rows, or more output than the output buffer
	// holds: refused before any worker sees it.
	wantFailure(t, r.run(0, "affine", make([]byte, 100)), ingest.StatusBadRequest, "not a whole number")
	wantFailure(t, r.run(0, "wide", make([]byte, slotIn)), ingest.StatusTooLarge, "more than the 16384-byte output buffer")
	s := r.agent.Stats()
	if s.ExternalRuns != uint64(runs) || s.ExternalFailed != 2 || s.Workers["affine"] != 1 || s.Workers["rowsum"] != 1 || s.WorkerAttaches != 2 || s.WorkerLost != 0 {
		t.Fatalf("stats after %d runs: %+v", runs, s)
	}
	// Stopping the agent disconnects its workers: lovelock_ingest raises
	// ConnectionError, and the process ends.
	r.stop()
	exited, err := affine.Wait(10 * time.Second)
	var ee *exec.ExitError
	if !exited || !errors.As(err, &ee) || !strings.Contains(affine.Output(), "ConnectionError") {
		t.Fatalf("worker after the agent stopped: exited %v, %v:\n%s", exited, err, affine.Output())
	}
}

// checkAffineRowsum runs affine and rowsum, whose workers are attached,
// on inputs from one row to a full slot, on both slots, one by one and
// concurrently, and checks every output byte and that affine's in-place
// writes are in the input buffer. It returns how many runs it made.
func checkAffineRowsum(t *testing.T, r *extRig) int {
	t.Helper()
	runs := 0
	for i, rows := range []int{1, 2, 7, 64, 255, 256} {
		slot := i % 2
		in := affineInput(rows, i)
		c := r.run(slot, "affine", in)
		want := affineWant(in)
		wantOK(t, c, len(want))
		if got := r.read(slot, 1, len(want)); !bytes.Equal(got, want) {
			t.Fatalf("affine, %d rows: wrong output", rows)
		}
		if got := r.read(slot, 0, len(in)); !bytes.Equal(got, want) {
			t.Fatalf("affine, %d rows: the worker's in-place writes are not in the slot's input buffer: not a view of it", rows)
		}
		in = rowsumInput(rows, i)
		c = r.run(1-slot, "rowsum", in)
		want = rowsumWant(in)
		wantOK(t, c, len(want))
		if got := r.read(1-slot, 1, len(want)); !bytes.Equal(got, want) {
			t.Fatalf("rowsum, %d rows: got %x, want %x", rows, got, want)
		}
		runs += 2
	}
	// Two slots at once: one worker per model serves them one at a time,
	// two models run side by side.
	for round := range 4 {
		ina, inr := affineInput(100+round, round), rowsumInput(50+round, round)
		ida := r.ring(0, "affine", ina)
		idr := r.ring(1, "rowsum", inr)
		ca, cr := r.complete(ida), r.complete(idr)
		wantOK(t, ca, len(ina))
		wantOK(t, cr, (50+round)*4)
		if !bytes.Equal(r.read(0, 1, len(ina)), affineWant(ina)) || !bytes.Equal(r.read(1, 1, (50+round)*4), rowsumWant(inr)) {
			t.Fatalf("round %d: wrong output", round)
		}
		runs += 2
	}
	return runs
}

// TestExternalNoWorker: a doorbell for an external model no worker serves
// fails as model-failed, saying how to start one.
func TestExternalNoWorker(t *testing.T) {
	r := newExtRig(t, nil)
	wantFailure(t, r.run(0, "idle", []byte("x")), ingest.StatusModelFailed, "no worker serves model idle", "lovelock_ingest.serve(\"idle\"", r.workers)
	if s := r.agent.Stats(); s.ExternalFailed != 1 || s.Failed != 1 {
		t.Fatalf("stats: %+v", s)
	}
}

// TestExternalWorkerWait: with WorkerWait, a request waits for a worker
// that attaches after it arrived.
func TestExternalWorkerWait(t *testing.T) {
	r := newExtRig(t, func(c *Config) { c.WorkerWait = 20 * time.Second })
	in := affineInput(8, 1)
	id := r.ring(0, "affine", in)
	r.worker("affine", 1)
	wantOK(t, r.complete(id), len(in))
	if !bytes.Equal(r.read(0, 1, len(in)), affineWant(in)) {
		t.Fatal("wrong output")
	}
}

// TestExternalWorkerFailures: a wrong output size and a worker's own error
// fail only their request; a worker dying mid-request fails that request,
// and later ones until a new worker attaches.
func TestExternalWorkerFailures(t *testing.T) {
	r := newExtRig(t, nil)
	first := r.worker("affine", 1)
	good := func(slot int) {
		t.Helper()
		in := affineInput(5, slot)
		wantOK(t, r.run(slot, "affine", in), len(in))
		if !bytes.Equal(r.read(slot, 1, len(in)), affineWant(in)) {
			t.Fatal("wrong output")
		}
	}
	good(0)
	wantFailure(t, r.run(1, "affine", trigger(-1, 4)), ingest.StatusModelFailed, "returned 192 bytes", "must return 256")
	good(1)
	wantFailure(t, r.run(0, "affine", trigger(-4, 2)), ingest.StatusModelFailed, "the model refuses -4")
	good(0)
	wantFailure(t, r.run(1, "affine", trigger(-2, 3)), ingest.StatusModelFailed, "disconnected while running this request", "start it again")
	if exited, _ := first.Wait(10 * time.Second); !exited || first.Cmd.ProcessState.ExitCode() != 3 {
		t.Fatalf("worker did not exit as told:\n%s", first.Output())
	}
	r.waitWorkers("affine", 0, nil)
	wantFailure(t, r.run(0, "affine", affineInput(1, 0)), ingest.StatusModelFailed, "no worker serves model affine")
	r.worker("affine", 1)
	good(1)
	good(0)
	s := r.agent.Stats()
	if s.ExternalRuns != 5 || s.ExternalFailed != 4 || s.WorkerLost != 1 || s.WorkerAttaches != 2 {
		t.Fatalf("stats: %+v", s)
	}
}

// TestExternalRunTimeout: a worker that overruns the run timeout fails its
// request and is disconnected.
func TestExternalRunTimeout(t *testing.T) {
	// Long enough for the good run after it, by a Python worker on a
	// loaded machine.
	r := newExtRig(t, func(c *Config) { c.RunTimeout = 2 * time.Second })
	r.worker("affine", 1)
	wantFailure(t, r.run(0, "affine", trigger(-3, 1)), ingest.StatusModelFailed, "did not answer within 2s", "disconnected")
	r.waitWorkers("affine", 0, nil)
	r.worker("affine", 1)
	in := affineInput(2, 0)
	wantOK(t, r.run(1, "affine", in), len(in))
	if s := r.agent.Stats(); s.WorkerLost != 1 || s.ExternalRuns != 1 {
		t.Fatalf("stats: %+v", s)
	}
}

// TestExternalLateOutput: a worker that overran the run timeout still has
// the slot's buffers mapped and writes its output late; the slot goes to
// no other request before that worker's process is gone, so the next
// request on the same slot, run by another worker, gets its own output,
// never the late one.
func TestExternalLateOutput(t *testing.T) {
	r := newExtRig(t, func(c *Config) { c.RunTimeout = time.Second })
	w1 := r.worker("late", 1)
	a := bytes.Repeat([]byte("A"), 64)
	wantFailure(t, r.run(0, "late", a), ingest.StatusModelFailed, "did not answer within 1s")
	r.waitWorkers("late", 0, nil)
	r.worker("late", 1)
	b := bytes.Repeat([]byte("B"), 64)
	var c ingest.Ctrl
	for range 100 {
		if c = r.run(0, "late", b); c.Status != ingest.StatusOverloaded {
			break
		}
		time.Sleep(50 * time.Millisecond) // a retryable answer: the DPU retries
	}
	wantOK(t, c, len(b))
	// The overrunning worker has written its output, or never will.
	if exited, _ := w1.Wait(20 * time.Second); !exited {
		t.Fatalf("the worker that overran still runs:\n%s", w1.Output())
	}
	if got := r.read(0, 1, len(b)); !bytes.Equal(got, b) {
		t.Fatalf("slot 0's output after request B: %q, want B's %q", got, b)
	}
}

// TestExternalWorkersBusy: requests that find the model's only worker busy
// for the whole run timeout fail as overloaded, which clients retry, not
// as model-failed; once the worker is free it serves them again. The
// worker is a Go stand-in, held busy as a run holds it, so that the wait,
// not the worker's own run timeout, ends first.
func TestExternalWorkersBusy(t *testing.T) {
	// Long enough for the test to hand the freed worker its run.
	r := newExtRig(t, func(c *Config) { c.RunTimeout = time.Second })
	conn, err := net.Dial("unix", r.workers)
	if err != nil {
		t.Fatal(err)
	}
	wc := conn.(*net.UnixConn)
	defer wc.Close()
	if err := fdpass.Write(wc, WorkerAttach{Op: "attach", Version: WorkerProtocol, Model: "idle"}); err != nil {
		t.Fatal(err)
	}
	var att WorkerAttached
	fds, err := fdpass.Read(wc, &att)
	fdpass.CloseAll(fds)
	if err != nil || att.Err != "" {
		t.Fatalf("attach: %+v, %v", att, err)
	}
	r.waitWorkers("idle", 1, nil)
	e := r.agent.ext["idle"]
	w, err := e.acquire(context.Background(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	ids := []uint64{r.ring(0, "idle", []byte("x")), r.ring(1, "idle", []byte("y"))}
	for _, id := range ids {
		c := r.complete(id)
		wantFailure(t, c, ingest.StatusOverloaded, "the one worker of model idle stayed busy for 1s", "retry, or attach more workers")
		if !c.Status.Retryable() {
			t.Errorf("request %d: %s is not retryable", id, c.Status)
		}
	}
	e.release(w)
	id := r.ring(0, "idle", []byte("z"))
	var run WorkerRun
	if fds, err := fdpass.Read(wc, &run); err != nil || run.Request != id {
		t.Fatalf("worker got %+v, %v; want the run of request %d", run, err, id)
	} else {
		fdpass.CloseAll(fds)
	}
	if err := fdpass.Write(wc, WorkerDone{Op: "done", Request: run.Request, Len: run.OutLen}); err != nil {
		t.Fatal(err)
	}
	wantOK(t, r.complete(id), 8)
	if s := r.agent.Stats(); s.ExternalFailed != 2 || s.ExternalRuns != 1 || s.WorkerLost != 0 || s.Workers["idle"] != 1 {
		t.Fatalf("stats: %+v", s)
	}
}

// TestWorkerAttachRefused: unknown models, built-in models and other
// protocol versions are refused with a reason, from Go and from Python.
func TestWorkerAttachRefused(t *testing.T) {
	r := newExtRig(t, nil)
	for _, tc := range []struct {
		req  WorkerAttach
		want string
	}{
		{WorkerAttach{Op: "attach", Version: WorkerProtocol, Model: "nope"}, `no external model "nope" (external models: [affine idle late rowsum wide]`},
		{WorkerAttach{Op: "attach", Version: WorkerProtocol, Model: "checksum"}, "model checksum is built in"},
		{WorkerAttach{Op: "attach", Version: 99, Model: "affine"}, "worker protocol version 99"},
		{WorkerAttach{Op: "run", Version: WorkerProtocol, Model: "affine"}, `first frame is "run"`},
	} {
		conn, err := net.Dial("unix", r.workers)
		if err != nil {
			t.Fatal(err)
		}
		c := conn.(*net.UnixConn)
		if err := fdpass.Write(c, tc.req); err != nil {
			t.Fatal(err)
		}
		var got WorkerAttached
		fds, err := fdpass.Read(c, &got)
		fdpass.CloseAll(fds)
		c.Close()
		if err != nil || len(fds) != 0 || !strings.Contains(got.Err, tc.want) {
			t.Errorf("attach %+v: %+v, %d descriptors, %v; want an error saying %q", tc.req, got, len(fds), err, tc.want)
		}
	}
	p := workertest.Start(t, filepath.Join("testdata", "worker.py"), "nope", r.workers)
	if exited, err := p.Wait(20 * time.Second); !exited || err == nil || !strings.Contains(p.Output(), "ConnectionRefusedError: lovelock_ingest: the host agent refused model 'nope'") {
		t.Fatalf("python worker for an unknown model: exited %v, %v:\n%s", exited, err, p.Output())
	}
	if s := r.agent.Stats(); s.WorkerRefused != 5 || s.WorkerAttaches != 0 {
		t.Fatalf("stats: %+v", s)
	}
}

func TestExternalConfig(t *testing.T) {
	ck, _ := model.Builtin("checksum")
	ext := model.NewExternal("mine", 4, func(n int) int { return n })
	for _, tc := range []struct {
		name  string
		tweak func(*Config)
		want  string
	}{
		{"no worker socket", func(c *Config) { c.WorkerSocket = "" }, "external models need a worker socket"},
		{"same socket", func(c *Config) { c.WorkerSocket = c.HandleSocket }, "is also the handle socket"},
		{"twice", func(c *Config) { c.Models = []*model.Model{ext, ext} }, "model mine given twice"},
		{"no row", func(c *Config) { c.Models = []*model.Model{model.NewExternal("x", 0, func(int) int { return 1 })} }, "row size"},
		{"negative timeout", func(c *Config) { c.RunTimeout = -1 }, "want positive durations"},
	} {
		tr, err := memnet.New(memnet.Options{}).Listen(testHost)
		if err != nil {
			t.Fatal(err)
		}
		cfg := Config{Transport: tr, DPU: testDPU, Devices: []devmem.Device{devmem.NewShm(devmem.Info{Card: "H100-80GB"})},
			HandleSocket: "/x/h.sock", WorkerSocket: "/x/w.sock", Models: []*model.Model{ck, ext}}
		tc.tweak(&cfg)
		if err := cfg.defaults(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// TestPythonUnittest runs lovelock_ingest's own tests (a stand-in host
// agent in Python), so that CI, which runs Go tests, runs them too.
func TestPythonUnittest(t *testing.T) {
	p := workertest.Start(t, "-m", "unittest", "-v", "test_lovelock_ingest")
	exited, err := p.Wait(60 * time.Second)
	if !exited || err != nil {
		t.Fatalf("python -m unittest: exited %v, %v:\n%s", exited, err, p.Output())
	}
	t.Logf("%s", p.Output())
}

// TestExternalSeveralWorkers: two workers of one model share its
// requests; when one dies, the other serves them all.
func TestExternalSeveralWorkers(t *testing.T) {
	r := newExtRig(t, nil)
	first := r.worker("affine", 1)
	r.worker("affine", 2)
	for round := range 4 {
		in0, in1 := affineInput(30+round, round), affineInput(60+round, round+1)
		id0, id1 := r.ring(0, "affine", in0), r.ring(1, "affine", in1)
		wantOK(t, r.complete(id0), len(in0))
		wantOK(t, r.complete(id1), len(in1))
		if !bytes.Equal(r.read(0, 1, len(in0)), affineWant(in0)) || !bytes.Equal(r.read(1, 1, len(in1)), affineWant(in1)) {
			t.Fatalf("round %d: wrong output", round)
		}
	}
	first.Cmd.Process.Kill()
	first.Wait(10 * time.Second)
	r.waitWorkers("affine", 1, nil)
	for slot := range 2 {
		in := affineInput(9, slot)
		wantOK(t, r.run(slot, "affine", in), len(in))
	}
	if s := r.agent.Stats(); s.ExternalRuns != 10 || s.ExternalFailed != 0 || s.WorkerAttaches != 2 {
		t.Fatalf("stats: %+v", s)
	}
}
