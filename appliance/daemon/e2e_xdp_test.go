package daemon_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/testbed"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
)

// TestMessagingAgentXDP runs lovelockd's messaging agents on dpu0 and dpu1
// with transport xdp: each worker receives on AF_XDP sockets on pf0hpf
// (from its host) and p0 (from the other DPU), fed by lovelockd's own
// steering rules. Messages flow host0 -> host1 while both daemons are
// restarted (SIGTERM: the agent drains), and each arrives exactly once.
// Then, with the daemons left alone, the steering counters and the agents'
// transport counters show the traffic went through AF_XDP, not the kernel.
// Along the way an operator applies a rule set that overlaps the agent's
// traffic: lovelockd warns, keeps its own rules out of the state file, and
// refuses to let them be deleted or imitated. The testbed runs at MTU
// 9000 and the sockets are multi-buffer (messaging.multi_buffer, on by
// default): bundles of up to 8972 bytes, more than one XDP buffer holds
// (3478 bytes of payload on veth), go through the AF_XDP sockets.
func TestMessagingAgentXDP(t *testing.T) {
	spec := bed(t)
	if err := testbed.SetMTU(spec, 9000); err != nil {
		t.Fatal(err)
	}
	cluster := filepath.Join(t.TempDir(), "cluster.yaml")
	// One worker: the testbed's veths have one queue each. Bundles fit a
	// 9000-byte frame: XDP passes IP fragments to the stack. The restarts
	// below are not dead peers: on a loaded 2-core machine a lovelockd
	// took over 10 s (the default peer_timeout) to answer again.
	if err := os.WriteFile(cluster, []byte(`
mode: dpu
workers: 1
transfer_size: 8972
retransmit_timeout: 5ms
peer_timeout: 60s
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
	daemons := map[string]*daemonProc{}
	for _, node := range []string{"dpu0", "dpu1"} {
		daemons[node] = startDaemon(t, spec, node, "--msg-cluster", cluster, "--msg-node", node,
			"--msg-transport", "xdp", "--msg-iface", "pf0hpf", "--msg-iface", "p0", "--metrics", "127.0.0.1:19478")
	}
	// A daemon told to use an interface its node lacks says so.
	bad := startDaemon(t, spec, "dpu2", "--msg-cluster", cluster, "--msg-node", "dpu1",
		"--msg-transport", "xdp", "--msg-iface", "pf0hpf", "--msg-iface", "nope0")
	d0, d1 := daemons["dpu0"], daemons["dpu1"]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	agentUp := func(d *daemonProc) func() bool {
		return func() bool {
			st, err := d.client().MsgStats(ctx)
			return err == nil && len(st.Transport) == 3 // xsk pf0hpf, xsk p0, kernel
		}
	}
	for _, d := range daemons {
		eventually(t, d.node+"'s agent on AF_XDP", agentUp(d))
	}
	eventually(t, "dpu2's agent to report the unknown interface", func() bool {
		_, err := bad.client().MsgStats(ctx)
		return err != nil && strings.Contains(err.Error(), `interface "nope0"`)
	})
	// lovelock services says the same.
	if svcs, err := bad.client().Services(ctx); err != nil || len(svcs) != 1 || svcs[0].State != api.ServiceFailed ||
		!strings.Contains(svcs[0].Error, `interface "nope0"`) || svcs[0].Restarts == 0 {
		t.Errorf("dpu2's services: %+v, %v; want messaging failed on nope0", svcs, err)
	}
	bad.stop(syscall.SIGTERM)
	if svcs, err := d0.client().Services(ctx); err != nil || len(svcs) != 1 || svcs[0].Name != "messaging" || svcs[0].State != api.ServiceRunning ||
		!strings.HasPrefix(svcs[0].Binding, "AF_XDP on pf0hpf,p0, 1 workers") || !strings.Contains(svcs[0].Binding, "multi-buffer, max payload 8972") ||
		len(svcs[0].Degraded) != 0 {
		t.Errorf("dpu0's services: %+v, %v; want messaging running on AF_XDP", svcs, err)
	}

	// lovelockd's rules are live and listed as its own; the XDP programs
	// were attached to the agent's interfaces.
	set, err := d0.client().Rules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var owned []string
	for _, r := range set.Rules {
		if api.IsOwned(r.Name) {
			owned = append(owned, r.Name)
		}
	}
	if len(owned) != 5 {
		t.Errorf("lovelockd's rules on dpu0: %v, want 5 (2 interfaces x 1 worker x bundle, credit; IP fragments to the agent)", owned)
	}
	att, err := d0.client().Attachments(ctx)
	if err != nil || len(att) != 2 {
		t.Errorf("attachments on dpu0: %v, %v; want XDP on pf0hpf and p0", att, err)
	}
	// An operator's set that overlaps: applied, with a warning.
	res, err := d0.client().ApplyRules(ctx, mustRules(t, `
rules:
  - {name: host-udp, priority: 100, match: {iface: pf0hpf, proto: udp, dport: 61440}, action: pass}
  - {name: telnet, priority: 100, match: {proto: tcp, dport: 23}, action: drop}
`))
	if err != nil {
		t.Fatal(err)
	}
	if res.Rules != 7 || res.Owned != 5 || len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], `"host-udp"`) {
		t.Errorf("apply: %+v; want 7 rules, 5 owned, a warning about host-udp", res)
	}
	// The listed set applies back as it is.
	if set, err = d0.client().Rules(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d0.client().ApplyRules(ctx, set); err != nil {
		t.Errorf("the listed set does not apply back: %v", err)
	}
	if _, err := d0.client().DeleteRule(ctx, owned[0]); err == nil || !strings.Contains(err.Error(), "belongs to lovelockd") {
		t.Errorf("delete %s: %v", owned[0], err)
	}
	if _, err := d0.client().ApplyRules(ctx, mustRules(t, "rules: [{name: top, priority: 4000000001, action: drop}]\n")); err == nil ||
		!strings.Contains(err.Error(), "reserves for its own rules") {
		t.Errorf("a rule in lovelockd's priority band: %v", err)
	}

	clients := hostClients(t, spec, cluster)
	// host1 consumes all along, as applications do: a stopping agent
	// drains only as fast as its next hops take what it holds.
	var mu sync.Mutex
	seen := map[string]int{}
	go func() {
		for {
			m, err := clients["host1"].Recv(ctx)
			if err != nil {
				return
			}
			// A padded message is "msg N|" and pad bytes of 'p'.
			key, pad, padded := strings.Cut(string(m.Payload), "|")
			if padded && strings.Trim(pad, "p") != "" {
				key += " (corrupt)"
			}
			mu.Lock()
			seen[key]++
			mu.Unlock()
		}
	}()
	// send sends messages first..first+n-1 from host0 (pacing them, so
	// that during runs in the middle of the stream), each padded with pad
	// bytes, and waits until host1 received each exactly once.
	send := func(first, n, pad int, during func()) {
		t.Helper()
		errc := make(chan error, 1)
		go func() {
			for i := first; i < first+n; i++ {
				p := []byte(fmt.Sprintf("msg %d", i))
				if pad > 0 {
					p = append(append(p, '|'), strings.Repeat("p", pad)...)
				}
				if err := clients["host0"].SendContext(ctx, uint32(4+i%4), p); err != nil {
					errc <- err
					return
				}
				if i%200 == 199 {
					time.Sleep(10 * time.Millisecond)
				}
			}
			errc <- clients["host0"].Flush(ctx)
		}()
		if during != nil {
			during()
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		complete := func() (missing, dup int) {
			mu.Lock()
			defer mu.Unlock()
			for i := first; i < first+n; i++ {
				switch seen[fmt.Sprintf("msg %d", i)] {
				case 0:
					missing++
				case 1:
				default:
					dup++
				}
			}
			return missing, dup
		}
		deadline := time.Now().Add(60 * time.Second) // bounds a loss; measures nothing
		for {
			missing, dup := complete()
			if dup > 0 {
				t.Fatalf("%d messages delivered more than once", dup)
			}
			if missing == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of messages %d..%d never arrived", missing, first, first+n-1)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	restarts := func() {
		for _, d := range []*daemonProc{d0, d1} {
			time.Sleep(100 * time.Millisecond)
			start := time.Now()
			d.stop(syscall.SIGTERM)
			t.Logf("%s: lovelockd stopped in %v", d.node, time.Since(start).Round(time.Millisecond))
			d.start()
		}
	}
	const n = 4000
	send(0, n, 0, restarts)
	for _, d := range daemons {
		eventually(t, d.node+"'s agent back on AF_XDP", agentUp(d))
	}
	// The state file holds the operator's rules only.
	state, err := os.ReadFile(d0.state)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(state), api.OwnedRulePrefix) || !strings.Contains(string(state), "host-udp") {
		t.Errorf("state file: %s", state)
	}

	// Left alone, the agents carry everything through AF_XDP: 2000 short
	// messages, then 600 of 1500 bytes, whose bundles (5 messages, about
	// 7.5 KB) only multi-buffer sockets take.
	const m, big = 2000, 600
	phase := func(first, count, pad int) {
		t.Helper()
		before := map[string]messaging.Stats{}
		for _, d := range daemons {
			var err error
			if before[d.node], err = d.client().MsgStats(ctx); err != nil {
				t.Fatal(err)
			}
		}
		send(first, count, pad, nil)
		for _, d := range daemons {
			checkXDPPhase(t, ctx, spec, d, before[d.node], count, pad)
		}
	}
	phase(n, m, 0)
	phase(n+m, big, 1500)
}

// checkXDPPhase checks what daemon d's agent counted while count messages
// padded with pad bytes flowed, from its counters before: no drops, all of
// it through the AF_XDP sockets both ways, none through the kernel socket,
// the steering and Prometheus counters; with pad, bundles above one XDP
// buffer (3478 bytes) both sent and received.
func checkXDPPhase(t *testing.T, ctx context.Context, spec testbed.Spec, d *daemonProc, before messaging.Stats, count, pad int) {
	t.Helper()
	st, err := d.client().MsgStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Drops.Total() != 0 {
		t.Errorf("%s: drops %+v", d.node, st.Drops)
	}
	delta := map[string][2]uint64{}
	for i, p := range st.Transport {
		b := before.Transport[i]
		delta[p.Path+" "+p.Interface] = [2]uint64{p.RX - b.RX, p.TX - b.TX}
		if p.Path == "xsk" && (p.Mode != "copy" || p.Dropped != 0 || !p.MultiBuffer) {
			t.Errorf("%s: socket %+v: want copy mode, multi-buffer, nothing dropped", d.node, p)
		}
	}
	t.Logf("%s: datagrams [rx tx] by path while %d messages flowed: %v", d.node, count, delta)
	// dpu0 receives bundles from host0 on pf0hpf and credits from
	// dpu1 on p0, and sends the other way; dpu1 mirrors it.
	in, out := "xsk pf0hpf", "xsk p0"
	if d.node == "dpu1" {
		in, out = out, in
	}
	if delta[in][0] == 0 || delta[out][0] == 0 || delta[in][1] == 0 || delta[out][1] == 0 {
		t.Errorf("%s: the AF_XDP sockets did not carry the traffic both ways: %v", d.node, delta)
	}
	if k := delta["kernel "]; k[0] != 0 || k[1] != 0 {
		t.Errorf("%s: %d datagrams received and %d sent through the kernel socket, want none", d.node, k[0], k[1])
	}
	if pad > 0 {
		// Both agents receive and send this phase's bundles on the
		// AF_XDP sockets alone (above): their average size shows
		// multi-buffer frames went through them.
		sent, bundles := 0.0, 0.0
		for i, ds := range st.Destinations {
			sent += float64(ds.Bytes - before.Destinations[i].Bytes)
			bundles += float64(ds.Bundles - before.Destinations[i].Bundles)
		}
		rb := float64(st.Received.Bytes - before.Received.Bytes)
		rn := float64(st.Received.Bundles - before.Received.Bundles)
		t.Logf("%s: %d messages of %d B: sent %.0f bundles of %.0f B on average, received %.0f of %.0f B", d.node, count, pad, bundles, sent/bundles, rn, rb/rn)
		if bundles == 0 || sent/bundles <= 3478 || rn == 0 || rb/rn <= 3478 {
			t.Errorf("%s: bundles sent %.0f B, received %.0f B on average: want more than 3478 (one XDP buffer) both ways", d.node, sent/bundles, rb/rn)
		}
	}
	stats, err := d.client().Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Verdicts["xsk"].Packets == 0 {
		t.Errorf("%s: steering counted no xsk verdict", d.node)
	}
	for _, r := range stats.Rules {
		if r.Name == "lovelockd:msg/"+strings.Fields(in)[1]+"/w0/bundle" && r.Counter.Packets == 0 {
			t.Errorf("%s: rule %s counted nothing", d.node, r.Name)
		}
	}
	t.Logf("%s: steering xsk %d, xsk_miss %d packets", d.node, stats.Verdicts["xsk"].Packets, stats.Verdicts["xsk_miss"].Packets)
	for _, r := range stats.Rules {
		t.Logf("%s: rule %s id %d prio %d %s: %d", d.node, r.Name, r.ID, r.Priority, r.Action, r.Counter.Packets)
	}
	t.Logf("%s: verdicts %v default %d", d.node, stats.Verdicts, stats.Default.Packets)
	// The same counters in Prometheus' text format.
	metrics := scrapeMetrics(t, spec, d.node, "127.0.0.1:19478")
	for _, want := range []string{
		`lovelock_msg_transport_datagrams_total{dir="rx",iface="pf0hpf",path="xsk",worker="0"}`,
		`lovelock_msg_xsk_dropped_total{iface="p0",worker="0"} 0`,
		`lovelock_rule_packets_total{action="xsk:0",id=`,
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("%s: metrics lack %q", d.node, want)
		}
	}
}
