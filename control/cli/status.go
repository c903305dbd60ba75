package cli

import (
	"fmt"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/lovelock-dpu/lovelock/control/api"
)

func statusCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "status",
		Usage: "whether lovelockd runs everything it was asked to: health, attachments, rules, services, failures",
		Description: "Health is ok when every attachment runs on its live interface, the rule set is installed\n" +
			"and every service runs as asked; starting while a service is still starting; degraded\n" +
			"otherwise, with each failure and its cause listed. Attachments are checked against the\n" +
			"kernel, not the pins: a link whose interface was deleted or re-created shows as dead.\n" +
			"Services are those of 'lovelock services'. Exits 1 unless health is ok.",
		Flags: []ucli.Flag{outputFlag()},
		Action: func(c *ucli.Context) error {
			asJSON, err := wantJSON(c)
			if err != nil {
				return err
			}
			st, err := client(c).Status(c.Context)
			if err != nil {
				return err
			}
			if asJSON {
				if err := writeJSON(c.App.Writer, st); err != nil {
					return err
				}
			} else if err := printStatus(c, st); err != nil {
				return err
			}
			switch st.Health {
			case api.HealthOK:
				return nil
			case api.HealthDegraded:
				what := make([]string, len(st.Failures))
				for i, f := range st.Failures {
					what[i] = f.What
				}
				return ucli.Exit(fmt.Sprintf("lovelockd runs degraded: %s", strings.Join(what, ", ")), 1)
			case "":
				return ucli.Exit("lovelockd reports no health (an older release?): see 'lovelock iface list' and 'lovelock services'", 1)
			}
			return ucli.Exit(fmt.Sprintf("lovelockd is %s", st.Health), 1)
		},
	}
}

func printStatus(c *ucli.Context, st api.Status) error {
	w := c.App.Writer
	pins := "adopted"
	if st.Loaded {
		pins = "loaded"
	}
	fmt.Fprintf(w, "health:   %s\n", dash(string(st.Health)))
	fmt.Fprintf(w, "version:  %s, up since %s\n", st.Version, st.Started.Format(time.RFC3339))
	fmt.Fprintf(w, "pins:     %s (%s at start), Lovelock port %d\n", st.PinDir, pins, st.Port)
	if st.RulesPending {
		fmt.Fprintf(w, "rules:    %d pending: not installed (see failures)\n", st.Rules)
	} else {
		fmt.Fprintf(w, "rules:    %d live\n", st.Rules)
	}

	fmt.Fprintln(w)
	tw := newTable(w)
	fmt.Fprintln(tw, "IFACE\tHOOK\tIFINDEX\tSTATE")
	for _, l := range st.Links {
		state := "running"
		if !l.Live {
			state = "NOT RUNNING"
		}
		idx := "-"
		if l.Ifindex != 0 {
			idx = fmt.Sprint(l.Ifindex)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", l.Iface, l.Hook, idx, state)
	}
	if len(st.Links) == 0 {
		fmt.Fprintln(tw, "(none)\t\t\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	if len(st.Services) > 0 {
		fmt.Fprintln(w)
		tw = newTable(w)
		fmt.Fprintln(tw, "SERVICE\tSTATE\tSINCE\tRESTARTS")
		for _, s := range st.Services {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", s.Name, s.State, s.Since.Format(time.RFC3339), s.Restarts)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	if len(st.Failures) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "failures:")
		for _, f := range st.Failures {
			since := ""
			if !f.Since.IsZero() {
				since = " (since " + f.Since.Format(time.RFC3339) + ")"
			}
			fmt.Fprintf(w, "  %s%s: %s\n", f.What, since, f.Cause)
		}
	}
	return nil
}
