package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/images/appconfig"
)

// checkReadyWait bounds the wait for lovelockd's ready line in check mode;
// the boot test's own guard (90 s) is longer, so a hang here still reports.
const checkReadyWait = 60 * time.Second

// checkMarker starts every line the boot test (images/cmd/boottest) reads.
const checkMarker = "LOVELOCK-CHECK"

// bootCheck is the in-guest half of `make image-test`: once lovelockd says
// its data plane is ready, it verifies from inside the machine that the
// steering program really is attached, pinned and running on every steered
// interface, printing one LOVELOCK-CHECK line per fact.
func bootCheck(ctx context.Context, log *slog.Logger, cfg *appconfig.Config, dir string, ready <-chan struct{}) error {
	select {
	case <-ready:
	case <-time.After(checkReadyWait):
		return fmt.Errorf("lovelockd did not report ready within %v", checkReadyWait)
	case <-ctx.Done():
		return ctx.Err()
	}
	log.Info("boot check: lovelockd reports ready; checking the data plane from inside")
	progPin := filepath.Join(dir, bpf.PinProgXDP)
	prog, err := ebpf.LoadPinnedProgram(progPin, &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("pinned program %s: %w", progPin, err)
	}
	defer prog.Close()
	pinfo, err := prog.Info()
	if err != nil {
		return fmt.Errorf("pinned program %s: info: %w", progPin, err)
	}
	progID, ok := pinfo.ID()
	if !ok {
		return errors.New("pinned program: kernel reports no program ID")
	}
	fmt.Printf("%s ok pinned program %s id=%d name=%s\n", checkMarker, progPin, progID, pinfo.Name)

	for _, ifc := range cfg.Steered() {
		name := ifc.Name
		wantMode := uint32(nl.XDP_ATTACHED_DRV)
		if ifc.XDP == appconfig.XDPGeneric {
			wantMode = nl.XDP_ATTACHED_SKB
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			return fmt.Errorf("interface %s: %w", name, err)
		}
		x := l.Attrs().Xdp
		if x == nil || !x.Attached {
			return fmt.Errorf("interface %s: netlink reports no XDP program attached", name)
		}
		if x.AttachMode != wantMode {
			return fmt.Errorf("interface %s: XDP attach mode %d, want %d (%s)", name, x.AttachMode, wantMode, ifc.XDP)
		}
		if ebpf.ProgramID(x.ProgId) != progID {
			return fmt.Errorf("interface %s: XDP program id %d, pinned program is %d", name, x.ProgId, progID)
		}
		linkPin, linkID, err := pinnedXDPLink(dir, l.Attrs().Index, progID)
		if err != nil {
			return fmt.Errorf("interface %s: %w", name, err)
		}
		fmt.Printf("%s ok %s: driver=%s xdp attached mode=%s prog=%d link=%d pinned at %s\n",
			checkMarker, name, driverName(name), ifc.XDP, x.ProgId, linkID, linkPin)
	}

	if err := checkTraffic(ctx, cfg, dir); err != nil {
		return err
	}
	return checkAPI(ctx, cfg)
}

// checkAPI asks lovelockd through its local API what it has attached and
// counted: the daemon answers, reports every steered interface, and its
// counters agree that packets went through.
func checkAPI(ctx context.Context, cfg *appconfig.Config) error {
	socket := apiSocket(cfg)
	cl := api.NewClient(socket)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := cl.Status(ctx)
	if err != nil {
		return fmt.Errorf("api: status: %w", err)
	}
	if err := healthy(st); err != nil {
		return fmt.Errorf("api: %w", err)
	}
	for _, ifc := range cfg.Steered() {
		found := false
		for _, l := range st.Links {
			found = found || (l.Iface == ifc.Name && l.Hook == attach.HookXDP && l.Live)
		}
		if !found {
			return fmt.Errorf("api: status lists no running xdp attachment on %s: %+v", ifc.Name, st.Links)
		}
	}
	stats, err := cl.Stats(ctx)
	if err != nil {
		return fmt.Errorf("api: stats: %w", err)
	}
	rx := stats.Verdicts[bpf.StatRX.String()].Packets
	if rx == 0 {
		return errors.New("api: stats report no received packets")
	}
	fmt.Printf("%s ok api: %s answers: version %s, %d attachments, %d rules, rx %d packets\n",
		checkMarker, socket, st.Version, len(st.Attachments), st.Rules, rx)
	return nil
}

// pinnedXDPLink finds, among the links pinned under dir/links, the XDP link
// that holds prog on ifindex. It reads what the kernel says of each link
// rather than trusting pin names, so it follows the pin layout wherever
// control/attach takes it.
func pinnedXDPLink(dir string, ifindex int, prog ebpf.ProgramID) (string, link.ID, error) {
	pins, err := filepath.Glob(filepath.Join(dir, "links", "*"))
	if err != nil {
		return "", 0, err
	}
	for _, pin := range pins {
		l, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			continue
		}
		info, err := l.Info()
		l.Close()
		if err != nil || info.XDP() == nil {
			continue
		}
		if int(info.XDP().Ifindex) == ifindex && info.Program == prog {
			return pin, info.ID, nil
		}
	}
	return "", 0, fmt.Errorf("no XDP link pinned under %s holds program %d on ifindex %d (%d pins)",
		filepath.Join(dir, "links"), prog, ifindex, len(pins))
}

// checkTraffic makes the network answer (an ARP exchange with the gateway,
// provoked by a datagram to its discard port) and waits for the steering
// program's rx counter to count it: the program runs on the receive path.
func checkTraffic(ctx context.Context, cfg *appconfig.Config, dir string) error {
	var gw string
	for _, ifc := range cfg.Interfaces {
		if ifc.XDP != "" && ifc.Gateway != "" {
			gw = ifc.Gateway
			break
		}
	}
	if gw == "" {
		fmt.Printf("%s skip traffic: no steered interface has a gateway to talk to\n", checkMarker)
		return nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.Dial("udp", net.JoinHostPort(gw, "9")); err == nil {
			_, _ = c.Write([]byte("lovelock boot check"))
			c.Close()
		}
		stats, err := bpf.ReadPinnedStats(dir)
		if err != nil {
			return fmt.Errorf("steering counters: %w", err)
		}
		if rx := stats[bpf.StatRX].Packets; rx > 0 {
			fmt.Printf("%s ok traffic: steering program counted rx=%d packets (%d bytes) from %s's network\n",
				checkMarker, rx, stats[bpf.StatRX].Bytes, gw)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("steering program counted no received packet in 10s of talking to %s", gw)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// driverName reads the interface's driver from sysfs ("virtio_net").
func driverName(iface string) string {
	p, err := filepath.EvalSymlinks(filepath.Join("/sys/class/net", iface, "device/driver"))
	if err != nil {
		// virtio-net sits one level below its virtio device.
		return "unknown"
	}
	return filepath.Base(p)
}

// apiSocket is the API socket lovelockd is started with.
func apiSocket(cfg *appconfig.Config) string {
	return socketArg(cfg.Lovelockd.Args)
}

// socketArg returns the value of the last socket flag in args, in every
// form lovelockd's flag parsing takes (--socket PATH, --socket=PATH,
// -socket PATH, -socket=PATH), or the default socket.
func socketArg(args []string) string {
	socket := api.DefaultSocket
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break // the rest are not flags
		}
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, val, inline := strings.Cut(strings.TrimPrefix(a[1:], "-"), "=")
		if name != "socket" {
			continue
		}
		if inline {
			socket = val
		} else if i+1 < len(args) {
			socket = args[i+1]
			i++
		}
	}
	return socket
}

// healthy says why a node whose lovelockd reports st is not ready: only
// health ok is (lovelock status), so a DPU whose attachments, rules or
// services do not run is never reported ready.
func healthy(st api.Status) error {
	switch st.Health {
	case api.HealthOK:
		return nil
	case api.HealthDegraded:
		var b strings.Builder
		for i, f := range st.Failures {
			if i > 0 {
				b.WriteString("; ")
			}
			b.WriteString(f.What + ": " + f.Cause)
		}
		return fmt.Errorf("lovelockd runs degraded: %s", b.String())
	case "":
		return errors.New("lovelockd reports no health")
	}
	return fmt.Errorf("lovelockd is %s", st.Health)
}

// confirmReady asks lovelockd, once it said ready, whether it is.
func confirmReady(ctx context.Context, socket string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := api.NewClient(socket).Status(ctx)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	return healthy(st)
}

// readyRetry is how often /init asks lovelockd's API again after it said
// ready but the API did not confirm it.
const readyRetry = 5 * time.Second

// announceReady waits for lovelockd's ready line, then asks confirm until
// the API confirms it, and returns true; false when ctx ends first.
// lovelockd logs ready only when its state changes, so a failed
// confirmation is retried every retry (and at the next ready line) rather
// than waiting for a line that may never come. say gets "DPU is not ready:
// REASON" once per reason: the rshim log holds about 1 KiB in all.
func announceReady(ctx context.Context, ready <-chan struct{}, confirm func(context.Context) error,
	retry time.Duration, say func(string)) bool {
	select {
	case <-ready:
	case <-ctx.Done():
		return false
	}
	last := ""
	for {
		err := confirm(ctx)
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if why := err.Error(); why != last {
			say("DPU is not ready: " + why)
			last = why
		}
		t := time.NewTimer(retry)
		select {
		case <-ready:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
}
