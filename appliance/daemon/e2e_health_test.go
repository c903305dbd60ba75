package daemon_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/control/testbed"
)

// recreate deletes iface in node (its veth peer goes with it, as with a
// driver reset or a representor re-created) and has the testbed build it
// again: same name, same addresses, a new ifindex.
func recreate(t *testing.T, spec testbed.Spec, node, iface string) (before, after int) {
	t.Helper()
	err := spec.Run(node, func() error {
		l, err := netlink.LinkByName(iface)
		if err != nil {
			return err
		}
		before = l.Attrs().Index
		return netlink.LinkDel(l)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := testbed.Up(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	after = ifindex(t, spec, node, iface)
	if after == before {
		t.Fatalf("%s in %s kept ifindex %d", iface, node, after)
	}
	return before, after
}

func ifindex(t *testing.T, spec testbed.Spec, node, iface string) (idx int) {
	t.Helper()
	if err := spec.Run(node, func() error {
		l, err := netlink.LinkByName(iface)
		if err == nil {
			idx = l.Attrs().Index
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return idx
}

// xdpProg is the id of the XDP program the kernel runs on iface in node
// (what 'ip link' shows), 0 for none.
func xdpProg(t *testing.T, spec testbed.Spec, node, iface string) (id uint32) {
	t.Helper()
	if err := spec.Run(node, func() error {
		l, err := netlink.LinkByName(iface)
		if err == nil && l.Attrs().Xdp != nil && l.Attrs().Xdp.Attached {
			id = l.Attrs().Xdp.ProgId
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return id
}

// classifies checks that the classifier runs on dpu0's pf0hpf: datagrams
// from host0 to a port a rule drops are counted by the rule and never reach
// the socket, and datagrams to a passed port arrive.
func classifies(t *testing.T, spec testbed.Spec, d *daemonProc, passPort int, drop *udpCounter) {
	t.Helper()
	ctx := context.Background()
	before, err := d.client().Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pass := listenUDP(t, spec, "dpu0", passPort)
	dropped := drop.n.Load()
	dropPort := drop.conn.LocalAddr().(*net.UDPAddr).Port
	sp := dialUDP(t, spec, "host0", "10.77.10.2", 0, passPort)
	sd := dialUDP(t, spec, "host0", "10.77.10.2", 0, dropPort)
	const n = 20
	for i := 0; i < n; i++ {
		sp.Write([]byte("pass"))
		sd.Write([]byte("drop"))
	}
	eventually(t, "passed datagrams", func() bool { return pass.n.Load() == n })
	if got := drop.n.Load() - dropped; got != 0 {
		t.Errorf("%d datagrams to the dropped port arrived: no classifier runs on pf0hpf", got)
	}
	after, err := d.client().Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := after.Verdicts["drop"].Packets - before.Verdicts["drop"].Packets; got != n {
		t.Errorf("drop counter moved by %d, want %d", got, n)
		live, _ := d.client().Rules(ctx)
		t.Logf("verdicts before %+v after %+v; rules %+v; pf0hpf is ifindex %d, runs XDP program %d",
			before.Verdicts, after.Verdicts, live, ifindex(t, spec, "dpu0", "pf0hpf"), xdpProg(t, spec, "dpu0", "pf0hpf"))
	}
}

const dropRules = `
default: pass
rules:
  - {name: drop-7031, priority: 10, match: {iface: pf0hpf, proto: udp, dport: 7031}, action: drop}
`

// TestAdoptedButDead: lovelockd is killed, pf0hpf is deleted and created
// again, and lovelockd started on the same pins. The pinned XDP link then
// runs on nothing; lovelockd must not adopt it as attached but attach the
// classifier to the new interface. Then, while it runs, the interface goes
// and comes back once more: it must re-attach by itself.
func TestAdoptedButDead(t *testing.T) {
	spec := bed(t)
	d := startDaemon(t, spec, "dpu0", "--xdp", "pf0hpf")
	ctx := context.Background()
	if _, err := d.client().ApplyRules(ctx, mustRules(t, dropRules)); err != nil {
		t.Fatal(err)
	}
	drop := listenUDP(t, spec, "dpu0", 7031)
	classifies(t, spec, d, 7030, drop)

	d.stop(syscall.SIGKILL)
	recreate(t, spec, "dpu0", "pf0hpf")
	d.start()
	if xdpProg(t, spec, "dpu0", "pf0hpf") == 0 {
		t.Fatal("restarted lovelockd left the re-created pf0hpf without XDP")
	}
	log, _ := os.ReadFile(d.log.Name())
	if !strings.Contains(string(log), "re-attached") {
		t.Errorf("lovelockd's log does not say it re-attached pf0hpf")
	}
	st, err := d.client().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Health != api.HealthOK || len(st.Links) != 1 || !st.Links[0].Live || st.Links[0].Ifindex != ifindex(t, spec, "dpu0", "pf0hpf") {
		t.Errorf("status after the restart: health %s, links %+v, failures %+v; want ok and one live link on the new pf0hpf", st.Health, st.Links, st.Failures)
	}
	classifies(t, spec, d, 7032, drop)

	// While lovelockd runs: the interface goes...
	err = spec.Run("dpu0", func() error {
		l, err := netlink.LinkByName("pf0hpf")
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "status to report the attachment dead", func() bool {
		st, err := d.client().Status(ctx)
		// The rule on pf0hpf names a gone interface too.
		return err == nil && st.Health == api.HealthDegraded && len(st.Failures) == 2 &&
			st.Failures[0].What == "attachment pf0hpf xdp" && st.Failures[1].What == "rules" &&
			strings.Contains(st.Failures[1].Cause, "pf0hpf") && len(st.Links) == 1 && !st.Links[0].Live
	})
	// ... and comes back.
	if err := testbed.Up(ctx, spec); err != nil {
		t.Fatal(err)
	}
	eventually(t, "lovelockd to re-attach to the re-created pf0hpf", func() bool {
		st, err := d.client().Status(ctx)
		return err == nil && st.Health == api.HealthOK && len(st.Links) == 1 && st.Links[0].Live
	})
	if xdpProg(t, spec, "dpu0", "pf0hpf") == 0 {
		t.Fatal("the re-created pf0hpf has no XDP program")
	}
	classifies(t, spec, d, 7033, drop)
}

// TestDegradedStart starts lovelockd on things that cannot run: an XDP
// interface that does not exist, a rule file redirecting to it, and XDP on
// an interface where another program holds the hook (EBUSY). It must say
// degraded, not ready, report each failure with its cause, and become ready
// once the missing interface appears.
func TestDegradedStart(t *testing.T) {
	spec := bed(t)
	// A program attached without a BPF link holds dpu0's p0: lovelockd's
	// link attach gets EBUSY.
	passOnPeerNetlink(t, spec, "dpu0", "p0")
	dir := t.TempDir()
	rulesFile := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesFile, []byte(`
rules:
  - {name: out, priority: 10, match: {proto: udp, dport: 7040}, action: "redirect:late0"}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, spec, "dpu0", "--xdp", "late0", "--xdp", "p0", "--rules", rulesFile, "--metrics", "127.0.0.1:19478")
	ctx := context.Background()
	st, err := d.client().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Health != api.HealthDegraded {
		t.Errorf("health %q, want degraded", st.Health)
	}
	if st.Rules != 1 || !st.RulesPending {
		t.Errorf("status: %d rules, pending %v; want the rule file's 1 pending", st.Rules, st.RulesPending)
	}
	causes := map[string]string{}
	for _, f := range st.Failures {
		causes[f.What] = f.Cause
	}
	for what, want := range map[string]string{
		"attachment late0 xdp": "late0",
		"attachment p0 xdp":    "another XDP program",
		"rules":                "late0",
	} {
		if !strings.Contains(causes[what], want) {
			t.Errorf("failure %q: cause %q, want it to mention %q (failures %+v)", what, causes[what], want, st.Failures)
		}
	}
	metrics := string(scrapeMetrics(t, spec, "dpu0", "127.0.0.1:19478"))
	for _, want := range []string{"lovelock_healthy 0", "lovelock_failures 3", `lovelock_attachment_running{hook="xdp",iface="p0"} 0`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	time.Sleep(200 * time.Millisecond)
	log, _ := os.ReadFile(d.log.Name())
	if strings.Contains(string(log), "msg=ready") || !strings.Contains(string(log), `msg="degraded`) {
		t.Errorf("lovelockd's log says ready, or not degraded, while it is degraded:\n%s", log)
	}

	// late0 appears: lovelockd attaches to it and applies the rules. The
	// rule redirects to it from XDP (native, on late0 and p0), which a veth
	// takes while its peer runs an XDP program: the retry as late0 comes
	// up finds xdp_pass on late1.
	err = spec.Run("dpu0", func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "late0"}, PeerName: "late1"})
	})
	if err != nil {
		t.Fatal(err)
	}
	passOnPeerNetlink(t, spec, "dpu0", "late1")
	err = spec.Run("dpu0", func() error {
		l, err := netlink.LinkByName("late0")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "late0's attachment and the rules", func() bool {
		st, err := d.client().Status(ctx)
		if err != nil || len(st.Failures) != 1 {
			return false
		}
		return st.Failures[0].What == "attachment p0 xdp" && st.Rules == 1 && !st.RulesPending
	})
	if xdpProg(t, spec, "dpu0", "late0") == 0 {
		t.Error("late0 has no XDP program")
	}
}

// TestServiceXDPDetached: a service on AF_XDP sockets runs as asked while
// the steering program runs in XDP on its interface. An operator's detach
// makes it, and the node, degraded, saying how to fix it; an attach makes
// it run as asked again, without a restart.
func TestServiceXDPDetached(t *testing.T) {
	spec := bed(t)
	cfg := filepath.Join(t.TempDir(), "dpu2.yaml")
	if err := os.WriteFile(cfg, []byte(`
ingest:
  listen: "10.77.0.12:61440"
  host_listen: "10.77.12.2:61441"
  transport: xdp
  interfaces: [p0]
  models: [{name: checksum}]
  tenants: [{id: 1, models: [checksum]}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, spec, "dpu2", "--config", cfg)
	ctx := context.Background()
	// state returns the ingest service's state and reasons, and the node's
	// health with its failures' names.
	state := func() (api.ServiceState, string, api.Health, string) {
		st, err := d.client().Status(ctx)
		if err != nil || len(st.Services) != 1 {
			return "", "", "", fmt.Sprint(err)
		}
		var what []string
		for _, f := range st.Failures {
			what = append(what, f.What)
		}
		return st.Services[0].State, strings.Join(st.Services[0].Degraded, "; "), st.Health, strings.Join(what, ", ")
	}
	running := func() bool {
		svc, why, h, _ := state()
		return svc == api.ServiceRunning && why == "" && h == api.HealthOK
	}
	eventually(t, "ingest to run on AF_XDP on p0", running)

	if err := d.client().Detach(ctx, "p0", attach.HookXDP); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ingest to be degraded after the detach", func() bool {
		svc, why, h, fails := state()
		return svc == api.ServiceDegraded && strings.Contains(why, "no steering program in XDP on p0") &&
			strings.Contains(why, "lovelock iface attach p0") && h == api.HealthDegraded && fails == "service ingest"
	})

	if _, err := d.client().Attach(ctx, attach.Attachment{Iface: "p0", Hook: attach.HookXDP}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ingest to run as asked after the attach", running)
}

// passOnPeerNetlink attaches xdp_pass to iface in node the old way, through
// netlink rather than a BPF link, as another tool would: it stays until the
// interface goes, and a BPF link attach there fails with EBUSY.
func passOnPeerNetlink(t *testing.T, spec testbed.Spec, node, iface string) {
	t.Helper()
	s, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = spec.Run(node, func() error {
		l, err := netlink.LinkByName(iface)
		if err != nil {
			return err
		}
		return netlink.LinkSetXdpFdWithFlags(l, s.XDPPass.FD(), nl.XDP_FLAGS_DRV_MODE)
	})
	if err != nil {
		t.Fatal(fmt.Errorf("attach xdp_pass to %s in %s: %w", iface, node, err))
	}
}

// TestRedirectDelivered: a redirect:p0 rule on dpu0 delivers host0's
// datagrams to the fabric on the testbed as it is brought up, with nothing
// attached by the test: the testbed runs xdp_pass on the peers of DPU
// ports, without which veth drops redirected frames uncounted.
func TestRedirectDelivered(t *testing.T) {
	spec := bed(t)
	d := startDaemon(t, spec, "dpu0", "--xdp", "pf0hpf")
	ctx := context.Background()
	if _, err := d.client().ApplyRules(ctx, mustRules(t, `
rules:
  - {name: out, priority: 10, match: {iface: pf0hpf, proto: udp, dport: 7050}, action: "redirect:p0"}
`)); err != nil {
		t.Fatal(err)
	}
	fabric := countFrames(t, spec, "fabric", "dpu0-p0", 7050)
	send := dialUDP(t, spec, "host0", "10.77.10.2", 0, 7050)
	const n = 30
	for i := 0; i < n; i++ {
		if _, err := send.Write([]byte("to the fabric")); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, fmt.Sprintf("%d redirected frames on the fabric's dpu0-p0", n), func() bool { return fabric.n.Load() == n })
	st, err := d.client().Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Verdicts["redirect"].Packets != n {
		t.Errorf("redirect counter %d, want %d", st.Verdicts["redirect"].Packets, n)
	}
}
