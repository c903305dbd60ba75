package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	ucli "github.com/urfave/cli/v2"

	"github.com/lovelock-dpu/lovelock/control/planner"
)

// runPlanCmd runs `lovelock plan args...` in-process and returns its output.
func runPlanCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var buf bytes.Buffer
	app := &ucli.App{
		Name:      "lovelock",
		Commands:  []*ucli.Command{planCommand()},
		Writer:    &buf,
		ErrWriter: &buf,
	}
	setupCommands(app)
	err := app.Run(append([]string{"lovelock", "plan"}, args...))
	return buf.String(), err
}

func TestPlanTableDefault(t *testing.T) {
	out, err := runPlanCmd(t)
	if err != nil {
		t.Fatalf("plan: %v\n%s", err, out)
	}
	// The paper's headline: φ = 3, μ = 1.2 → 2.33x cheaper, 3.11x less energy.
	for _, want := range []string{"cost ratio, eq. 1", "2.33x", "energy ratio, eq. 2", "3.11x", "φ", "μ"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestPlanReadmeExample runs the command the README shows.
func TestPlanReadmeExample(t *testing.T) {
	out, err := runPlanCmd(t, "--phi", "3", "--slowdown", "1.2")
	if err != nil {
		t.Fatalf("plan: %v\n%s", err, out)
	}
	if !strings.Contains(out, "2.33x") || !strings.Contains(out, "3.11x") {
		t.Errorf("output lacks 2.33x and 3.11x:\n%s", out)
	}
}

func TestPlanTableProjectedWithFabric(t *testing.T) {
	out, err := runPlanCmd(t, "--phi", "2", "--project", "--fabric-share", "0.1")
	if err != nil {
		t.Fatalf("plan: %v\n%s", err, out)
	}
	// §5.2: device cost 3.5x, 2.26x with fabric, 4.58x energy, μ = 1.22.
	for _, want := range []string{"3.50x", "2.26x", "4.58x", "1.222", "PROJECTION"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestPlanJSON(t *testing.T) {
	out, err := runPlanCmd(t, "--pcie-share", "0.75", "--phi", "2", "--mu", "0.9", "--output", "json")
	if err != nil {
		t.Fatalf("plan: %v\n%s", err, out)
	}
	var got struct {
		Mode   string         `json:"mode"`
		Inputs planner.Inputs `json:"inputs"`
		Result planner.Result `json:"result"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if got.Mode != "evaluate" || got.Inputs.PCIeCost != 21 || math.Abs(got.Inputs.PCIePower-33.6) > 1e-9 {
		t.Errorf("mode %q, c_p %v, p_p %v; want evaluate, 21, 33.6", got.Mode, got.Inputs.PCIeCost, got.Inputs.PCIePower)
	}
	// §4: 1.22x cost, 1.4x energy.
	if math.Abs(got.Result.CostRatio-28.0/23) > 1e-9 || math.Abs(got.Result.EnergyRatio-44.8/(0.9*35.6)) > 1e-9 {
		t.Errorf("cost %v energy %v", got.Result.CostRatio, got.Result.EnergyRatio)
	}
}

func TestPlanSearch(t *testing.T) {
	out, err := runPlanCmd(t, "--target-slowdown", "1", "--target-cost-ratio", "2", "-o", "json")
	if err != nil {
		t.Fatalf("plan: %v\n%s", err, out)
	}
	var got struct {
		Mode   string               `json:"mode"`
		Search planner.SearchResult `json:"search"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	// φ·μ(φ) = 4.7·0.39 + 0.61 = 2.443; cost 7/φ ≥ 2 allows φ ≤ 3.5.
	if got.Mode != "search" || got.Search.PhiMin == nil || got.Search.PhiMax == nil ||
		math.Abs(*got.Search.PhiMin-2.443) > 1e-9 || math.Abs(*got.Search.PhiMax-3.5) > 1e-9 ||
		math.Abs(got.Search.Phi-2.443) > 1e-9 {
		t.Errorf("search result %+v", got.Search)
	}

	out, err = runPlanCmd(t, "--target-cost-ratio", "3.5")
	if err != nil {
		t.Fatalf("plan: %v\n%s", err, out)
	}
	for _, want := range []string{"largest φ with cost ratio ≥ 3.5", "chosen φ", "3.50x"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestPlanScenarioPaper(t *testing.T) {
	out, err := runPlanCmd(t, "--scenario", "paper")
	if err != nil {
		t.Fatalf("plan: %v\n%s", err, out)
	}
	for _, s := range planner.PaperScenarios() {
		if !strings.Contains(out, s.Name) {
			t.Errorf("output lacks scenario %s", s.Name)
		}
	}
	for _, want := range []string{"4.58", "2.26", "1.51", "does not follow", "33.2 [", "80% ["} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	out, err = runPlanCmd(t, "--scenario", "paper", "--output", "json")
	if err != nil {
		t.Fatalf("plan json: %v\n%s", err, out)
	}
	var got struct {
		Scenarios []struct {
			Name   string         `json:"name"`
			Result planner.Result `json:"result"`
		} `json:"scenarios"`
		Claims []planner.Claim `json:"claims"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if len(got.Scenarios) != len(planner.PaperScenarios()) || len(got.Claims) == 0 {
		t.Fatalf("got %d scenarios and %d claims", len(got.Scenarios), len(got.Claims))
	}
	if s := got.Scenarios[0]; s.Name != "headline" || math.Abs(s.Result.CostRatio-7.0/3) > 1e-9 {
		t.Errorf("first scenario %+v", s)
	}
}

func TestPlanErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string // substrings of the error
		is   error
	}{
		{"phi zero", []string{"--phi", "0"}, []string{"--phi", "greater than 0"}, planner.ErrInvalidInput},
		{"alias", []string{"--cs", "-7"}, []string{"--server-cost", "-7"}, planner.ErrInvalidInput},
		{"pcie share 1", []string{"--pcie-share", "1"}, []string{"--pcie-share", "[0, 1)"}, planner.ErrInvalidInput},
		{"shares above 1", []string{"--project", "--cpu-share", "0.5"}, []string{"--network-share", "exceed 1"}, planner.ErrInvalidInput},
		{"bad output", []string{"--output", "yaml"}, []string{"--output", "table or json"}, nil},
		{"bad scenario", []string{"--scenario", "mine"}, []string{"--scenario", "paper"}, nil},
		{"scenario with phi", []string{"--scenario", "paper", "--phi", "2"}, []string{"--phi", "--scenario"}, nil},
		{"search with phi", []string{"--target-slowdown", "1", "--phi", "2"}, []string{"--phi", "drop"}, nil},
		{"zero target", []string{"--target-slowdown", "0"}, []string{"--target-slowdown", "greater than 0"}, nil},
		{"unreachable", []string{"--pcie-share", "0.75", "--target-cost-ratio", "1.5"}, []string{"--target-cost-ratio", "cannot be met"}, planner.ErrUnreachable},
		{"mu and project", []string{"--mu", "1", "--project"}, []string{"--mu", "--project"}, nil},
		{"share and cost", []string{"--pcie-share", "0.5", "--pcie-cost", "3"}, []string{"--pcie-share", "--pcie-cost"}, nil},
		{"share and cost alias", []string{"--fabric-share", "0.1", "--cf", "0.7"}, []string{"--fabric-share", "--fabric-cost"}, nil},
		{"argument", []string{"now"}, []string{`"now"`, "only flags"}, nil},
		{"unparsable", []string{"--phi", "three"}, []string{"phi"}, nil},
		// Valid but so far from 1 that a result overflows: refused, naming
		// the flag, not printed as +Inf or failed as a JSON write.
		{"overflow json", []string{"--phi", "1e-320", "-o", "json"}, []string{"--phi 1e-320", "nearer 1"}, planner.ErrInvalidInput},
		{"overflow search", []string{"--target-cost-ratio", "1e-320"}, []string{"--target-cost-ratio 1e-320", "nearer 1"}, planner.ErrInvalidInput},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runPlanCmd(t, tt.args...)
			if err == nil {
				t.Fatalf("no error; output:\n%s", out)
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %v is not %v", err, tt.is)
			}
		})
	}
}

// TestPlanWorkloadFlagsNeedProjection: the workload flags feed only the
// projection of μ (--project) and the search; evaluating with --mu ignored
// them and printed the default μ's result.
func TestPlanWorkloadFlagsNeedProjection(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want string // substring of the error; "" for none
	}{
		{"shares without --project", []string{"--phi", "2", "--cpu-share", "0.9", "--network-share", "0.1"},
			"plan: --cpu-share describes the workload, which only --project and a search target (--target-slowdown, --target-cost-ratio) use"},
		{"network share with --mu", []string{"--mu", "1.1", "--network-share", "0.5"}, "--network-share describes the workload"},
		{"cpu ratio alone", []string{"--cpu-ratio", "3"}, "--cpu-ratio describes the workload"},
		{"bandwidth ratio, --project off", []string{"--project=false", "--bandwidth-ratio", "2"}, "add --project, or drop --bandwidth-ratio"},
		{"with --project", []string{"--phi", "2", "--project", "--cpu-share", "0.9", "--network-share", "0.1"}, ""},
		{"in a search", []string{"--target-slowdown", "1", "--cpu-ratio", "3"}, ""},
		{"hardware flags alone", []string{"--phi", "2", "--mu", "1.1", "--pcie-share", "0.5"}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runPlanCmd(t, tt.args...)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("%v\n%s", err, out)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want one containing %q; output:\n%s", err, tt.want, out)
			}
		})
	}
}

// TestPlanTableExtremes: valid inputs far from 1 whose results are finite
// but whose saving, as a percentage, overflows float64 (a cost ratio of
// 1e-307 is 1e+309% more) or whose ratio has hundreds of digits. Before, the
// table printed "+Inf% more" for the first and every digit of 1e307 for the
// second; JSON was right.
func TestPlanTableExtremes(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want []string
	}{
		{"cost ratio 1e-307", []string{"--server-cost", "1e-307", "--phi", "1"},
			[]string{"1e-307x  Lovelock costs 1e+309% more"}},
		{"denormal device cost ratio", []string{"--server-cost", "1e-310", "--phi", "1", "--fabric-cost", "1"},
			[]string{"1e-310x  Lovelock devices cost 1e+312% more", "0.50x    Lovelock costs 100.0% more"}},
		{"energy ratio 1e-307", []string{"--server-power", "1e-307", "--phi", "1", "--mu", "1"},
			[]string{"1e-307x  Lovelock uses 1e+309% more energy"}},
		{"huge mu", []string{"--mu", "1e305"},
			[]string{"3.73e-305x  Lovelock uses 2.68e+306% more energy", "1e-305x     of the traditional fabric"}},
		{"huge cost ratio", []string{"--server-cost", "1e300", "--phi", "1e-7"},
			[]string{"1e+307x    Lovelock costs 100.0% less", "9.33e+07x  Lovelock uses 100.0% less energy"}},
		{"huge target", []string{"--target-slowdown", "1e300"},
			[]string{"2.87e+300x  Lovelock costs 100.0% less", "run time (μ)      1.000        1e+300"}},
		{"saving below 0.05%", []string{"--phi", "1.0000001", "--server-cost", "1", "--server-power", "1", "--mu", "1"},
			[]string{"1.00x  Lovelock costs 1e-05% more"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runPlanCmd(t, tt.args...)
			if err != nil {
				t.Fatalf("plan: %v\n%s", err, out)
			}
			for _, bad := range []string{"Inf", "NaN", "n/a", "0000000000"} {
				if strings.Contains(out, bad) {
					t.Errorf("output has %q:\n%s", bad, out)
				}
			}
			for _, want := range tt.want {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

// TestPlanFixed pins the formatter every table cell goes through.
func TestPlanFixed(t *testing.T) {
	for _, tt := range []struct {
		x        float64
		decimals int
		want     string
	}{
		{2.3333, 2, "2.33"},
		{0, 2, "0.00"},
		{0.005, 2, "0.01"},
		{0.004, 2, "0.004"},
		{-1e-300, 1, "-1e-300"},
		{999999.9, 1, "999999.9"},
		{1e6, 1, "1e+06"},
		{math.MaxFloat64, 2, "1.8e+308"},
		{math.Inf(1), 2, planNA},
		{math.Inf(-1), 2, planNA},
		{math.NaN(), 2, planNA},
	} {
		if got := planFixed(tt.x, tt.decimals); got != tt.want {
			t.Errorf("planFixed(%g, %d) = %q, want %q", tt.x, tt.decimals, got, tt.want)
		}
	}
	for _, r := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		if got := planSaving(r, "costs", "less", "more"); got != planNA {
			t.Errorf("planSaving(%g) = %q, want %q", r, got, planNA)
		}
	}
}

func TestPlanHelp(t *testing.T) {
	out, err := runPlanCmd(t, "--help")
	if err != nil {
		t.Fatalf("plan --help: %v", err)
	}
	for _, want := range []string{
		"--phi value", "(default: 3)", "--mu value, --slowdown value", "(default: 1.2)",
		"--server-cost value, --cs value", "(default: 7)", "(default: 11.2)",
		"c_p:", "p_p:", "c_f:", "--cpu-share", "(default: 0.39)", "(default: 4.7)",
		"--scenario", "--target-slowdown", "--target-cost-ratio", "--output",
		"φ    SmartNICs provisioned", "μ    slowdown",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q:\n%s", want, out)
		}
	}
}
