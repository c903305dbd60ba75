package daemon_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestUpgradeUnderTraffic streams packets from host0 to host1 through
// dpu0's XDP classifier while lovelockd is stopped and started again
// configured for another Lovelock port: the pins it finds were loaded for
// the old port, which lovelockd once refused. It upgrades them in place
// (new programs with the state file's rules, the link's program swapped),
// says so in its log, and not one packet of the stream is lost; the drop
// rule on a canary flow holds across the upgrade.
func TestUpgradeUnderTraffic(t *testing.T) {
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

	stop, done := make(chan struct{}), make(chan int)
	go func() {
		sent := 0
		for {
			select {
			case <-stop:
				done <- sent
				return
			default:
			}
			// At most 64 in flight: a receiver's full socket buffer
			// must not pass for a loss in the data plane.
			if int64(sent)-stream.n.Load() >= 64 {
				time.Sleep(100 * time.Microsecond)
				continue
			}
			if _, err := sendStream.Write([]byte("stream")); err == nil {
				sent++
			}
			sendCanary.Write([]byte("canary"))
		}
	}()
	eventually(t, "the stream before the upgrade", func() bool { return stream.n.Load() >= 100 })
	d.stop(syscall.SIGTERM)
	if err := os.WriteFile(d.args[1], []byte("port: 5555\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d.start()
	upgraded := stream.n.Load()
	eventually(t, "the stream after the upgrade", func() bool { return stream.n.Load() >= upgraded+100 })
	close(stop)
	sent := <-done
	eventually(t, fmt.Sprintf("all %d streamed packets", sent), func() bool { return stream.n.Load() == int64(sent) })
	if got := stream.n.Load(); got != int64(sent) {
		t.Errorf("received %d of %d streamed packets", got, sent)
	}
	if got := canary.n.Load(); got != 0 {
		t.Errorf("%d canary packets got through: the data plane stopped classifying", got)
	}
	st, err := d.client().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Loaded || st.Port != 5555 || st.Rules != 2 || len(st.Attachments) != 1 || st.Health != "ok" {
		t.Errorf("status after the upgrade: %+v; want loaded pins for port 5555, 2 rules, 1 attachment, health ok", st)
	}
	stats, err := d.client().Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range stats.Rules {
		// The counters went over: the stream's rule counts the packets
		// of both programs.
		if r.Name == "stream" && r.Counter.Packets < uint64(upgraded)+100 {
			t.Errorf("stream rule counted %d packets, want those before the upgrade (%d) and after", r.Counter.Packets, upgraded)
		}
	}
	log, err := os.ReadFile(d.log.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(log, []byte("data plane upgraded")) || !bytes.Contains(log, []byte("port 61440")) || !bytes.Contains(log, []byte("port 5555")) {
		t.Errorf("lovelockd's log says nothing of an upgrade from port 61440 to 5555:\n%s", log)
	}
}
