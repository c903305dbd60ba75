package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/hostagent"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// TestForeignRegistration: a registration the agent must not act on, from
// a peer outside host_peer or naming a handle socket host_socket does not
// allow, is ignored, counted and logged once per source; the real host's
// registration survives and its requests still run, and the named socket
// is never dialed. Before, any peer that reached the host port could
// register a host agent of its own (the real host's slots dropped) and
// make the DPU dial any unix path, or redirect the real host's doorbells
// with a heartbeat of its epoch.
func TestForeignRegistration(t *testing.T) {
	for _, tc := range []struct {
		name string
		from netip.AddrPort
		// socket is the handle socket the rogue names, given the rig's
		// socket directory (allowed) and another directory beside it.
		socket func(allowed, other string) string
		// heartbeat: a bare register of the real host's epoch instead of
		// a rogue host agent of its own.
		heartbeat bool
		setting   string // the setting the log line points at
	}{
		{name: "foreign source, allowed socket", from: netip.MustParseAddrPort("10.0.0.66:61441"),
			socket: func(allowed, _ string) string { return filepath.Join(allowed, "rogue.sock") }, setting: "host_peer"},
		{name: "host link, socket elsewhere", from: netip.MustParseAddrPort("10.1.0.9:61441"),
			socket: func(_, other string) string { return filepath.Join(other, "rogue.sock") }, setting: "host_socket"},
		{name: "host link, socket leaving the directory by ..", from: netip.MustParseAddrPort("10.1.0.9:61441"),
			socket: func(allowed, other string) string { return allowed + "/../" + filepath.Base(other) + "/rogue.sock" }, setting: "host_socket"},
		{name: "foreign source, the host's own epoch", from: netip.MustParseAddrPort("10.0.0.66:61441"), heartbeat: true, setting: "host_peer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &recordLog{}
			r := newRig(t, rigOptions{tweak: func(c *Config) {
				c.HostPeer = netip.MustParsePrefix("10.1.0.0/24") // the host link
				c.Logger = slog.New(logs)
			}})
			other := t.TempDir() // beside the rig's socket directory
			before := r.agent.Stats()
			realEpoch := before.Host.Epoch

			ep, err := r.net.Listen(tc.from)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ep.Close() }) // after the rogue stops (cleanups run last first)
			var rogue *hostagent.Agent
			var acked func() bool
			if tc.heartbeat {
				acked = rawRegisterer(t, ep, r.host.Epoch(), r.socket)
			} else {
				rogue = startRogue(t, ep, tc.socket(filepath.Dir(r.socket), other))
				acked = rogue.Registered
			}

			// Wait until several of its registrations were refused; the
			// agent acknowledging one is the failure.
			var s Stats
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				s = r.agent.Stats()
				if s.HostRefused >= before.HostRefused+3 {
					break
				}
				if acked() || s.Registrations != before.Registrations || time.Now().After(deadline) {
					t.Fatalf("the agent heard %v: acknowledged %v, registrations %d (were %d), refused %d; host %s",
						tc.from, acked(), s.Registrations, before.Registrations, s.HostRefused, hostOf(s))
				}
			}
			if s.Host == nil || s.Host.Epoch != realEpoch || s.Host.Addr != hostAddr.String() || s.RegisterFailed != before.RegisterFailed {
				t.Errorf("the real host's registration changed: %s (was epoch %s from %v), failed registrations %d", hostOf(s), realEpoch, hostAddr, s.RegisterFailed)
			}
			if rogue != nil {
				if hs := rogue.Stats(); hs.HandlesServed != 0 || hs.HandleRefused != 0 {
					t.Errorf("the agent dialed the rogue's socket: served %d, refused %d", hs.HandlesServed, hs.HandleRefused)
				}
			}
			in := randomBytes(1, 4096)
			want := model.Checksum(in)
			if a := r.client(1).infer("checksum", in, 0); a.status != ingest.StatusOK || !bytes.Equal(a.out, want[:]) {
				t.Errorf("the real host's request: status %v %q", a.status, a.text)
			}
			if got := logs.from(tc.from.Addr()); len(got) != 1 || !strings.Contains(got[0], tc.setting) {
				t.Errorf("log lines for %v: %q, want one naming %s", tc.from.Addr(), got, tc.setting)
			}
		})
	}
}

func hostOf(s Stats) string {
	if s.Host == nil {
		return "none"
	}
	return fmt.Sprintf("epoch %s from %s, socket %s", s.Host.Epoch, s.Host.Addr, s.Host.Socket)
}

// startRogue runs a host agent of its own on ep whose registrations name
// socket.
func startRogue(t *testing.T, ep transport.Transport, socket string) *hostagent.Agent {
	t.Helper()
	ck, _ := model.Builtin("checksum")
	h, err := hostagent.New(hostagent.Config{Transport: ep, DPU: dpuHostAddr, Devices: []devmem.Device{devmem.NewShm(devmem.Info{})},
		Cards: []string{"H100-80GB"}, HandleSocket: socket, Models: []*model.Model{ck}, Heartbeat: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("rogue host agent: %v", err)
		}
	})
	return h
}

// rawRegisterer sends a register of epoch naming socket from ep each time
// the returned func is called, and reports whether an ack came back.
func rawRegisterer(t *testing.T, ep transport.Transport, epoch uint64, socket string) func() bool {
	buf := make([]transport.Packet, 4)
	return func() bool {
		c := ingest.Ctrl{Op: ingest.OpRegister, Epoch: epoch, Text: socket, Version: ingest.CtrlVersion}
		dg := ingest.AppendCtrl(nil, &c)
		if _, err := ep.Send([]transport.Packet{{Addr: dpuHostAddr, Data: dg}}); err != nil {
			t.Fatalf("send: %v", err)
		}
		for i := range buf {
			buf[i].Data = make([]byte, 9000)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		n, err := ep.Recv(ctx, buf)
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("recv: %v", err)
		}
		for _, p := range buf[:n] {
			if h, payload, err := wire.Decode(p.Data); err == nil && h.Type == wire.TypeIngestCtrl {
				if c, err := ingest.DecodeCtrl(payload); err == nil && c.Op == ingest.OpRegisterAck {
					return true
				}
			}
		}
		return false
	}
}

// recordLog keeps the agent's log records' messages by their "from".
type recordLog struct {
	mu   sync.Mutex
	msgs map[netip.Addr][]string
}

func (l *recordLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *recordLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *recordLog) WithGroup(string) slog.Handler            { return l }

func (l *recordLog) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if from, ok := a.Value.Any().(netip.AddrPort); ok && a.Key == "from" {
			l.mu.Lock()
			if l.msgs == nil {
				l.msgs = map[netip.Addr][]string{}
			}
			l.msgs[from.Addr()] = append(l.msgs[from.Addr()], r.Message)
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

func (l *recordLog) from(a netip.Addr) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.msgs[a]
}

// TestSocketAllowed: which handle sockets a registration may name, by
// host_socket: the path itself, or any socket directly in a directory;
// never one reached through .. or a relative path.
func TestSocketAllowed(t *testing.T) {
	for _, tc := range []struct {
		allowed, path string
		want          bool
	}{
		{"/run/lovelock/ingest.sock", "/run/lovelock/ingest.sock", true},
		{"/run/lovelock/ingest.sock", "/run/lovelock/other.sock", false},
		{"/run/lovelock/ingest.sock", "/run/lovelock/ingest.sock/", false},
		{"/run/lovelock/", "/run/lovelock/ingest.sock", true},
		{"/run/lovelock/", "/run/lovelock/sub/ingest.sock", false},
		{"/run/lovelock/", "/run/lovelock/../x/ingest.sock", false},
		{"/run/lovelock/", "/run/lovelock//ingest.sock", false},
		{"/run/lovelock/", "/run/lovelockd.sock", false},
		{"/run/lovelock/", "ingest.sock", false},
		{"/run/lovelock/", "", false},
		{"/", "/ingest.sock", true},
	} {
		c := Config{HostSocket: tc.allowed}
		if got := c.socketAllowed(tc.path); got != tc.want {
			t.Errorf("host_socket %q, registration naming %q: allowed %v, want %v", tc.allowed, tc.path, got, tc.want)
		}
	}
}
