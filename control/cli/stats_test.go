package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/control/api"
)

// resetSamples are two samples between which the counters of rx, rule "web"
// and the default went down (reset), and rule "old"'s ID 1 went to "new".
func resetSamples() (prev, now api.Stats) {
	c := func(p uint64) api.Counter { return api.Counter{Packets: p, Bytes: 10 * p} }
	prev = api.Stats{
		Time:     time.Unix(1e9, 0),
		Verdicts: map[string]api.Counter{"rx": c(1000), "pass": c(100)},
		Rules:    []api.RuleStat{{Name: "old", ID: 1, Counter: c(900)}, {Name: "web", ID: 2, Counter: c(500)}},
		Default:  c(300),
	}
	now = api.Stats{
		Time:     time.Unix(1e9+2, 0),
		Verdicts: map[string]api.Counter{"rx": c(40), "pass": c(140)},
		Rules:    []api.RuleStat{{Name: "new", ID: 1, Counter: c(20)}, {Name: "web", ID: 2, Counter: c(10)}},
		Default:  c(10),
	}
	return prev, now
}

// TestStatsRatesReset: a counter that went down has no rate (not ~1.8e19),
// and a rule whose ID was another rule's is not measured against that
// rule's counters.
func TestStatsRatesReset(t *testing.T) {
	prev, now := resetSamples()
	r := sampleOf(now, &prev).Rates
	if r == nil {
		t.Fatal("no rates")
	}
	if v, ok := r.Rules["new"]; !ok || v.PPS != 10 || v.BPS != 800 {
		t.Errorf("rule new (ID 1, was old's): %+v %v, want 10 pps from zero", v, ok)
	}
	if v, ok := r.Rules["web"]; ok {
		t.Errorf("rule web went from 500 to 10 packets: rate %+v, want none", v)
	}
	if v, ok := r.Verdicts["rx"]; ok {
		t.Errorf("rx went down: rate %+v, want none", v)
	}
	if v := r.Verdicts["pass"]; v.PPS != 20 {
		t.Errorf("pass: %+v, want 20 pps", v)
	}
	if r.Default != nil {
		t.Errorf("default went down: rate %+v, want none", *r.Default)
	}

	// The table prints "-" for them.
	out := runFake(t, &seqStats{samples: []api.Stats{prev, now}}, "stats", "--watch", "--count", "2", "--interval", "1ms")
	last := out[strings.LastIndex(out, "COUNTER"):]
	rows := map[string][]string{}
	for _, l := range strings.Split(last, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			rows[f[0]] = f
		}
	}
	for name, want := range map[string]string{"rx": "-", "pass": "20", "web": "-", "new": "10", "(default)": "-"} {
		row := rows[name]
		i := len(row) - 4 // RATE is "N pps M Mb/s", or "-"
		if want == "-" {
			i = len(row) - 1
		}
		if i < 0 || row[i] != want {
			t.Errorf("%s: row %q, want rate %s\n%s", name, row, want, last)
		}
	}
}

// seqStats answers Stats with its samples in turn.
type seqStats struct {
	fakeService
	samples []api.Stats
}

func (f *seqStats) Stats() (api.Stats, error) {
	s := f.samples[0]
	if len(f.samples) > 1 {
		f.samples = f.samples[1:]
	}
	return s, nil
}

// TestStatsPending: while the rule set did not go live, the stats table
// says so above the rules, as rule list does: their zeros are not counts
// of a running set. Before, a pending set's rules showed 0 packets as if
// they ran and matched nothing.
func TestStatsPending(t *testing.T) {
	for _, pending := range []bool{false, true} {
		svc := &fakeService{status: api.Status{Rules: 1, RulesPending: pending}}
		out, _, err := runCLI(serveFake(t, svc), "stats")
		if err != nil || !strings.Contains(out, "RULE") || strings.Contains(out, "pending:") != pending {
			t.Errorf("pending %v: err = %v, output:\n%s", pending, err, out)
		}
		// JSON carries it too: before, only the table said so.
		out, _, err = runCLI(serveFake(t, svc), "stats", "--output", "json")
		if err != nil || strings.Contains(out, `"rules_pending": true`) != pending {
			t.Errorf("pending %v, JSON: err = %v, output:\n%s", pending, err, out)
		}
	}
}

// TestStatsCountChecked: --count must be 0 or more, and only --watch
// takes it; before, a negative count watched for ever and a count without
// --watch was ignored.
func TestStatsCountChecked(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"stats", "--watch", "--count", "-1"}, "--count -1"},
		{[]string{"stats", "--count", "3"}, "takes --watch"},
	} {
		_, _, err := runCLI(serveFake(t, &fakeService{}), tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want it to mention %q", tc.args, err, tc.want)
		}
	}
}
