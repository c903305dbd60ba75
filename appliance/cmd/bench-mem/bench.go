package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/appliance/internal/memcluster"
	"github.com/lovelock-dpu/lovelock/control/testbed"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem/fmap"
)

const chunk = farmem.DefaultChunkSize

type bench struct {
	spec    testbed.Spec
	region  farmem.RegionInfo
	cluster *memcluster.Cluster
	// maxDatagram caps the requesters' datagrams (0: the default).
	maxDatagram int
}

// client opens a far-memory client in host0 to server (mem0 directly, or
// dpu0's agent).
func (b *bench) client(server string) (*farmem.Client, error) {
	var cl *farmem.Client
	err := b.spec.Run("host0", func() error {
		var err error
		cl, err = farmem.NewClient(farmem.ClientOptions{Config: farmem.Config{MaxDatagram: b.maxDatagram}, Server: netip.MustParseAddrPort(server)})
		return err
	})
	return cl, err
}

// fill writes the whole region once, so that reads read data.
func (b *bench) fill(ctx context.Context) error {
	cl, err := b.client(memAddr)
	if err != nil {
		return err
	}
	defer cl.Close()
	r, err := cl.Open(ctx, b.region.ID, true)
	if err != nil {
		return err
	}
	defer r.Close()
	for off := int64(0); off < int64(b.region.Size); off += chunk {
		if _, err := r.WriteAt(chunkOf[byte(off>>16)], off); err != nil {
			return fmt.Errorf("fill the region: %w", err)
		}
	}
	return r.Sync()
}

// filled is the byte fill writes at offset i; the writes of the
// benchmark write the same, so the region keeps it.
func filled(i int) byte { return byte(i>>16) + byte(i) }

// chunkOf holds, for each value of the chunk-index byte, the chunk fill
// writes (filled(off+i) depends on off's 64 KiB index only through it).
var chunkOf = func() [256][]byte {
	var out [256][]byte
	for k := range out {
		out[k] = make([]byte, chunk)
		for i := range out[k] {
			out[k][i] = filled(k<<16 + i)
		}
	}
	return out
}()

// point is one measured configuration.
type point struct {
	mbps     float64
	p50, p99 time.Duration
	cpuPerGB float64 // host CPU seconds per GiB moved
	errors   int
	// perRecv is the requesters' datagrams received per receive call
	// (how many replies share a wake-up of the client's receive loop).
	perRecv float64
}

// chunks runs n requesters doing 64 KiB reads (or writes) at random
// chunk offsets of the region through server for the bench's duration,
// each as fast as it can or, with rate > 0 (bytes/s for all together),
// paced so that they offer that load.
func (b *bench) chunks(ctx context.Context, server string, n int, write bool, rate float64) (point, error) {
	cl, err := b.client(server)
	if err != nil {
		return point{}, err
	}
	defer cl.Close()
	r, err := cl.Open(ctx, b.region.ID, write)
	if err != nil {
		return point{}, err
	}
	defer r.Close()
	nchunks := int(b.region.Size / chunk)
	var pace time.Duration
	if rate > 0 {
		pace = time.Duration(float64(n*chunk) / rate * float64(time.Second))
	}
	var (
		cpu0, cpu time.Duration
		st0, st1  farmem.LinkStats
	)
	w := measure(n, 200*time.Millisecond, *duration, pace,
		func(worker int) func() error {
			rng := rand.New(rand.NewPCG(uint64(worker), 7))
			buf := make([]byte, chunk)
			return func() error {
				off := int64(rng.IntN(nchunks)) * chunk
				var err error
				if write {
					_, err = r.WriteAt(chunkOf[byte(off>>16)], off)
				} else {
					_, err = r.ReadAt(buf, off)
				}
				return err
			}
		},
		func() { cpu0, st0 = selfCPU(), cl.Stats().Link },
		func() { cpu, st1 = selfCPU()-cpu0, cl.Stats().Link })
	p := summarize(w.lats, int64(w.ok)*chunk, w.elapsed, cpu, w.errs)
	if rc := st1.Receives - st0.Receives; rc > 0 {
		p.perRecv = float64(st1.RXDatagrams-st0.RXDatagrams) / float64(rc)
	}
	return p, nil
}

// window is what measure counted: the operations that completed inside
// the measured window, and its length.
type window struct {
	lats    []time.Duration
	ok      int
	errs    int
	elapsed time.Duration
}

// measure runs n workers, each calling its op (newOp(worker) makes it)
// back to back, or one every pace when pace > 0, for warmup and then a
// measured window of length. It counts an operation when it completes
// inside the window: one in flight when the window closes is not counted,
// as the window's length does not include its end. atStart and atEnd run
// at the window's edges (CPU and counter readings).
func measure(n int, warmup, length, pace time.Duration, newOp func(worker int) func() error, atStart, atEnd func()) window {
	var (
		mu        sync.Mutex
		all       window
		measuring atomic.Bool
		stop      = make(chan struct{})
		wg        sync.WaitGroup
	)
	for worker := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			op := newOp(worker)
			next := time.Now().Add(time.Duration(worker) * pace / time.Duration(n)) // spread the workers out
			var mine window
			defer func() {
				mu.Lock()
				all.lats, all.ok, all.errs = append(all.lats, mine.lats...), all.ok+mine.ok, all.errs+mine.errs
				mu.Unlock()
			}()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if pace > 0 {
					if d := time.Until(next); d > 0 {
						time.Sleep(d)
					} else if d < -pace {
						next = time.Now() // behind: do not catch up in a burst
					}
					next = next.Add(pace)
				}
				start := time.Now()
				err := op()
				if !measuring.Load() {
					continue
				}
				if err != nil {
					mine.errs++
					continue
				}
				mine.lats = append(mine.lats, time.Since(start))
				mine.ok++
			}
		}()
	}
	time.Sleep(warmup)
	atStart()
	start := time.Now()
	measuring.Store(true)
	time.Sleep(length)
	measuring.Store(false)
	all.elapsed = time.Since(start)
	atEnd()
	close(stop)
	wg.Wait()
	return all
}

func summarize(lats []time.Duration, moved int64, elapsed, cpu time.Duration, errs int) point {
	p := point{errors: errs}
	if moved > 0 {
		p.mbps = float64(moved) / elapsed.Seconds() / 1e6
		p.cpuPerGB = cpu.Seconds() / (float64(moved) / (1 << 30))
	}
	if len(lats) > 0 {
		slices.Sort(lats)
		p.p50, p.p99 = nearestRank(lats, 50), nearestRank(lats, 99)
	}
	return p
}

// nearestRank is the pct-th percentile of sorted, non-empty lats by the
// nearest-rank method, ceil(n·pct/100)-th smallest, as bench-ingest and
// client.Load report theirs: p99 of 100 samples is the 99th, not the largest.
func nearestRank(lats []time.Duration, pct int) time.Duration {
	i := (len(lats)*pct + 99) / 100
	return lats[max(i, 1)-1]
}

// selfCPU is this process's CPU time, user and system.
func selfCPU() time.Duration {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// faultIn touches one byte per page of a fresh read-only mapping of the
// region (buffer: a third of it, SODA's default), without and with
// read-ahead, against one requester reading it chunk by chunk through the
// agent. Host CPU counts this process and host0's lovelockd, whose host
// agent serves the faults.
func (b *bench) faultIn(ctx context.Context) (mapping, ahead, explicit point, err error) {
	if mapping, err = b.mapScan(ctx, fmap.Options{}); err != nil {
		return
	}
	if ahead, err = b.mapScan(ctx, fmap.Options{ReadAhead: fmap.SuggestedReadAhead}); err != nil {
		return
	}
	explicit, err = b.explicitScan(ctx)
	return
}

// mapScan maps the region with opts and touches one byte per page, in order.
func (b *bench) mapScan(ctx context.Context, opts fmap.Options) (point, error) {
	pid0, err := b.cluster.Host.CPU()
	if err != nil {
		return point{}, err
	}
	cpu0 := selfCPU()
	start := time.Now()
	m, err := fmap.Map(ctx, b.cluster.HostSocket, fmap.RegionRef{ID: uint64(b.region.ID), ReadOnly: true}, opts)
	if err != nil {
		return point{}, err
	}
	mem := m.Bytes()
	page := os.Getpagesize()
	bad := 0
	for i := 0; i < len(mem); i += page {
		if mem[i] != filled(i) {
			bad++
		}
	}
	elapsed := time.Since(start)
	pid1, err := b.cluster.Host.CPU()
	if err != nil {
		// No CPU figure from a failed reading (it would count -pid0).
		m.Close()
		return point{}, fmt.Errorf("host agent's CPU time after the scan: %w", err)
	}
	cpu := selfCPU() - cpu0 + pid1 - pid0
	if err := m.Close(); err != nil {
		return point{}, err
	}
	if bad > 0 {
		return point{}, fmt.Errorf("%d pages of the mapping do not hold what was written", bad)
	}
	return summarize(nil, int64(len(mem)), elapsed, cpu, 0), nil
}

// explicitScan reads the region chunk after chunk through the agent with
// one requester.
func (b *bench) explicitScan(ctx context.Context) (point, error) {
	cl, err := b.client(agentAddr)
	if err != nil {
		return point{}, err
	}
	defer cl.Close()
	r, err := cl.Open(ctx, b.region.ID, false)
	if err != nil {
		return point{}, err
	}
	defer r.Close()
	buf := make([]byte, chunk)
	cpu0 := selfCPU()
	start := time.Now()
	for off := int64(0); off < int64(b.region.Size); off += chunk {
		if _, err := r.ReadAt(buf, off); err != nil {
			return point{}, err
		}
	}
	return summarize(nil, int64(b.region.Size), time.Since(start), selfCPU()-cpu0, 0), nil
}

func (b *bench) report(ctx context.Context, counts []int) error {
	fmt.Printf("\nregion %s, %d KiB chunks at random offsets, %v per point; host CPU: this process (the requesters, in host0)\n",
		farmem.Size(b.region.Size), chunk>>10, *duration)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, pairHeader)
	target := map[string]map[int][2]point{"read": {}, "write": {}} // op → requesters → (direct, via agent)
	for _, write := range []bool{false, true} {
		op := "read"
		if write {
			op = "write"
		}
		for _, n := range counts {
			d, err := b.chunks(ctx, memAddr, n, write, 0)
			if err != nil {
				return err
			}
			a, err := b.chunks(ctx, agentAddr, n, write, 0)
			if err != nil {
				return err
			}
			fmt.Fprintln(tw, pairRow(op, n, d, a))
			target[op][n] = [2]point{d, a}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if *rate > 0 {
		if err := b.equalLoad(ctx, counts[len(counts)-1]); err != nil {
			return err
		}
	}
	m, ra, e, err := b.faultIn(ctx)
	if err != nil {
		return fmt.Errorf("fault-in: %w", err)
	}
	fmt.Printf("\nfault-in, one byte per page of a fresh mapping (buffer a third of the region, host0's host agent): %.0f MB/s, host CPU %.2f s/GiB (this process and host0's lovelockd)\n",
		m.mbps, m.cpuPerGB)
	fmt.Printf("the same with read-ahead of %d chunks (fmap.SuggestedReadAhead):                         %.0f MB/s, host CPU %.2f s/GiB; with/without %.2f\n",
		fmap.SuggestedReadAhead, ra.mbps, ra.cpuPerGB, ra.mbps/m.mbps)
	fmt.Printf("explicit reads, one requester, chunk after chunk through the agent:                        %.0f MB/s, host CPU %.2f s/GiB; mapping/explicit %.2f\n",
		e.mbps, e.cpuPerGB, m.mbps/e.mbps)
	for _, op := range []string{"read", "write"} {
		fmt.Println(targetLine(op, target[op]))
	}
	var st farmem.AgentStats
	if err := b.cluster.DPU.Client().ServiceStats(ctx, "farmem", &st); err == nil {
		defer func() {
			fmt.Printf("dpu0's lovelockd agent: %d host requests in %d task batches (%.1f per batch), fabric retransmits %d, timeouts %d\n",
				st.HostRequests, st.Batches, st.AvgBatch, st.Fabric.Retransmits, st.Fabric.Timeouts)
			fmt.Printf("dpu0's lovelockd agent: datagrams per receive call %.1f from the memory nodes, %.1f from hosts; per send %.1f to hosts\n",
				ratio(st.Fabric.RXDatagrams, st.Fabric.Receives), ratio(st.Host.RXDatagrams, st.Host.Receives), ratio(st.Host.TXDatagrams, st.Host.Sends))
		}()
	}
	if *pinned {
		if err := b.pinnedSection(ctx, slices.Max(counts)); err != nil {
			return err
		}
	}
	if *xdpRows {
		return b.xdpCompare(ctx, counts[len(counts)-1])
	}
	return nil
}

// pairHeader and pairRow are the columns of the tables that set the
// direct path beside the agent path, one row per op and requester count.
const pairHeader = "op\trequesters\tdirect MB/s\tp50 µs\tp99 µs\tCPU s/GiB\trx/recv\tvia agent MB/s\tp50 µs\tp99 µs\tCPU s/GiB\trx/recv\t×direct\tCPU ×direct\terrors\t"

func pairRow(op string, n int, d, a point) string {
	return fmt.Sprintf("%s\t%d\t%.0f\t%d\t%d\t%.2f\t%.1f\t%.0f\t%d\t%d\t%.2f\t%.1f\t%.2f\t%.2f\t%d\t", op, n,
		d.mbps, d.p50.Microseconds(), d.p99.Microseconds(), d.cpuPerGB, d.perRecv,
		a.mbps, a.p50.Microseconds(), a.p99.Microseconds(), a.cpuPerGB, a.perRecv, a.mbps/d.mbps, a.cpuPerGB/d.cpuPerGB, d.errors+a.errors)
}

// equalLoad measures host CPU per GiB with both paths offered the same
// load (-rate), below what either sustains: CPU per byte taken at
// different throughputs also differs by the idle time each leaves (wakeups
// and the Go scheduler's spinning between requests), which is not the
// path's cost.
func (b *bench) equalLoad(ctx context.Context, n int) error {
	fmt.Printf("\nequal offered load: %d requesters paced to %.0f MB/s together, on both paths\n", n, *rate/1e6)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "op\tdirect MB/s\tp50 µs\tCPU s/GiB\trx/recv\tvia agent MB/s\tp50 µs\tCPU s/GiB\trx/recv\tCPU ×direct\terrors\t")
	for _, write := range []bool{false, true} {
		op := "read"
		if write {
			op = "write"
		}
		d, err := b.profiled("direct-"+op, func() (point, error) { return b.chunks(ctx, memAddr, n, write, *rate) })
		if err != nil {
			return err
		}
		a, err := b.profiled("agent-"+op, func() (point, error) { return b.chunks(ctx, agentAddr, n, write, *rate) })
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%d\t%.2f\t%.1f\t%.0f\t%d\t%.2f\t%.1f\t%.2f\t%d\t\n", op, d.mbps, d.p50.Microseconds(), d.cpuPerGB, d.perRecv,
			a.mbps, a.p50.Microseconds(), a.cpuPerGB, a.perRecv, a.cpuPerGB/d.cpuPerGB, d.errors+a.errors)
	}
	return tw.Flush()
}

// profiled runs f under a CPU profile written to -profile/name.pprof when
// -profile names a directory.
func (b *bench) profiled(name string, f func() (point, error)) (point, error) {
	if *profileDir == "" {
		return f()
	}
	out, err := os.Create(filepath.Join(*profileDir, name+".pprof"))
	if err != nil {
		return point{}, err
	}
	defer out.Close()
	if err := pprof.StartCPUProfile(out); err != nil {
		return point{}, err
	}
	defer pprof.StopCPUProfile()
	return f()
}

// ratio is a/b, 0 when b is.
func ratio(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// targetRequesters is where issue 11 states its targets.
const targetRequesters = 16

// targetLine is the verdict on issue 11's targets for op, from the row at
// 16 requesters of rows (requesters → direct, via agent): (b) ≥ 0.9× (a)'s
// throughput and less host CPU per GiB than (a). Without that row, or with
// errors or nothing moved on either path, it is not measured: a ratio to a
// failed baseline (+Inf, NaN) is no pass.
func targetLine(op string, rows map[int][2]point) string { return layoutTargetLine("", op, rows) }

// layoutTargetLine is targetLine for rows measured in a CPU layout other
// than the shared one, which the line names after op.
func layoutTargetLine(layout, op string, rows map[int][2]point) string {
	head := fmt.Sprintf("%d requesters, %s: ", targetRequesters, op)
	if layout != "" {
		head = fmt.Sprintf("%d requesters, %s, %s: ", targetRequesters, op, layout)
	}
	pair, ok := rows[targetRequesters]
	if !ok {
		return head + fmt.Sprintf("not measured (no %d-requester row in -requesters)", targetRequesters)
	}
	for i, side := range []struct{ on, who string }{{"on the direct path", "the direct path"}, {"via the agent", "the agent path"}} {
		p := pair[i]
		switch {
		case p.errors > 0:
			return head + fmt.Sprintf("not measured (%d errors %s; the targets need clean rows)", p.errors, side.on)
		case p.mbps <= 0 || p.cpuPerGB <= 0:
			return head + fmt.Sprintf("not measured (%s moved nothing)", side.who)
		}
	}
	d, a := pair[0], pair[1]
	ratio, cr := a.mbps/d.mbps, a.cpuPerGB/d.cpuPerGB
	return head + fmt.Sprintf("via agent %.2fx the direct throughput (target ≥ 0.9: %s), host CPU per GiB %.2fx (target < 1: %s)",
		ratio, met(ratio >= 0.9), cr, met(cr < 1))
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}
