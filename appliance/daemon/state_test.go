package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// unwritable points d's state file where it cannot be written (under a
// regular file: root writes anywhere else) until the test calls the
// returned func.
func unwritable(t *testing.T, d *Daemon) (restore func()) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	path := d.cfg.State
	d.cfg.State = filepath.Join(file, "state.json")
	return func() { d.cfg.State = path }
}

// wantSaveError checks that err is a failed state file write that says
// what to do.
func wantSaveError(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), "the state file was not written") || !strings.Contains(err.Error(), "the next change writes") {
		t.Errorf("%s with the state file unwritable: %v, want the failed write and what to do", what, err)
	}
}

// TestSaveFailsStateFollows: a change whose state file write fails is
// live, and lovelockd's state must follow it: a later swap (a service
// binding, an operator's rule add) starts from it, not from the set before,
// and the link events re-attach what it asks for, not what it removed. The
// next change writes the state file once it can.
func TestSaveFailsStateFollows(t *testing.T) {
	drop := func(name string, port int) rules.Set {
		t.Helper()
		set, err := rules.Parse(fmt.Appendf(nil, "rules: [{name: %s, priority: 1, match: {proto: udp, dport: %d}, action: drop}]\n", name, port))
		if err != nil {
			t.Fatal(err)
		}
		return *set
	}
	// verdicts runs a datagram to each port through the XDP program: 1
	// is dropped, 2 passed.
	verdicts := func(t *testing.T, d *Daemon, ports ...uint16) []uint32 {
		t.Helper()
		var out []uint32
		for _, p := range ports {
			ret, err := d.node.Steer.XDP.Run(&ebpf.RunOptions{Data: testenv.UDPFrame(p)})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, ret)
		}
		return out
	}
	names := func(s rules.Set) []string {
		var out []string
		for _, r := range s.Rules {
			out = append(out, r.Name)
		}
		return out
	}

	t.Run("rules", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			// later is the swap after the failed write, the state file
			// writable again; want the operator's rules then.
			later func(t *testing.T, d *Daemon) error
			want  []string
			// ports 7000, 7001, 7002: 1 dropped, 2 passed.
			verdicts []uint32
		}{
			{name: "a service binds", later: func(t *testing.T, d *Daemon) error {
				own := drop(api.OwnedRulePrefix+"svc", 7002).Rules
				own[0].Priority = api.OwnedPriority
				_, err := steering{d}.Reserve("svc", own)
				return err
			}, want: []string{"b"}, verdicts: []uint32{2, 1, 1}},
			{name: "rule add", later: func(t *testing.T, d *Daemon) error {
				_, err := d.AddRule(drop("c", 7002).Rules[0])
				return err
			}, want: []string{"b", "c"}, verdicts: []uint32{2, 1, 1}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				cfg, _ := tempConfig(t)
				cfg.Metrics = ""
				d, err := New(cfg, slog.New(slog.DiscardHandler))
				if err != nil {
					t.Fatal(err)
				}
				defer d.Close()
				if _, err := d.ApplyRules(drop("a", 7000)); err != nil {
					t.Fatal(err)
				}
				restore := unwritable(t, d)
				_, err = d.ApplyRules(drop("b", 7001))
				wantSaveError(t, "ApplyRules", err)
				if got := verdicts(t, d, 7000, 7001); !slices.Equal(got, []uint32{2, 1}) {
					t.Fatalf("after the failed write: verdicts %v for 7000, 7001; want b's set live", got)
				}
				restore()
				if err := tc.later(t, d); err != nil {
					t.Fatal(err)
				}
				if got := verdicts(t, d, 7000, 7001, 7002); !slices.Equal(got, tc.verdicts) {
					t.Errorf("verdicts %v for 7000, 7001, 7002, want %v (b's set, not a's, and the change)", got, tc.verdicts)
				}
				d.mu.Lock()
				op := names(d.state.Rules)
				d.mu.Unlock()
				if !slices.Equal(op, tc.want) {
					t.Errorf("operator's rules %v, want %v", op, tc.want)
				}
			})
		}
		// The next change through the API writes the whole state.
		cfg, _ := tempConfig(t)
		cfg.Metrics = ""
		d, err := New(cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		restore := unwritable(t, d)
		_, err = d.ApplyRules(drop("b", 7001))
		wantSaveError(t, "ApplyRules", err)
		restore()
		if _, err := d.AddRule(drop("c", 7002).Rules[0]); err != nil {
			t.Fatal(err)
		}
		st, err := LoadState(cfg.State)
		if err != nil {
			t.Fatal(err)
		}
		if got := names(st.Rules); !st.HasRules || !slices.Equal(got, []string{"b", "c"}) {
			t.Errorf("state file after the next change: has_rules %v, rules %v; want b and c", st.HasRules, got)
		}
	})

	t.Run("attachments", func(t *testing.T) {
		v0 := attach.Attachment{Iface: "v0", Hook: attach.HookXDP, Mode: attach.ModeGeneric}
		attachV0 := func(d *Daemon) error { _, err := d.Attach(v0); return err }
		for _, tc := range []struct {
			name string
			// before is done with the state file writable, change with
			// it unwritable; want is whether v0's XDP must run after v0
			// is re-created and its link event handled.
			before, change func(d *Daemon) error
			want           bool
		}{
			{name: "attach", change: attachV0, want: true},
			{name: "detach", before: attachV0, change: func(d *Daemon) error { return d.Detach("v0", attach.HookXDP) }, want: false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				cfg, _ := tempConfig(t)
				cfg.Metrics = ""
				ns := testenv.NewNetNS(t)
				veth := func() error {
					return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "v0"}, PeerName: "v1"})
				}
				testenv.InNetNS(t, ns, func() error {
					if err := veth(); err != nil {
						return err
					}
					d, err := New(cfg, slog.New(slog.DiscardHandler))
					if err != nil {
						return err
					}
					defer d.Close()
					if tc.before != nil {
						if err := tc.before(d); err != nil {
							return err
						}
					}
					restore := unwritable(t, d)
					err = tc.change(d)
					restore()
					wantSaveError(t, tc.name, err)
					// v0 is re-created (a driver reset): its link event
					// brings back what the state asks for.
					l, err := netlink.LinkByName("v0")
					if err != nil {
						return err
					}
					if err := netlink.LinkDel(l); err != nil {
						return err
					}
					if err := veth(); err != nil {
						return err
					}
					d.relink([]string{"v0"})
					d.mu.Lock()
					_, err = d.node.Check(v0)
					h, _, fails := d.health()
					d.mu.Unlock()
					if runs := err == nil; runs != tc.want {
						t.Errorf("v0's XDP after its re-creation: runs %v (%v), want %v", runs, err, tc.want)
					}
					if h != api.HealthOK {
						t.Errorf("health %s, failures %+v; want ok", h, fails)
					}
					return nil
				})
			})
		}
	})
}
