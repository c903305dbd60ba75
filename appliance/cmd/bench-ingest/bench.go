package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/lovelock-dpu/lovelock/control/testbed"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/client"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
)

// path is one of Conspirator's configurations, numbered as in its paper.
type path struct {
	num  int
	name string
}

var paths = []path{
	{1, "TCP server on the host"},
	{3, "host UDP, no DPU"},
	{4, "through the DPU"},
}

// row is one measured configuration.
type row struct {
	path     path
	loaded   bool
	requests int // completed
	rps      float64
	p50, p99 time.Duration
	hostCPU  time.Duration // host-side processes, over the window
	dpuCPU   time.Duration // the DPU agent, over the window (path 4)
	// procCPU is the host-side process's own utime+stime over the
	// window: a diagnostic beside hostCPU, which it is part of.
	procCPU time.Duration
	busy    float64 // the background load's share of the host CPU
	wrong   int
	failed  int
	retrans uint64
	note    string // set when the row was not measured
}

func (r row) measured() bool { return r.note == "" }

// perReq is CPU time per completed request.
func (r row) perReq(cpu time.Duration) time.Duration {
	if r.requests == 0 {
		return 0
	}
	return cpu / time.Duration(r.requests)
}

type bench struct {
	spec testbed.Spec
	dir  string
}

// warmup runs before each measured window, so that connections, buffers
// and the scheduler's estimates are in place.
const warmup = 300 * time.Millisecond

// measure starts path p's processes (and the background load when
// loaded), runs the client load and stops them all.
func (b *bench) measure(ctx context.Context, p path, loaded bool) (row, error) {
	r := row{path: p, loaded: loaded}
	var hostSide, dpu *child
	var err error
	if *deviceKind == deviceShm {
		// The models run in an executor, the GPU's stand-in, off the
		// host's CPU in every path (devmem.ShmOptions.Executor); on
		// cuda the GPU runs them.
		gpu, err := startChild(ctx, b.spec, b.dir, "gpu0", gpuCPU(), "executor", b.args()...)
		if err != nil {
			return r, err
		}
		defer gpu.stop()
	}
	switch p.num {
	case 1:
		hostSide, err = startChild(ctx, b.spec, b.dir, "gpu0", hostCPU, "tcp-server", b.args()...)
	case 3:
		hostSide, err = startChild(ctx, b.spec, b.dir, "gpu0", hostCPU, "udp-host", b.args()...)
	case 4:
		// The DPU agent dials only the socket its host registers with.
		sock := []string{"-handle-socket", fmt.Sprintf("%s/handles-%d.sock", b.dir, time.Now().UnixNano())}
		dpu, err = startChild(ctx, b.spec, b.dir, "dpu2", dpuCPU, "dpu-agent", append(b.args(), sock...)...)
		if err == nil {
			defer dpu.stop()
			hostSide, err = startChild(ctx, b.spec, b.dir, "gpu0", hostCPU, "host-agent", append(b.args(), sock...)...)
		}
	}
	if err != nil {
		return r, err
	}
	defer hostSide.stop()
	var busy *child
	if loaded {
		if busy, err = startChild(ctx, b.spec, b.dir, "", hostCPU, "busy", b.args()...); err != nil {
			return r, err
		}
		defer busy.stop()
	}

	var load func(d time.Duration) (loadResult, error)
	if p.num == 1 {
		load, err = b.tcpLoad()
	} else {
		target := udpHostAddr
		if p.num == 4 {
			target = dpuClientAddr
		}
		load, err = b.ingestLoad(netip.MustParseAddrPort(target))
	}
	if err != nil {
		return r, err
	}
	if _, err := load(warmup); err != nil {
		return r, fmt.Errorf("warm-up: %w", err)
	}
	h0, err := cpuBusy(hostCPU)
	if err != nil {
		return r, err
	}
	// A CPU reading that fails fails the row: a figure computed from it
	// (a busy loop's time taken for 0) would overstate or understate the
	// host's CPU that the targets judge.
	var d0, b0 time.Duration
	if dpu != nil {
		if d0, err = dpu.cpu(); err != nil {
			return r, fmt.Errorf("DPU agent's CPU time: %w", err)
		}
	}
	p0, _ := hostSide.cpu() // the diagnostic line's only
	if busy != nil {
		if b0, err = busy.cpu(); err != nil {
			return r, fmt.Errorf("busy loop's CPU time: %w", err)
		}
	}
	lr, err := load(*duration)
	if err != nil {
		return r, err
	}
	h1, err := cpuBusy(hostCPU)
	if err != nil {
		return r, err
	}
	// The host's CPU time is all of its CPU's busy time, soft interrupts
	// (its share of the network stack) included, less the background
	// load's.
	r.hostCPU = h1 - h0
	if p1, err := hostSide.cpu(); err == nil {
		r.procCPU = p1 - p0
	}
	if dpu != nil {
		d1, err := dpu.cpu()
		if err != nil {
			return r, fmt.Errorf("DPU agent's CPU time: %w", err)
		}
		r.dpuCPU = d1 - d0
	}
	if busy != nil {
		b1, err := busy.cpu()
		if err != nil {
			return r, fmt.Errorf("busy loop's CPU time: %w", err)
		}
		r.busy = (b1 - b0).Seconds() / lr.elapsed.Seconds()
		r.hostCPU -= b1 - b0
	}
	r.requests, r.wrong, r.failed, r.retrans = lr.ok, lr.wrong, lr.failed, lr.retrans
	r.rps, r.p50, r.p99 = float64(lr.ok)/lr.elapsed.Seconds(), lr.p50, lr.p99
	if lr.ok == 0 {
		return r, fmt.Errorf("no request completed (%d failed: %s)", lr.failed, lr.firstError)
	}
	return r, nil
}

func (b *bench) args() []string {
	return []string{"-model", *modelName, "-size", fmt.Sprint(*size), "-device", *deviceKind, fmt.Sprintf("-cuda-block=%v", *cudaBlock), "-executor", filepath.Join(b.dir, "executor.sock")}
}

// loadResult is one closed-loop load's outcome.
type loadResult struct {
	ok, wrong, failed int
	retrans           uint64
	elapsed           time.Duration
	p50, p99          time.Duration
	firstError        string
}

// ingestLoad returns a closed loop of the client library against target,
// from a socket in the client node; each call is one client.Load with
// every result checked against the model's CPU reference.
func (b *bench) ingestLoad(target netip.AddrPort) (func(time.Duration) (loadResult, error), error) {
	check, err := client.Verify(*modelName)
	if err != nil {
		return nil, err
	}
	var tr *udp.Conn
	err = b.spec.Run("client", func() error {
		var err error
		tr, err = udp.Listen(netip.MustParseAddrPort(clientAddr), udpOptions(8<<20))
		return err
	})
	if err != nil {
		return nil, err
	}
	// 250 ms before the first retransmission: a loaded host may take
	// longer than the default 100 ms, and a retransmission is extra
	// work for the path under test.
	c, err := client.New(tr, target, client.Options{Timeout: 250 * time.Millisecond})
	if err != nil {
		tr.Close()
		return nil, err
	}
	// The client closes with the testbed's namespaces; each row makes
	// its own, so leaking one until exit is bounded.
	return func(d time.Duration) (loadResult, error) {
		rep, err := client.Load(context.Background(), c, client.LoadOptions{Model: *modelName, Size: *size,
			Concurrency: *concurrency, Duration: d, Check: check})
		if err != nil {
			return loadResult{}, err
		}
		return loadResult{ok: rep.OK, wrong: rep.Wrong, failed: rep.Failures(), retrans: rep.Retransmissions,
			elapsed: rep.Elapsed, p50: rep.Latency.P50, p99: rep.Latency.P99, firstError: rep.FirstError + rep.FirstWrong}, nil
	}, nil
}

// tcpLoad returns path (1)'s closed loop: -concurrency connections from
// the client node, each sending its next input when the last result came
// back, every result checked.
func (b *bench) tcpLoad() (func(time.Duration) (loadResult, error), error) {
	check, err := client.Verify(*modelName)
	if err != nil {
		return nil, err
	}
	conns := make([]net.Conn, *concurrency)
	err = b.spec.Run("client", func() error {
		for i := range conns {
			c, err := net.DialTimeout("tcp", tcpAddr, 5*time.Second)
			if err != nil {
				return err
			}
			conns[i] = c
		}
		return nil
	})
	if err != nil {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
		return nil, err
	}
	// The same input for every request, as client.Load sends with Size.
	input := make([]byte, *size)
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range input {
		input[i] = byte(rng.Uint32())
	}
	req := binary.BigEndian.AppendUint32(nil, uint32(len(input)))
	req = append(req, input...)
	return func(d time.Duration) (loadResult, error) {
		var (
			mu   sync.Mutex
			res  loadResult
			lats []time.Duration
			wg   sync.WaitGroup
		)
		start := time.Now()
		end := start.Add(d)
		for _, c := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var mine []time.Duration
				ok, wrong, failed, first := 0, 0, 0, ""
				hdr := make([]byte, 5)
				var out []byte
				for time.Now().Before(end) {
					t := time.Now()
					err := roundTrip(c, req, hdr, &out)
					switch {
					case err != nil:
						failed++
						if first == "" {
							first = err.Error()
						}
						if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
							time.Sleep(time.Until(end))
						}
						continue
					}
					mine = append(mine, time.Since(t))
					ok++
					if err := check(input, out); err != nil {
						wrong++
						if first == "" {
							first = err.Error()
						}
					}
				}
				mu.Lock()
				lats = append(lats, mine...)
				res.ok, res.wrong, res.failed = res.ok+ok, res.wrong+wrong, res.failed+failed
				if res.firstError == "" {
					res.firstError = first
				}
				mu.Unlock()
			}()
		}
		wg.Wait()
		res.elapsed = time.Since(start)
		res.p50, res.p99 = percentile(lats, 50), percentile(lats, 99)
		return res, nil
	}, nil
}

// roundTrip sends one framed request on c and reads the framed answer
// into *out.
func roundTrip(c net.Conn, req, hdr []byte, out *[]byte) error {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(req); err != nil {
		return err
	}
	if _, err := io.ReadFull(c, hdr); err != nil {
		return err
	}
	n := int(binary.BigEndian.Uint32(hdr[1:5]))
	if cap(*out) < n {
		*out = make([]byte, n)
	}
	*out = (*out)[:n]
	if _, err := io.ReadFull(c, *out); err != nil {
		return err
	}
	if hdr[0] != tcpOK {
		return fmt.Errorf("server: %s", *out)
	}
	return nil
}

// percentile returns the nearest-rank p-th percentile of lats (sorting
// it), as client.Load reports its own.
func percentile(lats []time.Duration, p int) time.Duration {
	if len(lats) == 0 {
		return 0
	}
	slices.Sort(lats)
	i := (len(lats)*p + 99) / 100 // ceil(n·p/100), the nearest rank
	return lats[max(i, 1)-1]
}
