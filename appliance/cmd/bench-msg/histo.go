package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging/apps"
)

// histoRow is one row of the Histogram table: a mode, its transport, and
// the inserts per second of each repeated run.
type histoRow struct {
	name   string
	mode   messaging.Mode
	xdp    bool
	tsize  int
	rates  []float64 // inserts/s, one per run
	bundle float64   // host0 client's average bundle bytes, last run
	retx   uint64    // retransmitted bundles, all runs, clients and agents
}

// stats is the rates' min, median and max; the median of an even count
// is the mean of the middle two. r has at least one run (-histo-runs ≥ 1).
func (r histoRow) stats() (lo, med, hi float64) {
	s := slices.Clone(r.rates)
	slices.Sort(s)
	n := len(s)
	med = s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return s[0], med, s[n-1]
}

// histo runs Histogram in the shape of issue 15's table: -histo-ranks ranks
// on each of host0 and host1, every rank sending -inserts inserts of 9 B
// (tag and key; -histo-pad adds bytes) to the owners of random keys of a
// table of 4096 keys per rank, in the modes none, host, dpu and dpu on
// AF_XDP, -histo-runs times each, round-robin over the modes so that a
// slow spell of the shared machine spreads over them. Every run checks the
// table exactly (apps.Histogram.Verify). It prints inserts/s as min, median
// and max, and the median's ratio to none's.
func (b *bench) histo(ctx context.Context) error {
	if *histoRuns < 1 {
		return fmt.Errorf("-histo-runs %d: want at least 1", *histoRuns)
	}
	tsize := min(messaging.DefaultTransferSize, b.maxPayload)
	rows := []*histoRow{
		{name: "none", mode: messaging.ModeNone, tsize: tsize},
		{name: "host", mode: messaging.ModeHost, tsize: tsize},
		{name: "dpu", mode: messaging.ModeDPU, tsize: tsize},
	}
	if *histoXDP {
		stop, err := b.steering()
		if err != nil {
			return err
		}
		defer stop()
		xt := b.xdpTransferSize()
		rows = append(rows, &histoRow{name: "dpu AF_XDP", mode: messaging.ModeDPU, xdp: true, tsize: xt})
		if xt != tsize {
			// The kernel-UDP agents at the AF_XDP transport's bundle size:
			// the transports compared at equal bundle sizes.
			rows = append(rows, &histoRow{name: fmt.Sprintf("dpu ≤%d", xt), mode: messaging.ModeDPU, tsize: xt})
		}
	}
	if *histoModes != "" {
		keep := strings.Split(*histoModes, ",")
		rows = slices.DeleteFunc(rows, func(r *histoRow) bool { return !slices.Contains(keep, r.name) })
		if len(rows) == 0 {
			return fmt.Errorf("-histo-modes %q: no such mode (none, host, dpu, dpu AF_XDP)", *histoModes)
		}
	}
	if *cpuProf != "" && *histoAll {
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
	fmt.Printf("\nHistogram: %d ranks on host0 and %d on host1, %d inserts per rank of %d B, 4096 keys per rank, %d agent workers (AF_XDP: %d), %d runs per row, totals checked exactly\n",
		*histoRanks, *histoRanks, *histoN, 9+*histoPad, *workers, *xdpW, *histoRuns)
	for run := range *histoRuns {
		for _, r := range rows {
			res, st, err := b.histoRun(ctx, r)
			if err != nil {
				return fmt.Errorf("histogram %s run %d: %w", r.name, run+1, err)
			}
			r.rates = append(r.rates, res.Rate())
			r.bundle = st.bundle
			r.retx += st.retx
		}
	}
	_, err := fmt.Print(histoTable(rows))
	return err
}

// histoTable renders the Histogram rows, each median also as a multiple of
// the none row's median; without a none row (-histo-modes) that column is
// '-' and a line says so, rather than a ratio to whichever row came first.
func histoTable(rows []*histoRow) string {
	var sb strings.Builder
	tw := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\ttransfer_size\tmin M/s\tmedian M/s\tmax M/s\t× none (median)\tbundle B\tretx\t")
	none := 0.0
	for _, r := range rows {
		if r.mode == messaging.ModeNone && !r.xdp {
			_, none, _ = r.stats()
		}
	}
	for _, r := range rows {
		lo, med, hi := r.stats()
		x := "-"
		if none > 0 {
			x = fmt.Sprintf("%.2f", med/none)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t%s\t%.0f\t%d\t\n", r.name, r.tsize, lo/1e6, med/1e6, hi/1e6, x, r.bundle, r.retx)
	}
	_ = tw.Flush()
	if none <= 0 {
		sb.WriteString("× none: not measured (no none row in this run)\n")
	}
	sb.WriteString(histoVerdicts(rows))
	return sb.String()
}

// histoVerdicts judges issue 15's Histogram targets on this run's medians:
// the DPU agents (kernel UDP) at ≥ 0.8× none, and the AF_XDP agents at ≥
// the kernel-UDP agents at the same transfer size (equal MTU). A row the
// run lacks (-histo-modes, -histo-xdp=false) makes its verdict not measured.
func histoVerdicts(rows []*histoRow) string {
	find := func(mode messaging.Mode, xdp bool, tsize int) *histoRow {
		for _, r := range rows {
			if r.mode == mode && r.xdp == xdp && (tsize == 0 || r.tsize == tsize) {
				return r
			}
		}
		return nil
	}
	judge := func(what string, r, base *histoRow, baseName string, least float64) string {
		if r == nil || base == nil {
			return fmt.Sprintf("target %s: not measured (no %s row in this run)\n", what, baseName)
		}
		_, med, _ := r.stats()
		_, b, _ := base.stats()
		if b <= 0 {
			return fmt.Sprintf("target %s: not measured (the %s row moved nothing)\n", what, base.name)
		}
		return fmt.Sprintf("target %s: %s (%.2f)\n", what, met(med >= least*b), med/b)
	}
	var sb strings.Builder
	if n := find(messaging.ModeNone, false, 0); n != nil {
		sb.WriteString(judge("dpu ≥ 0.8x none (medians)", find(messaging.ModeDPU, false, n.tsize), n, "dpu", 0.8))
	} else {
		sb.WriteString(judge("dpu ≥ 0.8x none (medians)", nil, nil, "none", 0.8))
	}
	if x := find(messaging.ModeDPU, true, 0); x != nil {
		sb.WriteString(judge("AF_XDP agents ≥ kernel-UDP agents at equal MTU (medians)", x, find(messaging.ModeDPU, false, x.tsize),
			fmt.Sprintf("kernel-UDP dpu at %d B", x.tsize), 1))
	} else {
		sb.WriteString(judge("AF_XDP agents ≥ kernel-UDP agents at equal MTU (medians)", nil, nil, "dpu AF_XDP", 1))
	}
	return sb.String()
}

type histoStats struct {
	bundle float64
	retx   uint64
}

// histoRun runs Histogram once in r's configuration.
func (b *bench) histoRun(ctx context.Context, r *histoRow) (apps.Result, histoStats, error) {
	w := *workers
	if r.xdp {
		w = *xdpW
	}
	l := b.layout(r.mode, r.tsize, w)
	l.RanksPerClient = *histoRanks
	if r.xdp {
		l.OpenAgent = b.openXDP
		defer b.closeXDP()
	}
	h := apps.NewHistogram(l.Ranks(), apps.HistogramParams{InsertsPerRank: *histoN, KeysPerRank: 4096, Seed: 1, Pad: *histoPad})
	cl, err := apps.StartCluster(l, h.Handle)
	if err != nil {
		return apps.Result{}, histoStats{}, err
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, 120*time.Second)
	defer cancel()
	res, err := h.Run(rctx, cl)
	if err != nil {
		return apps.Result{}, histoStats{}, err
	}
	st := histoStats{bundle: cl.Clients[0].Stats().Sent().AvgBundleBytes}
	clients, agents := cl.Stats()
	for _, s := range append(clients, agents...) {
		st.retx += s.Sent().Retransmits
	}
	return res, st, nil
}
