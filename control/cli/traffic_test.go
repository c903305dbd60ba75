package cli

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/control/testbed"
	"github.com/lovelock-dpu/lovelock/control/testenv"
)

const (
	exampleRules = "../../appliance/examples/rules.yaml"
	exampleCheck = "../../appliance/examples/traffic-check.yaml"
)

// steerService is an api.Service over a real steering program attached to
// a testbed DPU: rules compile into it, stats come from its maps. It
// stands in for lovelockd, whose API the traffic check reads.
type steerService struct {
	fakeService
	spec  testbed.Spec
	node  string
	steer *bpf.Steer
	mu    sync.Mutex
}

func (s *steerService) Rules() (rules.Set, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.set, nil
}

func (s *steerService) ApplyRules(set rules.Set) (api.Applied, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range set.Rules {
		set.Rules[i].ID = uint32(i + 1)
	}
	var rs *bpf.Ruleset
	err := s.spec.Run(s.node, func() (err error) {
		rs, err = rules.Compile(&set, rules.LinkResolver, 0)
		return err
	})
	if err != nil {
		return api.Applied{}, err
	}
	if err := s.steer.Apply(rs); err != nil {
		return api.Applied{}, err
	}
	s.set = set
	return api.Applied{Rules: len(set.Rules)}, nil
}

func (s *steerService) Stats() (api.Stats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	verdicts, err := s.steer.Stats()
	if err != nil {
		return api.Stats{}, err
	}
	st := api.Stats{Verdicts: map[string]api.Counter{}}
	for i, c := range verdicts {
		st.Verdicts[bpf.Stat(i).String()] = c
	}
	if st.Default, err = s.steer.RuleCounter(0); err != nil {
		return api.Stats{}, err
	}
	for _, r := range s.set.Rules {
		c, err := s.steer.RuleCounter(r.ID)
		if err != nil {
			return api.Stats{}, err
		}
		st.Rules = append(st.Rules, api.RuleStat{Name: r.Name, ID: r.ID, Priority: r.Priority, Action: r.Action.String(), Counter: c})
	}
	return st, nil
}

// steerOnDPU brings up a testbed, attaches the steering program to dpu0's
// pf0hpf and p0 as lovelockd does, and serves its API.
func steerOnDPU(t *testing.T) (testbed.Spec, *steerService, string) {
	t.Helper()
	testenv.RequirePriv(t)
	spec := testbed.DefaultSpec()
	spec.Prefix = fmt.Sprintf("lltt%d-", os.Getpid()%100000)
	t.Cleanup(func() {
		if err := testbed.Down(context.Background(), spec); err != nil {
			t.Errorf("testbed down: %v", err)
		}
	})
	if err := testbed.Up(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	steer, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	t.Cleanup(func() { steer.Close() })
	err = spec.Run("dpu0", func() error {
		for _, name := range []string{"pf0hpf", "p0"} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			xl, err := steer.AttachXDP(l.Attrs().Index, link.XDPDriverMode)
			if err != nil {
				return fmt.Errorf("attach %s: %w", name, err)
			}
			t.Cleanup(func() { xl.Close() })
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	svc := &steerService{spec: spec, node: "dpu0", steer: steer}
	return spec, svc, serveFake(t, svc)
}

// TestTrafficCheck: with the example rules on dpu0, every class of the mix
// goes where traffic-check.yaml says and the check passes; when a class
// does not arrive (its rule now drops it, or the fabric cannot receive
// redirects) the check fails on that class and exits non-zero.
func TestTrafficCheck(t *testing.T) {
	spec, svc, sock := steerOnDPU(t)
	check := func(t *testing.T) (string, error) {
		t.Helper()
		out, _, err := runCLI(sock, "testbed", "traffic", "--prefix", spec.Prefix, "--count", "7", "--check", exampleCheck, "host0")
		t.Logf("\n%s", out)
		return out, err
	}
	classLine := func(out, class string) string {
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, class+"  ") {
				return l
			}
		}
		return ""
	}
	if _, _, err := runCLI(sock, "rules", "apply", "-f", exampleRules); err != nil {
		t.Fatal(err)
	}

	t.Run("example rules", func(t *testing.T) {
		out, err := check(t)
		if err != nil {
			t.Fatalf("check failed: %v", err)
		}
		for _, class := range trafficMix {
			if l := classLine(out, class.name); !strings.HasSuffix(strings.TrimSpace(l), "ok") {
				t.Errorf("class %q: %q, want ok", class.name, l)
			}
		}
		if !strings.Contains(out, "counter xsk_miss: 7, want 7") || !strings.Contains(out, "counter malformed: 14, want 14") {
			t.Errorf("xsk_miss or malformed not counted as sent")
		}
	})

	t.Run("rule drops a pass class", func(t *testing.T) {
		set, _ := svc.Rules()
		set.Rules = slices.Clone(set.Rules)
		for i := range set.Rules {
			if set.Rules[i].Name == "other-service" {
				set.Rules[i].Action = rules.Drop()
			}
		}
		if _, err := svc.ApplyRules(set); err != nil {
			t.Fatal(err)
		}
		out, err := check(t)
		if err == nil || !strings.Contains(err.Error(), "bundle tenant 7") {
			t.Errorf("check error %v, want a FAIL naming bundle tenant 7", err)
		}
		for _, class := range []string{"bundle tenant 7", "mem-read tenant 3 region 40"} {
			if l := classLine(out, class); !strings.HasSuffix(strings.TrimSpace(l), "FAIL") {
				t.Errorf("class %q: %q, want FAIL", class, l)
			}
		}
		if l := classLine(out, "tcp syn :23"); !strings.HasSuffix(strings.TrimSpace(l), "ok") {
			t.Errorf("tcp syn :23: %q, want ok", l)
		}
	})

	t.Run("redirects not delivered", func(t *testing.T) {
		if _, _, err := runCLI(sock, "rules", "apply", "-f", exampleRules); err != nil {
			t.Fatal(err)
		}
		// Without a program on the fabric's end, veth drops what XDP
		// redirects into dpu0's p0: counted, never arriving.
		err := spec.Run("fabric", func() error {
			l, err := netlink.LinkByName("dpu0-p0")
			if err != nil {
				return err
			}
			return netlink.LinkSetXdpFd(l, -1)
		})
		if err != nil {
			t.Fatal(err)
		}
		out, err := check(t)
		if err == nil || !strings.Contains(err.Error(), "mem-read tenant 3 region 5") {
			t.Errorf("check error %v, want a FAIL naming mem-read tenant 3 region 5", err)
		}
		if l := classLine(out, "bundle tenant 7"); !strings.HasSuffix(strings.TrimSpace(l), "ok") {
			t.Errorf("bundle tenant 7: %q, want ok", l)
		}
	})
}

// TestTrafficExpectFile: the example expectations cover the mix exactly,
// and files that do not are refused before anything is sent.
func TestTrafficExpectFile(t *testing.T) {
	exp, err := readTrafficExpect(exampleCheck)
	if err != nil {
		t.Fatal(err)
	}
	if len(exp) != len(trafficMix) {
		t.Errorf("%d expectations for %d classes", len(exp), len(trafficMix))
	}
	var all strings.Builder
	all.WriteString("classes:\n")
	for _, cl := range trafficMix {
		fmt.Fprintf(&all, "  - {class: %q, rule: r, to: kernel}\n", cl.name)
	}
	for _, tc := range []struct{ name, file, want string }{
		{"unknown class", all.String() + "  - {class: nope, rule: r, to: kernel}\n", `no class "nope"`},
		{"twice", all.String() + fmt.Sprintf("  - {class: %q, rule: r, to: kernel}\n", trafficMix[0].name), "listed twice"},
		{"missing", "classes:\n  - {class: \"tcp syn :23\", rule: r, to: nowhere}\n", "has no expectation"},
		{"no rule", "classes:\n  - {class: \"tcp syn :23\", to: nowhere}\n", "want both rule and to"},
		{"unknown field", "classes:\n  - {class: \"tcp syn :23\", rule: r, to: nowhere, via: x}\n", "unknown field"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := filepath.Join(t.TempDir(), "expect.yaml")
			if err := os.WriteFile(name, []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := readTrafficExpect(name); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// TestTrafficDeltas: the counters' increase is taken only over the rule set
// the classifier was built from, installed and unchanged, with no counter
// going back; otherwise the check stops with an error instead of comparing
// another set's counts, or a difference wrapped round by a restart (which,
// for the default, read as a surplus "not from the mix" and passed).
func TestTrafficDeltas(t *testing.T) {
	set := rules.Set{Rules: []rules.Rule{{Name: "a", ID: 1}, {Name: "b", ID: 2}}}
	stats := func(def uint64, rs ...api.RuleStat) api.Stats {
		return api.Stats{Default: api.Counter{Packets: def}, Rules: rs,
			Verdicts: map[string]api.Counter{"malformed": {Packets: def}}}
	}
	rule := func(name string, id uint32, n uint64) api.RuleStat {
		return api.RuleStat{Name: name, ID: id, Counter: api.Counter{Packets: n}}
	}
	before := stats(100, rule("a", 1, 10), rule("b", 2, 20))
	pending := stats(100, rule("a", 1, 10), rule("b", 2, 20))
	pending.RulesPending = true
	malformedBack := stats(150, rule("a", 1, 15), rule("b", 2, 27))
	malformedBack.Verdicts["malformed"] = api.Counter{Packets: 3}
	for _, tc := range []struct {
		name          string
		before, after api.Stats
		want          string // error substring; "" for none
	}{
		{"unchanged set", before, stats(150, rule("a", 1, 15), rule("b", 2, 27)), ""},
		{"default went back (lovelockd restarted)", before, stats(5, rule("a", 1, 15), rule("b", 2, 27)), "went back"},
		{"rule went back", before, stats(150, rule("a", 1, 3), rule("b", 2, 27)), "went back"},
		{"verdict went back", before, malformedBack, "went back"},
		{"rule re-created under another ID", before, stats(150, rule("a", 1, 15), rule("b", 3, 7)), "changed during the check"},
		{"rule added", before, stats(150, rule("a", 1, 15), rule("b", 2, 27), rule("c", 3, 1)), "changed during the check"},
		{"counters of another set than the classifier's", stats(100, rule("a", 1, 10)), stats(150, rule("a", 1, 15)), "not the set"},
		{"set not installed", pending, stats(150, rule("a", 1, 15), rule("b", 2, 27)), "not installed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := trafficDeltas(set, tc.before, tc.after)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("error %v, want one saying %q (deltas %v)", err, tc.want, d)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]uint64{trafficDefaultRule: 50, "a": 5, "b": 7}
			if !maps.Equal(d.rules, want) || d.verdicts["malformed"] != 50 {
				t.Errorf("deltas %v %v, want %v and malformed 50", d.rules, d.verdicts, want)
			}
		})
	}
}

// perfectTraffic is a --check run where every class of the example file went
// where it says: the frames, expectations, captures, counters and a
// classifier that agrees.
func perfectTraffic(t *testing.T, count int) (me, peer testbed.Endpoint, frames [][][]byte, exp map[string]classExpect, pts []*trafficPoint, d counterDeltas, classify func([]byte) (string, string, bool)) {
	t.Helper()
	spec := testbed.DefaultSpec()
	for _, l := range spec.Links {
		if l.A.Node == "host0" && l.A.Iface == "eth0" {
			me, peer = l.A, l.B
		}
	}
	frames, err := trafficFrames(me, peer, count)
	if err != nil {
		t.Fatal(err)
	}
	if exp, err = readTrafficExpect(exampleCheck); err != nil {
		t.Fatal(err)
	}
	pts = trafficPoints(spec, peer)
	d = counterDeltas{rules: map[string]uint64{}, verdicts: map[string]uint64{}}
	classOf := map[string]int{}
	for ci, class := range trafficMix {
		e := exp[class.name]
		for _, f := range frames[ci] {
			classOf[string(f)] = ci
		}
		for _, p := range pts {
			if p.seen == nil {
				p.seen = make([]int, len(trafficMix))
			}
			if p.name == e.To {
				p.seen[ci] = count
			}
		}
		d.rules[e.Rule] += uint64(count)
		switch {
		case e.Rule == "tenant1-ingest":
			d.verdicts["xsk_miss"] += uint64(count)
		case strings.HasPrefix(class.name, "garbage"):
			d.verdicts["malformed"] += uint64(count)
		}
	}
	classify = func(frame []byte) (string, string, bool) {
		class := trafficMix[classOf[string(frame)]].name
		action := "pass"
		if exp[class].Rule == "tenant1-ingest" {
			action = "xsk:1"
		}
		return exp[class].Rule, action, strings.HasPrefix(class, "garbage")
	}
	return me, peer, frames, exp, pts, d, classify
}

// TestTrafficReportCaptureLoss: a capture that lost frames (its socket's
// buffer overflowed) or stopped early cannot tell a frame that went nowhere
// from one it missed, so the check fails naming it; before, every class
// passed, the dropped ones ("nowhere") on the capture's silence.
func TestTrafficReportCaptureLoss(t *testing.T) {
	for _, tc := range []struct {
		name string
		lose func(pts []*trafficPoint)
		want string // error substring; "" for a pass
	}{
		{"nothing lost", func([]*trafficPoint) {}, ""},
		{"kernel capture dropped frames", func(pts []*trafficPoint) { pts[0].drops = 12 }, "capture at dpu0 pf0hpf"},
		{"fabric capture failed", func(pts []*trafficPoint) {
			for _, p := range pts {
				if p.name == "p0" {
					p.err = unix.ENETDOWN
				}
			}
		}, "capture at fabric dpu0-p0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			me, peer, frames, exp, pts, d, classify := perfectTraffic(t, 5)
			tc.lose(pts)
			var out strings.Builder
			err := trafficReport(&out, me, peer, frames, exp, pts, d, classify)
			t.Logf("\n%s", out.String())
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want a FAIL naming %q", err, tc.want)
			}
			if strings.Contains(out.String(), "every class went where its rule says") {
				t.Errorf("the report says every class arrived, though a capture lost frames")
			}
		})
	}
}

// TestTrafficCaptureDrops: a capture whose socket buffer overflows records
// the frames the kernel dropped for it.
func TestTrafficCaptureDrops(t *testing.T) {
	ns := testenv.NewNetNS(t)
	testenv.VethPair(t, testenv.VethEnd{NS: ns, Name: "tx"}, testenv.VethEnd{NS: ns, Name: "rx"})
	frame := testenv.UDPFrame(5000)
	const sent = 200
	p := &trafficPoint{name: trafficKernel}
	// The smallest buffer: a handful of frames fit, the rest are dropped.
	captureVeth(t, ns, p, 0, slices.Repeat([][]byte{frame}, sent))
	stop := make(chan struct{})
	p.read(map[string]int{string(frame): 0}, stop)
	close(stop)
	<-p.done
	if p.err != nil {
		t.Fatal(p.err)
	}
	t.Logf("seen %d, dropped %d", p.seen[0], p.drops)
	if p.drops == 0 || p.seen[0]+p.drops > sent {
		t.Errorf("seen %d, dropped %d of %d sent into a full buffer: want drops counted", p.seen[0], p.drops, sent)
	}
}

// TestTrafficCaptureStops: a capture stops as soon as it is told, though no
// frame arrives and its socket has no receive timeout, and still counts what
// was queued before the stop, its end marker apart. Before, the reader
// noticed the stop only when a receive timed out (the socket's 50 ms
// SO_RCVTIMEO); without one it blocked for good.
func TestTrafficCaptureStops(t *testing.T) {
	ns := testenv.NewNetNS(t)
	testenv.VethPair(t, testenv.VethEnd{NS: ns, Name: "tx"}, testenv.VethEnd{NS: ns, Name: "rx"})
	frame := testenv.UDPFrame(5000)
	const sent = 5
	p := &trafficPoint{name: "p0", at: testbed.Endpoint{Node: "fabric", Iface: "dpu0-p0"}}
	p.setMarker("dpu0")
	captureVeth(t, ns, p, -1, append(slices.Repeat([][]byte{frame}, sent), p.marker))
	stop := make(chan struct{})
	p.read(map[string]int{string(frame): 0}, stop)
	close(stop)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second): // a bound on a hang, not a measurement
		t.Fatal("the capture did not stop within 10 s of being told")
	}
	if p.err != nil {
		t.Fatal(p.err)
	}
	select {
	case <-p.marked:
	default:
		t.Error("the end marker was queued before the stop but not seen")
	}
	if p.seen[0] != sent || p.drops != 0 {
		t.Errorf("seen %d, dropped %d; want the %d frames queued before the stop", p.seen[0], p.drops, sent)
	}
	// Anything else on the veth (IPv6 chatter) counts as other; the marker must not.
	t.Logf("other frames: %d", p.other)
}

// captureVeth binds p's packet socket, in ns, to the veth end rx (a
// receive buffer of rcvbuf bytes; -1: the default) and sends frames into
// it from tx.
func captureVeth(t *testing.T, ns netns.NsHandle, p *trafficPoint, rcvbuf int, frames [][]byte) {
	t.Helper()
	testenv.InNetNS(t, ns, func() error {
		rx, err := netlink.LinkByName("rx")
		if err != nil {
			return err
		}
		tx, err := netlink.LinkByName("tx")
		if err != nil {
			return err
		}
		proto := int(htons(unix.ETH_P_ALL))
		if p.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto); err != nil {
			return err
		}
		if rcvbuf >= 0 {
			if err := unix.SetsockoptInt(p.fd, unix.SOL_SOCKET, unix.SO_RCVBUF, rcvbuf); err != nil {
				return err
			}
		}
		if err := unix.Bind(p.fd, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: rx.Attrs().Index}); err != nil {
			return err
		}
		out, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(out)
		to := &unix.SockaddrLinklayer{Ifindex: tx.Attrs().Index, Halen: 6}
		for _, f := range frames {
			if err := unix.Sendto(out, f, 0, to); err != nil {
				return err
			}
		}
		return nil
	})
}
