package daemon_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/xsk"
)

func mustRules(t *testing.T, yaml string) rules.Set {
	t.Helper()
	set, err := rules.Parse([]byte(yaml))
	if err != nil {
		t.Fatalf("rules: %v\n%s", err, yaml)
	}
	return *set
}

// TestActions checks every action end to end on the testbed: dpu0 runs
// lovelockd with XDP on pf0hpf (traffic from host0) and TC egress on pf0hpf
// (traffic dpu0 itself sends to host0).
func TestActions(t *testing.T) {
	spec := bed(t)
	d := startDaemon(t, spec, "dpu0", "--xdp", "pf0hpf", "--tc-egress", "pf0hpf")
	ctx := context.Background()
	set := mustRules(t, `
default: pass
rules:
  - {name: pass-7001, priority: 10, match: {iface: pf0hpf, proto: udp, dport: 7001}, action: pass}
  - {name: drop-7002, priority: 10, match: {iface: pf0hpf, proto: udp, dport: 7002}, action: drop}
  - {name: redirect-7003, priority: 10, match: {iface: pf0hpf, proto: udp, dport: 7003}, action: "redirect:p0"}
  - {name: egress-drop-7005, priority: 10, match: {iface: pf0hpf, proto: udp, dport: 7005}, action: drop}
`)
	if _, err := d.client().ApplyRules(ctx, set); err != nil {
		t.Fatal(err)
	}
	// Redirected frames leave p0 and reach the fabric bridge's port.
	passOnPeer(t, spec, "fabric", "dpu0-p0")
	redirected := countFrames(t, spec, "fabric", "dpu0-p0", 7003)

	recv := map[int]*udpCounter{}
	for _, p := range []int{7001, 7002, 7003} {
		recv[p] = listenUDP(t, spec, "dpu0", p)
	}
	for _, p := range []int{7005, 7006} {
		recv[p] = listenUDP(t, spec, "host0", p)
	}
	const n = 50
	for _, p := range []int{7001, 7002, 7003} {
		c := dialUDP(t, spec, "host0", "10.77.10.2", 0, p)
		for i := 0; i < n; i++ {
			if _, err := c.Write([]byte(fmt.Sprintf("to %d #%d", p, i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, p := range []int{7005, 7006} {
		c := dialUDP(t, spec, "dpu0", "10.77.10.1", 0, p)
		for i := 0; i < n; i++ {
			if _, err := c.Write([]byte(fmt.Sprintf("egress %d #%d", p, i))); err != nil {
				t.Fatal(err)
			}
		}
	}

	eventually(t, "passed packets", func() bool { return recv[7001].n.Load() == n })
	eventually(t, "redirected frames", func() bool { return redirected.n.Load() == n })
	eventually(t, "egress passed packets", func() bool { return recv[7006].n.Load() == n })
	time.Sleep(100 * time.Millisecond)
	for _, p := range []int{7002, 7003, 7005} {
		if got := recv[p].n.Load(); got != 0 {
			t.Errorf("port %d: %d packets reached the kernel socket, want 0", p, got)
		}
	}

	st, err := d.client().Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range st.Rules {
		if r.Counter.Packets != n {
			t.Errorf("rule %s counted %d packets, want %d", r.Name, r.Counter.Packets, n)
		}
	}
	if st.Verdicts["drop"].Packets != 2*n || st.Verdicts["redirect"].Packets != n {
		t.Errorf("verdict counters %+v: want %d drops and %d redirects", st.Verdicts, 2*n, n)
	}

	// A rule set the node cannot take is refused whole, with a clear
	// error, and the live set stays as it was.
	bad := mustRules(t, `
rules:
  - {name: nowhere, priority: 10, match: {proto: udp, dport: 9}, action: "redirect:nope0"}
`)
	if _, err := d.client().ApplyRules(ctx, bad); err == nil || !strings.Contains(err.Error(), "nope0") {
		t.Errorf("apply with an unknown interface: %v, want an error naming it", err)
	}
	live, err := d.client().Rules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(live.Rules) != len(set.Rules) || live.Rules[0].Name != "pass-7001" {
		t.Errorf("a refused set changed the live one: %+v", live.Rules)
	}
	if _, err := d.client().Attach(ctx, attach.Attachment{Iface: "nope0", Hook: attach.HookXDP}); err == nil || !strings.Contains(err.Error(), "nope0") {
		t.Errorf("attach to an unknown interface: %v, want an error naming it", err)
	}
}

// TestRestartUnderTraffic streams packets from host0 to host1 through dpu0
// while lovelockd is killed with SIGKILL and restarted, twice. A pass rule
// carries the stream; a drop rule guards a canary flow, so a data plane that
// stopped classifying would be seen too.
func TestRestartUnderTraffic(t *testing.T) {
	spec := bed(t)
	d := startDaemon(t, spec, "dpu0", "--xdp", "pf0hpf")
	ctx := context.Background()
	set := mustRules(t, `
default: pass
rules:
  - {name: stream, priority: 10, match: {iface: pf0hpf, proto: udp, dport: 7010}, action: pass}
  - {name: canary, priority: 10, match: {iface: pf0hpf, proto: udp, dport: 7011}, action: drop}
`)
	if _, err := d.client().ApplyRules(ctx, set); err != nil {
		t.Fatal(err)
	}
	stream := listenUDP(t, spec, "host1", 7010)
	canary := listenUDP(t, spec, "host1", 7011)
	sendStream := dialUDP(t, spec, "host0", "10.77.11.1", 0, 7010)
	sendCanary := dialUDP(t, spec, "host0", "10.77.11.1", 0, 7011)

	done := make(chan int)
	go func() {
		sent := 0
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			for i := 0; i < 10; i++ {
				if _, err := sendStream.Write([]byte("stream")); err == nil {
					sent++
				}
				sendCanary.Write([]byte("canary"))
			}
			time.Sleep(time.Millisecond)
		}
		done <- sent
	}()
	for i := 0; i < 2; i++ {
		time.Sleep(500 * time.Millisecond)
		d.stop(syscall.SIGKILL)
		time.Sleep(100 * time.Millisecond)
		d.start()
	}
	sent := <-done
	eventually(t, fmt.Sprintf("all %d streamed packets", sent), func() bool { return stream.n.Load() == int64(sent) })
	if got := canary.n.Load(); got != 0 {
		t.Errorf("%d canary packets got through: the data plane stopped classifying", got)
	}
	if got := stream.n.Load(); got != int64(sent) {
		t.Errorf("received %d of %d streamed packets", got, sent)
	}
	// The restarted daemon adopted the data plane and restored its rules.
	st, err := d.client().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Loaded || st.Rules != 2 || len(st.Attachments) != 1 {
		t.Errorf("status after restarts: %+v; want adopted pins, 2 rules, 1 attachment", st)
	}
}

var swaps = flag.Int("swaps", 2000, "rule set swaps in TestAtomicSwapUnderTraffic")

// TestAtomicSwapUnderTraffic swaps two rule sets thousands of times through
// the API while host0 sends to dpu0. Set A passes the packets to a kernel
// socket; set B redirects them out of p0. The sets use different mask shapes
// and the default drops, so a packet classified by a mix of the two (A's
// shapes over B's entries, or the reverse) would match nothing and vanish:
// every packet sent must arrive at exactly one of the two places.
func TestAtomicSwapUnderTraffic(t *testing.T) {
	spec := bed(t)
	d := startDaemon(t, spec, "dpu0", "--xdp", "pf0hpf")
	ctx := context.Background()
	setA := mustRules(t, `
default: drop
rules:
  - {name: a, priority: 10, match: {iface: pf0hpf, proto: udp, dport: 7020}, action: pass}
`)
	setB := mustRules(t, `
default: drop
rules:
  - {name: b, priority: 10, match: {iface: pf0hpf, src: 10.77.10.1/32}, action: "redirect:p0"}
`)
	if _, err := d.client().ApplyRules(ctx, setA); err != nil {
		t.Fatal(err)
	}
	passOnPeer(t, spec, "fabric", "dpu0-p0")
	redirected := countFrames(t, spec, "fabric", "dpu0-p0", 7020)
	passed := listenUDP(t, spec, "dpu0", 7020)
	send := dialUDP(t, spec, "host0", "10.77.10.2", 0, 7020)

	stop := make(chan struct{})
	sentc := make(chan int)
	go func() {
		sent := 0
		for {
			select {
			case <-stop:
				sentc <- sent
				return
			default:
			}
			for i := 0; i < 8; i++ {
				if _, err := send.Write([]byte("swap")); err == nil {
					sent++
				}
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	start := time.Now()
	for i := 0; i < *swaps; i++ {
		set := setA
		if i%2 == 0 {
			set = setB
		}
		if _, err := d.client().ApplyRules(ctx, set); err != nil {
			close(stop)
			<-sentc
			t.Fatalf("swap %d: %v", i, err)
		}
	}
	close(stop)
	sent := <-sentc
	t.Logf("%d swaps in %s while %d packets were sent", *swaps, time.Since(start).Round(time.Millisecond), sent)
	arrived := func() int64 { return passed.n.Load() + redirected.n.Load() }
	deadline := time.Now().Add(5 * time.Second)
	for arrived() < int64(sent) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := arrived(); got != int64(sent) {
		t.Errorf("%d packets sent, %d arrived (%d passed, %d redirected): some were classified by neither set",
			sent, got, passed.n.Load(), redirected.n.Load())
	}
	if passed.n.Load() == 0 || redirected.n.Load() == 0 {
		t.Errorf("both sets must have carried traffic: %d passed, %d redirected", passed.n.Load(), redirected.n.Load())
	}
}

// TestXSKAction sends packets through an xsk rule to an AF_XDP socket bound
// to pf0hpf's queue 0 on dpu0; without the socket, the same packets fall
// back to the kernel stack.
func TestXSKAction(t *testing.T) {
	spec := bed(t)
	d := startDaemon(t, spec, "dpu0", "--xdp", "pf0hpf")
	ctx := context.Background()
	set := mustRules(t, `
rules:
  - {name: to-worker, priority: 10, match: {iface: pf0hpf, proto: udp, dport: 7004}, action: "xsk:0"}
`)
	if _, err := d.client().ApplyRules(ctx, set); err != nil {
		t.Fatal(err)
	}
	var sock *xsk.Socket
	var ifindex int
	err := spec.Run("dpu0", func() error {
		l, err := netlink.LinkByName("pf0hpf")
		if err != nil {
			return err
		}
		ifindex = l.Attrs().Index
		sock, err = xsk.Open(ifindex, 0, nil, nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	steer, err := bpf.OpenPinned(d.pinDir)
	if err != nil {
		t.Fatal(err)
	}
	defer steer.Close()
	if err := steer.SetXSK(ifindex, 0, sock.FD()); err != nil {
		t.Fatal(err)
	}

	kernel := listenUDP(t, spec, "dpu0", 7004)
	send := dialUDP(t, spec, "host0", "10.77.10.2", 0, 7004)
	const n = 50
	for i := 0; i < n; i++ {
		if _, err := send.Write([]byte(fmt.Sprintf("to the worker #%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	got := 0
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for got < n && rctx.Err() == nil {
		k, err := sock.TryReceive(func(frame []byte) {
			if udpDport(frame) == 7004 {
				got++
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if k == 0 {
			sock.Poll(rctx, 50*time.Millisecond)
		}
	}
	if got != n {
		t.Errorf("AF_XDP socket got %d of %d packets", got, n)
	}
	if k := kernel.n.Load(); k != 0 {
		t.Errorf("%d packets reached the kernel socket while the AF_XDP socket was registered", k)
	}

	// Without a socket, xsk packets go to the stack: nothing is lost.
	if err := steer.ClearXSK(ifindex, 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		send.Write([]byte("no worker"))
	}
	eventually(t, "fallback to the kernel", func() bool { return kernel.n.Load() == 10 })
	st, err := d.client().Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Verdicts["xsk"].Packets != n || st.Verdicts["xsk_miss"].Packets != 10 {
		t.Errorf("xsk = %d, xsk_miss = %d; want %d and 10", st.Verdicts["xsk"].Packets, st.Verdicts["xsk_miss"].Packets, n)
	}
}

// TestMessagingAgent runs lovelockd's messaging agents on dpu0 and dpu1 and
// sends messages between host processes on host0 and host1 through them.
func TestMessagingAgent(t *testing.T) {
	spec := bed(t)
	cluster := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := os.WriteFile(cluster, []byte(`
mode: dpu
workers: 1
nodes:
  - name: dpu0
    agent: 10.77.10.2:61440
    clients: [{name: app, addr: "10.77.10.1:7100", ranks: "0-3"}]
  - name: dpu1
    agent: 10.77.11.2:61440
    clients: [{name: app, addr: "10.77.11.1:7100", ranks: "4-7"}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	d0 := startDaemon(t, spec, "dpu0", "--xdp", "pf0hpf", "--msg-cluster", cluster, "--msg-node", "dpu0",
		"--metrics", "127.0.0.1:19477")
	startDaemon(t, spec, "dpu1", "--xdp", "pf0hpf", "--msg-cluster", cluster, "--msg-node", "dpu1")
	clients := hostClients(t, spec, cluster)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const n = 2000
	for i := 0; i < n; i++ {
		if err := clients["host0"].SendContext(ctx, uint32(4+i%4), []byte(fmt.Sprintf("msg %d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := clients["host0"].Flush(ctx); err != nil {
		t.Fatal(err)
	}
	seen := make(map[string]bool, n)
	for len(seen) < n {
		m, err := clients["host1"].Recv(ctx)
		if err != nil {
			t.Fatalf("after %d of %d messages: %v", len(seen), n, err)
		}
		if seen[string(m.Payload)] {
			t.Fatalf("message %q delivered twice", m.Payload)
		}
		seen[string(m.Payload)] = true
	}

	st, err := d0.client().MsgStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Role != "agent" || st.Node != "dpu0" || st.Received.Messages != n || st.Drops.Total() != 0 {
		t.Errorf("dpu0 agent stats: role %s node %s received %d messages, %d drops; want agent dpu0, %d, 0",
			st.Role, st.Node, st.Received.Messages, st.Drops.Total(), n)
	}

	// The same counters, and the data plane's, in Prometheus' text format on
	// dpu0's loopback.
	metrics := scrapeMetrics(t, spec, "dpu0", "127.0.0.1:19477")
	for _, want := range []string{
		fmt.Sprintf("lovelock_msg_received_messages_total %d", n),
		`lovelock_msg_drops_total{reason="malformed"} 0`,
		`lovelock_steer_packets_total{counter="rx"}`,
		`lovelock_steer_iface_packets_total{counter="rx",iface="pf0hpf"}`,
		`lovelock_steer_iface_bytes_total{counter="pass",iface="pf0hpf"}`,
		"lovelock_stats_up 1",
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// Per interface, by name in dpu0's namespace: only pf0hpf runs the
	// classifier, so it counted every packet dpu0's data plane saw (read
	// after the global counters, so at least as many).
	ds, err := d0.client().Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pf := ds.Interfaces["pf0hpf"]
	if rx := ds.Verdicts["rx"].Packets; len(ds.Interfaces) != 1 || pf == nil || rx == 0 || pf["rx"].Packets < rx {
		t.Errorf("dpu0 per-interface counters %v (rx %d in all): want pf0hpf alone, with all of rx", ds.Interfaces, rx)
	}
}

// TestSecondDaemonSameSocket: a second lovelockd with its own pins but the
// first one's socket refuses to start before it says ready, and leaves the
// first one's socket in place.
func TestSecondDaemonSameSocket(t *testing.T) {
	spec := bed(t)
	d := startDaemon(t, spec, "dpu0")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "none.yaml"), []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(lovelockdBinary(t), "--config", filepath.Join(dir, "none.yaml"),
		"--pin-dir", filepath.Join(testenv.BPFFS(t), "lovelock"), "--state", filepath.Join(dir, "state.json"),
		"--socket", d.socket, "--metrics", "off")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := spec.Run("dpu1", cmd.Start); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(out.String(), "another lovelockd") || strings.Contains(out.String(), "msg=ready") {
			t.Errorf("second lovelockd: %v, want it to refuse the socket before ready:\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("second lovelockd still runs on the first one's socket:\n%s", out.String())
	}
	if _, err := d.client().Status(context.Background()); err != nil {
		t.Errorf("the first lovelockd no longer answers: %v", err)
	}
}
