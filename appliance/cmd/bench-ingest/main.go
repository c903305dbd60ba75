// Command bench-ingest prints Conspirator's comparison of accelerator
// ingest on the netns testbed, in one run: inputs from the client node to
// the GPU host gpu0 behind dpu2,
//
//	(1) over TCP to a server on gpu0 that copies each input from host memory
//	    into the device buffer, runs the model and answers;
//	(3) over the Lovelock ingest protocol on kernel UDP to gpu0, which
//	    reassembles in host memory and copies to the device (no DPU help);
//	(4) through the DPU: the ingest agent on dpu2 writes inputs straight
//	    into the buffers gpu0's host agent registered with it;
//
// each unloaded and with a busy loop taking 80 % of the host's CPU:
// requests/s, p50/p99 latency, host CPU per request, and the ratios the
// issue's targets are stated in.
//
// Every role is this binary re-executed in its node and pinned to a CPU:
// the host-side processes (the TCP server, the path-(3) receiver, the host
// agent) and the busy loop on CPU 0, the DPU agent on CPU 1. The client
// (this process) runs on CPU 1 too. Host CPU is the host-side process's
// utime+stime from /proc over the measured window.
//
// -device picks gpu0's device: shm (the default), shared memory with the
// models run by an executor process standing in for the GPU, or cuda, GPU 0
// through the CUDA driver in a binary built with -tags cuda, the models run
// on the GPU and the DPU agent maps its buffers through the driver.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/lovelock-dpu/lovelock/appliance/internal/cpupin"
	"github.com/lovelock-dpu/lovelock/control/testbed"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
)

var (
	prefix       = flag.String("prefix", fmt.Sprintf("bi%d-", os.Getpid()%100000), "namespace prefix of the testbed this run brings up (and removes)")
	modelName    = flag.String("model", "checksum", "built-in model every request runs")
	sizeFlag     = flag.String("size", "64KiB", "input size")
	duration     = flag.Duration("duration", 3*time.Second, "measured time per row (after a warm-up)")
	concurrency  = flag.Int("concurrency", 8, "closed-loop requests outstanding (TCP: connections)")
	deviceKind   = flag.String("device", deviceShm, "the GPU host's device: shm (shared memory, the models in an executor process, the GPU's stand-in) or cuda (GPU 0 through the CUDA driver; a binary built with -tags cuda)")
	cudaBlock    = flag.Bool("cuda-block", false, "with -device cuda: the host and DPU processes sleep while they wait for the GPU (cuda.Options.BlockingWait) instead of the driver's default, which spins")
	role         = flag.String("role", "", "internal: run as one role of the bench (set by the bench itself)")
	handleSocket = flag.String("handle-socket", "", "internal: the host agent's handle socket (the DPU agent dials only it)")
	executor     = flag.String("executor", "", "internal: the executor's socket (set by the bench)")
	size         = new(int)
)

// The testbed's addresses (control/testbed/spec.go): the client, dpu2's
// uplink p0 and host-facing pf0hpf, gpu0's eth0.
const (
	clientAddr    = "10.77.0.30:0"
	dpuClientAddr = "10.77.0.12:61440" // (4): clients to the DPU agent
	dpuHostAddr   = "10.77.12.2:61441" // (4): the DPU agent's control socket towards gpu0
	hostAgentAddr = "10.77.12.1:61441" // (4): gpu0's host agent
	udpHostAddr   = "10.77.12.1:61440" // (3): gpu0's own UDP receiver
	tcpAddr       = "10.77.12.1:61442" // (1): gpu0's TCP server
	mtu           = 9000
)

// CPUs: the host's and the DPU's (and the client's).
const (
	hostCPU = 0
	dpuCPU  = 1
)

// gpuCPU is where the executor, the GPU's stand-in, computes: a CPU of its
// own where the machine has a third, else the DPU's.
func gpuCPU() int {
	if runtime.NumCPU() >= 3 {
		return 2
	}
	return dpuCPU
}

func main() {
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	s, err := farmem.ParseSize(*sizeFlag)
	if err == nil && (s <= 0 || s > 1<<30) {
		err = errors.New("want 1 byte to 1 GiB")
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-ingest: -size %q: %v\n", *sizeFlag, err)
		os.Exit(2)
	}
	*size = int(s)
	if err := checkDevice(*deviceKind); err != nil {
		fmt.Fprintln(os.Stderr, "bench-ingest:", err)
		os.Exit(2)
	}
	if *role != "" {
		err = runRole(ctx, *role)
	} else {
		err = run(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-ingest:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	if runtime.NumCPU() < 2 {
		return fmt.Errorf("%d CPU: the bench pins the host to CPU %d and the DPU to CPU %d", runtime.NumCPU(), hostCPU, dpuCPU)
	}
	if *concurrency < 1 {
		return errors.New("-concurrency: want at least 1")
	}
	// Pinned for the whole run, never restored: this process is the DPU's.
	if _, err := cpupin.Pin(os.Getpid(), dpuCPU); err != nil {
		return err
	}
	gpuDesc, err := describeGPU()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "bench-ingest-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	spec := testbed.DefaultSpec()
	spec.Prefix = *prefix
	if err := testbed.Up(ctx, spec); err != nil {
		return err
	}
	defer func() {
		if err := testbed.Down(context.Background(), spec); err != nil {
			fmt.Fprintln(os.Stderr, "bench-ingest: testbed down:", err)
		}
	}()
	if err := testbed.SetMTU(spec, mtu); err != nil {
		return err
	}
	if err := steerReceive(spec, map[string]int{"gpu0": hostCPU, "dpu2": dpuCPU, "client": dpuCPU}); err != nil {
		return err
	}
	host, _ := os.Hostname()
	fmt.Printf("testbed %q, MTU %d, on %s (%d CPUs, %s/%s); model %s, %s inputs, %d outstanding, %v per row\n",
		spec.Prefix, mtu, host, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, *modelName, farmem.Size(*size), *concurrency, *duration)
	if *deviceKind == deviceCUDA {
		fmt.Printf("CPU %d: gpu0's processes (TCP server, UDP receiver, host agent), its network receive work (RPS) and the background load; CPU %d: dpu2's agent, which maps gpu0's device buffers through the CUDA driver, and the client; the models run on %s\n", hostCPU, dpuCPU, gpuDesc)
	} else {
		fmt.Printf("CPU %d: gpu0's processes (TCP server, UDP receiver, host agent), its network receive work (RPS) and the background load; CPU %d: dpu2's agent and the client; CPU %d: the executor that runs the models (the GPU's stand-in)\n", hostCPU, dpuCPU, gpuCPU())
	}
	fmt.Println("host CPU per request: CPU 0's busy time (soft interrupts included) less the background load's, per completed request; the machine must be otherwise quiet")
	b := &bench{spec: spec, dir: dir}
	var rows []row
	for _, p := range paths {
		for _, loaded := range []bool{false, true} {
			r, err := b.measure(ctx, p, loaded)
			if err != nil {
				r = row{path: p, loaded: loaded, note: "not measured: " + err.Error()}
			}
			rows = append(rows, r)
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
	fmt.Println()
	fmt.Print(formatTable(rows))
	runsOn := "in the executor (the GPU's stand-in)"
	if *deviceKind == deviceCUDA {
		runsOn = "on " + gpuDesc
	}
	if c, err := modelCost(); err == nil {
		fmt.Printf("the model alone (%s on %s, CPU reference on CPU %d, input hot in cache, unloaded): %.1f µs per input; it runs %s, not on the host CPU\n",
			*modelName, farmem.Size(*size), hostCPU, float64(c)/float64(time.Microsecond), runsOn)
	} else {
		fmt.Printf("the model alone: not measured: %v\n", err)
	}
	wrong := 0
	for _, r := range rows {
		wrong += r.wrong
	}
	if wrong > 0 {
		return fmt.Errorf("%d wrong results", wrong)
	}
	return nil
}
