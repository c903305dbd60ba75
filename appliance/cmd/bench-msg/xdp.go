package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"runtime/pprof"
	"strings"
	"text/tabwriter"

	"github.com/lovelock-dpu/lovelock/appliance/service"
	"github.com/lovelock-dpu/lovelock/appliance/service/msgservice"
	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// The DPU agents on AF_XDP: the steering program in native XDP on each
// DPU's pf0hpf and p0, and each agent bound to AF_XDP sockets on both with
// its reserved rules by the service frame (service.Bind with the messaging
// service's rules): what lovelockd does with messaging.transport xdp, in
// process.

var xdpIfaces = []string{"pf0hpf", "p0"}

// steering loads the steering program in dpu0 and dpu1 and attaches it.
func (b *bench) steering() (stop func(), err error) {
	b.steer = map[string]*service.Program{}
	var stops []func()
	stop = func() {
		for _, s := range stops {
			s()
		}
	}
	for _, dpu := range []string{"dpu0", "dpu1"} {
		err := b.spec.Run(dpu, func() error {
			p, s, err := service.LoadProgram(xdpIfaces)
			if err != nil {
				return err
			}
			b.steer[dpu] = p
			stops = append(stops, s)
			return nil
		})
		if err != nil {
			stop()
			return nil, err
		}
	}
	return stop, nil
}

// openXDP is apps.Layout.OpenAgent for the DPU agents on AF_XDP.
func (b *bench) openXDP(n int, opts udp.Options, workers int) ([]transport.Transport, error) {
	dpu := fmt.Sprintf("dpu%d", n)
	addr := netip.AddrPortFrom(b.addr(dpu), wire.DefaultPort) // XDP parses Lovelock headers on this port only
	eps := make([]messaging.Endpoint, workers)
	for w := range eps {
		eps[w] = messaging.AgentEndpoint(n, w)
	}
	needs := service.Needs{
		XDP:   &service.XDPNeeds{Interfaces: xdpIfaces, Addr: addr, Workers: workers, Kernel: opts, MultiBuffer: *xdpSG},
		Rules: msgservice.Rules(addr, 0, eps, xdpIfaces),
	}
	var bound *service.Binding
	err := b.spec.Run(dpu, func() error {
		var err error
		bound, err = service.Bind(b.steer[dpu], slog.Default(), msgservice.Name, needs)
		return err
	})
	if err != nil {
		return nil, err
	}
	if len(bound.Degraded) > 0 {
		bound.Close()
		return nil, fmt.Errorf("%s: agent bound short of its needs: %s", dpu, strings.Join(bound.Degraded, "; "))
	}
	if b.bound == nil {
		b.bound = map[string]*service.Binding{}
	}
	b.bound[dpu] = bound
	return bound.Transports(), nil
}

// closeXDP unbinds the DPU agents (the agents closed their sockets).
func (b *bench) closeXDP() {
	for dpu, bound := range b.bound {
		_ = b.spec.Run(dpu, func() error { bound.Close(); return nil })
	}
	b.bound = nil
}

// xdpCounts sums the AF_XDP transports' counters, and the steering
// programs' xsk_miss, over both DPUs.
func (b *bench) xdpCounts() xdpPoint {
	var p xdpPoint
	for _, s := range b.steer {
		if st, err := s.Steer.Stats(); err == nil {
			p.miss += st[bpf.StatXSKMiss].Packets
		}
	}
	for _, bound := range b.bound {
		for _, g := range bound.Groups {
			st := g.Stats()
			k := st.KernelRX + st.KernelTX + st.KernelFallback
			p.datagrams += k
			p.kernel += k
			p.waits += st.Polls
			p.kernelIO += st.KernelReads + st.KernelSends
			for _, s := range st.Sockets {
				p.datagrams += s.Transport.RXPackets + s.Transport.TXPackets
				p.kicks += s.Socket.TXWakeups + s.Socket.RXWakeups
				p.waits += s.Socket.Polls
				p.dropped += s.Socket.RXDropped + s.Socket.RXRingFull
				p.mode = s.Mode.String()
			}
		}
	}
	return p
}

// transports runs, per message size and at the testbed's MTU: the baseline
// (one datagram per message, no agent) again, the DPU agents on kernel UDP
// with bundles up to the MTU, the same agents with bundles capped at what
// the AF_XDP transport carries (only when that cap is lower), and the
// agents on AF_XDP. The steering program is attached to pf0hpf and p0 of
// both DPUs throughout, so every datagram here passes through XDP as on a
// DPU (the baseline's and the kernel-UDP agents' with verdict pass), which
// slows the baseline down. The ratios are therefore taken to base, the
// baseline of the main table, measured earlier in the same run without
// XDP: the higher of the two. It checks in the AF_XDP rows' own counters
// that their datagrams took the AF_XDP sockets.
func (b *bench) transports(ctx context.Context, msgSizes []int, base map[int]point) error {
	stop, err := b.steering()
	if err != nil {
		return err
	}
	defer stop()
	udpT := min(messaging.DefaultTransferSize, b.maxPayload)
	xdpT := b.xdpTransferSize()
	fmt.Printf("\nbaseline vs DPU agents on kernel UDP (bundles ≤ %d B) vs on AF_XDP (bundles ≤ %d B), MTU %d, XDP on the DPUs' pf0hpf and p0 in every row, "+
		"%d agent worker(s), %d senders, %v per point\n", udpT, xdpT, *mtu, *xdpW, *senders, *duration)
	if *cpuProf != "" {
		f, err := os.Create(*cpuProf)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	type row struct {
		size                  int
		base, xbase, u, uc, x point
		capped                bool // uc was measured
	}
	var rows []row
	for _, sz := range msgSizes {
		r := row{size: sz, base: base[sz], capped: xdpT < udpT}
		if r.xbase, err = b.baseline(ctx, sz); err != nil {
			return err
		}
		if r.u, err = b.messaging(ctx, messaging.ModeDPU, sz, udpT, *xdpW, false); err != nil {
			return err
		}
		if r.capped {
			if r.uc, err = b.messaging(ctx, messaging.ModeDPU, sz, xdpT, *xdpW, false); err != nil {
				return err
			}
		}
		if r.x, err = b.messaging(ctx, messaging.ModeDPU, sz, xdpT, *xdpW, true); err != nil {
			return err
		}
		rows = append(rows, r)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "size B\tbaseline msg/s\tbase+XDP msg/s\tudp msg/s\t×base\tbundle B\tudp ≤%d msg/s\t×base\txdp msg/s\t×base\tbundle B\txdp/udp\txdp/udp ≤%d\tretx udp/udp≤/xdp\t\n", xdpT, xdpT)
	dash := func(ok bool, f string, v float64) string {
		if !ok {
			return "-"
		}
		return fmt.Sprintf(f, v)
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%.0f\t%.0f\t%.0f\t%.1f\t%.0f\t%s\t%s\t%.0f\t%.1f\t%.0f\t%.2f\t%s\t%d/%d/%d\t\n", r.size,
			r.base.rate, r.xbase.rate, r.u.rate, r.u.rate/r.base.rate, r.u.bundle,
			dash(r.capped, "%.0f", r.uc.rate), dash(r.capped, "%.1f", r.uc.rate/r.base.rate),
			r.x.rate, r.x.rate/r.base.rate, r.x.bundle, r.x.rate/r.u.rate, dash(r.capped, "%.2f", r.x.rate/r.uc.rate),
			r.u.retx, r.uc.retx, r.x.retx)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Printf("(baseline: one datagram per message, from the main table (no XDP); base+XDP: the same, measured here, through XDP on the DPUs; "+
		"udp: the DPU agents on kernel UDP; udp ≤%d: the same with bundles capped like AF_XDP's; xdp: on AF_XDP; "+
		"×base: the ratio to the baseline; bundle B: host0 client's average bundle)\n", xdpT)

	fmt.Println("\nthe AF_XDP rows' transport counters (both DPUs' agents):")
	tw = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "size B\tmode\tdatagrams\tvia kernel socket\txsk_miss\tdropped\tper datagram: wait\tkick\tkernel I/O\t")
	var all xdpPoint
	for _, r := range rows {
		x := r.x.xdp
		dg := float64(max(x.datagrams, 1))
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d (%.2f%%)\t%d\t%d\t%.2f\t%.2f\t%.2f\t\n", r.size, x.mode, x.datagrams, x.kernel, 100*float64(x.kernel)/dg,
			x.miss, x.dropped, float64(x.waits)/dg, float64(x.kicks)/dg, float64(x.kernelIO)/dg)
		all.datagrams += x.datagrams
		all.kernel += x.kernel
		all.miss += x.miss
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Println("(datagrams: the agents' received and sent, on all paths; via kernel socket: of those, on the kernel sockets; xsk_miss: " +
		"xsk verdicts the steering programs passed to the stack; wait = epoll_wait of an idle worker, " +
		"kick = sendto/recvfrom wakeups of the AF_XDP sockets, kernel I/O = recvmmsg/sendmmsg on the kernel sockets)")
	xdpPath := all.datagrams > 0 && float64(all.kernel+all.miss) <= 0.001*float64(all.datagrams)
	if !xdpPath {
		fmt.Printf("WARNING: the AF_XDP rows did not stay on the AF_XDP sockets: %d of %d datagrams on the kernel sockets, xsk_miss %d\n",
			all.kernel, all.datagrams, all.miss)
	} else {
		fmt.Printf("AF_XDP path check: %d of %d agent datagrams on the kernel sockets, xsk_miss %d\n", all.kernel, all.datagrams, all.miss)
	}
	u, x, bs := map[int]float64{}, map[int]float64{}, map[int]float64{}
	for _, r := range rows {
		u[r.size], x[r.size], bs[r.size] = r.u.rate, r.x.rate, r.base.rate
	}
	fmt.Println(transportVerdicts(u, x, bs, xdpPath))
	return nil
}
