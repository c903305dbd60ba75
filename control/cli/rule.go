package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
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
		&ucli.UintFlag{Name: "priority", Usage: "higher wins, 0 is the lowest; rules that can match the same packet need different priorities"},
		&ucli.StringFlag{Name: "action", Required: true, Usage: "pass, drop, redirect:IFACE or xsk:QUEUE"},
	}
	for _, m := range matchFlags {
		addFlags = append(addFlags, &ucli.StringFlag{Name: m.name, Usage: m.usage})
	}
	addFlags = append(addFlags, forceFlag())
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
			"(YAML, or strict JSON for a .json file; docs/rules.md) atomically; a set with any error changes\n" +
			"nothing. It prints what it changes: + added, - removed, ~ changed. A rule without a match that\n" +
			"drops or redirects every packet needs --force.",
		Action: ruleList,
		Subcommands: []*ucli.Command{{
			Name:  "apply",
			Usage: "replace the live rule set with a file's, atomically",
			Flags: []ucli.Flag{
				&ucli.StringFlag{Name: "file", Aliases: []string{"f"}, Required: true, Usage: "rule file (YAML or JSON)"},
				&ucli.BoolFlag{Name: "dry-run", Usage: "have lovelockd check the set as an apply would (its own rules, interfaces, port), print what would change, and change nothing"},
				forceFlag(),
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
	// Until a set goes live (an interface it names is missing, say),
	// lovelockd lists the set it will install: say so, as status does.
	if st, err := client(c).Status(c.Context); err == nil && st.RulesPending {
		fmt.Fprintln(c.App.Writer, "pending: this set is not installed yet; the data plane runs the set it had, or none (the failures in 'lovelock status' say why)")
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
	if err := refuseSweeping(c, set, "rule add"); err != nil {
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
	if c.NArg() == 0 {
		return errors.New("rule del: want exactly one rule name (see 'lovelock rule list')")
	}
	if err := checkArgs(c, 1); err != nil {
		return err
	}
	res, err := client(c).DeleteRule(c.Context, c.Args().First())
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "rule %s deleted; %d rules live\n", c.Args().First(), res.Rules)
	return nil
}

func forceFlag() ucli.Flag {
	return &ucli.BoolFlag{Name: "force", Usage: "accept a rule without a match that drops or redirects every packet"}
}

// refuseSweeping refuses, without --force, rules that match every packet
// and drop or redirect it: a match forgotten in a file drops everything
// without a word otherwise. With --force it warns.
func refuseSweeping(c *ucli.Context, set *rules.Set, what string) error {
	sw := set.Sweeping()
	if len(sw) == 0 {
		return nil
	}
	names := make([]string, len(sw))
	for i, r := range sw {
		names[i] = fmt.Sprintf("%q (%s)", r.Name, r.Action)
	}
	msg := fmt.Sprintf("rule %s has no match: it takes every packet on every hooked interface", strings.Join(names, ", "))
	if len(sw) > 1 {
		msg = fmt.Sprintf("rules %s have no match: they take every packet on every hooked interface", strings.Join(names, ", "))
	}
	if !c.Bool("force") {
		return fmt.Errorf("%s: %s; add a match, or pass --force if that is what you want", what, msg)
	}
	fmt.Fprintf(c.App.ErrWriter, "warning: %s\n", msg)
	return nil
}

func rulesApply(c *ucli.Context) error {
	path := c.String("file")
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("rules apply: %w", err)
	}
	set, err := rules.ParseFile(path, data)
	if err != nil {
		return fmt.Errorf("rules apply: %w", err)
	}
	if err := refuseSweeping(c, set, "rules apply "+path); err != nil {
		return err
	}
	if c.Bool("dry-run") {
		return rulesDryRun(c, path, set)
	}
	cl := client(c)
	live, err := cl.Rules(c.Context)
	if err != nil {
		return fmt.Errorf("rules apply %s: %w", path, err)
	}
	changes := rules.Diff(&live, set, api.IsOwned)
	res, err := cl.ApplyRules(c.Context, *set)
	if err != nil {
		return fmt.Errorf("rules apply %s: %w", path, err)
	}
	printChanges(c, changes, "changed")
	fmt.Fprintf(c.App.Writer, "applied %s: %d rules live", path, res.Rules)
	if res.Owned > 0 {
		fmt.Fprintf(c.App.Writer, " (%d of them lovelockd's own)", res.Owned)
	}
	fmt.Fprintln(c.App.Writer)
	printWarnings(c, res)
	return nil
}

// rulesDryRun checks set as 'rules apply' would and prints what would
// change. lovelockd checks it (CheckRules): merged with its own rules,
// against the node's interfaces and port, so that a set it passes is one
// the apply takes, as long as nothing changes meanwhile. Where no lovelockd
// answers, the CLI checks the file alone, in its own network namespace,
// and says what that leaves unchecked.
func rulesDryRun(c *ucli.Context, path string, set *rules.Set) error {
	cl := client(c)
	res, err := cl.CheckRules(c.Context, *set)
	switch {
	case err == nil:
		fmt.Fprintf(c.App.Writer, "%s: %d rules pass lovelockd's checks; with its own, %d rules would be live\n", path, len(set.Rules), res.Rules)
		printWarnings(c, res)
	case errors.Is(err, api.ErrNoDaemon):
		fmt.Fprintf(c.App.ErrWriter, "note: lovelockd did not check the file (%v), so only the file was checked, here, "+
			"for the default Lovelock port %d, without lovelockd's own rules and not knowing which interfaces run native XDP "+
			"(a redirect lovelockd would refuse from one is a warning): the apply may still refuse it\n", err, wire.DefaultPort)
		if err := rules.Validate(set, rules.LinkResolver, wire.DefaultPort); err != nil {
			return fmt.Errorf("rules apply %s: %w", path, err)
		}
		warnings, err := rules.CheckXDPRedirects(set, rules.LinkResolver, rules.XDPHooks{Unknown: true})
		if err != nil {
			return fmt.Errorf("rules apply %s: %w", path, err)
		}
		printWarnings(c, api.Applied{Warnings: warnings})
		fmt.Fprintf(c.App.Writer, "%s: %d rules parse and validate, interfaces included\n", path, len(set.Rules))
		return nil
	default:
		return fmt.Errorf("rules apply %s: %w", path, err)
	}
	live, err := cl.Rules(c.Context)
	if err != nil {
		fmt.Fprintf(c.App.Writer, "(no diff: %v)\n", err)
		return nil
	}
	printChanges(c, rules.Diff(&live, set, api.IsOwned), "would change")
	return nil
}

// printChanges prints a rule set change, or that there is none.
func printChanges(c *ucli.Context, ch rules.Changes, verb string) {
	if ch.Empty() {
		fmt.Fprintf(c.App.Writer, "%s: nothing\n", verb)
		return
	}
	fmt.Fprintf(c.App.Writer, "%s: %d added, %d removed, %d changed\n%s", verb, len(ch.Added), len(ch.Removed), len(ch.Changed), ch)
}

// matchString formats a match as field=value pairs, in file-format terms.
func matchString(m rules.Match) string { return rules.MatchString(m) }
