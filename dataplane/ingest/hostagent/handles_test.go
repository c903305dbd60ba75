package hostagent

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/memnet"
)

// testUUID is the device UUID startAgent's GPU reports.
const testUUID = "GPU-00112233-4455-6677-8899-aabbccddeeff"

func startAgent(t *testing.T, allow []uint32) (*Agent, string) {
	t.Helper()
	n := memnet.New(memnet.Options{})
	tr, err := n.Listen(netip.MustParseAddrPort("10.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "h.sock")
	ck, _ := model.Builtin("checksum")
	ready := make(chan error, 1)
	a, err := New(Config{Transport: tr, DPU: netip.MustParseAddrPort("10.0.0.2:1"), Devices: []devmem.Device{devmem.NewShm(devmem.Info{UUID: testUUID})},
		Cards: []string{"H100-80GB"}, HandleSocket: sock, AllowUIDs: allow, Models: []*model.Model{ck}, SlotInput: 4096, SlotOutput: 64,
		Ready: func() { _, err := os.Stat(sock); ready <- err }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("ready before the handle socket is open: %v", err)
		}
	case err := <-done:
		t.Fatalf("Run returned before it was ready: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the agent never said it was ready")
	}
	return a, sock
}

// TestReadyNotOnFailure: an agent whose handle socket cannot be opened
// fails its Run without saying it is ready.
func TestReadyNotOnFailure(t *testing.T) {
	n := memnet.New(memnet.Options{})
	tr, err := n.Listen(netip.MustParseAddrPort("10.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ck, _ := model.Builtin("checksum")
	readied := false
	a, err := New(Config{Transport: tr, DPU: netip.MustParseAddrPort("10.0.0.2:1"), Devices: []devmem.Device{devmem.NewShm(devmem.Info{})},
		Cards: []string{"H100-80GB"}, HandleSocket: filepath.Join(notDir, "h.sock"), Models: []*model.Model{ck}, SlotInput: 4096, SlotOutput: 64,
		Ready: func() { readied = true }})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Run(context.Background()); err == nil || readied {
		t.Errorf("Run: %v, ready called: %v; want an error and no ready", err, readied)
	}
}

// TestHandles: the DPU gets the current epoch's layout and one
// descriptor per buffer; writes through them land in the host's buffers.
// A stale epoch and a user not allowed get a clear refusal and nothing.
func TestHandles(t *testing.T) {
	a, sock := startAgent(t, nil)
	ctx := context.Background()
	l, hs, err := FetchLayout(ctx, sock, a.Epoch())
	if err != nil {
		t.Fatal(err)
	}
	if len(l.GPUs) != 1 || len(l.GPUs[0].Slots) != 8 || len(hs) != 16 {
		t.Fatalf("layout: %d GPUs, %d handles", len(l.GPUs), len(hs))
	}
	// The handles name the GPU by UUID too: an ordinal differs between
	// processes with different CUDA_VISIBLE_DEVICES.
	if l.GPUs[0].UUID != testUUID {
		t.Errorf("layout says UUID %q, want %q", l.GPUs[0].UUID, testUUID)
	}
	for i, h := range hs {
		if h.UUID != testUUID || h.Device != 0 {
			t.Errorf("handle %d names device %d, UUID %q; want 0, %q", i, h.Device, h.UUID, testUUID)
		}
	}
	maps := importAll(t, hs)
	// Slot 3's input, seen from the host.
	if err := maps[6].WriteAt([]byte("dpu wrote this"), 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 14)
	if err := a.gpus[0].slots[3].in.ReadAt(got, 0); err != nil || string(got) != "dpu wrote this" {
		t.Errorf("host reads %q, %v", got, err)
	}
	if err := maps[6].WriteAt(make([]byte, 4097), 0); err == nil {
		t.Error("a write past the slot succeeded")
	}

	if _, _, err := FetchLayout(ctx, sock, a.Epoch()+2); err == nil || !strings.Contains(err.Error(), "stale") {
		t.Errorf("stale epoch: %v", err)
	}
	b, sock2 := startAgent(t, []uint32{12345})
	if _, _, err := FetchLayout(ctx, sock2, b.Epoch()); err == nil || !strings.Contains(err.Error(), "may not map") {
		t.Errorf("user not allowed: %v", err)
	}
	if st := b.Stats(); st.HandleRefused != 1 || st.HandlesServed != 0 {
		t.Errorf("refusals counted %d, served %d", st.HandleRefused, st.HandlesServed)
	}
}

func TestConfigErrors(t *testing.T) {
	n := memnet.New(memnet.Options{})
	tr, _ := n.Listen(netip.MustParseAddrPort("10.0.0.1:1"))
	ck, _ := model.Builtin("checksum")
	base := func() Config {
		return Config{Transport: tr, DPU: netip.MustParseAddrPort("10.0.0.2:1"), Devices: []devmem.Device{devmem.NewShm(devmem.Info{})},
			Cards: []string{"H100-80GB"}, HandleSocket: "/x", Models: []*model.Model{ck}}
	}
	for name, tc := range map[string]struct {
		f    func(*Config)
		want string
	}{
		"no card":    {func(c *Config) { c.Cards = nil }, "unknown MIG card"},
		"bad card":   {func(c *Config) { c.Cards = []string{"V100"} }, "V100"},
		"no devices": {func(c *Config) { c.Devices = nil }, "no devices"},
		"no models":  {func(c *Config) { c.Models = nil }, "no models"},
		"slots":      {func(c *Config) { c.Slots = 9 }, "slots per GPU"},
		"no dpu":     {func(c *Config) { c.DPU = netip.AddrPort{} }, "no DPU address"},
	} {
		c := base()
		tc.f(&c)
		if _, err := New(c); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error about %q", name, err, tc.want)
		}
	}
}

// importAll maps every handle as the DPU would; the mappings close when
// the test ends.
func importAll(t *testing.T, hs []devmem.Handle) []devmem.Mapping {
	t.Helper()
	var maps []devmem.Mapping
	for _, h := range hs {
		m, err := devmem.ShmImporter{}.Import(h)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		maps = append(maps, m)
	}
	return maps
}
