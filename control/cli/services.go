package cli

import (
	"fmt"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/lovelock-dpu/lovelock/control/api"
)

func servicesCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "services",
		Usage: "the services lovelockd runs (messaging, far memory, ingest): state, what they run on, why they failed",
		Description: "Each service lovelockd's config names is planned, bound to its AF_XDP sockets and steering\n" +
			"rules, and run; a failure is reported and the service started again. State is running,\n" +
			"degraded (running, bound short of what it asked: the lines below it say how), failed\n" +
			"(restarting; LAST ERROR says why and when it tries again: the waits double with each\n" +
			"failure in a row, up to 30 s), starting (not serving yet) or stopped. docs/services.md describes the frame.",
		Flags: []ucli.Flag{outputFlag()},
		Action: func(c *ucli.Context) error {
			asJSON, err := wantJSON(c)
			if err != nil {
				return err
			}
			svcs, err := client(c).Services(c.Context)
			if err != nil {
				return err
			}
			if asJSON {
				if err := writeJSON(c.App.Writer, svcs); err != nil {
					return err
				}
				return servicesExit(svcs) // scripts read the exit as the table's readers do
			}
			w := c.App.Writer
			if len(svcs) == 0 {
				fmt.Fprintln(w, "lovelockd runs no service: its config (/etc/lovelock/lovelockd.yaml) enables none of messaging, memory_server, far_memory, far_memory_host, ingest, ingest_host (docs/services.md)")
				return nil
			}
			tw := newTable(w)
			fmt.Fprintln(tw, "SERVICE\tSTATE\tSINCE\tRESTARTS\tON\tLAST ERROR")
			for _, s := range svcs {
				last := dash(s.Error)
				if !s.NextTry.IsZero() {
					last += " (next try " + s.NextTry.Format(time.RFC3339) + ")"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", s.Name, s.State, s.Since.Format(time.RFC3339), s.Restarts, dash(s.Binding), last)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, s := range svcs {
				for _, d := range s.Degraded {
					fmt.Fprintf(w, "%s degraded: %s\n", s.Name, d)
				}
			}
			return servicesExit(svcs)
		},
	}
}

// servicesExit is the services command's exit: 1, naming them, unless
// every service runs as asked.
func servicesExit(svcs []api.ServiceStatus) error {
	if bad := unhealthy(svcs); len(bad) > 0 {
		return ucli.Exit(fmt.Sprintf("not every service runs as asked: %s", strings.Join(bad, ", ")), 1)
	}
	return nil
}

// unhealthy names the services that do not run as asked.
func unhealthy(svcs []api.ServiceStatus) []string {
	var out []string
	for _, s := range svcs {
		if s.State != api.ServiceRunning {
			out = append(out, s.Name+" "+string(s.State))
		}
	}
	return out
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// fetchStats fills, for each service the node runs whose name is a key of
// into, the value there with the service's stats, and returns the names
// it filled.
func fetchStats(c *ucli.Context, into map[string]any) (map[string]bool, error) {
	cl := client(c)
	svcs, err := cl.Services(c.Context)
	if err != nil {
		return nil, err
	}
	found := map[string]bool{}
	for _, s := range svcs {
		v, ok := into[s.Name]
		if !ok {
			continue
		}
		if err := cl.ServiceStats(c.Context, s.Name, v); err != nil {
			return nil, err
		}
		found[s.Name] = true
	}
	return found, nil
}
