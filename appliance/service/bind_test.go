package service

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/xdp"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
	"github.com/lovelock-dpu/lovelock/dataplane/xsk"
)

// fakeSteering records what Bind asked of it.
type fakeSteering struct {
	port     uint16
	reserved map[string][]rules.Rule
	failRule bool
	reserves int // Reserve calls
}

func (f *fakeSteering) Port() uint16                             { return f.port }
func (f *fakeSteering) XDPAttached(string) (bool, error)         { return true, nil }
func (f *fakeSteering) SetXSK(int, uint32, int) error            { return nil }
func (f *fakeSteering) SetXSKMultiBuffer(int, uint32, int) error { return nil }
func (f *fakeSteering) ClearXSK(int, uint32) error               { return nil }
func (f *fakeSteering) Reserve(name string, rs []rules.Rule) ([]string, error) {
	f.reserves++
	if f.failRule && rs != nil {
		return nil, errorString("rules do not compile")
	}
	if f.reserved == nil {
		f.reserved = map[string][]rules.Rule{}
	}
	if rs == nil {
		delete(f.reserved, name)
	} else {
		f.reserved[name] = rs
	}
	return nil, nil
}

type errorString string

func (e errorString) Error() string { return string(e) }

func reservedRule(name string) rules.Rule {
	typ := wire.TypeBundle
	return rules.Rule{Name: api.OwnedRulePrefix + name, Priority: api.OwnedPriority,
		Match: rules.Match{Type: &typ}, Action: rules.XSK(0)}
}

// TestBindRefuses: needs the steering program cannot serve are refused
// before anything is opened, each with its reason.
func TestBindRefuses(t *testing.T) {
	addr := netip.MustParseAddrPort("10.77.0.1:61440")
	for _, c := range []struct {
		name  string
		needs Needs
		want  string
	}{
		{"no interfaces", Needs{XDP: &XDPNeeds{Addr: addr, Workers: 1}}, "no interfaces"},
		{"ipv6", Needs{XDP: &XDPNeeds{Interfaces: []string{"p0"}, Addr: netip.MustParseAddrPort("[fd00::1]:61440"), Workers: 1}}, "IPv4 only"},
		{"port", Needs{XDP: &XDPNeeds{Interfaces: []string{"p0"}, Addr: netip.MustParseAddrPort("10.77.0.1:7000"), Workers: 1}}, "port 61440 only"},
		{"workers", Needs{XDP: &XDPNeeds{Interfaces: []string{"p0"}, Addr: addr, Workers: bpf.MaxXSKQueues + 1}}, "reaches queues 0..63"},
		{"no workers", Needs{XDP: &XDPNeeds{Interfaces: []string{"p0"}, Addr: addr}}, "0 workers"},
		{"unreserved name", Needs{Rules: []rules.Rule{{Name: "mine", Priority: api.OwnedPriority, Action: rules.Pass()}}}, `reserved rule "mine"`},
		{"unreserved priority", Needs{Rules: []rules.Rule{{Name: api.OwnedRulePrefix + "x", Priority: 5, Action: rules.Pass()}}}, "priority 4000000000 or more"},
		// Refused before it opens sockets on an interface (which this
		// one lacks, so opening would fail first).
		{"unreserved name with sockets", Needs{XDP: &XDPNeeds{Interfaces: []string{"lovelock-none0"}, Addr: addr, Workers: 1},
			Rules: []rules.Rule{{Name: "mine", Priority: api.OwnedPriority, Action: rules.Pass()}}}, `reserved rule "mine"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := &fakeSteering{port: 61440}
			_, err := Bind(st, slog.Default(), "svc", c.needs)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "svc: ") {
				t.Errorf("err = %v, want one naming the service and %q", err, c.want)
			}
			if len(st.reserved) != 0 {
				t.Errorf("rules left reserved: %v", st.reserved)
			}
		})
	}
}

// TestBindRulesOnly: a service on kernel sockets may still reserve rules;
// when they do not compile it does not start, and Close removes them.
func TestBindRulesOnly(t *testing.T) {
	st := &fakeSteering{port: 61440}
	b, err := Bind(st, slog.Default(), "svc", Needs{Rules: []rules.Rule{reservedRule("svc/a")}})
	if err != nil || len(b.Degraded) != 0 || len(st.reserved["svc"]) != 1 || b.String() != "kernel sockets" {
		t.Fatalf("bind: %v, %+v, %v", err, b, st.reserved)
	}
	b.Close()
	b.Close()
	if len(st.reserved) != 0 {
		t.Errorf("rules left reserved after Close: %v", st.reserved)
	}
	st.failRule = true
	if _, err := Bind(st, slog.Default(), "svc", Needs{Rules: []rules.Rule{reservedRule("svc/a")}}); err == nil || !strings.Contains(err.Error(), "do not compile") {
		t.Errorf("bind with failing rules: %v", err)
	}
}

// TestBindReserveRetried: reserved rules that did not compile with the
// operator's set are tried again at each Recheck, which says so in the
// reason; once they compile they are reserved and the reason is gone
// for good. A closed binding reserves nothing again.
func TestBindReserveRetried(t *testing.T) {
	openGroups = func(xdp.GroupOptions, int, udp.Options) ([]*xdp.Group, error) { return nil, nil }
	t.Cleanup(func() { openGroups = xdp.OpenGroups })
	needs := Needs{XDP: &XDPNeeds{Interfaces: []string{"p0"}, Addr: netip.MustParseAddrPort("10.77.0.1:61440"), Workers: 1},
		Rules: []rules.Rule{reservedRule("svc/a")}}
	st := &fakeSteering{port: 61440, failRule: true}
	b, err := Bind(st, slog.New(slog.DiscardHandler), "svc", needs)
	if err != nil {
		t.Fatal(err)
	}
	if r := b.Reasons(); len(r) != 1 || !strings.Contains(r[0], "reserved steering rules do not compile") || !strings.Contains(r[0], "retried every second") {
		t.Fatalf("reasons %q; want the rules that did not compile, and that they are retried", r)
	}
	if b.Recheck() || len(b.Reasons()) != 1 || st.reserves != 2 {
		t.Errorf("recheck, rules still failing: reasons %q after %d Reserve calls; want one reason, unchanged, after 2", b.Reasons(), st.reserves)
	}
	st.failRule = false // the operator changed their rules
	if !b.Recheck() || len(b.Reasons()) != 0 || len(st.reserved["svc"]) != 1 {
		t.Errorf("recheck, rules compile: reasons %q, reserved %v; want none left, the rules reserved", b.Reasons(), st.reserved)
	}
	if b.Recheck() || st.reserves != 3 {
		t.Errorf("recheck once reserved: %d Reserve calls, want no more than 3", st.reserves)
	}
	if len(b.Degraded) != 1 {
		t.Errorf("Degraded %q; want the reason found at bind", b.Degraded)
	}
	b.Close()
	if len(st.reserved) != 0 {
		t.Errorf("rules left reserved after Close: %v", st.reserved)
	}

	st.failRule = true
	b, err = Bind(st, slog.New(slog.DiscardHandler), "svc", needs)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	st.failRule = false
	if b.Recheck() || len(st.reserved) != 0 {
		t.Errorf("recheck after Close reserved %v", st.reserved)
	}
}

// dpuPair is a DPU namespace whose interface "pf0hpf" (10.77.0.1) runs the
// steering program in XDP, and a host namespace at its other end.
type dpuPair struct {
	dpu, host netns.NsHandle
	prog      *Program
}

func newDPUPair(t *testing.T, attach bool) *dpuPair {
	t.Helper()
	p := &dpuPair{dpu: testenv.NewNetNS(t), host: testenv.NewNetNS(t)}
	idx, _ := testenv.VethPair(t,
		testenv.VethEnd{NS: p.dpu, Name: "pf0hpf", Addr: "10.77.0.1/24"},
		testenv.VethEnd{NS: p.host, Name: "eth0", Addr: "10.77.0.2/24"})
	s, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	p.prog = &Program{Steer: s}
	if attach {
		testenv.InNetNS(t, p.dpu, func() error {
			l, err := s.AttachXDP(idx, link.XDPDriverMode)
			if err != nil {
				return err
			}
			t.Cleanup(func() { l.Close() })
			return nil
		})
		p.prog.Attached = []string{"pf0hpf"}
	}
	return p
}

func (p *dpuPair) bind(t *testing.T, needs Needs) (b *Binding, err error) {
	t.Helper()
	testenv.InNetNS(t, p.dpu, func() error {
		b, err = Bind(p.prog, slog.Default(), "svc", needs)
		return nil
	})
	return b, err
}

// send sends one Lovelock datagram of typ from the host to the DPU.
func (p *dpuPair) send(t *testing.T, typ wire.Type, payload string) {
	t.Helper()
	testenv.InNetNS(t, p.host, func() error {
		c, err := net.Dial("udp4", "10.77.0.1:61440")
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(wire.Header{Version: wire.Version, Type: typ}.AppendTo(nil, []byte(payload)))
		return err
	})
}

func xdpNeeds() Needs {
	return Needs{
		XDP:   &XDPNeeds{Interfaces: []string{"pf0hpf"}, Addr: netip.MustParseAddrPort("10.77.0.1:61440"), Workers: 1},
		Rules: []rules.Rule{reservedRule("svc/pf0hpf/w0")},
	}
}

// TestBindXDP: Bind opens the worker's AF_XDP socket, registers it and
// installs the reserved rule, so the service's datagrams arrive on the
// socket (not the kernel's); Close takes it all back, and the same queue
// binds again.
func TestBindXDP(t *testing.T) {
	p := newDPUPair(t, true)
	b, err := p.bind(t, xdpNeeds())
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Degraded) != 0 || len(b.Groups) != 1 || !strings.HasPrefix(b.String(), "AF_XDP on pf0hpf, 1 workers") {
		t.Fatalf("binding %s, degraded %v", b, b.Degraded)
	}
	p.send(t, wire.TypeBundle, "to the socket")
	pkts := []transport.Packet{{Data: make([]byte, 2048)}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := b.Transports()[0].Recv(ctx, pkts)
	if err != nil || n != 1 || !strings.HasSuffix(string(pkts[0].Data), "to the socket") {
		t.Fatalf("recv: %d, %v, %q", n, err, pkts[0].Data)
	}
	paths := b.Paths()
	if len(paths) != 2 || paths[0].Path != "xsk" || paths[0].RX != 1 || paths[1].Path != "kernel" || paths[1].RX != 0 {
		t.Errorf("paths %+v, want the datagram on the AF_XDP path", paths)
	}
	if c, err := p.prog.Steer.RuleCounter(1); err != nil || c.Packets != 1 {
		t.Errorf("reserved rule counter %+v, %v", c, err)
	}
	b.Close()
	if len(p.prog.reserved) != 0 {
		t.Errorf("reserved rules left after Close: %v", p.prog.reserved)
	}
	b2, err := p.bind(t, xdpNeeds())
	if err != nil {
		t.Fatalf("bind again after Close: %v", err)
	}
	b2.Close()
}

// TestBindDegraded: what is bound short of the needs is said, and the
// service runs on its kernel sockets: no XDP on an interface, reserved
// rules that do not compile (an interface the node does not have).
func TestBindDegraded(t *testing.T) {
	p := newDPUPair(t, false)
	needs := xdpNeeds()
	r := reservedRule("svc/nope")
	r.Match.Iface = "nope0"
	needs.Rules = append(needs.Rules, r)
	b, err := p.bind(t, needs)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	want := []string{"no steering program in XDP on pf0hpf", "reserved steering rules do not compile"}
	if len(b.Degraded) != len(want) {
		t.Fatalf("degraded %q, want %d lines", b.Degraded, len(want))
	}
	for i, w := range want {
		if !strings.Contains(b.Degraded[i], w) {
			t.Errorf("degraded[%d] = %q, want %q", i, b.Degraded[i], w)
		}
	}
	if len(p.prog.reserved) != 0 {
		t.Errorf("rules reserved though they did not compile: %v", p.prog.reserved)
	}
}

// TestBindMultiBufferFallback: XDPNeeds.MultiBuffer binds the sockets with
// XDP_USE_SG; where the kernel or driver refuses it, Bind opens
// single-buffer sockets instead and says so in Degraded and String, and
// the service's datagrams still reach its socket.
func TestBindMultiBufferFallback(t *testing.T) {
	p := newDPUPair(t, true)
	needs := xdpNeeds()
	needs.XDP.MultiBuffer = true
	b, err := p.bind(t, needs)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Degraded) != 0 || !b.Groups[0].Transports()[0].MultiBuffer() || !strings.Contains(b.String(), "multi-buffer") {
		t.Fatalf("binding %s, degraded %v: want multi-buffer sockets", b, b.Degraded)
	}
	if paths := b.Paths(); !paths[0].MultiBuffer {
		t.Errorf("paths %+v: want the socket shown as multi-buffer", paths)
	}
	b.Close()

	refusals := 0
	openGroups = func(opts xdp.GroupOptions, n int, kernel udp.Options) ([]*xdp.Group, error) {
		if opts.MultiBuffer {
			refusals++
			return nil, fmt.Errorf("xdp: xsk pf0hpf/0: bind in copy mode: %w: %w", xsk.ErrMultiBuffer, unix.EOPNOTSUPP)
		}
		return xdp.OpenGroups(opts, n, kernel)
	}
	t.Cleanup(func() { openGroups = xdp.OpenGroups })
	b, err = p.bind(t, needs)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if refusals != 1 || len(b.Degraded) != 1 || !strings.Contains(b.Degraded[0], "multi-buffer AF_XDP refused") ||
		!strings.Contains(b.Degraded[0], "up to 1472 bytes") || !strings.Contains(b.String(), "single-buffer") ||
		b.Groups[0].Transports()[0].MultiBuffer() {
		t.Fatalf("binding %s, degraded %q after %d refusals: want single-buffer sockets, said", b, b.Degraded, refusals)
	}
	if !strings.Contains(b.Degraded[0], "until the service binds again (restart lovelockd") {
		t.Errorf("degraded %q: want it to say that only a restart fixes it", b.Degraded[0])
	}
	b.Recheck()
	if r := b.Reasons(); len(r) != 1 || r[0] != b.Degraded[0] {
		t.Errorf("reasons after a recheck %q; want the refusal still", r)
	}
	p.send(t, wire.TypeBundle, "to the socket")
	pkts := []transport.Packet{{Data: make([]byte, 2048)}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if n, err := b.Transports()[0].Recv(ctx, pkts); err != nil || n != 1 || !strings.HasSuffix(string(pkts[0].Data), "to the socket") {
		t.Fatalf("recv: %d, %v, %q", n, err, pkts[0].Data)
	}
	// Other errors are not retried.
	calls := 0
	openGroups = func(opts xdp.GroupOptions, n int, kernel udp.Options) ([]*xdp.Group, error) {
		calls++
		return xdp.OpenGroups(opts, n, kernel)
	}
	needs.XDP.Interfaces = []string{"nope0"}
	if _, err := p.bind(t, needs); err == nil || calls != 1 {
		t.Errorf("bind on nope0: %v after %d opens, want an error after 1", err, calls)
	}
}
