package cli

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/api"
)

func statsCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "stats",
		Usage: "show the data plane's counters: per verdict, per rule and per interface, packets, bytes and rates",
		Description: "Counters come straight from the BPF maps. The per-interface table counts each packet under the\n" +
			"interface the steering hook ran on (TC egress: the one it leaves by); (other) holds every ifindex\n" +
			"from 1023 up, if<N> an ifindex with no interface now. Rates need two samples: with --watch, every\n" +
			"--interval prints the counters and the rates since the previous sample. --watch --output json\n" +
			"prints JSON lines: one document per sample, with \"rates\" from the second on.",
		Flags: []ucli.Flag{
			outputFlag(),
			&ucli.BoolFlag{Name: "watch", Aliases: []string{"w"}, Usage: "print again every --interval, with rates, until interrupted"},
			&ucli.DurationFlag{Name: "interval", Value: time.Second, Usage: "sampling interval for --watch"},
			&ucli.IntFlag{Name: "count", Usage: "with --watch, stop after this many samples (0: until interrupted)"},
		},
		Action: stats,
	}
}

func stats(c *ucli.Context) error {
	asJSON, err := wantJSON(c)
	if err != nil {
		return err
	}
	interval := c.Duration("interval")
	if interval <= 0 {
		return fmt.Errorf("--interval %s: must be positive", interval)
	}
	switch n := c.Int("count"); {
	case n < 0:
		return fmt.Errorf("--count %d: want 0 (until interrupted) or more samples", n)
	case c.IsSet("count") && !c.Bool("watch"):
		return fmt.Errorf("--count %d takes --watch: without it, stats prints one sample", n)
	}
	cl := client(c)
	var prev *api.Stats
	for n := 1; ; n++ {
		st, err := cl.Stats(c.Context)
		if err != nil {
			return err
		}
		if asJSON && c.Bool("watch") {
			// JSON lines: one compact document per sample, with the
			// rates since the previous one, so `jq` reads the stream.
			if err := json.NewEncoder(c.App.Writer).Encode(sampleOf(st, prev)); err != nil {
				return err
			}
		} else if asJSON {
			if err := writeJSON(c.App.Writer, st); err != nil {
				return err
			}
		} else if err := printStats(c, st, prev); err != nil {
			return err
		}
		if !c.Bool("watch") || (c.Int("count") > 0 && n >= c.Int("count")) {
			return nil
		}
		prev = &st
		select {
		case <-c.Context.Done():
			return nil
		case <-time.After(interval):
		}
	}
}

func printStats(c *ucli.Context, st api.Stats, prev *api.Stats) error {
	rate := func(now, before api.Counter) string {
		if prev == nil {
			return "-"
		}
		r, ok := perSecond(now, before, st.Time.Sub(prev.Time).Seconds())
		if !ok {
			return "-"
		}
		return fmt.Sprintf("%.0f pps %.1f Mb/s", r.PPS, r.BPS/1e6)
	}
	w := c.App.Writer
	fmt.Fprintf(w, "%s\n", st.Time.Format(time.RFC3339))
	tw := newTable(w)
	fmt.Fprintln(tw, "COUNTER\tPACKETS\tBYTES\tRATE")
	for i := bpf.Stat(0); i < bpf.NumStats; i++ {
		name := i.String()
		v := st.Verdicts[name]
		var before api.Counter
		if prev != nil {
			before = prev.Verdicts[name]
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", name, v.Packets, v.Bytes, rate(v, before))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	// A set that did not go live counts nothing (lovelockd reports its
	// rules at zero): say so, as rule list does.
	if st.RulesPending {
		fmt.Fprintln(w, "pending: these rules are not installed yet and count nothing; the data plane runs the set it had, or none (the failures in 'lovelock status' say why)")
	}
	tw = newTable(w)
	fmt.Fprintln(tw, "RULE\tID\tPRIO\tOWNER\tACTION\tPACKETS\tBYTES\tRATE")
	var prevRule map[ruleKey]api.Counter
	var prevDefault api.Counter
	if prev != nil {
		prevRule = rulesByKey(prev.Rules)
		prevDefault = prev.Default
	}
	for _, r := range st.Rules {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%d\t%d\t%s\n", r.Name, r.ID, r.Priority, owner(r.Name), r.Action, r.Counter.Packets, r.Counter.Bytes, rate(r.Counter, prevRule[ruleKey{r.Name, r.ID}]))
	}
	fmt.Fprintf(tw, "(default)\t0\t-\t-\t-\t%d\t%d\t%s\n", st.Default.Packets, st.Default.Bytes, rate(st.Default, prevDefault))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if len(st.Interfaces) == 0 {
		return nil
	}
	// Per interface: packets of every counter, and the rate of rx.
	tw = newTable(w)
	fmt.Fprint(tw, "IFACE")
	for i := bpf.Stat(0); i < bpf.NumStats; i++ {
		fmt.Fprintf(tw, "\t%s", strings.ToUpper(i.String()))
	}
	fmt.Fprintln(tw, "\tRX RATE")
	rx := bpf.StatRX.String()
	for _, name := range ifaceOrder(st.Interfaces) {
		cs := st.Interfaces[name]
		fmt.Fprint(tw, name)
		for i := bpf.Stat(0); i < bpf.NumStats; i++ {
			fmt.Fprintf(tw, "\t%d", cs[i.String()].Packets)
		}
		var before api.Counter
		if prev != nil {
			before = prev.Interfaces[name][rx]
		}
		fmt.Fprintf(tw, "\t%s\n", rate(cs[rx], before))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	return nil
}

// ruleKey matches a rule's counters across samples: an ID freed by a
// deleted rule may be given to a new one, whose counters start again.
type ruleKey struct {
	name string
	id   uint32
}

func rulesByKey(rs []api.RuleStat) map[ruleKey]api.Counter {
	m := make(map[ruleKey]api.Counter, len(rs))
	for _, r := range rs {
		m[ruleKey{r.Name, r.ID}] = r.Counter
	}
	return m
}

// perSecond is the rate from before to now over dt seconds; false when
// there is none: no time passed, or a counter went down (it was reset, as
// an upgrade that cannot carry counters does), where the difference of
// unsigned counters would be near 2^64.
func perSecond(now, before api.Counter, dt float64) (Rate, bool) {
	if dt <= 0 || now.Packets < before.Packets || now.Bytes < before.Bytes {
		return Rate{}, false
	}
	return Rate{PPS: float64(now.Packets-before.Packets) / dt, BPS: float64(now.Bytes-before.Bytes) * 8 / dt}, true
}

// ifaceOrder sorts interface names, the shared slot of large ifindexes
// last.
func ifaceOrder(ifs map[string]map[string]api.Counter) []string {
	names := slices.Sorted(maps.Keys(ifs))
	if i := slices.Index(names, api.IfaceOther); i >= 0 {
		names = append(slices.Delete(names, i, i+1), api.IfaceOther)
	}
	return names
}

// statsSample is one line of `stats --watch --output json`: the counters,
// and from the second sample on the rates since the previous one.
type statsSample struct {
	api.Stats
	Rates *statsRates `json:"rates,omitempty"`
}

// statsRates are per-second rates over IntervalS seconds, keyed like the
// counters (rules by name). A counter that went down (reset) has no rate
// and is left out.
type statsRates struct {
	IntervalS float64         `json:"interval_s"`
	Verdicts  map[string]Rate `json:"verdicts"`
	Rules     map[string]Rate `json:"rules"`
	Default   *Rate           `json:"default,omitempty"`
	// Interfaces: interface name to counter name to rate.
	Interfaces map[string]map[string]Rate `json:"interfaces,omitempty"`
}

// Rate is packets and bits per second.
type Rate struct {
	PPS float64 `json:"pps"`
	BPS float64 `json:"bps"`
}

func sampleOf(st api.Stats, prev *api.Stats) statsSample {
	s := statsSample{Stats: st}
	if prev == nil {
		return s
	}
	dt := st.Time.Sub(prev.Time).Seconds()
	if dt <= 0 {
		return s
	}
	// put records the rate of a counter under key, unless it has none.
	put := func(m map[string]Rate, key string, now, before api.Counter) {
		if v, ok := perSecond(now, before, dt); ok {
			m[key] = v
		}
	}
	r := &statsRates{IntervalS: dt, Verdicts: map[string]Rate{}, Rules: map[string]Rate{}}
	if v, ok := perSecond(st.Default, prev.Default, dt); ok {
		r.Default = &v
	}
	for name, v := range st.Verdicts {
		put(r.Verdicts, name, v, prev.Verdicts[name])
	}
	before := rulesByKey(prev.Rules)
	for _, rs := range st.Rules {
		put(r.Rules, rs.Name, rs.Counter, before[ruleKey{rs.Name, rs.ID}])
	}
	for name, cs := range st.Interfaces {
		if r.Interfaces == nil {
			r.Interfaces = map[string]map[string]Rate{}
		}
		m := make(map[string]Rate, len(cs))
		for c, v := range cs {
			put(m, c, v, prev.Interfaces[name][c])
		}
		r.Interfaces[name] = m
	}
	s.Rates = r
	return s
}
