package attach_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

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

// TestEnsureAdoptDetach walks a daemon's life: first start loads and
// attaches, a restart adopts the pins untouched, detach removes one link.
func TestEnsureAdoptDetach(t *testing.T) {
	ns := testenv.NewNetNS(t)
	dir := filepath.Join(testenv.BPFFS(t), "lovelock")
	cfg := attach.Config{Dir: dir, Interfaces: []string{"a", "b"}}

	testenv.InNetNS(t, ns, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "a"}, PeerName: "b"}); err != nil {
			return err
		}
		for _, n := range cfg.Interfaces {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}

		res, err := attach.Ensure(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Loaded || !slices.Equal(res.Attached, cfg.Interfaces) || len(res.Adopted) != 0 {
			t.Errorf("first start: %+v, want loaded and both attached", res)
		}

		res, err = attach.Ensure(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if res.Loaded || len(res.Attached) != 0 || !slices.Equal(res.Adopted, cfg.Interfaces) {
			t.Errorf("restart: %+v, want both adopted and nothing loaded", res)
		}

		if err := attach.Detach(dir, "a"); err != nil {
			t.Fatal(err)
		}
		if on, err := xdpAttached("a"); err != nil || on {
			t.Errorf("a after detach: attached=%v err=%v", on, err)
		}
		if on, err := xdpAttached("b"); err != nil || !on {
			t.Errorf("b after detaching a: attached=%v err=%v", on, err)
		}
		if err := attach.Detach(dir, "a"); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("second detach: %v, want ErrNotExist", err)
		}
		return nil
	})
}

func TestEnsureBadInput(t *testing.T) {
	ns := testenv.NewNetNS(t)
	bpffs := testenv.BPFFS(t)
	for _, tc := range []struct {
		name string
		cfg  attach.Config
		want string
	}{
		{"unknown interface", attach.Config{Dir: filepath.Join(bpffs, "x"), Interfaces: []string{"nope0"}}, "interface nope0"},
		{"bad mode", attach.Config{Dir: filepath.Join(bpffs, "y"), Mode: "turbo"}, `xdp mode "turbo"`},
		{"not bpffs", attach.Config{Dir: t.TempDir()}, "not on a bpffs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.InNetNS(t, ns, func() error {
				_, err := attach.Ensure(tc.cfg)
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("err = %v, want it to mention %q", err, tc.want)
				}
				// A refused config leaves nothing pinned behind.
				if entries, _ := os.ReadDir(tc.cfg.Dir); len(entries) != 0 {
					t.Errorf("pin dir %s holds %d entries after a refused config", tc.cfg.Dir, len(entries))
				}
				return nil
			})
		})
	}
}
