package main

// -throughput: packets per second through a veth testbed.
//
//	gen ──veth──▶ dut ──veth──▶ sink
//	AF_XDP TX     native XDP on the ingress veth:    counting XDP program
//	(copy mode)   floor program or the classifier    (redirect row)
//	              xsk:0 ─▶ AF_XDP worker on dut (xsk row)
//
// Each row installs dut's program (and rule set), runs the generator for
// the warm-up and the timed window, stops it, waits for the frames in
// flight, and reads every counter: the generator's, the classifier's
// (Steer.Stats, the rule's counter), the counting programs', the worker's
// and its socket's, the veths' drop counters, /proc/stat and
// /proc/softirqs. Rates come from the window; losses between stages from
// the whole row, which then has nothing in flight.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"
	"unsafe"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/bpf"
	llnetns "github.com/lovelock-dpu/lovelock/control/netns"
	"github.com/lovelock-dpu/lovelock/dataplane/xsk"
)

// tpOptions configure -throughput.
type tpOptions struct {
	duration time.Duration // timed window per row and round
	warmup   time.Duration // traffic before the window opens
	rounds   int           // rounds over all rows; each row keeps its best
	gen      string        // generator kind
	batch    int           // frames per generator call
	spin     time.Duration // how long the AF_XDP worker busy-polls an empty ring
	rows     []string      // row keys to run, in table order; empty: all
	pin      bool          // pin the generator and the worker to CPUs of their own
	threaded bool          // threaded NAPI on dut's ingress and the sink, pinned with the worker
}

// rowKeys are the rows' -rows names, in table order.
var rowKeys = []string{"floor", "default", "drop", "redirect", "xsk"}

const (
	xdpDrop = 1 // XDP_DROP
	// dport is the generator's UDP destination port, matched by the rules.
	dport = 9
	// ruleID is the one rule's ID in the classifier rows.
	ruleID = 1
)

// snap is every counter, read at one moment.
type snap struct {
	t           time.Time
	offered     uint64        // frames the generator handed to the kernel
	floor, sink uint64        // the counting programs on dut's ingress and on the sink
	steer       []bpf.Counter // the classifier's counters, by bpf.Stat
	rule        bpf.Counter   // the matching rule's counter
	got         uint64        // frames the AF_XDP worker received
	xs          xsk.Stats     // the worker socket's counters
	cpu         []cpuTimes
	netRX       []uint64
	self        time.Duration // CPU time of this process (user + system)
}

// row is one path through the testbed.
type row struct {
	key   string // for -rows
	name  string
	floor bool         // the counting XDP_DROP program instead of the classifier
	rs    *bpf.Ruleset // rule set applied for the row (classifier rows)
	xsk   bool         // run the AF_XDP worker
	// seen counts frames that reached dut's XDP program, verdict those it
	// gave the row's verdict, done those that completed the path.
	seen, verdict, done func(snap) uint64
	what                string // what done counts, for the notes
}

// result is one measurement of a row: rates over the timed window, and
// totals over the whole row (warm-up and drain included), so that the
// losses between stages are exact.
type result struct {
	secs                float64
	offered, seen, done float64 // per second, in the window
	tOffered, tSeen     uint64  // whole row
	tVerdict, tDone     uint64
	steer               []bpf.Counter // whole row
	xs                  xsk.Stats     // whole row
	cpu                 []cpuUse      // window
	self                float64       // CPUs this process used, window
	netRX               uint64        // NET_RX softirqs, window, all CPUs
	gDrops, eDrops      uint64        // veth drop counters, whole row
}

type bench struct {
	o      tpOptions
	s      *bpf.Steer
	tb     *testbed
	floor  *counter
	sink   *counter
	gen    generator
	rx     *xsk.Socket
	got    atomic.Uint64
	prefix string

	genCPU, workerCPU int // with -pin; -1: not pinned

	// With -threaded: the NAPI threads of the sink and of dut's ingress
	// (new for every row), whose CPU time counts as ours.
	sinkNAPI, inNAPI []int
}

// pickCPUs chooses the generator's and the worker's CPU among those the
// process may use: the first and the last.
func (b *bench) pickCPUs() {
	b.genCPU, b.workerCPU = -1, -1
	var set unix.CPUSet
	if !b.o.pin || unix.SchedGetaffinity(0, &set) != nil || set.Count() < 2 {
		return
	}
	for i := range 8 * int(unsafe.Sizeof(set)) {
		if set.IsSet(i) {
			if b.genCPU < 0 {
				b.genCPU = i
			}
			b.workerCPU = i
		}
	}
}

// pinThread locks the calling goroutine to its thread and the thread to
// cpu. The goroutine must not unlock: the thread then ends with it, and
// its affinity never reaches another goroutine.
func (b *bench) pinThread(cpu int) {
	if cpu < 0 {
		return
	}
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(cpu)
	_ = unix.SchedSetaffinity(0, &set) // best effort: unpinned still measures
}

func (b *bench) pinning() string {
	napi := "dut's and sink's NAPI in softirq on the sending CPU"
	if b.o.threaded {
		napi = "dut's and sink's NAPI threaded"
		if b.workerCPU >= 0 {
			napi += fmt.Sprintf(", pinned to CPU %d", b.workerCPU)
		}
	}
	if b.genCPU < 0 {
		return "threads not pinned; " + napi
	}
	return fmt.Sprintf("generator pinned to CPU %d, worker to CPU %d; %s", b.genCPU, b.workerCPU, napi)
}

func runThroughput(ctx context.Context, w io.Writer, o tpOptions) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("-throughput needs root: it creates network namespaces and attaches XDP programs")
	}
	b := &bench{o: o, prefix: fmt.Sprintf("bst%d-", os.Getpid())}
	b.pickCPUs()
	// Everything below is undone in reverse order, also on error or
	// interrupt: sockets, links and programs first, the namespaces last.
	var closers []func() error
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			if cerr := closers[i](); cerr != nil {
				err = errors.Join(err, fmt.Errorf("clean up: %w", cerr))
			}
		}
	}()

	if b.s, err = bpf.Load(bpf.Options{}); err != nil {
		return err
	}
	closers = append(closers, b.s.Close)
	if b.tb, err = newTestbed(b.prefix); err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	closers = append(closers, b.tb.Close)
	if b.floor, err = newCounter("bst_floor", xdpDrop); err != nil {
		return err
	}
	closers = append(closers, func() error { b.floor.Close(); return nil })
	if b.sink, err = newCounter("bst_sink", xdpDrop); err != nil {
		return err
	}
	closers = append(closers, func() error { b.sink.Close(); return nil })
	sl, err := b.tb.sinkIf.attach(b.sink.prog)
	if err != nil {
		return err
	}
	closers = append(closers, sl.Close)
	if o.threaded {
		if b.sinkNAPI, err = setThreaded(b.tb.sinkIf, b.workerCPU); err != nil {
			return err
		}
	}

	frame := udpFrame(b.tb.inIf.mac, b.tb.genIf.mac, dport)
	if b.gen, err = newGenerator(o.gen, b.tb.genIf, frame, o.batch); err != nil {
		return err
	}
	closers = append(closers, b.gen.Close)

	err = llnetns.Do(b.tb.dut, func() error {
		var err error
		b.rx, err = xsk.Open(b.tb.inIf.index, 0, nil, &xsk.SocketConfig{NoTX: true})
		return err
	})
	if err != nil {
		return fmt.Errorf("AF_XDP worker socket: %w", err)
	}
	closers = append(closers, b.rx.Close)
	if err := b.s.SetXSK(b.tb.inIf.index, 0, b.rx.FD()); err != nil {
		return err
	}
	closers = append(closers, func() error { return b.s.ClearXSK(b.tb.inIf.index, 0) })

	rows := b.rows(o.rows)
	fmt.Fprintf(w, "testbed: gen %s ⇄ %s dut %s ⇄ %s sink (veth, one queue each), native XDP on %s; 64-byte UDP frames\n",
		b.tb.genIf.name, b.tb.inIf.name, b.tb.outIf.name, b.tb.sinkIf.name, b.tb.inIf.name)
	fmt.Fprintf(w, "generator: %s\n", b.gen.describe())
	fmt.Fprintf(w, "worker: AF_XDP %s mode on %s queue 0, TryReceive loop, busy-polls %v before it sleeps in poll(2)\n", b.rx.Mode(), b.tb.inIf.name, o.spin)
	fmt.Fprintf(w, "%v per row after %v of warm-up, best of %d rounds; %d CPUs, %s\n", o.duration, o.warmup, o.rounds, runtime.NumCPU(), b.pinning())

	best := make([]*result, len(rows))
	for round := range o.rounds {
		for i, r := range rows {
			res, err := b.measure(ctx, r)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round+1, r.name, err)
			}
			if best[i] == nil || res.done > best[i].done {
				best[i] = res
			}
		}
	}
	return b.print(w, rows, best)
}

// rows returns the rows named in keys (all when keys is empty).
func (b *bench) rows(keys []string) []*row {
	st := func(k bpf.Stat) func(snap) uint64 {
		return func(s snap) uint64 { return s.steer[k].Packets }
	}
	rule := func(s snap) uint64 { return s.rule.Packets }
	one := func(a bpf.Action, arg uint32, def bpf.Action, port uint16) *bpf.Ruleset {
		var k bpf.RuleKey
		k.Flow.Proto, k.Flow.Dport = 17, port
		return &bpf.Ruleset{
			Shapes:        []bpf.Shape{{Fields: bpf.FieldProto | bpf.FieldDport, MaxPrio: 100}},
			Entries:       []bpf.Entry{{Key: k, Val: bpf.RuleVal{Prio: 100, Id: ruleID, Action: uint16(a), Arg: arg}}},
			DefaultAction: def,
		}
	}
	floor := func(s snap) uint64 { return s.floor }
	all := []*row{
		{key: "floor", name: "XDP_DROP, counted (floor)", floor: true, seen: floor, verdict: floor, done: floor, what: "counted and dropped by the floor program"},
		{key: "default", name: "classifier, no match, default drop", rs: one(bpf.ActionPass, 0, bpf.ActionDrop, dport+1),
			seen: st(bpf.StatRX), verdict: st(bpf.StatNoRule), done: st(bpf.StatDrop), what: "dropped by the classifier"},
		{key: "drop", name: "classifier, rule drop", rs: one(bpf.ActionDrop, 0, bpf.ActionPass, dport),
			seen: st(bpf.StatRX), verdict: rule, done: st(bpf.StatDrop), what: "dropped by the classifier"},
		{key: "redirect", name: "redirect:" + b.tb.outIf.name + " → sink XDP", rs: one(bpf.ActionRedirect, uint32(b.tb.outIf.index), bpf.ActionPass, dport),
			seen: st(bpf.StatRX), verdict: st(bpf.StatRedirect), done: func(s snap) uint64 { return s.sink },
			what: "counted by the XDP program on " + b.tb.sinkIf.name},
		{key: "xsk", name: "xsk:0 → AF_XDP worker", rs: one(bpf.ActionXSK, 0, bpf.ActionPass, dport), xsk: true,
			seen: st(bpf.StatRX), verdict: st(bpf.StatXSK), done: func(s snap) uint64 { return s.got },
			what: "received by the worker loop"},
	}
	if len(keys) == 0 {
		return all
	}
	var out []*row
	for _, r := range all {
		if slices.Contains(keys, r.key) {
			out = append(out, r)
		}
	}
	return out
}

func (b *bench) snap() (snap, error) {
	s := snap{offered: b.gen.offered(), got: b.got.Load()}
	var err error
	if s.floor, err = b.floor.read(); err != nil {
		return s, err
	}
	if s.steer, err = b.s.Stats(); err != nil {
		return s, err
	}
	if s.rule, err = b.s.RuleCounter(ruleID); err != nil {
		return s, err
	}
	if s.sink, err = b.sink.read(); err != nil {
		return s, err
	}
	if s.xs, err = b.rx.Stats(); err != nil {
		return s, err
	}
	s.t = time.Now()
	// Best effort: these only explain.
	s.cpu, _ = readCPUTimes()
	s.netRX, _ = readNetRX()
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	for _, pid := range slices.Concat(b.sinkNAPI, b.inNAPI) {
		s.self += taskCPU(pid)
	}
	return s, nil
}

// vethDrops reads the drop counters of the generator's veth (frames its
// peer's ring had no room for) and of dut's egress veth (redirected frames
// the sink's ring had no room for).
func (b *bench) vethDrops() (g, e uint64) {
	if st, err := b.tb.genIf.linkStats(); err == nil {
		g = st.TxDropped
	}
	if st, err := b.tb.outIf.linkStats(); err == nil {
		e = st.TxDropped
	}
	return g, e
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// measure runs one row: it installs the row's program and rule set on dut,
// starts the worker (xsk rows) and the generator, opens the timed window
// after the warm-up, stops the generator, waits for the frames in flight,
// and reads every counter.
func (b *bench) measure(ctx context.Context, r *row) (_ *result, err error) {
	prog := b.s.XDP
	if r.floor {
		prog = b.floor.prog
	}
	if r.rs != nil {
		if err := b.s.Apply(r.rs); errors.Is(err, bpf.ErrNotDrained) {
			fmt.Fprintf(os.Stderr, "bench-steer: warning: %v\n", err)
		} else if err != nil {
			return nil, err
		}
	}
	var l link.Link
	if l, err = b.tb.inIf.attach(prog); err != nil {
		return nil, err
	}
	defer func() {
		if cerr := l.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("detach XDP: %w", cerr))
		}
	}()

	if b.o.threaded {
		// The ingress NAPI is created with the XDP program: make it
		// threaded now.
		if b.inNAPI, err = setThreaded(b.tb.inIf, b.workerCPU); err != nil {
			return nil, err
		}
	}
	g0, e0 := b.vethDrops()
	start, err := b.snap()
	if err != nil {
		return nil, err
	}

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var rxErr error
	if r.xsk {
		wg.Go(func() {
			b.pinThread(b.workerCPU)
			err := b.work(wctx)
			if wctx.Err() == nil {
				rxErr = err
				cancel()
			}
		})
	}
	var stop atomic.Bool
	genDone := make(chan error, 1)
	go func() {
		b.pinThread(b.genCPU)
		err := b.gen.run(wctx, &stop)
		if err != nil {
			cancel()
		}
		genDone <- err
	}()
	stopAll := func() error {
		stop.Store(true)
		var err error
		select {
		case err = <-genDone:
		case <-time.After(5 * time.Second):
			err = errors.New("generator did not stop within 5 s")
		}
		cancel()
		wg.Wait()
		return errors.Join(err, rxErr)
	}

	var t0, t1 snap
	err = sleep(wctx, b.o.warmup)
	if err == nil {
		t0, err = b.snap()
	}
	if err == nil {
		err = sleep(wctx, b.o.duration)
	}
	if err == nil {
		t1, err = b.snap()
	}
	if err != nil {
		// Interrupted, or the generator or the worker failed (and
		// cancelled wctx): say which.
		stopErr := stopAll()
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case stopErr != nil:
			return nil, stopErr
		}
		return nil, err
	}

	// Stop sending, push out what the generator still holds, and give the
	// last frames time to get through (until the counts stop moving).
	stop.Store(true)
	var genErr error
	select {
	case genErr = <-genDone:
	case <-time.After(5 * time.Second):
		genErr = errors.New("generator did not stop within 5 s")
	}
	if genErr == nil {
		b.gen.drain()
		last, quiet := uint64(0), time.Now()
		for deadline := time.Now().Add(time.Second); time.Now().Before(deadline) && time.Since(quiet) < 50*time.Millisecond; {
			time.Sleep(5 * time.Millisecond)
			s, err := b.snap()
			if err != nil {
				break
			}
			if n := r.done(s) + r.seen(s); n != last {
				last, quiet = n, time.Now()
			}
		}
	}
	cancel()
	wg.Wait()
	if err := errors.Join(genErr, rxErr); err != nil {
		return nil, err
	}
	end, err := b.snap()
	if err != nil {
		return nil, err
	}
	g1, e1 := b.vethDrops()

	secs := t1.t.Sub(t0.t).Seconds()
	res := &result{
		secs:     secs,
		offered:  float64(t1.offered-t0.offered) / secs,
		seen:     float64(r.seen(t1)-r.seen(t0)) / secs,
		done:     float64(r.done(t1)-r.done(t0)) / secs,
		tOffered: end.offered - start.offered,
		tSeen:    r.seen(end) - r.seen(start),
		tVerdict: r.verdict(end) - r.verdict(start),
		tDone:    r.done(end) - r.done(start),
		xs:       xskDelta(start.xs, end.xs),
		cpu:      cpuDelta(t0.cpu, t1.cpu),
		self:     (t1.self - t0.self).Seconds() / secs,
		gDrops:   g1 - g0,
		eDrops:   e1 - e0,
	}
	for i := range end.steer {
		res.steer = append(res.steer, bpf.Counter{Packets: end.steer[i].Packets - start.steer[i].Packets})
	}
	if len(t0.netRX) == len(t1.netRX) {
		for i := range t0.netRX {
			res.netRX += t1.netRX[i] - t0.netRX[i]
		}
	}
	return res, nil
}

// work is the AF_XDP worker: it receives until ctx ends, counting frames.
// It is Socket.Receive without the runtime.Gosched in its idle spin: on a
// goroutine locked to its thread (-pin), every Gosched hands the thread's P
// to another thread and back (futex wake-ups), which costs more than the
// packets. While the ring stays empty it spins for -spin, then sleeps in
// poll(2).
func (b *bench) work(ctx context.Context) error {
	count := func([]byte) {}
	idle := time.Time{}
	for ctx.Err() == nil {
		n, err := b.rx.TryReceive(count)
		if err != nil {
			return err
		}
		if n > 0 {
			b.got.Add(uint64(n))
			idle = time.Time{}
			continue
		}
		if idle.IsZero() {
			idle = time.Now()
		}
		if time.Since(idle) >= b.o.spin {
			if _, err := b.rx.Poll(ctx, 100*time.Millisecond); err != nil {
				return err
			}
			idle = time.Time{}
		}
	}
	return ctx.Err()
}

func xskDelta(a, b xsk.Stats) xsk.Stats {
	return xsk.Stats{
		RXDropped:       b.RXDropped - a.RXDropped,
		RXRingFull:      b.RXRingFull - a.RXRingFull,
		RXFillRingEmpty: b.RXFillRingEmpty - a.RXFillRingEmpty,
		RXPackets:       b.RXPackets - a.RXPackets,
		Polls:           b.Polls - a.Polls,
	}
}

func (b *bench) print(w io.Writer, rows []*row, best []*result) error {
	floor := 0.0
	if rows[0].floor {
		floor = best[0].done
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "path\toffered/s\tat XDP/s\tdone/s\tdone/offered\tx floor\tlost before XDP\tlost after verdict\tCPUs: ours+others\t\n")
	for i, r := range rows {
		res := best[i]
		xFloor := "-"
		if floor > 0 {
			xFloor = fmt.Sprintf("%.2f", res.done/floor)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.2f\t%s\t%s\t%s\t%s\t\n", r.name,
			mpps(res.offered), mpps(res.seen), mpps(res.done), res.done/res.offered, xFloor,
			lost(res.tOffered, res.tSeen), lost(res.tVerdict, res.tDone), fmt.Sprintf("%.2f+%.2f", res.self, res.others()))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nrates: over the timed window; losses: whole row (warm-up and drain included), of the stage's input;\n")
	fmt.Fprintf(w, "CPUs: used by bench-steer (its softirq work and NAPI threads included) + by everything else, over the window.\n")
	for i, r := range rows {
		if o := best[i].others(); o > 0.1 {
			fmt.Fprintf(w, "warning: %s: other work kept %.2f CPUs busy during the best round; its numbers are low, run again on a quieter machine.\n", r.name, o)
		}
	}
	fmt.Fprintf(w, "cross-checks (best round of each row):\n")
	for i, r := range rows {
		res := best[i]
		var notes []string
		notes = append(notes, fmt.Sprintf("offered %d, at XDP %d, verdict %d, %s %d", res.tOffered, res.tSeen, res.tVerdict, r.what, res.tDone))
		if !r.floor {
			var c []string
			for k, v := range res.steer {
				if v.Packets > 0 {
					c = append(c, fmt.Sprintf("%s %d", bpf.Stat(k), v.Packets))
				}
			}
			notes = append(notes, "Steer.Stats: "+strings.Join(c, ", "))
		}
		if r.xsk {
			notes = append(notes, fmt.Sprintf("socket: received %d, rx_dropped %d, rx_ring_full %d, fill_ring_empty %d, polls %d",
				res.xs.RXPackets, res.xs.RXDropped, res.xs.RXRingFull, res.xs.RXFillRingEmpty, res.xs.Polls))
		}
		notes = append(notes, fmt.Sprintf("veth drops: %s %d, %s %d", b.tb.genIf.name, res.gDrops, b.tb.outIf.name, res.eDrops))
		if res.seen > 0 && res.netRX > 0 {
			notes = append(notes, fmt.Sprintf("NET_RX softirqs %.0f/s (%.1f frames each)", float64(res.netRX)/res.secs, res.seen*res.secs/float64(res.netRX)))
		}
		notes = append(notes, cpuDetail(res.cpu))
		fmt.Fprintf(w, "  %s:\n    %s\n", r.name, strings.Join(notes, "\n    "))
	}
	return nil
}

func mpps(v float64) string { return fmt.Sprintf("%.3fM", v/1e6) }

// lost formats in-out as a count and a share of in.
func lost(in, out uint64) string {
	d := int64(in) - int64(out)
	if in == 0 {
		return fmt.Sprintf("%d", d)
	}
	return fmt.Sprintf("%d (%.2f%%)", d, 100*float64(d)/float64(in))
}

// others is how many CPUs other processes (and the kernel's own work for
// them) kept busy during the window: every CPU's busy time less ours.
func (r *result) others() float64 {
	total := 0.0
	for _, u := range r.cpu {
		total += u.busy()
	}
	return max(total-r.self, 0)
}

func cpuDetail(use []cpuUse) string {
	var p []string
	for i, u := range use {
		p = append(p, fmt.Sprintf("cpu%d user %.0f%% sys %.0f%% softirq %.0f%% steal %.0f%%", i, 100*u.user, 100*u.system, 100*u.softirq, 100*u.steal))
	}
	return strings.Join(p, "; ")
}
