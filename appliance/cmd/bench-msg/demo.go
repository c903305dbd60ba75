package main

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/lovelock-dpu/lovelock/control/testbed"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging/apps"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
)

// demo runs Histogram across host0 and host1 through their DPUs.
func (b *bench) demo(ctx context.Context) error {
	w := *workers
	l := b.layout(messaging.ModeDPU, messaging.DefaultTransferSize, w)
	if *demoXDP {
		w = *xdpW
		l = b.layout(messaging.ModeDPU, b.xdpTransferSize(), w)
		l.OpenAgent = b.openXDP
		defer b.closeXDP()
	}
	h := apps.NewHistogram(l.Ranks(), apps.HistogramParams{InsertsPerRank: *inserts, KeysPerRank: 4096, Seed: 1})
	cl, err := apps.StartCluster(l, h.Handle)
	if err != nil {
		return err
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	res, err := h.Run(rctx, cl)
	if err != nil {
		return err
	}
	on := "kernel UDP"
	if *demoXDP {
		c := b.xdpCounts()
		on = fmt.Sprintf("AF_XDP (%s mode; %d of %d agent datagrams through the kernel sockets, xsk_miss %d)", c.mode, c.kernel, c.datagrams, c.miss)
	}
	fmt.Printf("histogram: %d ranks on host0 and host1, agents on dpu0 and dpu1 over %s: %d inserts in %v: %.0f msg/s, %.1f MB/s; table verified\n",
		l.Ranks(), on, res.Messages, res.Elapsed.Round(time.Millisecond), res.Rate(), float64(res.Bytes)/res.Elapsed.Seconds()/1e6)
	clients, agents := cl.Stats()
	for i, s := range clients {
		fmt.Printf("  host%d client: average bundle %.0f B (transfer_size %d)\n", i, s.Sent().AvgBundleBytes, s.TransferSize)
	}
	for i, s := range agents {
		fmt.Printf("  dpu%d agent:   average bundle %.0f B\n", i, s.Sent().AvgBundleBytes)
	}
	return nil
}

// demoExternal runs Histogram between the clients of a cluster file, on the
// hosts of an existing testbed, through agents that run elsewhere.
func demoExternal(ctx context.Context, spec testbed.Spec, file string) error {
	cfg, err := messaging.LoadConfig(file)
	if err != nil {
		return err
	}
	opts := udp.Options{ReadBuffer: cfg.SocketBuffer, WriteBuffer: cfg.SocketBuffer, MaxPayload: udp.MaxPayloadForMTU(*mtu, false)}
	// Each client runs on the testbed node that has its address.
	owner := map[netip.Addr]string{}
	for _, name := range spec.NodeNames() {
		if a, err := spec.NodeAddr(name); err == nil {
			owner[a] = name
		}
	}
	ranks := 0
	for _, n := range cfg.Nodes {
		for _, c := range n.Clients {
			ranks += len(c.Ranks.All())
		}
	}
	h := apps.NewHistogram(uint32(ranks), apps.HistogramParams{InsertsPerRank: *inserts, KeysPerRank: 4096, Seed: 1})
	cl, err := apps.StartClients(cfg, func(n, c int) (conn *udp.Conn, err error) {
		addr := cfg.Nodes[n].Clients[c].Addr
		node, ok := owner[addr.Addr()]
		if !ok {
			return nil, fmt.Errorf("no node of testbed %q has address %v", spec.Prefix, addr.Addr())
		}
		err = spec.Run(node, func() (err error) {
			conn, err = udp.Listen(addr, opts)
			return err
		})
		return conn, err
	}, h.Handle)
	if err != nil {
		return err
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	res, err := h.Run(rctx, cl)
	if err != nil {
		return err
	}
	var nodes []string
	for _, n := range cfg.Nodes {
		nodes = append(nodes, n.Name)
	}
	fmt.Printf("histogram: %d ranks, clients on the hosts, agents of %s (%s mode): %d inserts in %v: %.0f msg/s, %.1f MB/s; table verified\n",
		cl.Ranks(), strings.Join(nodes, ", "), cfg.Mode, res.Messages, res.Elapsed.Round(time.Millisecond), res.Rate(), float64(res.Bytes)/res.Elapsed.Seconds()/1e6)
	for _, c := range cl.Clients {
		st := c.Stats()
		fmt.Printf("  %s/%s client: average bundle %.0f B (transfer_size %d)\n", st.Node, st.Client, st.Sent().AvgBundleBytes, st.TransferSize)
	}
	return nil
}
