package hostagent

import (
	"context"
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

// TestRegistrationLapses: a DPU that acknowledges once and then goes
// silent (its lovelockd stopped) leaves the host agent unregistered after
// a few heartbeats, with the age of the last ack in its stats; acks that
// come back register it again.
func TestRegistrationLapses(t *testing.T) {
	nw := memnet.New(memnet.Options{Seed: 1, MaxPayload: 8972})
	hostEP, _ := nw.Listen(testHost)
	dpuEP, _ := nw.Listen(testDPU)
	defer hostEP.Close()
	defer dpuEP.Close()
	ck, _ := model.Builtin("checksum")
	a, err := New(Config{Transport: hostEP, DPU: testDPU, Devices: []devmem.Device{devmem.NewShm(devmem.Info{Index: 0})}, Cards: []string{"H100-80GB"},
		SlotInput: 4096, SlotOutput: 64, Slots: 1, HandleSocket: filepath.Join(t.TempDir(), "handles.sock"), Models: []*model.Model{ck},
		Heartbeat: 10 * time.Millisecond})
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
	if a.Registered() {
		t.Fatal("registered before any ack")
	}
	// ackNext acknowledges the next register, as the DPU does each one.
	ackNext := func() {
		t.Helper()
		pkts := []transport.Packet{{Data: make([]byte, 9000)}}
		for {
			pkts[0].Data = pkts[0].Data[:cap(pkts[0].Data)]
			rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
			n, err := dpuEP.Recv(rctx, pkts)
			rcancel()
			if err != nil || n != 1 {
				t.Fatalf("no register from the host agent: %v", err)
			}
			_, payload, err := wire.Decode(pkts[0].Data)
			if err != nil {
				t.Fatal(err)
			}
			c, err := ingest.DecodeCtrl(payload)
			if err != nil || c.Op != ingest.OpRegister {
				continue
			}
			ack := ingest.Ctrl{Op: ingest.OpRegisterAck, Epoch: c.Epoch, Version: ingest.CtrlVersion}
			if _, err := dpuEP.Send([]transport.Packet{{Addr: testHost, Data: ingest.AppendCtrl(nil, &ack)}}); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	// ackUntilRegistered answers registers until the host agent says it is
	// registered: an ack counts for ackWindow heartbeats (30 ms), which a
	// loaded machine can let pass before the test looks.
	ackUntilRegistered := func() {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !a.Registered(); ackNext() {
			if time.Now().After(deadline) {
				t.Fatalf("not registered after 5s of acks: %+v", a.Stats())
			}
		}
	}
	ackNext()
	ackUntilRegistered()
	// The DPU goes silent: the registers pile up unanswered.
	for deadline := time.Now().Add(5 * time.Second); a.Registered(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still registered 5s (500 heartbeats) after the last ack: %+v", a.Stats())
		}
	}
	if s := a.Stats(); s.Registered || s.LastAck < ackWindow*a.cfg.Heartbeat {
		t.Errorf("stats of a host whose DPU went silent: registered %v, last ack %v ago", s.Registered, s.LastAck)
	}
	ackNext()
	ackUntilRegistered()
}
