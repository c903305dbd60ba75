package attach_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/control/testenv"
)

func xdpAttached(name string) (bool, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return false, err
	}
	return l.Attrs().Xdp != nil && l.Attrs().Xdp.Attached, nil
}

// vethAB creates the pair a ⇄ b in ns, both up.
func vethAB(t *testing.T, ns netns.NsHandle) {
	t.Helper()
	testenv.VethPair(t, testenv.VethEnd{NS: ns, Name: "a"}, testenv.VethEnd{NS: ns, Name: "b"})
}

// TestOpenAdoptDetach walks a daemon's life: the first start loads, pins and
// attaches; a restart adopts the pins untouched; detach removes one link.
func TestOpenAdoptDetach(t *testing.T) {
	ns := testenv.NewNetNS(t)
	dir := filepath.Join(testenv.BPFFS(t), "lovelock")

	vethAB(t, ns)
	testenv.InNetNS(t, ns, func() error {
		n, err := attach.Open(attach.Options{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		if !n.Loaded {
			t.Error("first open adopted, want loaded")
		}
		// A second writer is refused while the first holds the lock.
		if _, err := attach.Open(attach.Options{Dir: dir}); err == nil || !strings.Contains(err.Error(), "another lovelockd") {
			t.Errorf("second open: %v, want a lock error", err)
		}
		for _, a := range []attach.Attachment{{Iface: "a", Hook: attach.HookXDP}, {Iface: "b", Hook: attach.HookXDP}, {Iface: "a", Hook: attach.HookTCEgress}} {
			if adopted, err := n.Attach(a); err != nil || adopted {
				t.Fatalf("attach %+v: adopted=%v err=%v", a, adopted, err)
			}
		}
		n.Close()

		n, err = attach.Open(attach.Options{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		if n.Loaded {
			t.Error("restart loaded, want adopted")
		}
		if adopted, err := n.Attach(attach.Attachment{Iface: "a", Hook: attach.HookXDP}); err != nil || !adopted {
			t.Errorf("re-attach: adopted=%v err=%v, want adopted", adopted, err)
		}
		got, err := n.Attachments()
		if err != nil || len(got) != 3 {
			t.Errorf("attachments = %+v, %v; want 3", got, err)
		}

		if err := n.Detach("a", attach.HookXDP); err != nil {
			t.Fatal(err)
		}
		if on, err := xdpAttached("a"); err != nil || on {
			t.Errorf("a after detach: attached=%v err=%v", on, err)
		}
		if on, err := xdpAttached("b"); err != nil || !on {
			t.Errorf("b after detaching a: attached=%v err=%v", on, err)
		}
		if err := n.Detach("a", attach.HookXDP); !errors.Is(err, attach.ErrNotAttached) {
			t.Errorf("second detach: %v, want ErrNotAttached", err)
		}
		return nil
	})
}

// TestOpenStale plants a pin directory whose program is not this build's:
// Open must refuse it and leave it exactly as it was.
func TestOpenStale(t *testing.T) {
	dir := filepath.Join(testenv.BPFFS(t), "lovelock")
	n, err := attach.Open(attach.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
	// Swap the XDP program pin for another program: an "older version".
	xdp := filepath.Join(dir, bpf.PinProgXDP)
	if err := os.Remove(xdp); err != nil {
		t.Fatal(err)
	}
	old, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.XDP,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()},
		License:      "GPL",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := old.Pin(xdp); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadDir(dir)
	_, err = attach.Open(attach.Options{Dir: dir})
	if !errors.Is(err, bpf.ErrStale) {
		t.Fatalf("open stale: %v, want ErrStale", err)
	}
	after, _ := os.ReadDir(dir)
	if len(before) != len(after) {
		t.Errorf("stale open changed the pin dir: %d entries before, %d after", len(before), len(after))
	}
}

func TestOpenBadInput(t *testing.T) {
	bpffs := testenv.BPFFS(t)
	ns := testenv.NewNetNS(t)
	t.Run("not bpffs", func(t *testing.T) {
		_, err := attach.Open(attach.Options{Dir: filepath.Join(t.TempDir(), "lovelock")})
		if !errors.Is(err, attach.ErrNoBPFFS) {
			t.Errorf("err = %v, want ErrNoBPFFS", err)
		}
	})
	t.Run("missing bpffs", func(t *testing.T) {
		_, err := attach.Open(attach.Options{Dir: "/nonexistent/bpf/lovelock"})
		if !errors.Is(err, attach.ErrNoBPFFS) {
			t.Errorf("err = %v, want ErrNoBPFFS", err)
		}
	})
	t.Run("unknown interface and hook", func(t *testing.T) {
		n, err := attach.Open(attach.Options{Dir: filepath.Join(bpffs, "x")})
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		testenv.InNetNS(t, ns, func() error {
			if _, err := n.Attach(attach.Attachment{Iface: "nope0", Hook: attach.HookXDP}); err == nil || !strings.Contains(err.Error(), "interface nope0") {
				t.Errorf("unknown iface: %v", err)
			}
			if _, err := n.Attach(attach.Attachment{Iface: "lo", Hook: "tc-sideways"}); err == nil || !strings.Contains(err.Error(), `hook "tc-sideways"`) {
				t.Errorf("bad hook: %v", err)
			}
			if _, err := n.Attach(attach.Attachment{Iface: "lo", Hook: attach.HookXDP, Mode: "turbo"}); err == nil || !strings.Contains(err.Error(), `xdp mode "turbo"`) {
				t.Errorf("bad mode: %v", err)
			}
			return nil
		})
		if got, _ := n.Attachments(); len(got) != 0 {
			t.Errorf("refused attachments left pins: %+v", got)
		}
	})
}

// TestOpenMissingParent: a pin directory whose parent does not exist yet
// is fine on a bpffs (Open creates it), and still "not on a bpffs mount"
// elsewhere.
func TestOpenMissingParent(t *testing.T) {
	fs := testenv.BPFFS(t)
	for _, d := range []string{filepath.Join(fs, "missing"), filepath.Join(fs, "missing", "deeper")} {
		if err := attach.CheckBPFFS(d); err != nil {
			t.Errorf("check %s under a bpffs: %v, want nil", d, err)
		}
	}
	off := filepath.Join(t.TempDir(), "missing")
	if err := attach.CheckBPFFS(off); !errors.Is(err, attach.ErrNoBPFFS) || !strings.Contains(err.Error(), "nearest existing parent") {
		t.Errorf("check %s off bpffs: %v, want ErrNoBPFFS naming the parent", off, err)
	}
	dir := filepath.Join(fs, "missing", "lovelock")
	n, err := attach.Open(attach.Options{Dir: dir})
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	defer n.Close()
	if _, err := os.Stat(filepath.Join(dir, bpf.PinProgXDP)); !n.Loaded || err != nil {
		t.Errorf("open %s: loaded=%v, pinned program: %v", dir, n.Loaded, err)
	}
}

// TestClsact attaches the TC classifier the way kernels without tcx need:
// a direct-action filter on a clsact qdisc, recorded beside the pins, adopted
// on a second attach, classifying real packets, and gone after detach.
func TestClsact(t *testing.T) {
	nsA, nsB := testenv.NewNetNS(t), testenv.NewNetNS(t)
	dir := filepath.Join(testenv.BPFFS(t), "lovelock")
	var n *attach.Node
	testenv.VethPair(t, testenv.VethEnd{NS: nsA, Name: "a", Addr: "10.98.0.1/24"}, testenv.VethEnd{NS: nsB, Name: "b"})
	testenv.InNetNS(t, nsA, func() error {
		l, err := netlink.LinkByName("a")
		if err != nil {
			return err
		}
		// A permanent neighbour: packets leave at once, no ARP.
		if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.Attrs().Index, State: netlink.NUD_PERMANENT,
			IP: net.IPv4(10, 98, 0, 2), HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0, 2}}); err != nil {
			return err
		}
		if n, err = attach.Open(attach.Options{Dir: dir}); err != nil {
			return err
		}
		a := attach.Attachment{Iface: "a", Hook: attach.HookTCEgress, Mode: attach.ModeClsact}
		if adopted, err := n.Attach(a); err != nil || adopted {
			t.Fatalf("attach: adopted=%v err=%v", adopted, err)
		}
		if adopted, err := n.Attach(a); err != nil || !adopted {
			t.Errorf("second attach: adopted=%v err=%v, want adopted", adopted, err)
		}
		filters, err := netlink.FilterList(l, netlink.HANDLE_MIN_EGRESS)
		if err != nil || len(filters) != 1 {
			t.Fatalf("egress filters = %v, %v; want one", filters, err)
		}
		got, err := n.Attachments()
		if err != nil || len(got) != 1 || got[0].Mode != attach.ModeClsact {
			t.Errorf("attachments = %+v, %v", got, err)
		}
		// Packets leaving a are classified.
		c, err := net.Dial("udp4", "10.98.0.2:9")
		if err != nil {
			return err
		}
		defer c.Close()
		for range 10 {
			c.Write([]byte("x"))
		}
		st, err := n.Steer.Stats()
		if err != nil || st[bpf.StatRX].Packets < 10 {
			t.Errorf("rx after 10 packets out of a: %+v, %v", st, err)
		}
		if err := n.Detach("a", attach.HookTCEgress); err != nil {
			t.Fatal(err)
		}
		if filters, _ := netlink.FilterList(l, netlink.HANDLE_MIN_EGRESS); len(filters) != 0 {
			t.Errorf("filters after detach: %v", filters)
		}
		if got, _ := n.Attachments(); len(got) != 0 {
			t.Errorf("attachments after detach: %+v", got)
		}
		return n.Close()
	})
}

// TestLockPerPinDir: two nodes with different pin directories under one
// bpffs open side by side (the lock was the parent's, so the second was
// refused); a second writer of the same directory is refused with an error
// that names the holder.
func TestLockPerPinDir(t *testing.T) {
	fs := testenv.BPFFS(t)
	a, err := attach.Open(attach.Options{Dir: filepath.Join(fs, "node-a")})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := attach.Open(attach.Options{Dir: filepath.Join(fs, "node-b")})
	if err != nil {
		t.Fatalf("second node with another pin dir: %v", err)
	}
	defer b.Close()
	_, err = attach.Open(attach.Options{Dir: filepath.Join(fs, "node-a")})
	if err == nil || !strings.Contains(err.Error(), "another lovelockd") ||
		!strings.Contains(err.Error(), fmt.Sprintf("pid %d (", os.Getpid())) {
		t.Errorf("second writer of node-a: %v, want a lock error naming pid %d", err, os.Getpid())
	}
}

// TestAttachModeMismatch: asking for generic XDP where native XDP is
// attached is an error that says so, not "already attached".
func TestAttachModeMismatch(t *testing.T) {
	ns := testenv.NewNetNS(t)
	dir := filepath.Join(testenv.BPFFS(t), "lovelock")
	vethAB(t, ns)
	testenv.InNetNS(t, ns, func() error {
		n, err := attach.Open(attach.Options{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		if _, err := n.Attach(attach.Attachment{Iface: "a", Hook: attach.HookXDP, Mode: attach.ModeNative}); err != nil {
			t.Fatal(err)
		}
		_, err = n.Attach(attach.Attachment{Iface: "a", Hook: attach.HookXDP, Mode: attach.ModeGeneric})
		if err == nil || !strings.Contains(err.Error(), "already attached in native mode, not generic") {
			t.Errorf("generic over native: err = %v, want a mode mismatch", err)
		}
		for _, m := range []attach.Mode{attach.ModeNative, ""} {
			if adopted, err := n.Attach(attach.Attachment{Iface: "a", Hook: attach.HookXDP, Mode: m}); err != nil || !adopted {
				t.Errorf("mode %q over native: adopted=%v err=%v, want adopted", m, adopted, err)
			}
		}
		return nil
	})
}

// TestAttachXDPHeldElsewhere: another tool's XDP program holds the hook.
// The attach error must say how to free it: a program attached through
// netlink goes with 'ip link set IFACE xdp off', but one a BPF link holds
// does not (the kernel refuses with EBUSY), so the error names the link and
// its program and says to remove its pin or stop its holder.
func TestAttachXDPHeldElsewhere(t *testing.T) {
	for _, tc := range []struct {
		name string
		// hold attaches prog to l outside lovelockd's pin directory and
		// returns what the error must say and must not.
		hold func(t *testing.T, l netlink.Link, prog *ebpf.Program) (want []string, not string)
	}{
		{name: "BPF link", hold: func(t *testing.T, l netlink.Link, prog *ebpf.Program) ([]string, string) {
			fl, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: l.Attrs().Index, Flags: link.XDPDriverMode})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { fl.Close() })
			info, err := fl.Info()
			if err != nil {
				t.Fatal(err)
			}
			return []string{fmt.Sprintf("BPF link %d holds XDP there, with program %d \"other_xdp\"", info.ID, info.Program),
				"remove the link's pin in bpffs or stop the process that holds it"}, "xdp off' removes it"
		}},
		{name: "netlink", hold: func(t *testing.T, l netlink.Link, prog *ebpf.Program) ([]string, string) {
			if err := netlink.LinkSetXdpFdWithFlags(l, prog.FD(), nl.XDP_FLAGS_DRV_MODE); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { netlink.LinkSetXdpFdWithFlags(l, -1, nl.XDP_FLAGS_DRV_MODE) })
			return []string{"not attached through a BPF link", "'ip link set a xdp off' removes it"}, "BPF link "
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := testenv.NewNetNS(t)
			dir := filepath.Join(testenv.BPFFS(t), "lovelock")
			vethAB(t, ns)
			other, err := ebpf.NewProgram(&ebpf.ProgramSpec{
				Name: "other_xdp", Type: ebpf.XDP, License: "GPL",
				Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()},
			})
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			testenv.InNetNS(t, ns, func() error {
				l, err := netlink.LinkByName("a")
				if err != nil {
					return err
				}
				want, not := tc.hold(t, l, other)
				n, err := attach.Open(attach.Options{Dir: dir})
				if err != nil {
					return err
				}
				defer n.Close()
				_, err = n.Attach(attach.Attachment{Iface: "a", Hook: attach.HookXDP})
				if err == nil {
					return fmt.Errorf("attach where another program holds XDP: no error")
				}
				for _, w := range want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("attach error %q does not say %q", err, w)
					}
				}
				if strings.Contains(err.Error(), not) {
					t.Errorf("attach error %q says %q", err, not)
				}
				return nil
			})
		})
	}
}

// TestAdoptRecreatedInterface: the interfaces are deleted and created again
// (a driver reset, a representor re-created) while the links stay pinned.
// The pins then run on nothing: Check must say so, and a restart's attach
// must replace them rather than adopt them, so the classifier runs on the
// new interfaces again.
func TestAdoptRecreatedInterface(t *testing.T) {
	ns := testenv.NewNetNS(t)
	dir := filepath.Join(testenv.BPFFS(t), "lovelock")
	vethAB(t, ns)
	testenv.InNetNS(t, ns, func() error {
		n, err := attach.Open(attach.Options{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		atts := []attach.Attachment{
			{Iface: "a", Hook: attach.HookXDP},
			{Iface: "a", Hook: attach.HookTCEgress},
			{Iface: "b", Hook: attach.HookTCIngress, Mode: attach.ModeClsact},
		}
		for _, a := range atts {
			if _, err := n.Attach(a); err != nil {
				t.Fatalf("attach %+v: %v", a, err)
			}
			if _, err := n.Check(a); err != nil {
				t.Errorf("check %+v right after attach: %v", a, err)
			}
		}
		n.Close()

		// Delete the pair: the links lose their interface.
		old, err := netlink.LinkByName("a")
		if err != nil {
			return err
		}
		if err := netlink.LinkDel(old); err != nil {
			return err
		}
		n, err = attach.Open(attach.Options{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		for _, a := range atts {
			if _, err := n.Check(a); !errors.Is(err, attach.ErrDefunct) {
				t.Errorf("check %+v with its interface gone: %v, want ErrDefunct", a, err)
			}
			// Nothing to attach to: an error, and the pin stays to say
			// what was asked for.
			if out, err := n.Reattach(a); !errors.Is(err, attach.ErrDefunct) {
				t.Errorf("attach %+v with its interface gone: %v %v, want ErrDefunct", a, out, err)
			}
		}
		st, err := n.Status()
		if err != nil || len(st) != len(atts) {
			t.Fatalf("status = %+v, %v; want %d entries", st, err, len(atts))
		}
		for _, s := range st {
			if s.Live || s.Problem == "" {
				t.Errorf("status of %s %s with its interface gone: live=%v problem=%q", s.Iface, s.Hook, s.Live, s.Problem)
			}
		}

		// The interfaces come back under the same names, new ifindexes
		// (VethPair enters ns itself, from this thread already in it).
		vethAB(t, ns)
		if on, err := xdpAttached("a"); err != nil || on {
			t.Fatalf("re-created a has XDP before any attach: %v %v", on, err)
		}
		for _, a := range atts {
			if _, err := n.Check(a); !errors.Is(err, attach.ErrDefunct) {
				t.Errorf("check %+v on the re-created interface: %v, want ErrDefunct", a, err)
			}
			out, err := n.Reattach(a)
			if err != nil || out != attach.Replaced {
				t.Errorf("attach %+v on the re-created interface: %v %v, want replaced", a, out, err)
			}
			if _, err := n.Check(a); err != nil {
				t.Errorf("check %+v after replacing: %v", a, err)
			}
			if out, err := n.Reattach(a); err != nil || out != attach.Adopted {
				t.Errorf("second attach %+v: %v %v, want adopted", a, out, err)
			}
		}
		if on, err := xdpAttached("a"); err != nil || !on {
			t.Errorf("re-created a after attach: XDP attached=%v err=%v", on, err)
		}
		b, err := netlink.LinkByName("b")
		if err != nil {
			return err
		}
		if filters, err := netlink.FilterList(b, netlink.HANDLE_MIN_INGRESS); err != nil || len(filters) != 1 {
			t.Errorf("re-created b's ingress filters: %v %v, want one", filters, err)
		}
		return nil
	})
}

// TestDetachClsactGone: a clsact attachment whose interface was deleted
// detaches (its filter went with the interface; the marker goes now) rather
// than failing on the missing interface and leaving the node degraded.
func TestDetachClsactGone(t *testing.T) {
	ns := testenv.NewNetNS(t)
	dir := filepath.Join(testenv.BPFFS(t), "lovelock")
	vethAB(t, ns)
	testenv.InNetNS(t, ns, func() error {
		n, err := attach.Open(attach.Options{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		hooks := []attach.Hook{attach.HookTCIngress, attach.HookTCEgress}
		for _, h := range hooks {
			if _, err := n.Attach(attach.Attachment{Iface: "a", Hook: h, Mode: attach.ModeClsact}); err != nil {
				t.Fatalf("attach %s: %v", h, err)
			}
		}
		l, err := netlink.LinkByName("a")
		if err != nil {
			return err
		}
		if err := netlink.LinkDel(l); err != nil {
			return err
		}
		for _, h := range hooks {
			if err := n.Detach("a", h); err != nil {
				t.Errorf("detach %s with the interface gone: %v", h, err)
			}
		}
		if got, err := n.Attachments(); err != nil || len(got) != 0 {
			t.Errorf("attachments after detach: %+v, %v; want none", got, err)
		}
		if err := n.Detach("a", attach.HookTCIngress); !errors.Is(err, attach.ErrNotAttached) {
			t.Errorf("second detach: %v, want ErrNotAttached", err)
		}
		return nil
	})
}

// TestOpenPortMismatch: pins loaded for one Lovelock port are refused by a
// node configured for another (the port is a load-time constant the tag
// check cannot see), and left as they were.
func TestOpenPortMismatch(t *testing.T) {
	dir := filepath.Join(testenv.BPFFS(t), "lovelock")
	n, err := attach.Open(attach.Options{Dir: dir, Port: 61440})
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
	before, _ := os.ReadDir(dir)
	_, err = attach.Open(attach.Options{Dir: dir, Port: 5555})
	if !errors.Is(err, attach.ErrPortMismatch) || !strings.Contains(err.Error(), "port 61440") || !strings.Contains(err.Error(), "configured for 5555") {
		t.Fatalf("open 61440 pins for port 5555: %v, want ErrPortMismatch naming both ports", err)
	}
	after, _ := os.ReadDir(dir)
	if len(before) != len(after) {
		t.Errorf("refused open changed the pin dir: %d entries before, %d after", len(before), len(after))
	}
	for _, port := range []uint16{61440, 0} {
		n, err := attach.Open(attach.Options{Dir: dir, Port: port})
		if err != nil {
			t.Fatalf("open with port %d: %v", port, err)
		}
		if n.Loaded {
			t.Errorf("open with port %d loaded, want adopted", port)
		}
		n.Close()
	}
}

// TestNativeXDP: an XDP attachment runs the classifier in native XDP when
// asked in native mode, or in none unless the kernel runs a generic program
// on the interface (a link of no mode adopts any); generic and TC ones do
// not.
func TestNativeXDP(t *testing.T) {
	ns := testenv.NewNetNS(t)
	testenv.VethPair(t, testenv.VethEnd{NS: ns, Name: "n0"}, testenv.VethEnd{NS: ns, Name: "g0"})
	testenv.XDPPassGenericOn(t, ns, "g0")
	testenv.InNetNS(t, ns, func() error {
		for _, tc := range []struct {
			a    attach.Attachment
			want bool
		}{
			{attach.Attachment{Iface: "n0", Hook: attach.HookXDP, Mode: attach.ModeNative}, true},
			{attach.Attachment{Iface: "n0", Hook: attach.HookXDP}, true},
			{attach.Attachment{Iface: "absent0", Hook: attach.HookXDP}, true},
			{attach.Attachment{Iface: "g0", Hook: attach.HookXDP}, false},
			{attach.Attachment{Iface: "g0", Hook: attach.HookXDP, Mode: attach.ModeNative}, true},
			{attach.Attachment{Iface: "n0", Hook: attach.HookXDP, Mode: attach.ModeGeneric}, false},
			{attach.Attachment{Iface: "n0", Hook: attach.HookTCIngress}, false},
			{attach.Attachment{Iface: "n0", Hook: attach.HookTCEgress, Mode: attach.ModeClsact}, false},
		} {
			if got := tc.a.NativeXDP(); got != tc.want {
				t.Errorf("%+v: NativeXDP %v, want %v", tc.a, got, tc.want)
			}
		}
		return nil
	})
}
