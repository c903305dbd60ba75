package main

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	llnetns "github.com/lovelock-dpu/lovelock/control/netns"
)

// testbed is gen ⇄ dut ⇄ sink: three fresh, anonymous network namespaces
// joined by two veth pairs, each end with one queue and IPv6 off (no DAD or
// router solicitations in the counts).
//
//	gen: <p>g ⇄ <p>i :dut: <p>e ⇄ <p>s :sink
//
// The namespaces are anonymous: they never show in `ip netns list`, and they
// die with the last file descriptor on them, so even a killed process leaves
// no namespace, and no veth (a veth goes with its namespace), behind. Close
// still deletes the links and closes the handles at once.
type testbed struct {
	gen, dut, sink netns.NsHandle
	handles        []*netlink.Handle

	genIf, inIf, outIf, sinkIf iface
}

type iface struct {
	ns    netns.NsHandle
	name  string
	index int
	mac   net.HardwareAddr
}

func newTestbed(prefix string) (tb *testbed, err error) {
	tb = &testbed{gen: netns.None(), dut: netns.None(), sink: netns.None()}
	defer func() {
		if err != nil {
			err = errors.Join(err, tb.Close())
			tb = nil
		}
	}()
	for _, ns := range []*netns.NsHandle{&tb.gen, &tb.dut, &tb.sink} {
		if *ns, err = newNetNS(); err != nil {
			return nil, err
		}
	}
	if tb.genIf, tb.inIf, err = tb.veth(tb.gen, prefix+"g", tb.dut, prefix+"i"); err != nil {
		return nil, err
	}
	if tb.outIf, tb.sinkIf, err = tb.veth(tb.dut, prefix+"e", tb.sink, prefix+"s"); err != nil {
		return nil, err
	}
	return tb, nil
}

// newNetNS creates an anonymous network namespace with lo up and IPv6 off
// for the interfaces created in it later.
func newNetNS() (netns.NsHandle, error) {
	orig, err := netns.Get()
	if err != nil {
		return netns.None(), fmt.Errorf("get current netns: %w", err)
	}
	defer orig.Close()
	ns := netns.None()
	// netns.New moves the calling thread; Do moves it back.
	err = llnetns.Do(orig, func() error {
		if ns, err = netns.New(); err != nil {
			return fmt.Errorf("new netns: %w", err)
		}
		for _, k := range []string{"all", "default"} {
			err := os.WriteFile("/proc/sys/net/ipv6/conf/"+k+"/disable_ipv6", []byte("1"), 0)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("disable IPv6: %w", err)
			}
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return fmt.Errorf("lo: %w", err)
		}
		return netlink.LinkSetUp(lo)
	})
	if err != nil {
		if ns.IsOpen() {
			ns.Close()
		}
		return netns.None(), err
	}
	return ns, nil
}

func (tb *testbed) handle(ns netns.NsHandle) (*netlink.Handle, error) {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink handle: %w", err)
	}
	tb.handles = append(tb.handles, h)
	return h, nil
}

// veth creates a in nsA and its peer b in nsB, one queue each, both up.
func (tb *testbed) veth(nsA netns.NsHandle, a string, nsB netns.NsHandle, b string) (ia, ib iface, err error) {
	ha, err := tb.handle(nsA)
	if err != nil {
		return ia, ib, err
	}
	hb, err := tb.handle(nsB)
	if err != nil {
		return ia, ib, err
	}
	v := &netlink.Veth{
		LinkAttrs:       netlink.LinkAttrs{Name: a, NumTxQueues: 1, NumRxQueues: 1},
		PeerName:        b,
		PeerNumTxQueues: 1,
		PeerNumRxQueues: 1,
		PeerNamespace:   netlink.NsFd(int(nsB)),
	}
	if err := ha.LinkAdd(v); err != nil {
		return ia, ib, fmt.Errorf("add veth %s ⇄ %s: %w", a, b, err)
	}
	// up returns the interface named even on error, so that Close deletes
	// the pair (through a) whatever fails here.
	up := func(h *netlink.Handle, ns netns.NsHandle, name string) (iface, error) {
		f := iface{ns: ns, name: name}
		l, err := h.LinkByName(name)
		if err != nil {
			return f, fmt.Errorf("veth %s: %w", name, err)
		}
		if err := h.LinkSetUp(l); err != nil {
			return f, fmt.Errorf("veth %s up: %w", name, err)
		}
		return iface{ns: ns, name: name, index: l.Attrs().Index, mac: l.Attrs().HardwareAddr}, nil
	}
	if ia, err = up(ha, nsA, a); err != nil {
		return ia, ib, err
	}
	ib, err = up(hb, nsB, b)
	return ia, ib, err
}

// attach attaches prog to the interface in native (driver) mode.
func (f iface) attach(prog *ebpf.Program) (link.Link, error) {
	var l link.Link
	err := llnetns.Do(f.ns, func() error {
		var err error
		l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: f.index, Flags: link.XDPDriverMode})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("attach XDP (native) to %s: %w", f.name, err)
	}
	return l, nil
}

// linkStats reads the interface's counters (drops, mostly).
func (f iface) linkStats() (*netlink.LinkStatistics, error) {
	h, err := netlink.NewHandleAt(f.ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	l, err := h.LinkByName(f.name)
	if err != nil {
		return nil, err
	}
	if l.Attrs().Statistics == nil {
		return nil, fmt.Errorf("%s: no statistics", f.name)
	}
	return l.Attrs().Statistics, nil
}

// Close deletes the veth pairs (deleting one end removes the other) and
// closes every handle; the namespaces go with the last reference to them.
func (tb *testbed) Close() error {
	var errs []error
	if len(tb.handles) > 0 {
		for _, f := range []iface{tb.genIf, tb.outIf} {
			if f.name == "" {
				continue
			}
			h, err := netlink.NewHandleAt(f.ns)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if l, err := h.LinkByName(f.name); err == nil {
				if err := h.LinkDel(l); err != nil {
					errs = append(errs, fmt.Errorf("delete %s: %w", f.name, err))
				}
			}
			h.Close()
		}
	}
	for _, h := range tb.handles {
		h.Close()
	}
	tb.handles = nil
	for _, ns := range []*netns.NsHandle{&tb.gen, &tb.dut, &tb.sink} {
		if ns.IsOpen() {
			if err := ns.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		*ns = netns.None()
	}
	return errors.Join(errs...)
}
