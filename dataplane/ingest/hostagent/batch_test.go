package hostagent

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/memnet"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// TestBatches: a host agent whose GPU's runs go to an executor (the
// shared-memory device's stand-in for a GPU's engines) through its
// launcher takes a batch of doorbells in one datagram and answers them,
// batched, to a DPU that speaks version 2 or later: every output exact, a doorbell
// rung again answered from memory without a second run, a stale epoch's
// doorbell refused as retryable. To a version 1 DPU every answer is a
// plain message.
func TestBatches(t *testing.T) {
	for _, dpuVersion := range []uint16{ingest.CtrlVersion, 0} {
		t.Run(map[uint16]string{0: "v1 DPU", ingest.CtrlVersion: "current DPU"}[dpuVersion], func(t *testing.T) { testBatches(t, dpuVersion) })
	}
}

func testBatches(t *testing.T, dpuVersion uint16) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "exec.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ck, _ := model.Builtin("checksum")
	ectx, ecancel := context.WithCancel(context.Background())
	edone := make(chan error, 1)
	go func() { edone <- devmem.ServeExecutor(ectx, ln, []*model.Model{ck}) }()
	defer func() {
		ecancel()
		if err := <-edone; err != nil {
			t.Error(err)
		}
	}()

	nw := memnet.New(memnet.Options{Seed: 1, MaxPayload: 8972})
	hostEP, _ := nw.Listen(testHost)
	dpuEP, _ := nw.Listen(testDPU)
	defer hostEP.Close()
	defer dpuEP.Close()
	dev := devmem.NewShmWith(devmem.Info{Index: 0}, devmem.ShmOptions{Executor: sock})
	defer dev.Close()
	a, err := New(Config{Transport: hostEP, DPU: testDPU, Devices: []devmem.Device{dev}, Cards: []string{"H100-80GB"},
		SlotInput: 64 << 10, SlotOutput: 64, HandleSocket: filepath.Join(dir, "handles.sock"), Models: []*model.Model{ck}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	// recv returns the next datagram's messages, acking registers.
	datagrams, first := 0, true
	recv := func() []ingest.Ctrl {
		t.Helper()
		pkts := []transport.Packet{{Data: make([]byte, 9000)}}
		for {
			rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
			n, err := dpuEP.Recv(rctx, pkts)
			rcancel()
			if err != nil || n != 1 {
				t.Fatalf("no datagram from the host agent: %v", err)
			}
			_, payload, err := wire.Decode(pkts[0].Data)
			if err != nil {
				t.Fatal(err)
			}
			var cs []ingest.Ctrl
			if dpuVersion < 2 {
				// What a version 1 DPU decodes.
				c, err := ingest.DecodeCtrl(payload)
				if err != nil {
					t.Fatalf("to a v1 DPU: %v", err)
				}
				cs = []ingest.Ctrl{c}
			} else if cs, err = ingest.DecodeCtrls(payload, nil); err != nil {
				t.Fatal(err)
			}
			if cs[0].Op == ingest.OpRegister {
				if cs[0].Version != ingest.CtrlVersion {
					t.Errorf("register says version %d", cs[0].Version)
				}
				ack := ingest.Ctrl{Op: ingest.OpRegisterAck, Epoch: cs[0].Epoch, Version: dpuVersion}
				dpuEP.Send([]transport.Packet{{Addr: testHost, Data: ingest.AppendCtrl(nil, &ack)}})
				if !first {
					continue
				}
				first = false
				return nil
			}
			datagrams++
			return cs
		}
	}
	recv() // the first register: the sockets are open
	for !a.Registered() {
		time.Sleep(time.Millisecond)
	}
	fctx, fcancel := context.WithTimeout(context.Background(), 5*time.Second)
	l, hs, err := FetchLayout(fctx, a.cfg.HandleSocket, a.Epoch())
	fcancel()
	if err != nil {
		t.Fatal(err)
	}
	maps := importAll(t, hs)
	slots := len(l.GPUs[0].Slots)
	// Every slot's input, and a doorbell for each in one datagram, with
	// one for an old epoch.
	var bells []ingest.Ctrl
	inputs := map[uint64][]byte{}
	for s := range slots {
		in := bytes.Repeat([]byte{byte(s), 0x5a}, 1000*(s+1))
		if err := maps[2*s].WriteAt(in, 0); err != nil {
			t.Fatal(err)
		}
		id := uint64(100 + s)
		inputs[id] = in
		bells = append(bells, ingest.Ctrl{Op: ingest.OpDoorbell, Epoch: a.Epoch(), Request: id, Slot: uint8(s), Length: uint32(len(in)), Text: "checksum"})
	}
	bells = append(bells, ingest.Ctrl{Op: ingest.OpDoorbell, Epoch: a.Epoch() + 2, Request: 99, Slot: 0, Length: 10, Text: "checksum"})
	b, n := ingest.AppendCtrls(nil, bells, 8972, true)
	if n != len(bells) {
		t.Fatalf("%d doorbells in the datagram", n)
	}
	if _, err := dpuEP.Send([]transport.Packet{{Addr: testHost, Data: b}}); err != nil {
		t.Fatal(err)
	}
	got := map[uint64]ingest.Ctrl{}
	for len(got) < len(bells) {
		for _, c := range recv() {
			if _, dup := got[c.Request]; dup || c.Op != ingest.OpComplete {
				t.Fatalf("unexpected %+v", c)
			}
			got[c.Request] = c
		}
	}
	if dpuVersion < 2 && datagrams != len(bells) {
		t.Errorf("%d datagrams for %d answers to a v1 DPU", datagrams, len(bells))
	}
	t.Logf("%d answers in %d datagrams", len(got), datagrams)
	if c := got[99]; c.Status != ingest.StatusHostUnavailable || !c.Status.Retryable() {
		t.Errorf("stale doorbell: %+v", c)
	}
	for s := range slots {
		id := uint64(100 + s)
		c := got[id]
		want := model.Checksum(inputs[id])
		out := make([]byte, c.Length)
		maps[2*s+1].ReadAt(out, 0)
		if c.Status != ingest.StatusOK || !bytes.Equal(out, want[:]) {
			t.Fatalf("slot %d: %+v %x, want %x", s, c, out, want)
		}
	}
	// Rung again: the same answer, from memory.
	ringAgain := ingest.AppendCtrl(nil, &bells[3])
	dpuEP.Send([]transport.Packet{{Addr: testHost, Data: ringAgain}})
	if cs := recv(); len(cs) != 1 || cs[0] != got[bells[3].Request] {
		t.Errorf("rung again: %+v, want %+v", cs, got[bells[3].Request])
	}
	if st := a.Stats(); st.Completed != uint64(slots) || st.Repeats != 1 || st.Stale != 1 {
		t.Errorf("stats: %+v", st)
	}
}
