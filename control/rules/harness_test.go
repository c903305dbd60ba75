package rules

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/lovelock-dpu/lovelock/bpf"
	llnetns "github.com/lovelock-dpu/lovelock/control/netns"
	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// The harness runs packets through the steering program with
// BPF_PROG_TEST_RUN. The ingress interface comes from the xdp_md context,
// which the kernel checks against the interfaces of the calling thread's
// network namespace: the harness makes a namespace with lo and two veth
// pairs (v0-v1, v2-v3) and runs packets from inside it.

// xdpMd is struct xdp_md as BPF_PROG_TEST_RUN takes it: data_end must be the
// data's length, data_meta and egress_ifindex zero.
type xdpMd struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// XDP return codes.
const (
	xdpDrop     = 1
	xdpPass     = 2
	xdpRedirect = 4
)

// maxRunLen is the most BPF_PROG_TEST_RUN keeps linear (a page less XDP
// headroom and skb_shared_info); the program sees nothing beyond it, while
// wire.ParseFrame sees the whole frame.
const maxRunLen = 3520

var harnessIfaces = []string{"lo", "v0", "v1", "v2", "v3"}

type harness struct {
	port   uint16
	ns     netns.NsHandle
	s      *bpf.Steer
	ifaces map[string]int
}

func newHarness(tb testing.TB, port uint16) *harness {
	tb.Helper()
	testenv.RequirePriv(tb)
	h := &harness{port: port, ns: testenv.NewNetNS(tb), ifaces: map[string]int{}}
	for _, pair := range [][2]string{{"v0", "v1"}, {"v2", "v3"}} {
		h.ifaces[pair[0]], h.ifaces[pair[1]] = testenv.VethPair(tb,
			testenv.VethEnd{NS: h.ns, Name: pair[0]}, testenv.VethEnd{NS: h.ns, Name: pair[1]})
	}
	testenv.InNetNS(tb, h.ns, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		h.ifaces["lo"] = lo.Attrs().Index
		return nil
	})
	s, err := bpf.Load(bpf.Options{Port: port})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	h.s = s
	return h
}

// resolve is the harness's Resolver: the namespace's interfaces, plus "ext"
// for redirect targets outside it (redirects are not carried out in test
// runs).
func (h *harness) resolve(name string) (int, error) {
	if name == "ext" {
		return 4242, nil
	}
	if idx, ok := h.ifaces[name]; ok {
		return idx, nil
	}
	return 0, errors.New("no such interface in the test namespace")
}

// inNS runs fn inside the harness's namespace. It reports errors rather
// than failing a test, so that fuzz targets can call it.
func (h *harness) inNS(fn func() error) error {
	return llnetns.Do(h.ns, fn)
}

// applied is a rule set installed in the data plane, with the Go
// classifier for it and the counters seen so far.
type applied struct {
	h       *harness
	cl      *Classifier
	names   map[uint32]string // rule ID -> name; 0 -> "default"
	counts  map[uint32]uint64 // packets counted per rule ID, as last read
	stats   []bpf.Counter     // data plane counters at apply time
	tallies [bpf.NumStats]uint64
	runs    int
}

func (h *harness) apply(s *Set) (*applied, error) {
	rs, err := Compile(s, h.resolve, h.port)
	if err != nil {
		return nil, err
	}
	cl, err := NewClassifier(s, h.resolve, h.port)
	if err != nil {
		return nil, err
	}
	if err := h.s.Apply(rs); err != nil {
		return nil, err
	}
	ids, err := IDs(s)
	if err != nil {
		return nil, err
	}
	a := &applied{h: h, cl: cl, names: map[uint32]string{0: "default"}, counts: map[uint32]uint64{}}
	for i, id := range ids {
		a.names[id] = s.Rules[i].Name
	}
	for id := range a.names {
		c, err := h.s.RuleCounter(id)
		if err != nil {
			return nil, err
		}
		a.counts[id] = c.Packets
	}
	if a.stats, err = h.s.Stats(); err != nil {
		return nil, err
	}
	return a, nil
}

// xdpCode is the XDP return code a verdict gives in a test run: xsk slots
// hold no socket, so xsk verdicts fall back to XDP_PASS.
func xdpCode(a bpf.Action) uint32 {
	switch a {
	case bpf.ActionDrop:
		return xdpDrop
	case bpf.ActionRedirect:
		return xdpRedirect
	}
	return xdpPass
}

// run classifies frame from ifindex with both classifiers and describes any
// disagreement: the XDP return code, and which rule's counter rose (exactly
// the one the Go classifier chose, by one). Call it inside the namespace.
func (a *applied) run(frame []byte, ifindex uint32) (Verdict, string, error) {
	want := a.cl.Classify(frame, ifindex)
	ret, err := a.h.s.XDP.Run(&ebpf.RunOptions{
		Data:    frame,
		Context: xdpMd{DataEnd: uint32(len(frame)), IngressIfindex: ifindex},
	})
	if err != nil {
		return want, "", fmt.Errorf("run %d-byte frame: %w", len(frame), err)
	}
	a.runs++
	a.tally(want)
	c, err := a.h.s.RuleCounter(want.RuleID)
	if err != nil {
		return want, "", err
	}
	rose := c.Packets - a.counts[want.RuleID]
	a.counts[want.RuleID] = c.Packets
	var d string
	switch {
	case rose != 1:
		got, err := a.whichRose()
		if err != nil {
			return want, "", err
		}
		d = fmt.Sprintf("Go: rule %q (%v, status %v); BPF counted rule %s", a.names[want.RuleID], want.Action, want.Status, got)
	case ret != xdpCode(want.Action):
		d = fmt.Sprintf("Go: rule %q, action %v (XDP %d); BPF returned %d", a.names[want.RuleID], want.Action, xdpCode(want.Action), ret)
	}
	return want, d, nil
}

// whichRose finds the rules whose counters moved without the Go classifier
// expecting it, and resyncs the counts.
func (a *applied) whichRose() (string, error) {
	var out []string
	for id := range a.names {
		c, err := a.h.s.RuleCounter(id)
		if err != nil {
			return "", err
		}
		if c.Packets != a.counts[id] {
			out = append(out, fmt.Sprintf("%q (+%d)", a.names[id], c.Packets-a.counts[id]))
			a.counts[id] = c.Packets
		}
	}
	if len(out) == 0 {
		return "none", nil
	}
	return fmt.Sprint(out), nil
}

func (a *applied) tally(v Verdict) {
	a.tallies[bpf.StatRX]++
	if v.Status.Malformed() {
		a.tallies[bpf.StatMalformed]++
	}
	// no_rule counts classified packets: a bad Lovelock header alone is
	// malformed and classified, so it may count under both.
	if v.RuleID == 0 && (!v.Status.Malformed() || v.BadLovelock) {
		a.tallies[bpf.StatNoRule]++
	}
	if v.Status == wire.StatusOK {
		a.tallies[bpf.StatLovelock]++
	}
	switch v.Action {
	case bpf.ActionXSK:
		// The harness registers no AF_XDP sockets: xsk verdicts pass.
		a.tallies[bpf.StatXSKMiss]++
		a.tallies[bpf.StatPass]++
	case bpf.ActionPass:
		a.tallies[bpf.StatPass]++
	case bpf.ActionDrop:
		a.tallies[bpf.StatDrop]++
	case bpf.ActionRedirect:
		a.tallies[bpf.StatRedirect]++
	}
}

// checkStats compares the data plane's counters since apply with what the
// Go verdicts add up to; this tells xsk from pass, which the return code
// cannot.
func (a *applied) checkStats() error {
	now, err := a.h.s.Stats()
	if err != nil {
		return err
	}
	var errs []error
	for i := range bpf.NumStats {
		if got := now[i].Packets - a.stats[i].Packets; got != a.tallies[i] {
			errs = append(errs, fmt.Errorf("counter %v rose by %d, the Go verdicts say %d", i, got, a.tallies[i]))
		}
	}
	a.stats = now
	a.tallies = [bpf.NumStats]uint64{}
	return errors.Join(errs...)
}
