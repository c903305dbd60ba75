package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"strconv"
	"strings"
	"text/tabwriter"

	ucli "github.com/urfave/cli/v2"

	"github.com/lovelock-dpu/lovelock/control/planner"
)

// Flag names of `lovelock plan`.
const (
	planFlagPhi            = "phi"
	planFlagMu             = "mu"
	planFlagProject        = "project"
	planFlagServerCost     = "server-cost"
	planFlagServerPower    = "server-power"
	planFlagPCIeCost       = "pcie-cost"
	planFlagPCIePower      = "pcie-power"
	planFlagPCIeShare      = "pcie-share"
	planFlagFabricCost     = "fabric-cost"
	planFlagFabricShare    = "fabric-share"
	planFlagCPUShare       = "cpu-share"
	planFlagNetworkShare   = "network-share"
	planFlagCPURatio       = "cpu-ratio"
	planFlagBandwidthRatio = "bandwidth-ratio"
	planFlagScenario       = "scenario"
	planFlagTargetSlowdown = "target-slowdown"
	planFlagTargetCost     = "target-cost-ratio"
	planFlagOutput         = "output"
)

// planModelFlags returns the flags that feed the model; --scenario takes none.
func planModelFlags() []string {
	return []string{
		planFlagPhi, planFlagMu, planFlagProject,
		planFlagServerCost, planFlagServerPower, planFlagPCIeCost, planFlagPCIePower, planFlagPCIeShare,
		planFlagFabricCost, planFlagFabricShare,
		planFlagCPUShare, planFlagNetworkShare, planFlagCPURatio, planFlagBandwidthRatio,
		planFlagTargetSlowdown, planFlagTargetCost,
	}
}

// planWorkloadFlags returns the flags that describe the workload: only the
// projection of μ (--project) and the search read them.
func planWorkloadFlags() []string {
	return []string{planFlagCPUShare, planFlagNetworkShare, planFlagCPURatio, planFlagBandwidthRatio}
}

// planFieldFlag returns the flag that sets a planner field.
func planFieldFlag(field string) (string, bool) {
	flag, ok := map[string]string{
		"ServerCost":              planFlagServerCost,
		"ServerPower":             planFlagServerPower,
		"PCIeCost":                planFlagPCIeCost,
		"PCIePower":               planFlagPCIePower,
		"FabricCost":              planFlagFabricCost,
		"Phi":                     planFlagPhi,
		"Mu":                      planFlagMu,
		"Workload.CPUShare":       planFlagCPUShare,
		"Workload.NetworkShare":   planFlagNetworkShare,
		"Workload.CPURatio":       planFlagCPURatio,
		"Workload.BandwidthRatio": planFlagBandwidthRatio,
		"Target.Slowdown":         planFlagTargetSlowdown,
		"Target.CostRatio":        planFlagTargetCost,
	}[field]
	return flag, ok
}

const planDescription = `Compares a traditional cluster of servers with a Lovelock cluster in which every
server is replaced by φ headless SmartNICs, using the cost and energy model of the
Lovelock paper (§4, §5.2). Every input is relative to one SmartNIC; every result is
traditional / Lovelock, so above 1 favours Lovelock. See docs/planner.md.

   φ    SmartNICs provisioned per server they replace
   μ    slowdown: Lovelock run time / traditional run time (1.2 = 20% slower)
   c_s  capital cost of one server, in SmartNICs   (paper: $10500/$1500 = 7)
   p_s  power draw of one server, in SmartNICs     (paper: 728 W/65 W = 11.2)
   c_p  cost of a node's PCIe devices (GPUs, SSDs), in SmartNICs
   p_p  power of a node's PCIe devices, in SmartNICs
   c_f  network fabric cost per server, in SmartNICs; each SmartNIC needs as much

   cost ratio   (eq. 1, with the §5.2 fabric term)  (c_s + c_f + c_p) / (φ(1 + c_f) + c_p)
   energy ratio (eq. 2)                             (p_s + p_p) / (μ(φ + p_p))
   projected μ  (§5.2, BigQuery-style)  cpu-share·cpu-ratio/φ + network-share/(φ·bandwidth-ratio)
                                        + (1 − cpu-share − network-share)

Modes:
   evaluate (default)   cost and energy ratios for --phi and --mu (or --project); the workload
                        flags need --project
   --scenario paper     every worked example of the paper, computed next to its printed numbers
   search               --target-slowdown gives the smallest φ whose projected μ meets it;
                        --target-cost-ratio the largest φ whose cost ratio meets it

Examples:
   lovelock plan                                   the paper's headline: φ=3, μ=1.2
   lovelock plan --pcie-share 0.75 --phi 2 --mu 0.9
   lovelock plan --phi 2 --project --fabric-share 0.1
   lovelock plan --target-slowdown 1 --output json
   lovelock plan --scenario paper`

// planCommand returns `lovelock plan`, the front end of package planner.
func planCommand() *ucli.Command {
	d := planner.DefaultInputs()
	const (
		catHardware = "Hardware, relative to one SmartNIC:"
		catCluster  = "Cluster:"
		catWorkload = "Workload, for --project and search (§5.2; default: BigQuery):"
		catModes    = "Modes:"
	)
	return &ucli.Command{
		Name:        "plan",
		Usage:       "estimate the cost and energy a Lovelock cluster of SmartNICs saves over servers",
		UsageText:   "lovelock plan [--phi φ] [--mu μ | --project] [hardware and workload flags] [--scenario paper | --target-slowdown μ | --target-cost-ratio R] [--output table|json]",
		Description: planDescription,
		Flags: []ucli.Flag{
			&ucli.Float64Flag{Name: planFlagPhi, Category: catCluster, Value: d.Phi,
				Usage: "φ: SmartNICs provisioned per server they replace (Lovelock nodes / traditional servers)"},
			&ucli.Float64Flag{Name: planFlagMu, Aliases: []string{"slowdown"}, Category: catCluster, Value: d.Mu,
				Usage: "μ: accepted slowdown, Lovelock run time / traditional run time (1.2 = 20% slower, 0.9 = 10% faster)"},
			&ucli.BoolFlag{Name: planFlagProject, Category: catCluster,
				Usage: "take μ from the workload projection at --phi instead of --mu"},
			&ucli.Float64Flag{Name: planFlagServerCost, Aliases: []string{"cs"}, Category: catHardware, Value: d.ServerCost,
				Usage: "c_s: capital cost of one server, in SmartNICs (paper: $10500/$1500)"},
			&ucli.Float64Flag{Name: planFlagServerPower, Aliases: []string{"ps"}, Category: catHardware, Value: d.ServerPower,
				Usage: "p_s: power draw of one server, in SmartNICs (paper: 728 W/65 W)"},
			&ucli.Float64Flag{Name: planFlagPCIeCost, Aliases: []string{"cp"}, Category: catHardware, Value: d.PCIeCost,
				Usage: "c_p: cost of the PCIe devices (GPUs, SSDs) attached to each node, in SmartNICs"},
			&ucli.Float64Flag{Name: planFlagPCIePower, Aliases: []string{"pp"}, Category: catHardware, Value: d.PCIePower,
				Usage: "p_p: power of the PCIe devices attached to each node, in SmartNICs"},
			&ucli.Float64Flag{Name: planFlagPCIeShare, Category: catHardware, DefaultText: "unset",
				Usage: "s: PCIe devices' share of a server system's cost and power, in [0,1); sets c_p = c_s·s/(1−s) and p_p = p_s·s/(1−s) (paper: 0.75)"},
			&ucli.Float64Flag{Name: planFlagFabricCost, Aliases: []string{"cf"}, Category: catHardware, Value: d.FabricCost,
				Usage: "c_f: network fabric (ports, ToR, links) cost per server, in SmartNICs; scales with φ (§5.2)"},
			&ucli.Float64Flag{Name: planFlagFabricShare, Category: catHardware, DefaultText: "unset",
				Usage: "fabric cost as a fraction of c_s, in [0,1); sets c_f = share·c_s (paper: 0.1, so c_f = 0.7)"},
			&ucli.Float64Flag{Name: planFlagCPUShare, Category: catWorkload, Value: d.Workload.CPUShare,
				Usage: "fraction of the traditional run time spent computing, RPC processing included"},
			&ucli.Float64Flag{Name: planFlagNetworkShare, Category: catWorkload, Value: d.Workload.NetworkShare,
				Usage: "fraction bound by network bandwidth (shuffle, storage I/O); the rest is not scaled"},
			&ucli.Float64Flag{Name: planFlagCPURatio, Category: catWorkload, Value: d.Workload.CPURatio,
				Usage: "CPU performance of one server / one SmartNIC (paper: 4.7, AMD Milan vs IPU E2000)"},
			&ucli.Float64Flag{Name: planFlagBandwidthRatio, Category: catWorkload, Value: d.Workload.BandwidthRatio,
				Usage: "network bandwidth of one SmartNIC / one server (paper: 1)"},
			&ucli.StringFlag{Name: planFlagScenario, Category: catModes, DefaultText: "unset",
				Usage: "print a built-in scenario set instead of evaluating: paper (the paper's worked examples)"},
			&ucli.Float64Flag{Name: planFlagTargetSlowdown, Category: catModes, DefaultText: "none",
				Usage: "search: the smallest φ whose projected μ is at most this (1 = as fast as the servers)"},
			&ucli.Float64Flag{Name: planFlagTargetCost, Category: catModes, DefaultText: "none",
				Usage: "search: the largest φ whose cost ratio is at least this (2 = Lovelock at most half the cost)"},
			&ucli.StringFlag{Name: planFlagOutput, Aliases: []string{"o"}, Value: "table",
				Usage: "output format: table or json"},
		},
		Action: runPlan,
	}
}

func runPlan(c *ucli.Context) error {
	format := c.String(planFlagOutput)
	if format != "table" && format != "json" {
		return fmt.Errorf("plan: invalid --%s %q: use table or json", planFlagOutput, format)
	}
	w := c.App.Writer

	if c.IsSet(planFlagScenario) {
		if s := c.String(planFlagScenario); s != "paper" {
			return fmt.Errorf("plan: invalid --%s %q: the only scenario set is paper", planFlagScenario, s)
		}
		for _, name := range planModelFlags() {
			if c.IsSet(name) {
				return fmt.Errorf("plan: --%s cannot be combined with --%s: the paper's scenarios use the paper's inputs; drop one of them",
					name, planFlagScenario)
			}
		}
		return writePlanScenarios(w, format)
	}

	in, err := planInputs(c)
	if err != nil {
		return err
	}

	if c.IsSet(planFlagTargetSlowdown) || c.IsSet(planFlagTargetCost) {
		for _, name := range []string{planFlagPhi, planFlagMu} {
			if c.IsSet(name) {
				return fmt.Errorf("plan: --%s cannot be combined with a search target: search finds φ and projects μ from the workload; drop --%s",
					name, name)
			}
		}
		var t planner.Target
		for _, f := range []struct {
			name string
			dst  *float64
		}{{planFlagTargetSlowdown, &t.Slowdown}, {planFlagTargetCost, &t.CostRatio}} {
			if !c.IsSet(f.name) {
				continue
			}
			v := c.Float64(f.name)
			if !(v > 0) { // 0 would read as "no target"
				return fmt.Errorf("plan: invalid --%s %g: must be greater than 0 (see lovelock plan --help)", f.name, v)
			}
			*f.dst = v
		}
		res, err := planner.Search(in, t)
		if err != nil {
			return planError(err)
		}
		return writePlanSearch(w, format, in, res)
	}

	if c.IsSet(planFlagProject) && c.IsSet(planFlagMu) {
		return fmt.Errorf("plan: --%s and --%s both set μ; drop one of them", planFlagMu, planFlagProject)
	}
	r, err := planner.Evaluate(in)
	if err != nil {
		return planError(err)
	}
	return writePlanEvaluation(w, format, in, r)
}

// planInputs builds the model inputs from the flags, deriving c_p, p_p and
// c_f from shares where those flags are given. Workload flags are refused
// where nothing reads them: evaluating with a given μ.
func planInputs(c *ucli.Context) (planner.Inputs, error) {
	if !c.Bool(planFlagProject) && !c.IsSet(planFlagTargetSlowdown) && !c.IsSet(planFlagTargetCost) {
		for _, name := range planWorkloadFlags() {
			if c.IsSet(name) {
				return planner.Inputs{}, fmt.Errorf("plan: --%s describes the workload, which only --%s and a search target (--%s, --%s) use; "+
					"evaluating takes μ from --%s: add --%s, or drop --%s", name, planFlagProject, planFlagTargetSlowdown, planFlagTargetCost,
					planFlagMu, planFlagProject, name)
			}
		}
	}
	in := planner.Inputs{
		ServerCost:  c.Float64(planFlagServerCost),
		ServerPower: c.Float64(planFlagServerPower),
		PCIeCost:    c.Float64(planFlagPCIeCost),
		PCIePower:   c.Float64(planFlagPCIePower),
		FabricCost:  c.Float64(planFlagFabricCost),
		Phi:         c.Float64(planFlagPhi),
		Mu:          c.Float64(planFlagMu),
		ProjectMu:   c.Bool(planFlagProject),
		Workload: planner.Workload{
			CPUShare:       c.Float64(planFlagCPUShare),
			NetworkShare:   c.Float64(planFlagNetworkShare),
			CPURatio:       c.Float64(planFlagCPURatio),
			BandwidthRatio: c.Float64(planFlagBandwidthRatio),
		},
	}
	for _, pair := range [][2]string{
		{planFlagPCIeShare, planFlagPCIeCost}, {planFlagPCIeShare, planFlagPCIePower}, {planFlagFabricShare, planFlagFabricCost},
	} {
		if c.IsSet(pair[0]) && c.IsSet(pair[1]) {
			return in, fmt.Errorf("plan: --%s and --%s both set the same term; drop one of them", pair[0], pair[1])
		}
	}
	// Validate first so that a bad --server-cost is reported as such, not as a
	// failure to derive c_p from it.
	if err := in.Validate(); err != nil {
		return in, planError(err)
	}
	if c.IsSet(planFlagPCIeShare) {
		s := c.Float64(planFlagPCIeShare)
		cp, err := planner.FromShare(in.ServerCost, s)
		if err != nil {
			return in, planFlagError(planFlagPCIeShare, s, err)
		}
		pp, err := planner.FromShare(in.ServerPower, s)
		if err != nil {
			return in, planFlagError(planFlagPCIeShare, s, err)
		}
		in.PCIeCost, in.PCIePower = cp, pp
	}
	if c.IsSet(planFlagFabricShare) {
		f := c.Float64(planFlagFabricShare)
		cf, err := planner.FabricFromFraction(in.ServerCost, f)
		if err != nil {
			return in, planFlagError(planFlagFabricShare, f, err)
		}
		in.FabricCost = cf
	}
	return in, nil
}

// planErr is an error about one flag; it unwraps to the planner's error so
// callers can still test for planner.ErrInvalidInput or ErrUnreachable.
type planErr struct {
	msg string
	err error
}

func (e *planErr) Error() string { return e.msg }
func (e *planErr) Unwrap() error { return e.err }

// planError names the flag behind a planner error.
func planError(err error) error {
	var ie *planner.InputError
	if errors.As(err, &ie) {
		if f, ok := planFieldFlag(ie.Field); ok {
			return planFlagError(f, ie.Value, err)
		}
		if ie.Field == "Target" {
			return &planErr{msg: fmt.Sprintf("plan: %s: use --%s or --%s", ie.Reason, planFlagTargetSlowdown, planFlagTargetCost), err: err}
		}
	}
	var ue *planner.UnreachableError
	if errors.As(err, &ue) {
		if f, ok := planFieldFlag(ue.Field); ok {
			return &planErr{msg: fmt.Sprintf("plan: --%s %g cannot be met: %s", f, ue.Value, ue.Reason), err: err}
		}
	}
	return fmt.Errorf("plan: %w", err)
}

func planFlagError(flag string, v float64, err error) error {
	reason := err.Error()
	var ie *planner.InputError
	if errors.As(err, &ie) {
		reason = ie.Reason
	}
	return &planErr{msg: fmt.Sprintf("plan: invalid --%s %g: %s (see lovelock plan --help)", flag, v, reason), err: err}
}

func writePlanJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("plan: write json: %w", err)
	}
	return nil
}

// planTable writes tab-separated rows aligned in columns.
type planTable struct{ tw *tabwriter.Writer }

func newPlanTable(w io.Writer) planTable {
	return planTable{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
}

func (t planTable) row(cells ...string) { fmt.Fprintln(t.tw, strings.Join(cells, "\t")) }

func (t planTable) flush() error {
	if err := t.tw.Flush(); err != nil {
		return fmt.Errorf("plan: write table: %w", err)
	}
	return nil
}

// planNum prints an input to six significant digits, hiding float noise such
// as 11.2·3 = 33.599999999999994.
func planNum(x float64) string { return strconv.FormatFloat(x, 'g', 6, 64) }

// planPhi prints a computed φ to four significant digits.
func planPhi(x float64) string { return strconv.FormatFloat(x, 'g', 4, 64) }

// planNA stands for a result that is not a number; the planner refuses
// inputs that give one, so it is only a guard against printing NaN or Inf.
const planNA = "n/a (not a finite number)"

// planFixed prints x with the given decimals. A value of a million or more,
// or one those decimals would show as 0 (a ratio of 1e-300 is not 0.00x),
// gets three significant digits instead: extreme but valid inputs (c_s =
// 1e300) would otherwise print hundreds of digits.
func planFixed(x float64, decimals int) string {
	switch a := math.Abs(x); {
	case math.IsNaN(x) || math.IsInf(x, 0):
		return planNA
	case x != 0 && (a >= 1e6 || a < 0.5*math.Pow10(-decimals)):
		return strconv.FormatFloat(x, 'g', 3, 64)
	}
	return strconv.FormatFloat(x, 'f', decimals, 64)
}

func planRatio(x float64) string { return planFixed(x, 2) + "x" }

// planSaving says in words what a traditional/Lovelock ratio means: Lovelock
// needs 1/ratio of the traditional cost or energy, a saving of 1 − 1/ratio.
// The planner refuses only results that are not finite, so a valid ratio may
// still be so small (1e-307, from c_s = 1e-307) that 1/ratio, or the saving
// as a percentage, overflows float64: that one is computed in big.Float,
// whose exponent does not, rather than printed as +Inf%.
func planSaving(ratio float64, what, less, more string) string {
	if !(ratio > 0) || math.IsInf(ratio, 0) {
		return planNA
	}
	word := func(pct float64) string {
		if pct < 0 {
			return more
		}
		return less
	}
	if pct := 100 * (1 - 1/ratio); !math.IsInf(pct, 0) {
		return fmt.Sprintf("Lovelock %s %s%% %s", what, planFixed(math.Abs(pct), 1), word(pct))
	}
	pct := new(big.Float).Quo(big.NewFloat(1), big.NewFloat(ratio))
	pct.Sub(big.NewFloat(1), pct).Mul(pct, big.NewFloat(100))
	sign, _ := pct.Float64() // −Inf: only the sign is used
	return fmt.Sprintf("Lovelock %s %s%% %s", what, pct.Abs(pct).Text('g', 3), word(sign))
}

const planLegend = "ratios are traditional / Lovelock: above 1 favours Lovelock"

func planHardwareRows(t planTable, in planner.Inputs) {
	t.row("INPUT", "SYMBOL", "VALUE")
	t.row("server cost, in SmartNICs", "c_s", planNum(in.ServerCost))
	t.row("server power, in SmartNICs", "p_s", planNum(in.ServerPower))
	t.row("PCIe devices' cost per node, in SmartNICs", "c_p", planNum(in.PCIeCost))
	t.row("PCIe devices' power per node, in SmartNICs", "p_p", planNum(in.PCIePower))
	t.row("fabric cost per server, in SmartNICs", "c_f", planNum(in.FabricCost))
}

func planWorkloadRows(t planTable, w planner.Workload) {
	t.row("CPU share of traditional run time", "", planNum(w.CPUShare))
	t.row("network share of traditional run time", "", planNum(w.NetworkShare))
	t.row("server / SmartNIC CPU performance", "", planNum(w.CPURatio))
	t.row("SmartNIC / server network bandwidth", "", planNum(w.BandwidthRatio))
}

func planResultRows(t planTable, in planner.Inputs, r planner.Result) {
	t.row("RESULT", "VALUE")
	if in.FabricCost > 0 {
		t.row("device cost ratio, eq. 1 without fabric", planRatio(r.DeviceCostRatio),
			planSaving(r.DeviceCostRatio, "devices cost", "less", "more"))
		t.row("cost ratio with fabric, §5.2", planRatio(r.CostRatio), planSaving(r.CostRatio, "costs", "less", "more"))
	} else {
		t.row("cost ratio, eq. 1", planRatio(r.CostRatio), planSaving(r.CostRatio, "costs", "less", "more"))
	}
	t.row("energy ratio, eq. 2", planRatio(r.EnergyRatio), planSaving(r.EnergyRatio, "uses", "less energy", "more energy"))
	t.row("fabric capacity needed, 1/μ", planRatio(r.FabricCapacity), "of the traditional fabric's capacity keeps pace (§5.2)")
}

func planProjectionRows(t planTable, w planner.Workload, p *planner.Projection) {
	if p == nil {
		return
	}
	t.row("PROJECTION, §5.2", "TRADITIONAL", "LOVELOCK")
	t.row(fmt.Sprintf("CPU, ×%s/φ", planNum(w.CPURatio)), planFixed(w.CPUShare, 3), planFixed(p.CPU, 3))
	t.row(fmt.Sprintf("network, ÷(φ·%s)", planNum(w.BandwidthRatio)), planFixed(w.NetworkShare, 3), planFixed(p.Network, 3))
	t.row("other, unscaled", planFixed(w.OtherShare(), 3), planFixed(p.Other, 3))
	t.row("run time (μ)", planFixed(1, 3), planFixed(p.Slowdown, 3))
}

func writePlanEvaluation(w io.Writer, format string, in planner.Inputs, r planner.Result) error {
	in.Mu = r.Mu // the μ used, also when projected
	if format == "json" {
		return writePlanJSON(w, struct {
			Mode   string         `json:"mode"`
			Inputs planner.Inputs `json:"inputs"`
			Result planner.Result `json:"result"`
		}{"evaluate", in, r})
	}
	fmt.Fprintf(w, "Lovelock plan: servers vs φ SmartNICs per server (%s)\n\n", planLegend)
	t := newPlanTable(w)
	planHardwareRows(t, in)
	t.row("SmartNICs per replaced server", "φ", planNum(in.Phi))
	if r.Projection != nil {
		t.row("slowdown, projected from the workload", "μ", planFixed(r.Mu, 3))
		planWorkloadRows(t, in.Workload)
	} else {
		t.row("slowdown, as given", "μ", planNum(r.Mu))
	}
	t.row()
	planResultRows(t, in, r)
	if r.Projection != nil {
		t.row()
		planProjectionRows(t, in.Workload, r.Projection)
	}
	return t.flush()
}

func writePlanSearch(w io.Writer, format string, in planner.Inputs, res planner.SearchResult) error {
	if format == "json" {
		in.Phi, in.Mu, in.ProjectMu = res.Phi, res.Result.Mu, true
		return writePlanJSON(w, struct {
			Mode   string               `json:"mode"`
			Inputs planner.Inputs       `json:"inputs"`
			Search planner.SearchResult `json:"search"`
		}{"search", in, res})
	}
	fmt.Fprintf(w, "Lovelock plan search: μ projected from the workload (%s)\n\n", planLegend)
	t := newPlanTable(w)
	planHardwareRows(t, in)
	planWorkloadRows(t, in.Workload)
	t.row()
	t.row("SEARCH", "VALUE")
	if res.PhiMin != nil {
		t.row("smallest φ with projected μ ≤ "+planNum(res.Target.Slowdown), planPhi(*res.PhiMin))
	}
	if res.PhiMax != nil {
		t.row("largest φ with cost ratio ≥ "+planNum(res.Target.CostRatio), planPhi(*res.PhiMax))
	}
	t.row("chosen φ", planPhi(res.Phi))
	t.row("projected μ at chosen φ", planFixed(res.Result.Mu, 3))
	t.row()
	planResultRows(t, in, res.Result)
	t.row()
	planProjectionRows(t, in.Workload, res.Result.Projection)
	return t.flush()
}

func writePlanScenarios(w io.Writer, format string) error {
	type evaluated struct {
		planner.Scenario
		Result planner.Result `json:"result"`
	}
	var rows []evaluated
	for _, s := range planner.PaperScenarios() {
		r, err := planner.Evaluate(s.Inputs)
		if err != nil {
			return fmt.Errorf("plan: scenario %s: %w", s.Name, err)
		}
		rows = append(rows, evaluated{s, r})
	}
	claims, err := planner.PaperClaims()
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	if format == "json" {
		return writePlanJSON(w, struct {
			Mode      string          `json:"mode"`
			Scenario  string          `json:"scenario"`
			Scenarios []evaluated     `json:"scenarios"`
			Claims    []planner.Claim `json:"claims"`
		}{"scenario", "paper", rows, claims})
	}

	var notes []string
	mark := func(p *planner.Printed, got float64, note string) string {
		if p == nil {
			return "-"
		}
		if p.Matches(got) {
			return p.String()
		}
		notes = append(notes, note)
		return fmt.Sprintf("%s [%d]", p, len(notes))
	}
	fmt.Fprintf(w, "The Lovelock paper's worked examples (%s; PAPER = as printed)\n\n", planLegend)
	t := newPlanTable(w)
	t.row("SCENARIO", "§", "φ", "μ", "PAPER μ", "c_p", "p_p", "c_f", "COST", "PAPER", "ENERGY", "PAPER", "FABRIC 1/μ")
	for _, e := range rows {
		in, r := e.Inputs, e.Result
		mu := planNum(r.Mu)
		if r.Projection != nil {
			mu = planFixed(r.Mu, 4) + " (proj.)"
		}
		t.row(e.Name, e.Section, planNum(in.Phi), mu,
			mark(e.Paper.Slowdown, r.Mu, e.Name+": "+e.Discrepancy),
			planNum(in.PCIeCost), planNum(in.PCIePower), planNum(in.FabricCost),
			planFixed(r.CostRatio, 2), mark(e.Paper.CostRatio, r.CostRatio, e.Name+": "+e.Discrepancy),
			planFixed(r.EnergyRatio, 2), mark(e.Paper.EnergyRatio, r.EnergyRatio, e.Name+": "+e.Discrepancy),
			planFixed(r.FabricCapacity, 2))
	}
	t.row()
	t.row("DERIVED NUMBER", "§", "COMPUTED", "PAPER")
	for _, c := range claims {
		got := planFixed(c.Computed, 2)
		if c.Unit == "%" {
			got = planFixed(c.Computed, 1) + "%"
		}
		paper := c.Paper.String() + c.Unit
		if !c.Paper.Matches(c.Computed) {
			notes = append(notes, c.Quantity+": "+c.Discrepancy)
			paper += fmt.Sprintf(" [%d]", len(notes))
		}
		t.row(c.Quantity, c.Section, got, paper)
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, e := range rows {
		fmt.Fprintf(w, "%-22s %s\n", e.Name, e.Description)
	}
	if len(notes) > 0 {
		fmt.Fprintln(w, "\nWhere the paper's number does not follow from its own formula:")
		for i, n := range notes {
			fmt.Fprintf(w, "[%d] %s\n", i+1, n)
		}
	}
	return nil
}
