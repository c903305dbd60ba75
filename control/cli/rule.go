package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/rules"
)

// matchFlags are `rule add`'s match fields, named as in rule files.
var matchFlags = []struct{ name, usage string }{
	{"iface", "ingress interface (the hook's interface)"},
	{"src", "source prefix, e.g. 10.77.10.0/24 or fd77::/64"},
	{"dst", "destination prefix"},
	{"proto", "IP protocol: udp, tcp, icmp, icmpv6 or a number"},
	{"sport", "L4 source port (needs --proto udp or tcp)"},
	{"dport", "L4 destination port (needs --proto udp or tcp)"},
	{"type", "Lovelock message type, e.g. bundle, mem-read"},
	{"tenant", "Lovelock tenant ID"},
	{"rank", "Lovelock destination rank, or a range LO-HI"},
	{"region", "Lovelock destination region (far memory)"},
}

func ruleCommand() *ucli.Command {
	addFlags := []ucli.Flag{
		&ucli.StringFlag{Name: "name", Required: true, Usage: "unique rule name (counters follow it across changes)"},
		&ucli.UintFlag{Name: "priority", Required: true, Usage: "higher wins; rules that can match the same packet need different priorities"},
		&ucli.StringFlag{Name: "action", Required: true, Usage: "pass, drop, redirect:IFACE or xsk:QUEUE"},
	}
	for _, m := range matchFlags {
		addFlags = append(addFlags, &ucli.StringFlag{Name: m.name, Usage: m.usage})
	}
	return &ucli.Command{
		Name:  "rule",
		Usage: "list, add and delete single steering rules (see 'rules apply' for whole rule sets)",
		Description: "Every change recompiles the whole rule set and swaps it in atomically: a packet sees the\n" +
			"old set or the new one, never a mix. docs/rules.md describes every field.",
		Subcommands: []*ucli.Command{
			{Name: "list", Usage: "list the live rules", Flags: []ucli.Flag{outputFlag()}, Action: ruleList},
			{
				Name: "add", Usage: "add a rule", Flags: addFlags, Action: ruleAdd,
				Description: "Example: lovelock rule add --name msg --priority 10 --iface p0 --proto udp \\\n" +
					"            --type bundle --action xsk:0",
			},
			{Name: "del", Usage: "delete a rule by name", ArgsUsage: "NAME", Action: ruleDel},
		},
	}
}

func rulesCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "rules",
		Usage: "show the live rule set, or replace it whole from a file",
		Flags: []ucli.Flag{outputFlag()},
		Description: "Without a subcommand, lists the live rules. 'rules apply -f FILE' replaces the whole set\n" +
			"(YAML or JSON, docs/rules.md) atomically; a set with any error changes nothing.",
		Action: ruleList,
		Subcommands: []*ucli.Command{{
			Name:  "apply",
			Usage: "replace the live rule set with a file's, atomically",
			Flags: []ucli.Flag{
				&ucli.StringFlag{Name: "file", Aliases: []string{"f"}, Required: true, Usage: "rule file (YAML or JSON)"},
				&ucli.BoolFlag{Name: "dry-run", Usage: "only parse and validate the file"},
			},
			Action: rulesApply,
		}},
	}
}

func ruleList(c *ucli.Context) error {
	asJSON, err := wantJSON(c)
	if err != nil {
		return err
	}
	set, err := client(c).Rules(c.Context)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(c.App.Writer, set)
	}
	tw := newTable(c.App.Writer)
	fmt.Fprintln(tw, "NAME\tID\tPRIO\tOWNER\tMATCH\tACTION")
	for _, r := range set.Rules {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", r.Name, r.ID, r.Priority, owner(r.Name), matchString(r.Match), r.Action)
	}
	fmt.Fprintf(tw, "(default)\t0\t-\t-\t-\t%s\n", set.Default)
	return tw.Flush()
}

// owner says who a rule belongs to: lovelockd (its own services' steering,
// which the operator's rule sets do not contain) or the operator.
func owner(name string) string {
	if api.IsOwned(name) {
		return "lovelockd"
	}
	return "operator"
}

// printWarnings prints what lovelockd warned about a rule change.
func printWarnings(c *ucli.Context, res api.Applied) {
	for _, w := range res.Warnings {
		fmt.Fprintf(c.App.ErrWriter, "warning: %s\n", w)
	}
}

func ruleAdd(c *ucli.Context) error {
	match := map[string]any{}
	for _, m := range matchFlags {
		if c.IsSet(m.name) {
			match[m.name] = c.String(m.name)
		}
	}
	// Build the rule as a one-rule file, so flags and files share one
	// parser and one set of error messages.
	doc, err := json.Marshal(map[string]any{"rules": []any{map[string]any{
		"name": c.String("name"), "priority": c.Uint("priority"), "match": match, "action": c.String("action"),
	}}})
	if err != nil {
		return err
	}
	set, err := rules.Parse(doc)
	if err != nil {
		return err
	}
	res, err := client(c).AddRule(c.Context, set.Rules[0])
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "rule %s added; %d rules live\n", c.String("name"), res.Rules)
	printWarnings(c, res)
	return nil
}

func ruleDel(c *ucli.Context) error {
	if c.NArg() != 1 {
		return errors.New("rule del: want exactly one rule name (see 'lovelock rule list')")
	}
	res, err := client(c).DeleteRule(c.Context, c.Args().First())
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "rule %s deleted; %d rules live\n", c.Args().First(), res.Rules)
	return nil
}

func rulesApply(c *ucli.Context) error {
	path := c.String("file")
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("rules apply: %w", err)
	}
	set, err := rules.Parse(data)
	if err != nil {
		return fmt.Errorf("rules apply %s: %w", path, err)
	}
	if c.Bool("dry-run") {
		fmt.Fprintf(c.App.Writer, "%s: %d rules parse and validate (interfaces are checked on apply)\n", path, len(set.Rules))
		return nil
	}
	res, err := client(c).ApplyRules(c.Context, *set)
	if err != nil {
		return fmt.Errorf("rules apply %s: %w", path, err)
	}
	fmt.Fprintf(c.App.Writer, "applied %s: %d rules live", path, res.Rules)
	if res.Owned > 0 {
		fmt.Fprintf(c.App.Writer, " (%d of them lovelockd's own)", res.Owned)
	}
	fmt.Fprintln(c.App.Writer)
	printWarnings(c, res)
	return nil
}

// matchString formats a match as field=value pairs, in file-format terms.
func matchString(m rules.Match) string {
	var parts []string
	add := func(k, v string) { parts = append(parts, k+"="+v) }
	if m.Iface != "" {
		add("iface", m.Iface)
	}
	if m.Src.IsValid() {
		add("src", m.Src.String())
	}
	if m.Dst.IsValid() {
		add("dst", m.Dst.String())
	}
	if m.Proto != nil {
		add("proto", rules.ProtoName(*m.Proto))
	}
	if m.Sport != nil {
		add("sport", strconv.Itoa(int(*m.Sport)))
	}
	if m.Dport != nil {
		add("dport", strconv.Itoa(int(*m.Dport)))
	}
	if m.Type != nil {
		add("type", m.Type.String())
	}
	if m.Tenant != nil {
		add("tenant", strconv.FormatUint(uint64(*m.Tenant), 10))
	}
	if m.Rank != nil {
		add("rank", m.Rank.String())
	}
	if m.Region != nil {
		add("region", strconv.FormatUint(uint64(*m.Region), 10))
	}
	if len(parts) == 0 {
		return "any"
	}
	return strings.Join(parts, " ")
}
