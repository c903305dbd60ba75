package cli

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	ucli "github.com/urfave/cli/v2"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/sched"
)

// runSchedCmd runs `lovelock sched args...` in-process.
func runSchedCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var buf bytes.Buffer
	app := &ucli.App{Name: "lovelock", Commands: []*ucli.Command{schedCommand()}, Writer: &buf, ErrWriter: &buf,
		ExitErrHandler: func(*ucli.Context, error) {}}
	setupCommands(app)
	err := app.Run(append([]string{"lovelock", "sched"}, args...))
	return buf.String(), err
}

func TestSchedHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"layout", "--help"}, {"simulate", "--help"}, {"synth", "--help"}} {
		out, err := runSchedCmd(t, args...)
		if err != nil || !strings.Contains(out, "USAGE") {
			t.Errorf("%v: %v\n%s", args, err, out)
		}
	}
}

func TestSchedLayout(t *testing.T) {
	out, err := runSchedCmd(t, "layout", "--card", "H100-80GB", "--all", "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	var layouts []layoutJSON
	if err := json.Unmarshal([]byte(out), &layouts); err != nil {
		t.Fatal(err)
	}
	if len(layouts) != 2318 {
		t.Fatalf("%d layouts, want 2318", len(layouts))
	}
	out, err = runSchedCmd(t, "layout", "--card", "A100-40GB")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2318 feasible layouts, 239 maximal", "AAAABBBB   6/7      3g.20gb@0 3g.20gb@4", "1g.5gb+me"} {
		if !strings.Contains(out, want) {
			t.Errorf("layout output lacks %q", want)
		}
	}
	if _, err := runSchedCmd(t, "layout", "--card", "V100"); err == nil || !strings.Contains(err.Error(), "want one of") {
		t.Fatalf("unknown card: %v", err)
	}
}

func TestSchedSimulate(t *testing.T) {
	dir := t.TempDir()
	pods := filepath.Join(dir, "pods.csv")
	if _, err := runSchedCmd(t, "synth", "--out", pods, "--pods", "400", "--mix", "small", "--seed", "3"); err != nil {
		t.Fatal(err)
	}
	plot := filepath.Join(dir, "gpus.svg")
	out, err := runSchedCmd(t, "simulate", "--trace", pods, "--gpus", "64xH100-80GB", "--plot", plot)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"400 pods → 400 requests", "naive", "firstfit", "bestfit", "lovelock", "GPU-HOURS"} {
		if !strings.Contains(out, want) {
			t.Errorf("simulate output lacks %q:\n%s", want, out)
		}
	}
	svg, err := os.ReadFile(plot)
	if err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(svg, new(struct{})); err != nil {
		t.Fatalf("plot is not XML: %v", err)
	}
	nodes := filepath.Join(dir, "nodes.csv")
	if err := os.WriteFile(nodes, []byte("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,262144,0,\nn1,96000,786432,8,G2\nn2,64000,262144,2,T4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = runSchedCmd(t, "simulate", "--trace", pods, "--nodes", nodes, "--card", "A100-80GB", "--policy", "bestfit,lovelock")
	if err != nil || !strings.Contains(out, "; 10 GPUs") || strings.Contains(out, "naive") {
		t.Fatalf("--nodes: %v\n%s", err, out)
	}
	out, err = runSchedCmd(t, "simulate", "--trace", pods, "--policy", "lovelock", "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Results []struct {
			Policy   string  `json:"policy"`
			GPUHours float64 `json:"gpu_hours"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.Results) != 1 || res.Results[0].GPUHours <= 0 {
		t.Fatalf("json: %v %+v\n%s", err, res, out)
	}
	for _, frag := range []string{"next", "stranded"} {
		out, err = runSchedCmd(t, "simulate", "--trace", pods, "--policy", "lovelock", "--frag", frag)
		if err != nil || !strings.Contains(out, "lovelock") {
			t.Fatalf("--frag %s: %v\n%s", frag, err, out)
		}
	}
}

// TestSchedSimulateJSONKeys: -o json names every field in snake_case, as
// the CLI's other JSON outputs do; before, the keys were sched's Go field
// names ("GPUHours", "PeakInUse", "Trace": {"CPUOnly"}).
func TestSchedSimulateJSONKeys(t *testing.T) {
	pods := filepath.Join(t.TempDir(), "pods.csv")
	if _, err := runSchedCmd(t, "synth", "--out", pods, "--pods", "50", "--seed", "3"); err != nil {
		t.Fatal(err)
	}
	out, err := runSchedCmd(t, "simulate", "--trace", pods, "--gpus", "8xH100-80GB", "--policy", "bestfit", "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var doc struct {
		Trace   map[string]any   `json:"trace"`
		Fleet   []map[string]any `json:"fleet"`
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || len(doc.Fleet) != 1 || len(doc.Results) != 1 {
		t.Fatalf("json: %v\n%s", err, out)
	}
	plans, _ := doc.Results[0]["plans"].(map[string]any)
	var top map[string]any
	if err := json.Unmarshal([]byte(out), &top); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what string
		obj  map[string]any
		want []string
	}{
		{"top level", top, []string{"fleet", "results", "trace"}},
		{"trace", doc.Trace, []string{"cpu_only", "multi_gpu", "no_deletion", "pods", "requests"}},
		{"fleet", doc.Fleet[0], []string{"card", "count"}},
		{"result", doc.Results[0], []string{"alloc_rate", "decisions", "frag", "gpu_hours", "gpus", "gpus_used", "mean_ns", "miss_slices",
			"misses", "objective", "p50_ns", "p99_ns", "peak_in_use", "placed", "plans", "policy", "rejected", "requests", "unserved"}},
		{"plans", plans, []string{"nodes", "over_nodes", "plans"}},
	} {
		if got := slices.Sorted(maps.Keys(tc.obj)); !slices.Equal(got, tc.want) {
			t.Errorf("%s keys %q, want %q", tc.what, got, tc.want)
		}
	}
	if doc.Results[0]["policy"] != "bestfit" || doc.Fleet[0]["card"] != "H100-80GB" || doc.Trace["pods"] != float64(50) {
		t.Errorf("values: %s", out)
	}
}

// TestSchedSimulateJSONCoversResult: every exported field of sched.Result
// that its own JSON would carry has a key in -o json, so a field added to
// sched is not silently left out.
func TestSchedSimulateJSONCoversResult(t *testing.T) {
	var want int
	rt := reflect.TypeFor[sched.Result]()
	for i := range rt.NumField() {
		if f := rt.Field(i); f.IsExported() && f.Tag.Get("json") != "-" {
			want++
		}
	}
	if got := reflect.TypeFor[simResultJSON]().NumField(); got != want {
		t.Errorf("simResultJSON has %d fields, sched.Result %d shown in JSON: map the new ones in simulateOutput", got, want)
	}
}

// TestSchedSimulateWarnsImpossibleSlack: with 0 < --slack < 1 every deadline
// is before arrival + run time, so every request misses it by construction.
func TestSchedSimulateWarnsImpossibleSlack(t *testing.T) {
	dir := t.TempDir()
	pods := filepath.Join(dir, "pods.csv")
	if _, err := runSchedCmd(t, "synth", "--out", pods, "--pods", "20", "--seed", "3"); err != nil {
		t.Fatal(err)
	}
	const warning = "every request misses its deadline"
	for _, tc := range []struct {
		args []string
		warn bool
	}{
		{[]string{"--slack", "0.5"}, true},
		{[]string{"--slack", "1", "--reconfig", "1s"}, true},
		{[]string{"--slack", "1"}, false},
		{[]string{"--slack", "2"}, false},
		{[]string{"--slack", "0"}, false},
	} {
		out, err := runSchedCmd(t, append([]string{"simulate", "--trace", pods, "--policy", "bestfit"}, tc.args...)...)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if strings.Contains(out, warning) != tc.warn {
			t.Errorf("%v: warned %v, want %v:\n%s", tc.args, !tc.warn, tc.warn, out)
		}
	}
}

// TestSchedSimulateFrag: FRAG is what its footnote says, the share of the
// free memory slices of GPUs in use that a typical request cannot use.
func TestSchedSimulateFrag(t *testing.T) {
	dir := t.TempDir()
	const head = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
	for _, tc := range []struct {
		name, pods, want string
	}{
		// 4g.40gb, 2g.20gb and 1g.10gb: slice 7 is left, and nothing can use it.
		{"4g, 2g and 1g", "a,1,1,1,480,,LS,Succeeded,0,1000,0\nb,1,1,1,240,,LS,Succeeded,0,1000,0\nc,1,1,1,100,,LS,Succeeded,0,1000,0\n", "1.000"},
		{"a whole GPU", "a,1,1,1,1000,,LS,Succeeded,0,1000,0\n", "0.000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, "pods.csv")
			if err := os.WriteFile(path, []byte(head+tc.pods), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := runSchedCmd(t, "simulate", "--trace", path, "--gpus", "1xH100-80GB", "--policy", "firstfit,bestfit,lovelock")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, "FRAG: share of the free memory slices of GPUs in use") {
				t.Errorf("footnote lacks FRAG's meaning:\n%s", out)
			}
			for _, line := range strings.Split(out, "\n") {
				f := strings.Fields(line)
				if len(f) > 4 && (f[0] == "firstfit" || f[0] == "bestfit" || f[0] == "lovelock") && f[4] != tc.want {
					t.Errorf("%s: FRAG %s, want %s:\n%s", f[0], f[4], tc.want, out)
				}
			}
		})
	}
}

func TestSchedSimulateErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.csv")
	os.WriteFile(bad, []byte("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"+
		"p0,1,1,1,100,,LS,Running,0,10,0\np1,1,1,1,x,,LS,Running,0,10,0\n"), 0o644)
	nodes := filepath.Join(dir, "nodes.csv")
	os.WriteFile(nodes, []byte("sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,8,G2\n"), 0o644)
	quote := filepath.Join(dir, "quote.csv")
	os.WriteFile(quote, []byte("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"+
		"p\"1,1000,1024,1,480,,LS,Succeeded,0,1000,0\n"), 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"simulate", "--trace", bad}, "line 3: column gpu_milli"},
		{[]string{"simulate", "--trace", bad, "--gpus", "lots"}, "want COUNTxCARD"},
		{[]string{"simulate", "--trace", bad, "--gpus", "8xH100-80GB", "--nodes", nodes}, "not both"},
		// --card is the card of --nodes' GPUs: it was ignored without them,
		// and the default fleet's or --gpus' cards simulated instead.
		{[]string{"simulate", "--trace", bad, "--card", "A100-40GB"}, "--card A100-40GB: it names the card of --nodes' GPUs; without --nodes, give the fleet as --gpus COUNTxA100-40GB"},
		{[]string{"simulate", "--trace", bad, "--gpus", "2xH100-80GB", "--card", "A100-40GB"}, "--card A100-40GB: it names the card of --nodes' GPUs; without --nodes, give the fleet as --gpus COUNTxA100-40GB"},
		{[]string{"simulate", "--trace", bad, "--policy", "random"}, "unknown policy"},
		{[]string{"simulate", "--trace", bad, "--frag", "fgd"}, "--frag: unknown fragmentation measure"},
		{[]string{"simulate", "--trace", filepath.Join(dir, "none.csv")}, "no such file"},
		{[]string{"synth", "--out", "-", "--mix", "abc"}, "--mix"},
		{[]string{"simulate", "--trace", quote}, "line 2: malformed trace: parse error on line 2"},
		{[]string{"synth", "--out", "-", "--mix", "100:NaN"}, `--mix: share mix "100:NaN": "100:NaN": weight NaN: want a finite number > 0`},
		{[]string{"synth", "--out", "-", "--mix", "100:1,500:inf"}, `"500:inf": weight +Inf: want a finite number > 0`},
		{[]string{"synth", "--out", "-", "--gap", "NaN"}, "--gap NaN: want a finite number of seconds > 0"},
		{[]string{"synth", "--out", "-", "--gap", "0"}, "--gap 0: want a finite number of seconds > 0"},
		{[]string{"synth", "--out", "-", "--duration", "Inf"}, "--duration +Inf: want a finite number of seconds > 0"},
		{[]string{"synth", "--out", "-", "--pods", "0"}, "--pods 0: want at least 1"},
		{[]string{"simulate", "--trace", bad, "--slack", "NaN"}, "--slack NaN: want a finite number ≥ 0"},
		{[]string{"simulate", "--trace", bad, "--slack", "-1"}, "--slack -1: want a finite number ≥ 0"},
		{[]string{"simulate", "--trace", bad, "--slack", "Inf"}, "--slack +Inf: want a finite number ≥ 0"},
		{[]string{"simulate", "--trace", bad, "--reconfig", "-5s"}, "--reconfig -5s: negative: use 0"},
		{[]string{"simulate", "--trace", bad, "--wait-margin", "-0.5"}, "--wait-margin -0.5: outside [0, 1): use 0"},
		{[]string{"simulate", "--trace", bad, "--wait-margin", "1"}, "--wait-margin 1: outside [0, 1)"},
	} {
		_, err := runSchedCmd(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}
