package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"

	"github.com/vishvananda/netlink"

	"github.com/lovelock-dpu/lovelock/appliance/service"
	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/xdp"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// The AF_XDP comparison runs far-memory agents in this process, in dpu0
// (so, unlike the main table's lovelockd roles, requesters, agents and
// memory server share one process, and the steering program is attached
// to dpu0's interfaces for every row, the direct row too):
// one on AF_XDP sockets (host side on pf0hpf at xdpHost, fabric side on p0
// at xdpFabric: two addresses, as each side needs its own socket on the
// Lovelock port) and, for the same datagram size, one on kernel UDP
// (kernelHost). A memory server in this process, in mem0, on memPortXDP,
// answers both with datagrams of that size: up to the MTU on multi-buffer
// sockets (-xdp-sg), else one AF_XDP frame.
const (
	xdpHost    = "10.77.0.110"
	xdpFabric  = "10.77.0.111"
	kernelHost = "10.77.0.112"
	memPortXDP = 7000
)

// memIP is mem0's address.
var memIP = netip.MustParseAddr("10.77.0.20")

// xdpRun is the comparison's setup.
type xdpRun struct {
	b        *bench
	max      int // datagram size every party uses
	region   farmem.RegionInfo
	server   *farmem.Server
	stop     []func()
	wg       sync.WaitGroup
	cancel   context.CancelFunc
	xdpMode  string
	xskMiss0 uint64
	steer    *service.Program
}

func (b *bench) xdpCompare(ctx context.Context, n int) error {
	x := &xdpRun{b: b, max: xdp.MaxPayloadForMTU(9000)}
	sizeNote := "one AF_XDP frame on veth"
	if *xdpSG {
		x.max, sizeNote = xdp.MaxPayloadForMTUMulti(9000), "multi-buffer AF_XDP sockets"
	}
	defer x.close()
	if err := x.setup(ctx); err != nil {
		return fmt.Errorf("AF_XDP comparison: %w", err)
	}
	saved := b.region
	b.region = x.region
	b.maxDatagram = x.max
	defer func() { b.region, b.maxDatagram = saved, 0 }()
	fmt.Printf("\nthe DPU agent on AF_XDP (%s mode) vs on kernel UDP, both in this process in dpu0, every party at %d-byte datagrams (%s); %d requesters\n",
		x.xdpMode, x.max, sizeNote, n)
	fmt.Println("  op     direct MB/s  kernel UDP agent MB/s  AF_XDP agent MB/s  kernel/direct  AF_XDP/kernel  AF_XDP/direct  p50 µs (direct / kernel / xdp)  errors (direct / kernel / xdp)")
	direct := netip.AddrPortFrom(memIP, memPortXDP).String()
	for _, write := range []bool{false, true} {
		d, err := b.chunks(ctx, direct, n, write, 0)
		if err != nil {
			return err
		}
		k, err := b.chunks(ctx, kernelHost+":61440", n, write, 0)
		if err != nil {
			return err
		}
		a, err := b.chunks(ctx, xdpHost+":61440", n, write, 0)
		if err != nil {
			return err
		}
		op := "read"
		if write {
			op = "write"
		}
		fmt.Printf("  %-5s  %11.0f  %21.0f  %17.0f  %13.2f  %13.2f  %13.2f  %d / %d / %d  %d / %d / %d\n", op, d.mbps, k.mbps, a.mbps, k.mbps/d.mbps, a.mbps/k.mbps, a.mbps/d.mbps,
			d.p50.Microseconds(), k.p50.Microseconds(), a.p50.Microseconds(), d.errors, k.errors, a.errors)
	}
	if st, err := x.steer.Steer.Stats(); err == nil {
		fmt.Printf("  xsk_miss on dpu0 (AF_XDP-bound datagrams the steering program passed to the stack): %d\n", st[bpf.StatXSKMiss].Packets-x.xskMiss0)
	}
	return nil
}

func (x *xdpRun) setup(ctx context.Context) error {
	spec := x.b.spec
	// A memory server in mem0 whose replies fit one AF_XDP frame.
	dir, err := os.MkdirTemp("", "bench-mem-xdp-")
	if err != nil {
		return err
	}
	x.stop = append(x.stop, func() { os.RemoveAll(dir) })
	cfg := farmem.Config{MaxDatagram: x.max}
	err = spec.Run("mem0", func() error {
		var err error
		x.server, err = farmem.NewServer(farmem.ServerOptions{Config: cfg, StateDir: filepath.Join(dir, "state"), Capacity: 1 << 32,
			Addr: netip.AddrPortFrom(memIP, memPortXDP)})
		return err
	})
	if err != nil {
		return err
	}
	x.region, err = x.server.Create(0, x.b.region.Size, true, "")
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	x.cancel = cancel
	x.wg.Go(func() { _ = x.server.Run(runCtx) })

	// dpu0: the addresses, the steering program in XDP on pf0hpf and p0,
	// and the two agents.
	err = spec.Run("dpu0", func() error {
		p0, err := netlink.LinkByName("p0")
		if err != nil {
			return err
		}
		for _, a := range []string{xdpHost, xdpFabric, kernelHost} {
			addr, _ := netlink.ParseAddr(a + "/24")
			if err := netlink.AddrAdd(p0, addr); err != nil {
				return fmt.Errorf("add %s to dpu0's p0: %w", a, err)
			}
		}
		p, stop, err := service.LoadProgram([]string{"pf0hpf", "p0"})
		if err != nil {
			return err
		}
		x.steer = p
		x.stop = append(x.stop, stop)
		return nil
	})
	if err != nil {
		return err
	}
	host, err := x.bind("mem-host", "pf0hpf", xdpHost, []wire.Type{wire.TypeMemRead, wire.TypeMemWrite})
	if err != nil {
		return err
	}
	fabric, err := x.bind("mem-fabric", "p0", xdpFabric, []wire.Type{wire.TypeMemReply})
	if err != nil {
		return err
	}
	x.xdpMode = host.Groups[0].Transports()[0].Mode().String()
	server := farmem.ServerSpec{Addr: netip.AddrPortFrom(memIP, memPortXDP)}
	agentCfg := farmem.AgentConfig{Config: cfg, Servers: []farmem.ServerSpec{server}}
	xa, err := farmem.NewAgent(agentCfg, farmem.AgentOptions{HostTransports: host.Transports(), FabricTransports: fabric.Transports()})
	if err != nil {
		return err
	}
	x.wg.Go(func() { _ = xa.Run(runCtx) })
	agentCfg.Listen = netip.MustParseAddrPort(kernelHost + ":61440")
	var ka *farmem.Agent
	if err := spec.Run("dpu0", func() error {
		ka, err = farmem.NewAgent(agentCfg, farmem.AgentOptions{})
		return err
	}); err != nil {
		return err
	}
	x.wg.Go(func() { _ = ka.Run(runCtx) })
	if st, err := x.steer.Steer.Stats(); err == nil {
		x.xskMiss0 = st[bpf.StatXSKMiss].Packets
	}
	return nil
}

// bind binds one side of the AF_XDP agent through the service frame: a
// socket on iface's queue 0 at addr, and a reserved rule per type that
// sends the side's datagrams there.
func (x *xdpRun) bind(name, iface, addr string, types []wire.Type) (*service.Binding, error) {
	ap := netip.AddrPortFrom(netip.MustParseAddr(addr), wire.DefaultPort)
	needs := service.Needs{XDP: &service.XDPNeeds{Interfaces: []string{iface}, Addr: ap, Workers: 1, MultiBuffer: *xdpSG}}
	for _, typ := range types {
		typ := typ
		needs.Rules = append(needs.Rules, rules.Rule{Name: fmt.Sprintf("%s%s/%s", api.OwnedRulePrefix, name, typ), Priority: api.OwnedPriority,
			Match: rules.Match{Iface: iface, Dst: netip.PrefixFrom(ap.Addr(), 32), Type: &typ}, Action: rules.XSK(0)})
	}
	var b *service.Binding
	err := x.b.spec.Run("dpu0", func() error {
		var err error
		b, err = service.Bind(x.steer, slog.Default(), name, needs)
		return err
	})
	if err != nil {
		return nil, err
	}
	// Unbinding recompiles the rules, which name dpu0's interfaces.
	x.stop = append(x.stop, func() { _ = x.b.spec.Run("dpu0", func() error { b.Close(); return nil }) })
	if len(b.Degraded) > 0 {
		return nil, fmt.Errorf("%s bound short of its needs: %v", name, b.Degraded)
	}
	return b, nil
}

func (x *xdpRun) close() {
	if x.cancel != nil {
		x.cancel()
	}
	x.wg.Wait()
	for i := len(x.stop) - 1; i >= 0; i-- {
		x.stop[i]()
	}
}
