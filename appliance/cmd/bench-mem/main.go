// Command bench-mem measures far memory on the netns testbed. lovelockd
// runs each far-memory role in its node, as on a cluster: the memory server
// on mem0, the far-memory agent on dpu0, the host agent on host0. The
// requesters run in this process, inside host0, so this process's CPU time
// is the host's. In one run it prints:
//
//   - 64 KiB chunk reads and writes with 1, 4 and 16 requesters, from host0
//     to mem0 directly (SODA's MemServer baseline) and through dpu0's agent:
//     throughput, p50/p99 latency, host CPU seconds per GiB moved;
//   - fault-in through the transparent mapping (host0's host agent), without
//     and with read-ahead, against explicit sequential reads through the
//     agent;
//   - (-pinned) the chunk reads and writes at the most requesters again with
//     dpu0's agent pinned to a CPU of its own and every other party to
//     another, as a DPU's own cores would separate them.
//
// With -demo it instead uses a running testbed's lovelockds (make demo):
// it maps a region from host0 through dpu0, writes and verifies a pattern
// far larger than the mapping's buffer, and prints throughput and the bytes
// dpu0's agent moved.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/lovelock-dpu/lovelock/appliance/internal/memcluster"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/testbed"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
)

var (
	prefix     = flag.String("prefix", fmt.Sprintf("bf%d-", os.Getpid()%100000), "namespace prefix of the testbed this run brings up (and removes)")
	lovelockd  = flag.String("lovelockd", "bin/lovelockd", "the lovelockd binary to run in the nodes")
	duration   = flag.Duration("duration", 2*time.Second, "measured time per point (after a 200ms warm-up)")
	regionSize = flag.String("region", "256MiB", "region size")
	requesters = flag.String("requesters", "1,4,16", "requester counts")
	profileDir = flag.String("profile", "", "write CPU profiles of this process (the requesters) during the equal-load points to this directory")
	rate       = flag.Float64("rate", 100e6, "also measure both paths at this equal offered load in bytes/s (the most requesters, paced; 0: skip)")
	pinned     = flag.Bool("pinned", true, "also measure both paths at the most requesters with dpu0's agent on CPU 1 and every other party (this process, host0's and mem0's lovelockd) on CPU 0")
	xdpRows    = flag.Bool("xdp", true, "also compare the DPU agent on AF_XDP with the same agent on kernel UDP, at equal datagram sizes")
	xdpSG      = flag.Bool("xdp-sg", true, "-xdp: bind the AF_XDP sockets with XDP_USE_SG (multi-buffer) and use datagrams up to the MTU, as on kernel UDP; false: one XDP buffer each (3478 B at MTU 9000)")
	demo       = flag.Bool("demo", false, "map a region from host0 through dpu0 on a running testbed, write and verify it, print throughput, and exit")
	demoSize   = flag.String("demo-size", "64MiB", "-demo: region size")
	memSock    = flag.String("mem-socket", "", "-demo: API socket of mem0's lovelockd")
	dpuSock    = flag.String("dpu-socket", "", "-demo: API socket of dpu0's lovelockd")
	hostSock   = flag.String("host-socket", "", "-demo: far-memory socket of host0's lovelockd (far_memory_host.socket)")
)

// The testbed's far-memory addresses.
const (
	memAddr   = memcluster.MemAddr
	agentAddr = memcluster.AgentAddr
)

func main() {
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var err error
	if *demo {
		err = runDemo(ctx)
	} else {
		err = run(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-mem:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	size, err := farmem.ParseSize(*regionSize)
	if err != nil {
		return fmt.Errorf("-region: %w", err)
	}
	counts, err := parseCounts(*requesters)
	if err != nil {
		return err
	}
	if _, err := os.Stat(*lovelockd); err != nil {
		return fmt.Errorf("-lovelockd: %w (build it: make build, or go build -o bin/lovelockd ./appliance/cmd/lovelockd)", err)
	}
	spec := testbed.DefaultSpec()
	spec.Prefix = *prefix
	if err := testbed.Up(ctx, spec); err != nil {
		return err
	}
	defer func() {
		if err := testbed.Down(context.Background(), spec); err != nil {
			fmt.Fprintln(os.Stderr, "bench-mem: testbed down:", err)
		}
	}()
	if err := testbed.SetMTU(spec, 9000); err != nil {
		return err
	}
	cl, err := memcluster.Start(ctx, spec, *lovelockd, memcluster.Options{})
	if err != nil {
		return err
	}
	defer cl.Stop()
	fmt.Printf("testbed %q: MTU 9000; lovelockd: memory server on mem0, far-memory agent on dpu0, host agent on host0\n", spec.Prefix)

	var info farmem.RegionInfo
	if err := cl.Mem.Client().ServiceCall(ctx, http.MethodPost, "memserver", "regions", api.MemCreate{Size: uint64(size), Writable: true}, &info); err != nil {
		return fmt.Errorf("create the region: %w", err)
	}
	b := &bench{spec: spec, region: info, cluster: cl}
	if err := b.fill(ctx); err != nil {
		return err
	}
	return b.report(ctx, counts)
}

func parseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range splitComma(s) {
		var n int
		if _, err := fmt.Sscan(f, &n); err != nil || n < 1 {
			return nil, fmt.Errorf("-requesters %q: want counts like 1,4,16", s)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("-requesters: empty")
	}
	return out, nil
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	return out
}
