package agent

import (
	"context"
	"encoding/binary"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/hostagent"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/hostagent/workertest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/memnet"
)

// userWorker is a user's model code as docs/ingest.md shows it: one line
// differs from code that reads its input from anywhere else.
const userWorker = `
import sys
import numpy as np
import lovelock_ingest

def my_model(x):
    return x * 2 + 1

for req in lovelock_ingest.serve("affine", socket=sys.argv[1]):
    x = req.numpy(np.float32, (-1, 16))
    y = my_model(x)
    req.reply(y)
`

// newExternalRig is newRig's path with a host agent that also runs the
// external model affine (rows of 16 float32, output as large as the
// input), served by userWorker in Python.
func newExternalRig(t *testing.T) (*rig, *hostagent.Agent, string) {
	t.Helper()
	dir := t.TempDir()
	r := &rig{t: t, net: memnet.New(memnet.Options{Seed: 1, MaxPayload: 8972}), socket: filepath.Join(dir, "ingest.sock"), gpus: 1}
	clients, err := r.net.Listen(dpuClientAddr)
	if err != nil {
		t.Fatal(err)
	}
	hostSide, err := r.net.Listen(dpuHostAddr)
	if err != nil {
		t.Fatal(err)
	}
	r.agent, err = New(Config{Clients: clients, Host: hostSide, Importer: devmem.ShmImporter{},
		HostPeer: netip.PrefixFrom(hostAddr.Addr(), 32), HostSocket: r.socket,
		Models:            []ModelConfig{{Name: "checksum"}, {Name: "affine"}},
		Tenants:           []TenantConfig{{ID: 1, Models: []string{"checksum", "affine"}}, {ID: 2, Models: []string{"checksum"}}},
		ReassemblyTimeout: 300 * time.Millisecond, DoorbellTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan error, 1)
	go func() { r.done <- r.agent.Run(ctx) }()
	t.Cleanup(r.stop)

	tr, err := r.net.Listen(hostAddr)
	if err != nil {
		t.Fatal(err)
	}
	ck, _ := model.Builtin("checksum")
	workers := filepath.Join(dir, "workers.sock")
	h, err := hostagent.New(hostagent.Config{Transport: tr, DPU: dpuHostAddr, Devices: []devmem.Device{devmem.NewShm(devmem.Info{})}, Cards: []string{"H100-80GB"},
		HandleSocket: r.socket, WorkerSocket: workers, Heartbeat: 50 * time.Millisecond,
		Models: []*model.Model{ck, model.NewExternal("affine", 64, func(n int) int { return n })}})
	if err != nil {
		t.Fatal(err)
	}
	hctx, hcancel := context.WithCancel(context.Background())
	hdone := make(chan error, 1)
	go func() { hdone <- h.Run(hctx) }()
	r.hostMu.Lock()
	r.host, r.hostCancel, r.hostDone, r.hostTr = h, hcancel, hdone, tr
	r.hostMu.Unlock()
	r.waitRegistered()
	return r, h, workers
}

func startUserWorker(t *testing.T, h *hostagent.Agent, socket string) *workertest.Process {
	t.Helper()
	script := filepath.Join(t.TempDir(), "my_worker.py")
	if err := os.WriteFile(script, []byte(userWorker), 0o644); err != nil {
		t.Fatal(err)
	}
	p := workertest.Start(t, script, socket)
	for deadline := time.Now().Add(20 * time.Second); h.Stats().Workers["affine"] != 1; time.Sleep(5 * time.Millisecond) {
		if p.Exited() || time.Now().After(deadline) {
			t.Fatalf("the worker did not attach:\n%s", p.Output())
		}
	}
	return p
}

func affineRows(seed, rows int) (in, want []byte) {
	for i := range rows * 16 {
		x := float32((i*11+seed*17)%8191)/16 - 255.9375 // 2x+1 is exact in float32
		in = binary.LittleEndian.AppendUint32(in, math.Float32bits(x))
		want = binary.LittleEndian.AppendUint32(want, math.Float32bits(float32(x*2)+1))
	}
	return in, want
}

// TestExternalModelEndToEnd: clients' inputs go through the DPU agent
// into the slot buffers and through a user's Python worker (the NumPy
// view of the slot) back to the clients, exactly; requests the worker
// cannot serve fail with the host's reason.
func TestExternalModelEndToEnd(t *testing.T) {
	r, h, socket := newExternalRig(t)
	c := r.client(1)
	a := c.infer("affine", make([]byte, 64), 0)
	if a.status != ingest.StatusModelFailed || !strings.Contains(a.text, "no worker serves model affine") {
		t.Fatalf("no worker: %s %q", a.status, a.text)
	}
	p := startUserWorker(t, h, socket)
	for i, rows := range []int{1, 2, 139, 140, 1024, 16384} { // 64 B to 1 MiB, across fragment boundaries
		in, want := affineRows(i, rows)
		a := c.infer("affine", in, 0)
		if a.status != ingest.StatusOK || len(a.out) != len(want) || string(a.out) != string(want) {
			t.Fatalf("%d rows: %s %q, %d bytes of output; want %d exact", rows, a.status, a.text, len(a.out), len(want))
		}
	}
	if a := c.infer("affine", make([]byte, 100), 0); a.status != ingest.StatusBadRequest || !strings.Contains(a.text, "not a whole number of 64-byte rows") {
		t.Fatalf("100 bytes: %s %q", a.status, a.text)
	}
	if a := r.client(2).infer("affine", make([]byte, 64), 0); a.status != ingest.StatusNotGranted {
		t.Fatalf("tenant 2: %s %q", a.status, a.text)
	}
	// The built-in model still runs beside it.
	in := randomBytes(3, 5000)
	want := model.Checksum(in)
	if a := c.infer("checksum", in, 0); a.status != ingest.StatusOK || string(a.out) != string(want[:]) {
		t.Fatalf("checksum: %s %q", a.status, a.text)
	}
	p.Cmd.Process.Kill()
	p.Wait(10 * time.Second)
	for deadline := time.Now().Add(10 * time.Second); h.Stats().Workers["affine"] != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the killed worker is still attached")
		}
	}
	if a := c.infer("affine", make([]byte, 64), 0); a.status != ingest.StatusModelFailed || !strings.Contains(a.text, "lovelock_ingest.serve") {
		t.Fatalf("after the worker died: %s %q", a.status, a.text)
	}
	if s := h.Stats(); s.ExternalRuns != 6 || s.ExternalFailed != 3 {
		t.Fatalf("host stats: %+v", s)
	}
}
