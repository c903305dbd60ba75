// Command bench-msg measures the messaging service on the netns testbed:
// messages per second and bytes per second from host0 to ranks on host1,
// with one UDP datagram per message as the baseline, with agents on the DPUs
// (dpu0, dpu1) and with agents on the hosts, then the baseline again beside
// the DPU agents on kernel UDP and the same agents on AF_XDP (the steering
// program in XDP on pf0hpf and p0, lovelockd's rules, xdp.Group transports),
// at the same MTU, then a transfer-size sweep and a workers sweep. It brings
// up a testbed of its own, under a unique prefix, and tears it down on exit.
// Last, it runs Histogram in the modes none, host, dpu and dpu on AF_XDP,
// repeated, and prints inserts/s as min/median/max (-histo-only: just that).
// With -demo it runs Histogram across host0 and host1 through their DPUs
// instead (over AF_XDP with -demo-xdp). Needs root.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/lovelock-dpu/lovelock/appliance/service"
	"github.com/lovelock-dpu/lovelock/control/testbed"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging/apps"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/xdp"
)

var (
	prefix     = flag.String("prefix", fmt.Sprintf("bm%d-", os.Getpid()%100000), "namespace prefix of the testbed this run brings up (and removes)")
	duration   = flag.Duration("duration", time.Second, "measured time per configuration (after a 200ms warm-up)")
	sizes      = flag.String("sizes", "8,16,64,256", "message sizes, bytes")
	mtu        = flag.Int("mtu", 1500, "MTU of the testbed's veths (9000 lets bundles reach 8972 bytes)")
	ranks      = flag.Int("ranks", 4, "ranks per host")
	senders    = flag.Int("senders", 2, "sending goroutines on host0")
	workers    = flag.Int("workers", 2, "agent workers")
	sweep      = flag.Bool("sweep", true, "run the transfer-size and workers sweeps")
	demo       = flag.Bool("demo", false, "run Histogram across host0 and host1 through their DPUs, print throughput and bundle sizes, and exit")
	inserts    = flag.Int("inserts", 200000, "-demo: inserts per rank")
	xdpRows    = flag.Bool("xdp", true, "compare the baseline, the DPU agents on kernel UDP and the same agents on AF_XDP")
	xdpW       = flag.Int("xdp-workers", 1, "agent workers in the AF_XDP comparison (each needs a queue on pf0hpf and p0; the testbed's veths have one)")
	xdpSG      = flag.Bool("xdp-sg", true, "bind the DPU agents' AF_XDP sockets with XDP_USE_SG (multi-buffer): bundles up to the MTU on AF_XDP; false: one XDP buffer (3478 B at MTU 9000)")
	demoXDP    = flag.Bool("demo-xdp", false, "-demo: run the DPU agents on AF_XDP")
	histoOn    = flag.Bool("histo", true, "run Histogram in the modes none, host, dpu and dpu on AF_XDP (issue 15's table) after the other tables")
	histoAll   = flag.Bool("histo-only", false, "run only the Histogram table")
	histoN     = flag.Int("histo-inserts", 1000000, "Histogram table: inserts per rank")
	histoRanks = flag.Int("histo-ranks", 1, "Histogram table: ranks per host")
	histoRuns  = flag.Int("histo-runs", 3, "Histogram table: runs per mode")
	histoPad   = flag.Int("histo-pad", 0, "Histogram table: bytes added to every 9-byte insert")
	histoXDP   = flag.Bool("histo-xdp", true, "Histogram table: include the DPU agents on AF_XDP")
	histoModes = flag.String("histo-modes", "", "Histogram table: only these rows, comma-separated (none, host, dpu, dpu AF_XDP)")
	cpuProf    = flag.String("cpuprofile", "", "write a CPU profile of the AF_XDP comparison (with -histo-only: of the Histogram runs) to this file")
	clusterF   = flag.String("cluster", "", "-demo: run the clients of this messaging cluster file on the hosts of the existing testbed -prefix, "+
		"against agents that run elsewhere (lovelockd on the DPUs); no testbed of its own")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-msg:", err)
		os.Exit(1)
	}
}

func run() (err error) {
	spec := testbed.DefaultSpec()
	spec.Prefix = *prefix
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if *clusterF != "" {
		if !*demo {
			return fmt.Errorf("-cluster goes with -demo")
		}
		return demoExternal(ctx, spec, *clusterF)
	}
	fmt.Printf("testbed %q: up\n", spec.Prefix)
	defer func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer dcancel()
		if err := testbed.Down(dctx, spec); err != nil {
			fmt.Fprintln(os.Stderr, "bench-msg: testbed down:", err)
		}
	}()
	if err := testbed.Up(ctx, spec); err != nil {
		return err
	}
	if *mtu != 1500 {
		if err := testbed.SetMTU(spec, *mtu); err != nil {
			return err
		}
		fmt.Printf("raised the MTU of this testbed's veths and bridge to %d\n", *mtu)
	}
	maxPayload := udp.MaxPayloadForMTU(*mtu, false)
	fmt.Printf("veth MTU %d: bundles are capped at %d B by the transport", *mtu, maxPayload)
	if *mtu == 1500 {
		fmt.Printf(" (raise it with -mtu 9000 for up to %d B)", udp.MaxPayloadForMTU(9000, false))
	}
	fmt.Println()
	b := &bench{spec: spec, maxPayload: maxPayload}
	if *demo && *demoXDP {
		stop, err := b.steering()
		if err != nil {
			return err
		}
		defer stop()
	}
	if *demo {
		return b.demo(ctx)
	}
	if *histoAll {
		return b.histo(ctx)
	}
	var msgSizes []int
	for _, f := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("bad -sizes %q", *sizes)
		}
		msgSizes = append(msgSizes, n)
	}

	fmt.Printf("\nhost0 → %d ranks on host1, %d senders, %d agent workers, %v per point\n", *ranks, *senders, *workers, *duration)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "size B\tbaseline msg/s\tMB/s\tdpu msg/s\tMB/s\t×base\thost msg/s\tMB/s\t×base\tbundle B (dpu)\tretx (dpu)\t")
	type row struct {
		size            int
		base, dpu, host point
	}
	var rows []row
	for _, sz := range msgSizes {
		r := row{size: sz}
		var err error
		if r.base, err = b.baseline(ctx, sz); err != nil {
			return err
		}
		if r.dpu, err = b.messaging(ctx, messaging.ModeDPU, sz, messaging.DefaultTransferSize, *workers, false); err != nil {
			return err
		}
		if r.host, err = b.messaging(ctx, messaging.ModeHost, sz, messaging.DefaultTransferSize, *workers, false); err != nil {
			return err
		}
		rows = append(rows, r)
		fmt.Fprintf(tw, "%d\t%.0f\t%.1f\t%.0f\t%.1f\t%.1f\t%.0f\t%.1f\t%.1f\t%.0f\t%d\t\n", sz,
			r.base.rate, r.base.mbps(sz), r.dpu.rate, r.dpu.mbps(sz), r.dpu.rate/r.base.rate,
			r.host.rate, r.host.mbps(sz), r.host.rate/r.base.rate, r.dpu.bundle, r.dpu.retx)
	}
	tw.Flush()
	dpuRate, baseRate := map[int]float64{}, map[int]float64{}
	for _, r := range rows {
		dpuRate[r.size], baseRate[r.size] = r.dpu.rate, r.base.rate
	}
	fmt.Printf("target ≥10x over the baseline for 16 and 64 B messages (dpu mode): %s\n", tenX(dpuRate, baseRate))
	if *xdpRows {
		base := map[int]point{}
		for _, r := range rows {
			base[r.size] = r.base
		}
		if err := b.transports(ctx, msgSizes, base); err != nil {
			return err
		}
	}
	if *histoOn {
		defer func() {
			if err == nil {
				err = b.histo(ctx)
			}
		}()
	}
	if !*sweep {
		return nil
	}

	fmt.Printf("\ntransfer-size sweep: dpu mode, 16 B messages, %d workers\n", *workers)
	tw = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "transfer_size\tmsg/s\tMB/s\tbundle B\tretx\t")
	for ts := 1024; ; ts *= 2 {
		t := min(ts, maxPayload)
		p, err := b.messaging(ctx, messaging.ModeDPU, 16, t, *workers, false)
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "%d\t%.0f\t%.1f\t%.0f\t%d\t\n", t, p.rate, p.mbps(16), p.bundle, p.retx)
		if t == maxPayload {
			break
		}
	}
	tw.Flush()
	if maxPayload < 2048 {
		fmt.Printf("(the %d-byte MTU caps bundles at %d B: run with -mtu 9000 to sweep further)\n", *mtu, maxPayload)
	}

	fmt.Printf("\nworkers sweep: dpu mode, 16 B messages, transfer_size %d\n", min(messaging.DefaultTransferSize, maxPayload))
	tw = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workers\tmsg/s\tMB/s\tbundle B\tretx\t")
	for _, w := range []int{1, 2} {
		p, err := b.messaging(ctx, messaging.ModeDPU, 16, messaging.DefaultTransferSize, w, false)
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "%d\t%.0f\t%.1f\t%.0f\t%d\t\n", w, p.rate, p.mbps(16), p.bundle, p.retx)
	}
	tw.Flush()
	return nil
}

// setMTU sets the MTU of every veth and bridge of the testbed.
type bench struct {
	spec       testbed.Spec
	maxPayload int
	steer      map[string]*service.Program // per DPU, with -xdp
	bound      map[string]*service.Binding // the DPU agents' AF_XDP bindings of the running configuration
}

type point struct {
	rate   float64 // messages delivered per second
	bundle float64 // average bundle bytes sent by host0's client
	retx   uint64  // retransmitted bundles, clients and agents
	xdp    *xdpPoint
}

// xdpTransferSize is the bundle size of a cluster whose DPU agents run on
// AF_XDP: what one datagram of the AF_XDP transport carries at the
// testbed's MTU (3478 bytes from MTU 3506 up: one XDP buffer on veth,
// xdp.SingleBufferFrame). The clients, on kernel UDP, keep to it too, so
// that their bundles reach the agents' AF_XDP sockets rather than pass to
// the stack as multi-buffer frames (xsk_miss).
//
// With -xdp-sg (the default) the sockets are bound with XDP_USE_SG and take
// multi-buffer frames, and the bundles reach the MTU less 28, as on kernel
// UDP (xdp.MaxPayloadForMTUMulti).
func (b *bench) xdpTransferSize() int {
	if *xdpSG {
		return min(messaging.DefaultTransferSize, b.maxPayload, xdp.MaxPayloadForMTUMulti(*mtu))
	}
	return min(messaging.DefaultTransferSize, b.maxPayload, xdp.MaxPayloadForMTU(*mtu))
}

// xdpPoint is what the DPU agents' AF_XDP transports did in a run, summed
// over both DPUs.
type xdpPoint struct {
	datagrams uint64 // received and sent, all paths
	kernel    uint64 // of those, through the kernel sockets
	waits     uint64 // epoll_wait calls of waiting workers
	kicks     uint64 // sendto/recvfrom wakeups of the AF_XDP sockets (copy mode: sendto transmits)
	kernelIO  uint64 // recvmmsg/sendmmsg calls on the kernel sockets
	dropped   uint64 // frames the kernel dropped for the sockets
	miss      uint64 // xsk verdicts the steering programs passed to the stack instead (xsk_miss)
	mode      string
}

func (p xdpPoint) sub(q xdpPoint) xdpPoint {
	return xdpPoint{datagrams: p.datagrams - q.datagrams, kernel: p.kernel - q.kernel, waits: p.waits - q.waits,
		kicks: p.kicks - q.kicks, kernelIO: p.kernelIO - q.kernelIO, dropped: p.dropped - q.dropped,
		miss: p.miss - q.miss, mode: p.mode}
}

func (p point) mbps(size int) float64 { return p.rate * float64(size) / 1e6 }

func (b *bench) addr(node string) netip.Addr {
	a, err := b.spec.NodeAddr(node)
	if err != nil {
		panic(err)
	}
	return a
}

// window runs load until stopped, and returns the rate of count over
// -duration after a warm-up.
func window(ctx context.Context, count *atomic.Uint64) float64 {
	select {
	case <-time.After(200 * time.Millisecond):
	case <-ctx.Done():
		return 0
	}
	c0, t0 := count.Load(), time.Now()
	select {
	case <-time.After(*duration):
	case <-ctx.Done():
	}
	return float64(count.Load()-c0) / time.Since(t0).Seconds()
}

// baseline sends one UDP datagram per message (batched sendmmsg), from
// host0 to one socket per rank on host1, and counts what arrives.
func (b *bench) baseline(ctx context.Context, size int) (point, error) {
	var rx []*udp.Conn
	var tx *udp.Conn
	closeAll := func() {
		for _, c := range rx {
			_ = c.Close()
		}
		if tx != nil {
			_ = tx.Close()
		}
	}
	defer closeAll()
	opts := udp.Options{ReadBuffer: 4 << 20, WriteBuffer: 4 << 20}
	err := b.spec.Run("host1", func() error {
		for range *ranks {
			c, err := udp.Listen(netip.AddrPortFrom(b.addr("host1"), 0), opts)
			if err != nil {
				return err
			}
			rx = append(rx, c)
		}
		return nil
	})
	if err != nil {
		return point{}, err
	}
	var txs []*udp.Conn
	err = b.spec.Run("host0", func() error {
		for range *senders {
			c, err := udp.Listen(netip.AddrPortFrom(b.addr("host0"), 0), opts)
			if err != nil {
				return err
			}
			txs = append(txs, c)
		}
		return nil
	})
	defer func() {
		for _, c := range txs {
			_ = c.Close()
		}
	}()
	if err != nil {
		return point{}, err
	}
	var got atomic.Uint64
	lctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, c := range rx {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pkts := make([]transport.Packet, 64)
			for i := range pkts {
				pkts[i].Data = make([]byte, 2048)
			}
			for {
				n, err := c.Recv(lctx, pkts)
				if err != nil {
					return
				}
				got.Add(uint64(n))
			}
		}()
	}
	for s, c := range txs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pkts := make([]transport.Packet, 64)
			payload := make([]byte, size)
			for i := range pkts {
				pkts[i] = transport.Packet{Data: payload, Addr: rx[(s+i)%len(rx)].LocalAddr()}
			}
			for lctx.Err() == nil {
				if _, err := c.Send(pkts); err != nil {
					time.Sleep(10 * time.Microsecond)
				}
			}
		}()
	}
	rate := window(ctx, &got)
	stop()
	for _, c := range rx {
		_ = c.Close()
	}
	rx = nil
	wg.Wait()
	return point{rate: rate}, nil
}

// layout is the two-node cluster of host0 and host1: one client per host
// serving -ranks ranks, the agents on the DPUs (ModeDPU, their sockets
// opened inside dpu0 and dpu1) or on the hosts (ModeHost).
func (b *bench) layout(mode messaging.Mode, tsize, w int) apps.Layout {
	return apps.Layout{
		Mode: mode, Nodes: 2, ClientsPerNode: 1, RanksPerClient: *ranks, Workers: w, MaxPayload: b.maxPayload,
		Tune: func(c *messaging.Config) {
			c.TransferSize = tsize
			c.SenderShards = *senders
		},
		ListenAgent: func(n int, opts udp.Options, workers int) (g []*udp.Conn, err error) {
			node := fmt.Sprintf("dpu%d", n)
			if mode == messaging.ModeHost {
				node = fmt.Sprintf("host%d", n)
			}
			err = b.spec.Run(node, func() (err error) {
				g, err = udp.ListenGroup(netip.AddrPortFrom(b.addr(node), 0), workers, opts)
				return err
			})
			return g, err
		},
		ListenClient: func(n, _ int, opts udp.Options) (c *udp.Conn, err error) {
			node := fmt.Sprintf("host%d", n)
			err = b.spec.Run(node, func() (err error) {
				c, err = udp.Listen(netip.AddrPortFrom(b.addr(node), 0), opts)
				return err
			})
			return c, err
		},
	}
}

// messaging sends size-byte messages from host0's client to host1's ranks
// through the cluster and counts what host1's client delivers. With
// useXDP the DPU agents run on AF_XDP.
func (b *bench) messaging(ctx context.Context, mode messaging.Mode, size, tsize, w int, useXDP bool) (point, error) {
	var got atomic.Uint64
	l := b.layout(mode, tsize, w)
	if useXDP {
		l.OpenAgent = b.openXDP
		defer b.closeXDP()
	}
	cl, err := apps.StartCluster(l, func(uint32, []byte) { got.Add(1) })
	if err != nil {
		return point{}, err
	}
	defer cl.Close()
	lctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	first := uint32(*ranks) // host1's ranks
	for s := range *senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			payload := make([]byte, size)
			for i := s; lctx.Err() == nil; i++ {
				if err := cl.Clients[0].SendContext(lctx, first+uint32(i%*ranks), payload); err != nil {
					return
				}
			}
		}()
	}
	var before xdpPoint
	if useXDP {
		before = b.xdpCounts()
	}
	rate := window(ctx, &got)
	var after xdpPoint
	if useXDP {
		after = b.xdpCounts()
	}
	stop()
	wg.Wait()
	p := point{rate: rate, bundle: cl.Clients[0].Stats().Sent().AvgBundleBytes}
	if useXDP {
		d := after.sub(before)
		p.xdp = &d
	}
	clients, agents := cl.Stats()
	for _, s := range append(clients, agents...) {
		p.retx += s.Sent().Retransmits
	}
	return p, nil
}
