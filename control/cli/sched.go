package cli

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/sched"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/sched/trace"
)

const schedDescription = `The accelerator-ingest scheduler (Conspirator) places each inference request or job on a
MIG slice of a GPU: which GPU, which profile, which start slot. It is exact about the
cards' geometry (seven compute and eight memory slices; each profile starts only at fixed
memory slices) and minimises eq. 1 of the Conspirator text: GPUs in use plus deadline
misses weighted by size, with fragmentation growth as the tie-breaker. See
docs/scheduling.md.

   layout     the feasible layouts of a card
   simulate   replay a pod trace through the policies and compare them
   synth      write a synthetic pod trace in the Alibaba cluster-trace-gpu-v2023 format`

func schedCommand() *ucli.Command {
	return &ucli.Command{
		Name:        "sched",
		Usage:       "MIG placement of accelerator work: card layouts, trace simulation",
		Description: schedDescription,
		Subcommands: []*ucli.Command{schedLayoutCommand(), schedSimulateCommand(), schedSynthCommand()},
	}
}

func cardNames() string {
	var names []string
	for _, c := range mig.Cards() {
		names = append(names, c.Name)
	}
	return strings.Join(names, ", ")
}

type layoutJSON struct {
	Card      string   `json:"card"`
	Instances []string `json:"instances"`
	Compute   int      `json:"compute_slices"`
	Memory    int      `json:"memory_slices"`
	Maximal   bool     `json:"maximal"`
}

func schedLayoutCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "layout",
		Usage:     "list the feasible MIG layouts of a card (every set of instances that fits together)",
		UsageText: "lovelock sched layout [--card CARD] [--all] [--output table|json]",
		Description: "Prints the card's profiles (memory slices, allowed start slots, most instances, SMs)\n" +
			"and its maximal layouts, those to which no further instance can be added; --all lists every\n" +
			"non-empty layout. Each instance is PROFILE@SLOT, SLOT being its first memory slice.",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "card", Value: "H100-80GB", Usage: "the card: " + cardNames()},
			&ucli.BoolFlag{Name: "all", Usage: "list every feasible layout, not only the maximal ones"},
			outputFlag(),
		},
		Action: func(c *ucli.Context) error {
			asJSON, err := wantJSON(c)
			if err != nil {
				return err
			}
			card, err := mig.CardByName(c.String("card"))
			if err != nil {
				return fmt.Errorf("--card: %w", err)
			}
			all := card.Layouts()
			var out []layoutJSON
			maximal := 0
			for _, l := range all {
				m := card.Maximal(l)
				if m {
					maximal++
				}
				if !m && !c.Bool("all") {
					continue
				}
				lj := layoutJSON{Card: card.Name, Maximal: m}
				for _, pl := range l {
					p := card.Profiles[pl.Profile]
					lj.Instances = append(lj.Instances, fmt.Sprintf("%s@%d", p.Name, pl.Start))
					lj.Compute += p.Compute
					lj.Memory += p.MemSlices
				}
				out = append(out, lj)
			}
			if asJSON {
				return writeJSON(c.App.Writer, out)
			}
			w := c.App.Writer
			fmt.Fprintf(w, "%s: %d compute slices, %d memory slices\n\n", card.Name, mig.ComputeSlices, mig.MemorySlices)
			tw := newTable(w)
			fmt.Fprintln(tw, "PROFILE\tID\tCOMPUTE\tMEMORY SLICES\tSTARTS\tMAX\tSMS")
			for _, p := range card.Profiles {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%d\t%d\n", p.Name, p.ID, p.Compute, p.MemSlices, strings.Trim(fmt.Sprint(p.Starts), "[]"), p.Max, p.SMs)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(w, "\n%d feasible layouts, %d maximal; listing %d:\n\n", len(all), maximal, len(out))
			tw = newTable(w)
			fmt.Fprintln(tw, "SLOTS 0-7\tCOMPUTE\tINSTANCES")
			for _, lj := range out {
				fmt.Fprintf(tw, "%s\t%d/7\t%s\n", slotPicture(&card, lj), lj.Compute, strings.Join(lj.Instances, " "))
			}
			return tw.Flush()
		},
	}
}

// slotPicture draws a layout's memory slices: one letter per instance, '.'
// for a free slice.
func slotPicture(card *mig.Card, lj layoutJSON) string {
	pic := []byte("........")
	for k, inst := range lj.Instances {
		name, slot, _ := strings.Cut(inst, "@")
		p, err := card.Profile(name)
		if err != nil {
			continue
		}
		var start int
		fmt.Sscan(slot, &start)
		for i := start; i < start+card.Profiles[p].MemSlices; i++ {
			pic[i] = byte('A' + k)
		}
	}
	return string(pic)
}

func schedSimulateCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "simulate",
		Usage:     "replay a pod trace through the placement policies: GPU-hours, allocation, fragmentation, misses, latency",
		UsageText: "lovelock sched simulate --trace PODS.csv [--nodes NODES.csv [--card CARD] | --gpus 64xH100-80GB] [--policy all] [--slack 2] [--frag next|stranded] [--plot gpus.svg] [--output table|json]",
		Description: "Reads an openb_pod_list_*.csv of Alibaba's cluster-trace-gpu-v2023 (or one written by\n" +
			"'lovelock sched synth'), maps each pod's gpu_milli to the smallest MIG profile whose speed\n" +
			"reaches it (docs/scheduling.md), and replays arrivals and completions through each policy:\n" +
			"   naive      one whole GPU per request (the Conspirator text's baseline)\n" +
			"   firstfit   the lowest-numbered GPU and slot that fit\n" +
			"   bestfit    the GPU left with the fewest free memory slices\n" +
			"   lovelock   eq. 1 online: GPUs in use, then deadline misses, then fragmentation growth\n" +
			"The trace's GPUs (V100, T4, …) have no MIG: with --nodes every GPU of the node list stands\n" +
			"for one --card. The trace has no deadlines: each request's is arrival + slack × run time.\n" +
			"MISSED counts requests that ended after their deadline, or, without one (--slack 0), that\n" +
			"started after arrival + --reconfig (the scheduler's reading: due on arrival), and UNSERVED ones.",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "trace", Required: true, Usage: "pod list CSV (openb_pod_list format)"},
			&ucli.StringFlag{Name: "nodes", Usage: "node list CSV (openb_node_list format): the fleet, one --card per GPU"},
			&ucli.StringFlag{Name: "card", Value: "H100-80GB", Usage: "with --nodes, the MIG card each GPU stands for: " + cardNames()},
			&ucli.StringFlag{Name: "gpus", Usage: "the fleet as COUNTxCARD[,COUNTxCARD…], e.g. 64xH100-80GB (default unless --nodes)"},
			&ucli.StringFlag{Name: "policy", Value: "all", Usage: "naive, firstfit, bestfit, lovelock or all"},
			&ucli.Float64Flag{Name: "slack", Value: 2, Usage: "deadline = arrival + slack × run time, finite and ≥ 0 (below 1 every request misses); 0: none (start on arrival, plus --reconfig, or count late)"},
			&ucli.DurationFlag{Name: "reconfig", Usage: "time to create a MIG instance on idle slices, added before each request's work (≥ 0)"},
			&ucli.Float64Flag{Name: "wait-margin", Usage: "lovelock: share of a request's slack kept in reserve when it waits for a slot instead of opening a GPU, in [0, 1) (0: wait up to the latest start)"},
			&ucli.StringFlag{Name: "frag", Value: sched.FragDefault.String(), Usage: "lovelock's fragmentation tie-breaker: next (FGD: free slices the next request cannot use) or stranded (free slices no expected profile can use); FRAG reports next's rate either way"},
			&ucli.StringFlag{Name: "plot", Usage: "write an SVG plot of GPUs in use over time, one line per policy, to this file"},
			outputFlag(),
		},
		Action: func(c *ucli.Context) error {
			asJSON, err := wantJSON(c)
			if err != nil {
				return err
			}
			fleet, err := schedFleet(c)
			if err != nil {
				return err
			}
			policies, err := schedPolicies(c.String("policy"))
			if err != nil {
				return err
			}
			frag, err := sched.ParseFrag(c.String("frag"))
			if err != nil {
				return fmt.Errorf("--frag: %w", err)
			}
			slack, reconfig, margin := c.Float64("slack"), c.Duration("reconfig"), c.Float64("wait-margin")
			switch {
			case !(slack >= 0) || math.IsInf(slack, 1):
				return fmt.Errorf("--slack %g: want a finite number ≥ 0: the deadline is arrival + slack × run time, 0 for none", slack)
			case reconfig < 0:
				return fmt.Errorf("--reconfig %v: negative: use 0 (instances ready at once) or the time creating a MIG instance takes", reconfig)
			case !(margin >= 0 && margin < 1):
				return fmt.Errorf("--wait-margin %g: outside [0, 1): use 0 to wait up to a request's latest start, or a share of its slack to keep, e.g. 0.5", margin)
			}
			if slack > 0 && (slack < 1 || slack == 1 && reconfig > 0) {
				fmt.Fprintf(c.App.ErrWriter, "warning: --slack %g: every request misses its deadline: arrival + %g × run time is before arrival + --reconfig (%v) + run time; use a larger --slack, or 0 for none\n",
					slack, slack, reconfig)
			}
			pods, err := trace.LoadPods(c.String("trace"))
			if err != nil {
				return fmt.Errorf("--trace: %w", err)
			}
			reqs, st, err := trace.Map(pods, trace.MapOptions{Slack: slack})
			if err != nil {
				return fmt.Errorf("--trace %s: %w", c.String("trace"), err)
			}
			if len(reqs) == 0 {
				return fmt.Errorf("--trace %s: no GPU pods with a deletion time among %d pods", c.String("trace"), st.Pods)
			}
			var results []sched.Result
			var curves []sched.Curve
			for _, p := range policies {
				r, err := sched.Simulate(sched.Config{Policy: p, Fleet: fleet, Reconfig: reconfig, WaitMargin: margin, Frag: frag}, reqs,
					sched.SimOptions{Series: c.String("plot") != ""})
				if err != nil {
					return fmt.Errorf("simulate %s: %w", p, err)
				}
				results = append(results, r)
				curves = append(curves, sched.Curve{Name: r.Policy, Points: r.Series})
			}
			if path := c.String("plot"); path != "" {
				if err := writePlot(path, c.String("trace"), curves); err != nil {
					return err
				}
			}
			if asJSON {
				return writeJSON(c.App.Writer, simulateOutput(st, fleet, results))
			}
			w := c.App.Writer
			total := 0
			for _, f := range fleet {
				total += f.Count
			}
			fmt.Fprintf(w, "%d pods → %d requests (%d CPU-only and %d unfinished pods left out, %d multi-GPU pods split); %d GPUs\n\n",
				st.Pods, st.Requests, st.CPUOnly, st.NoDeletion, st.MultiGPU, total)
			tw := newTable(w)
			fmt.Fprintln(tw, "POLICY\tGPU-HOURS\tVS NAIVE\tALLOC RATE\tFRAG\tMISSED\tUNSERVED\tREJECTED\tPEAK GPUS\tMEAN µS\tP99 µS")
			var naive float64
			for _, r := range results {
				if r.Policy == "naive" {
					naive = r.GPUHours
				}
			}
			for _, r := range results {
				vs := "-"
				if naive > 0 {
					vs = fmt.Sprintf("%+.1f%%", 100*(r.GPUHours/naive-1))
				}
				fmt.Fprintf(tw, "%s\t%.1f\t%s\t%.3f\t%.3f\t%d\t%d\t%d\t%d\t%.2f\t%.2f\n", r.Policy, r.GPUHours, vs, r.AllocRate, r.Frag,
					r.Misses, r.Unserved, r.Rejected, r.PeakInUse, r.MeanNs/1000, r.P99Ns/1000)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintln(w, "\nALLOC RATE: requested GPU share ÷ GPUs in use, over time. FRAG: share of the free memory slices of GPUs in use\n"+
				"that a typical request cannot use (FGD's fragmentation rate, over time; 1: no free slice is usable). MISSED: ended\n"+
				"after the deadline (without one: started after arrival + --reconfig), or never started. µS: time to decide one arrival.")
			return nil
		},
	}
}

// simulateJSON is `sched simulate -o json`: snake_case names with units
// as suffixes, like the CLI's other JSON outputs (sched's types have none,
// and their Go field names would leak out as keys).
type simulateJSON struct {
	Trace   traceStatsJSON  `json:"trace"`
	Fleet   []fleetJSON     `json:"fleet"`
	Results []simResultJSON `json:"results"`
}

type traceStatsJSON struct {
	Pods       int `json:"pods"`
	Requests   int `json:"requests"`
	CPUOnly    int `json:"cpu_only"`
	NoDeletion int `json:"no_deletion"`
	MultiGPU   int `json:"multi_gpu"`
}

type fleetJSON struct {
	Card  string `json:"card"`
	Count int    `json:"count"`
}

type simResultJSON struct {
	Policy    string  `json:"policy"`
	GPUs      int     `json:"gpus"`
	Requests  int     `json:"requests"`
	Placed    int     `json:"placed"`
	Rejected  int     `json:"rejected"`
	Unserved  int     `json:"unserved"`
	Misses    int     `json:"misses"`
	MissSize  int     `json:"miss_slices"`
	GPUHours  float64 `json:"gpu_hours"`
	GPUsUsed  int     `json:"gpus_used"`
	PeakInUse int     `json:"peak_in_use"`
	AllocRate float64 `json:"alloc_rate"`
	Frag      float64 `json:"frag"`
	Decisions int     `json:"decisions"`
	MeanNs    float64 `json:"mean_ns"`
	P50Ns     float64 `json:"p50_ns"`
	P99Ns     float64 `json:"p99_ns"`
	Plans     struct {
		Plans     int `json:"plans"`
		OverNodes int `json:"over_nodes"`
		Nodes     int `json:"nodes"`
	} `json:"plans"`
	Objective int `json:"objective"`
}

func simulateOutput(st trace.MapStats, fleet []sched.Fleet, results []sched.Result) simulateJSON {
	out := simulateJSON{
		Trace: traceStatsJSON{Pods: st.Pods, Requests: st.Requests, CPUOnly: st.CPUOnly, NoDeletion: st.NoDeletion, MultiGPU: st.MultiGPU},
		Fleet: []fleetJSON{}, Results: []simResultJSON{},
	}
	for _, f := range fleet {
		out.Fleet = append(out.Fleet, fleetJSON{Card: f.Card, Count: f.Count})
	}
	for _, r := range results {
		rj := simResultJSON{
			Policy: r.Policy, GPUs: r.GPUs, Requests: r.Requests, Placed: r.Placed, Rejected: r.Rejected,
			Unserved: r.Unserved, Misses: r.Misses, MissSize: r.MissSize, GPUHours: r.GPUHours, GPUsUsed: r.GPUsUsed,
			PeakInUse: r.PeakInUse, AllocRate: r.AllocRate, Frag: r.Frag, Decisions: r.Decisions,
			MeanNs: r.MeanNs, P50Ns: r.P50Ns, P99Ns: r.P99Ns, Objective: r.Objective,
		}
		rj.Plans.Plans, rj.Plans.OverNodes, rj.Plans.Nodes = r.Plans.Plans, r.Plans.OverNodes, r.Plans.Nodes
		out.Results = append(out.Results, rj)
	}
	return out
}

func writePlot(path, title string, curves []sched.Curve) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	if err := sched.WriteSVG(f, "GPUs in use: "+title, curves); err != nil {
		f.Close()
		return fmt.Errorf("--plot %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--plot %s: %w", path, err)
	}
	return nil
}

func schedFleet(c *ucli.Context) ([]sched.Fleet, error) {
	switch {
	case c.IsSet("nodes") && c.IsSet("gpus"):
		return nil, errors.New("give --nodes or --gpus, not both")
	case c.IsSet("card") && !c.IsSet("nodes"):
		// Else ignored: the default fleet's or --gpus' cards would run.
		return nil, fmt.Errorf("--card %s: it names the card of --nodes' GPUs; without --nodes, give the fleet as --gpus COUNTx%[1]s", c.String("card"))
	case c.IsSet("nodes"):
		nodes, err := trace.LoadNodes(c.String("nodes"))
		if err != nil {
			return nil, fmt.Errorf("--nodes: %w", err)
		}
		if _, err := mig.CardByName(c.String("card")); err != nil {
			return nil, fmt.Errorf("--card: %w", err)
		}
		return trace.Fleet(nodes, c.String("card"))
	case c.IsSet("gpus"):
		f, err := sched.ParseFleet(c.String("gpus"))
		if err != nil {
			return nil, fmt.Errorf("--gpus: %w", err)
		}
		return f, nil
	}
	return []sched.Fleet{{Card: "H100-80GB", Count: 64}}, nil
}

func schedPolicies(s string) ([]sched.Policy, error) {
	if s == "all" {
		return sched.Policies(), nil
	}
	var out []sched.Policy
	for _, name := range strings.Split(s, ",") {
		p, err := sched.ParsePolicy(strings.TrimSpace(name))
		if err != nil {
			return nil, fmt.Errorf("--policy: %w (or all)", err)
		}
		out = append(out, p)
	}
	return out, nil
}

func schedSynthCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "synth",
		Usage:     "write a synthetic pod trace with the columns of openb_pod_list",
		UsageText: "lovelock sched synth --out PODS.csv [--pods N] [--mix mixed | --mix MILLI[xGPUS]:WEIGHT,…] [--seed S] [--gap SECONDS] [--duration SECONDS]",
		Description: "Pods arrive with exponential gaps and run for log-normal times; gpu_milli follows the share\n" +
			"mix: a name (small, mixed, large, whole) or a list such as 100:3,500:1,1000x2:1 (1000x2: two\n" +
			"whole GPUs; weights finite and > 0). --gap and --duration must be finite and > 0. The same seed\n" +
			"writes the same trace.",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "out", Required: true, Usage: "file to write ('-' for standard output)"},
			&ucli.IntFlag{Name: "pods", Value: 10000, Usage: "number of pods"},
			&ucli.StringFlag{Name: "mix", Value: "mixed", Usage: "share mix: small, mixed, large, whole or MILLI[xGPUS]:WEIGHT,…"},
			&ucli.Uint64Flag{Name: "seed", Value: 1, Usage: "random seed"},
			&ucli.Float64Flag{Name: "gap", Value: 1, Usage: "mean seconds between pod creations"},
			&ucli.Float64Flag{Name: "duration", Value: 600, Usage: "mean run time in seconds"},
		},
		Action: func(c *ucli.Context) error {
			mix, err := trace.ParseMix(c.String("mix"))
			if err != nil {
				return fmt.Errorf("--mix: %w", err)
			}
			if n := c.Int("pods"); n <= 0 {
				return fmt.Errorf("--pods %d: want at least 1", n)
			}
			for _, name := range []string{"gap", "duration"} {
				if v := c.Float64(name); !(v > 0) || math.IsInf(v, 1) {
					return fmt.Errorf("--%s %g: want a finite number of seconds > 0", name, v)
				}
			}
			pods, err := trace.Synth(trace.SynthOptions{Pods: c.Int("pods"), Mix: mix, Seed: c.Uint64("seed"),
				MeanGap: c.Float64("gap"), MeanDuration: c.Float64("duration"), MaxWait: 30})
			if err != nil {
				return err
			}
			if c.String("out") == "-" {
				return trace.WritePods(c.App.Writer, pods)
			}
			f, err := os.Create(c.String("out"))
			if err != nil {
				return fmt.Errorf("--out: %w", err)
			}
			if err := trace.WritePods(f, pods); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return fmt.Errorf("--out: %w", err)
			}
			fmt.Fprintf(c.App.ErrWriter, "wrote %d pods to %s\n", len(pods), c.String("out"))
			return nil
		},
	}
}
