package attach_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// otherBuild pins into dir, in the layout a lovelockd pins, a data plane
// built from other code: the committed object with one harmless
// instruction added to xdp_steer (its tag differs), attached to iface's
// XDP and TC ingress hooks through pinned links and to its TC egress hook
// as a clsact filter. It returns the XDP program's ID.
func otherBuild(t *testing.T, dir, iface string) ebpf.ProgramID {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "links"), 0o700); err != nil {
		t.Fatal(err)
	}
	spec, err := bpf.SteerSpec()
	if err != nil {
		t.Fatal(err)
	}
	ps := spec.Programs[bpf.PinProgXDP]
	// R1 = R1 before the first instruction, which carries the function's
	// symbol and BTF: they move to the new first instruction.
	nop := asm.Mov.Reg(asm.R1, asm.R1)
	nop.Metadata, ps.Instructions[0].Metadata = ps.Instructions[0].Metadata, asm.Metadata{}
	ps.Instructions = append(asm.Instructions{nop}, ps.Instructions...)
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		t.Fatalf("load the other build: %+v", err)
	}
	defer coll.Close() // as the old lovelockd exits: the pins hold it
	for _, name := range []string{bpf.PinProgXDP, bpf.PinProgTCIngress, bpf.PinProgTCEgress, bpf.PinProgXDPPass} {
		if err := coll.Programs[name].Pin(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{bpf.PinStats, bpf.PinRuleStats, bpf.PinRulesets, bpf.PinShapesets, bpf.PinActiveSet, bpf.PinXSKs, bpf.PinXSKSlots} {
		if err := coll.Maps[name].Pin(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	nl, err := netlink.LinkByName(iface)
	if err != nil {
		t.Fatal(err)
	}
	idx := nl.Attrs().Index
	xdp, err := link.AttachXDP(link.XDPOptions{Program: coll.Programs[bpf.PinProgXDP], Interface: idx, Flags: link.XDPDriverMode})
	if err != nil {
		t.Fatal(err)
	}
	defer xdp.Close()
	tcx, err := link.AttachTCX(link.TCXOptions{Program: coll.Programs[bpf.PinProgTCIngress], Interface: idx, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		t.Fatal(err)
	}
	defer tcx.Close()
	if err := os.MkdirAll(filepath.Join(dir, "links", "clsact", "tc-egress@"+iface), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := xdp.Pin(filepath.Join(dir, "links", "xdp@"+iface)); err != nil {
		t.Fatal(err)
	}
	if err := tcx.Pin(filepath.Join(dir, "links", "tc-ingress@"+iface)); err != nil {
		t.Fatal(err)
	}
	if err := netlink.QdiscAdd(&netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: idx, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT,
	}}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.FilterAdd(&netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: idx, Parent: netlink.HANDLE_MIN_EGRESS, Handle: netlink.MakeHandle(0, 1),
			Protocol: unix.ETH_P_ALL, Priority: 1},
		Fd: coll.Programs[bpf.PinProgTCEgress].FD(), Name: "lovelock_steer", DirectAction: true,
	}); err != nil {
		t.Fatal(err)
	}
	info, err := coll.Programs[bpf.PinProgXDP].Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

// running returns the IDs of the programs iface's hooks run: XDP and TC
// ingress through their pinned links, TC egress through the clsact filter.
func running(t *testing.T, dir, iface string) map[attach.Hook]ebpf.ProgramID {
	t.Helper()
	out := map[attach.Hook]ebpf.ProgramID{}
	for _, h := range []attach.Hook{attach.HookXDP, attach.HookTCIngress} {
		l, err := link.LoadPinnedLink(filepath.Join(dir, "links", string(h)+"@"+iface), nil)
		if err != nil {
			t.Fatalf("%s: %v", h, err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			t.Fatal(err)
		}
		out[h] = info.Program
	}
	nl, err := netlink.LinkByName(iface)
	if err != nil {
		t.Fatal(err)
	}
	if x := nl.Attrs().Xdp; x == nil || ebpf.ProgramID(x.ProgId) != out[attach.HookXDP] {
		t.Errorf("%s: the kernel runs XDP program %+v, the link %d", iface, x, out[attach.HookXDP])
	}
	filters, err := netlink.FilterList(nl, netlink.HANDLE_MIN_EGRESS)
	if err != nil || len(filters) != 1 {
		t.Fatalf("%s egress filters: %v %v, want one", iface, filters, err)
	}
	out[attach.HookTCEgress] = ebpf.ProgramID(filters[0].(*netlink.BpfFilter).Id)
	return out
}

func idOf(t *testing.T, p *ebpf.Program) ebpf.ProgramID {
	t.Helper()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

// wantNew checks that every hook of iface runs n's programs.
func wantNew(t *testing.T, n *attach.Node, iface string) {
	t.Helper()
	got := running(t, n.Dir(), iface)
	want := map[attach.Hook]ebpf.ProgramID{
		attach.HookXDP: idOf(t, n.Steer.XDP), attach.HookTCIngress: idOf(t, n.Steer.TCIngress), attach.HookTCEgress: idOf(t, n.Steer.TCEgress),
	}
	for h, id := range want {
		if got[h] != id {
			t.Errorf("%s %s runs program %d, want the new one, %d", iface, h, got[h], id)
		}
	}
}

// udpPair is a sender in one namespace and a counting receiver in another.
type udpPair struct {
	out  *net.UDPConn
	in   *net.UDPConn
	recv atomic.Int64
}

func newUDPPair(t *testing.T, from, to netns.NsHandle, port int) *udpPair {
	t.Helper()
	u := &udpPair{}
	testenv.InNetNS(t, to, func() error {
		var err error
		u.in, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 98, 0, 2), Port: port})
		if err != nil {
			return err
		}
		return u.in.SetReadBuffer(1 << 20)
	})
	testenv.InNetNS(t, from, func() error {
		var err error
		u.out, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(10, 98, 0, 2), Port: port})
		return err
	})
	t.Cleanup(func() { u.in.Close(); u.out.Close() })
	go func() {
		buf := make([]byte, 64)
		for {
			if _, err := u.in.Read(buf); err != nil {
				return
			}
			u.recv.Add(1)
		}
	}()
	return u
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// setup builds nsA --a/b-- nsB, with permanent neighbours, and pins the
// other build in dir with every hook of b attached.
func setup(t *testing.T, dir string) (nsA, nsB netns.NsHandle, oldXDP ebpf.ProgramID) {
	nsA, nsB = testenv.NewNetNS(t), testenv.NewNetNS(t)
	testenv.VethPair(t, testenv.VethEnd{NS: nsA, Name: "a", Addr: "10.98.0.1/24"}, testenv.VethEnd{NS: nsB, Name: "b", Addr: "10.98.0.2/24"})
	var macA, macB net.HardwareAddr
	testenv.InNetNS(t, nsA, func() error {
		l, err := netlink.LinkByName("a")
		if err != nil {
			return err
		}
		macA = l.Attrs().HardwareAddr
		return nil
	})
	testenv.InNetNS(t, nsB, func() error {
		l, err := netlink.LinkByName("b")
		if err != nil {
			return err
		}
		macB = l.Attrs().HardwareAddr
		oldXDP = otherBuild(t, dir, "b")
		return netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.Attrs().Index, State: netlink.NUD_PERMANENT, IP: net.IPv4(10, 98, 0, 1), HardwareAddr: macA})
	})
	testenv.InNetNS(t, nsA, func() error {
		l, err := netlink.LinkByName("a")
		if err != nil {
			return err
		}
		return netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.Attrs().Index, State: netlink.NUD_PERMANENT, IP: net.IPv4(10, 98, 0, 2), HardwareAddr: macB})
	})
	return nsA, nsB, oldXDP
}

// TestUpgradeUnderTraffic: pins of another build run on b's XDP, TC
// ingress (tcx) and TC egress (clsact) hooks while a stream crosses b.
// Open refuses them without Upgrade; with it, it loads this build, fills
// its maps with a rule set that passes the stream and drops a canary,
// swaps every hook's program in place and the pin directories. Every
// datagram of the stream arrives, the new programs run on every hook and
// classify (the stream's rule counts, the canary is dropped), the counters
// went over, and nothing of the old pins is left.
func TestUpgradeUnderTraffic(t *testing.T) {
	fs := testenv.BPFFS(t)
	dir := filepath.Join(fs, "lovelock")
	nsA, nsB, oldXDP := setup(t, dir)
	stream := newUDPPair(t, nsA, nsB, 7010)
	canary := newUDPPair(t, nsA, nsB, 7011)

	set, err := rules.ParseFile("upgrade.yaml", []byte(`
default: pass
rules:
  - {name: stream, priority: 10, match: {iface: b, proto: udp, dport: 7010}, action: pass}
  - {name: canary, priority: 10, match: {iface: b, proto: udp, dport: 7011}, action: drop}
`))
	if err != nil {
		t.Fatal(err)
	}
	for i := range set.Rules {
		set.Rules[i].ID = uint32(i + 1)
	}

	// The sender keeps at most 64 datagrams in flight, so the receiver's
	// socket never overflows: a datagram missing is the data plane's.
	var sent atomic.Int64
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if sent.Load()-stream.recv.Load() >= 64 {
				time.Sleep(50 * time.Microsecond)
				continue
			}
			if _, err := stream.out.Write([]byte("stream")); err == nil {
				sent.Add(1)
			}
		}
	}()
	defer func() {
		select {
		case <-stopped:
		default:
			close(stop)
			<-stopped
		}
	}()
	waitFor(t, "the stream through the old build", func() bool { return stream.recv.Load() >= 200 })

	var n *attach.Node
	var rxBefore uint64
	testenv.InNetNS(t, nsB, func() error {
		if _, err := attach.Open(attach.Options{Dir: dir}); !errors.Is(err, bpf.ErrStale) {
			t.Fatalf("open without upgrade: %v, want ErrStale", err)
		}
		st, err := bpf.ReadPinnedStats(dir)
		if err != nil {
			return err
		}
		rxBefore = st[bpf.StatRX].Packets
		n, err = attach.Open(attach.Options{Dir: dir, Upgrade: true, Fill: func(s *bpf.Steer) error {
			rs, err := rules.Compile(set, func(name string) (int, error) {
				l, err := netlink.LinkByName(name)
				if err != nil {
					return 0, err
				}
				return l.Attrs().Index, nil
			}, 0)
			if err != nil {
				return err
			}
			return s.Apply(rs)
		}})
		if err != nil {
			t.Fatalf("upgrade: %v", err)
		}
		return nil
	})
	// The new program carries the stream now.
	waitFor(t, "the stream through the new build", func() bool {
		c, err := n.Steer.RuleCounter(1)
		return err == nil && c.Packets >= 200
	})
	close(stop)
	<-stopped
	const canaries = 20
	for range canaries {
		if _, err := canary.out.Write([]byte("canary")); err != nil {
			t.Fatal(err)
		}
	}
	// One more of the stream, behind the canaries in b's queue.
	if _, err := stream.out.Write([]byte("stream")); err != nil {
		t.Fatal(err)
	}
	sent.Add(1)
	waitFor(t, fmt.Sprintf("all %d datagrams of the stream", sent.Load()), func() bool { return stream.recv.Load() == sent.Load() })
	if got := stream.recv.Load(); got != sent.Load() {
		t.Errorf("received %d of %d datagrams", got, sent.Load())
	}
	if c, err := n.Steer.RuleCounter(2); err != nil || c.Packets != canaries || canary.recv.Load() != 0 {
		t.Errorf("canary rule counted %+v (%v) and %d arrived; want %d dropped by the new program", c, err, canary.recv.Load(), canaries)
	}

	rep := n.Upgraded
	if rep == nil || !n.Loaded {
		t.Fatalf("open: loaded=%v upgraded=%+v, want an upgrade", n.Loaded, rep)
	}
	if rep.From.Tag == rep.To.Tag || rep.From.Tag == "unknown" || rep.To.Port != 61440 || len(rep.Swapped) != 3 || len(rep.Failed) != 0 || !rep.CountersCarried {
		t.Errorf("report %+v: want two tags, port 61440, 3 swapped, none failed, counters carried", rep)
	}
	// The other build's pins have no per-interface counters (otherBuild
	// pins the maps of the layout before them): it is upgraded all the
	// same, its verdict counters carried, and the new map counts b from
	// the upgrade on.
	if rep.IfaceCountersCarried {
		t.Errorf("report %+v: per-interface counters carried from pins that have none", rep)
	}
	ifs, err := n.Steer.IfaceStats()
	if err != nil {
		t.Fatal(err)
	}
	var bIndex uint32
	testenv.InNetNS(t, nsB, func() error {
		l, err := netlink.LinkByName("b")
		if err == nil {
			bIndex = uint32(l.Attrs().Index)
		}
		return err
	})
	if c := ifs[bIndex]; c == nil || c[bpf.StatDrop].Packets != canaries {
		t.Errorf("per-interface counters %v: want b (ifindex %d) to have counted the %d canaries dropped by the new program", ifs, bIndex, canaries)
	}
	if _, err := os.Stat(filepath.Join(dir, bpf.PinIfaceStats)); err != nil {
		t.Errorf("the upgraded pins have no %s: %v", bpf.PinIfaceStats, err)
	}
	st, err := n.Steer.Stats()
	if err != nil {
		t.Fatal(err)
	}
	// Every datagram crossed b once, counted by the old program or the new
	// one; the counts went over (but for the few increments the new program
	// makes in the microseconds the carry reads and writes rx's slot).
	if rx := st[bpf.StatRX].Packets; rx < rxBefore+200 || rx < uint64(sent.Load())*9/10 {
		t.Errorf("rx after the upgrade %d, want the old program's %d and the new one's, all of the %d sent", rx, rxBefore, sent.Load())
	}
	testenv.InNetNS(t, nsB, func() error {
		wantNew(t, n, "b")
		for _, id := range running(t, dir, "b") {
			if id == oldXDP {
				t.Errorf("b still runs the old XDP program %d", id)
			}
		}
		return nil
	})
	// The old pins are gone: only the new directory is left.
	left, err := filepath.Glob(dir + "?*")
	if err != nil || len(left) != 0 {
		t.Errorf("pin directories left beside %s: %v (%v)", dir, left, err)
	}
	pinned, err := ebpf.LoadPinnedProgram(filepath.Join(dir, bpf.PinProgXDP), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Close()
	if id := idOf(t, pinned); id != idOf(t, n.Steer.XDP) {
		t.Errorf("pinned xdp_steer is program %d, want the new %d", id, idOf(t, n.Steer.XDP))
	}
	// A restart adopts the upgraded pins.
	n.Close()
	testenv.InNetNS(t, nsB, func() error {
		m, err := attach.Open(attach.Options{Dir: dir})
		if err != nil {
			t.Fatalf("open after the upgrade: %v", err)
		}
		defer m.Close()
		if m.Loaded || m.Upgraded != nil {
			t.Errorf("open after the upgrade: loaded=%v upgraded=%+v, want adopted untouched", m.Loaded, m.Upgraded)
		}
		return nil
	})
}

// TestUpgradeInterrupted: an upgrade that fails before its commit point (the
// rule set does not fill) leaves the old pins as they were, every hook on
// the old programs; one that dies right after it leaves the new pins in
// place with the hooks still on the old programs, and the next Open, by any
// caller of this build, swaps them and removes what the dead one left.
func TestUpgradeInterrupted(t *testing.T) {
	dir := filepath.Join(testenv.BPFFS(t), "lovelock")
	_, nsB, oldXDP := setup(t, dir)
	testenv.InNetNS(t, nsB, func() error {
		before := running(t, dir, "b")
		_, err := attach.Open(attach.Options{Dir: dir, Upgrade: true, Fill: func(*bpf.Steer) error { return errors.New("no such interface") }})
		if err == nil {
			t.Fatal("upgrade with a failing fill succeeded")
		}
		if got := running(t, dir, "b"); fmt.Sprint(got) != fmt.Sprint(before) || got[attach.HookXDP] != oldXDP {
			t.Errorf("after a failed upgrade b runs %v, want the old %v", got, before)
		}
		if left, _ := filepath.Glob(dir + "?*"); len(left) != 0 {
			t.Errorf("a failed upgrade left %v", left)
		}
		if _, err := attach.Open(attach.Options{Dir: dir}); !errors.Is(err, bpf.ErrStale) {
			t.Errorf("open after a failed upgrade: %v, want the old pins (ErrStale)", err)
		}

		attach.SetCrashAfterCommit(true)
		_, err = attach.Open(attach.Options{Dir: dir, Upgrade: true})
		attach.SetCrashAfterCommit(false)
		if err == nil {
			t.Fatal("crashed upgrade succeeded")
		}
		if got := running(t, dir, "b"); got[attach.HookXDP] != oldXDP {
			t.Errorf("right after the commit point b runs %v, want the old XDP program %d still", got, oldXDP)
		}
		n, err := attach.Open(attach.Options{Dir: dir})
		if err != nil {
			t.Fatalf("open after a crash past the commit point: %v", err)
		}
		defer n.Close()
		if n.Loaded || n.Upgraded == nil || len(n.Upgraded.Swapped) != 3 || len(n.Upgraded.Failed) != 0 {
			t.Errorf("open after the crash: loaded=%v report=%+v, want adopted with 3 hooks swapped", n.Loaded, n.Upgraded)
		}
		wantNew(t, n, "b")
		if left, _ := filepath.Glob(dir + "?*"); len(left) != 0 {
			t.Errorf("the crashed upgrade's old pins are left: %v", left)
		}
		return nil
	})
}
