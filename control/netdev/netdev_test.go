package netdev

import (
	"errors"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/control/testenv"
)

func TestXDPFeaturesString(t *testing.T) {
	for f, want := range map[XDPFeatures]string{
		0:                                     "none",
		XDPBasic | XDPRedirect | XDPNdoXmit:   "basic,redirect,ndo-xmit",
		XDPRxSG | XDPNdoXmitSG | 1<<9:         "rx-sg,ndo-xmit-sg,0x200",
		XDPXskZerocopy | XDPHwOffload | 1<<60: "xsk-zerocopy,hw-offload,0x1000000000000000",
	} {
		if got := f.String(); got != want {
			t.Errorf("%#x: %q, want %q", uint64(f), got, want)
		}
	}
}

// TestDevXDPFeatures asks this kernel about devices in a namespace of the
// test's: a veth transmits XDP frames (ndo-xmit) only while its peer runs
// an XDP program in native mode, a bridge has no XDP at all, and an
// ifindex with no device is an error. A kernel before 6.3 has no netdev
// family: every question is ErrNoFamily (make image-bpf-test-older runs
// this on Debian's 6.1).
func TestDevXDPFeatures(t *testing.T) {
	ns := testenv.NewNetNS(t)
	vIdx, _ := testenv.VethPair(t, testenv.VethEnd{NS: ns, Name: "v0"}, testenv.VethEnd{NS: ns, Name: "v1"})
	if !testenv.KernelAtLeast(t, 6, 3) {
		testenv.InNetNS(t, ns, func() error {
			for _, idx := range []int{vIdx, 1 << 30} {
				if f, err := DevXDPFeatures(idx); !errors.Is(err, ErrNoFamily) {
					t.Errorf("ifindex %d before 6.3: %v, %v; want ErrNoFamily", idx, f, err)
				}
			}
			return nil
		})
		return
	}
	testenv.InNetNS(t, ns, func() error {
		feat := func(ifindex int) XDPFeatures {
			t.Helper()
			f, err := DevXDPFeatures(ifindex)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
		if f := feat(vIdx); f&XDPNdoXmit != 0 || f&XDPRedirect == 0 {
			t.Errorf("veth whose peer runs no XDP program: %v, want redirect without ndo-xmit", f)
		}
		testenv.XDPPassOn(t, ns, "v1")
		if f := feat(vIdx); f&XDPNdoXmit == 0 {
			t.Errorf("veth whose peer runs an XDP program: %v, want ndo-xmit", f)
		}
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}); err != nil {
			return err
		}
		br, err := netlink.LinkByName("br0")
		if err != nil {
			return err
		}
		if f := feat(br.Attrs().Index); f != 0 {
			t.Errorf("bridge: %v, want none", f)
		}
		if _, err := DevXDPFeatures(1 << 30); !errors.Is(err, unix.ENODEV) {
			t.Errorf("no such ifindex: %v, want ENODEV", err)
		}
		return nil
	})
}
