// Command lovelockd is the Lovelock daemon: it owns a DPU's data plane. At
// start it adopts the steering programs pinned under the bpffs (or loads and
// pins them), reconciles attachments and rules with its state file, then
// serves the local API (unix socket, root only) and Prometheus metrics until
// it is stopped. Stopping it never detaches the data plane.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	ucli "github.com/urfave/cli/v2"

	"github.com/lovelock-dpu/lovelock/appliance/config"
	"github.com/lovelock-dpu/lovelock/appliance/daemon"
	"github.com/lovelock-dpu/lovelock/control/buildinfo"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := lovelockd(ctx, os.Args, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// lovelockd runs the daemon on args and returns its exit status. The error
// it stops on is logged through the handler --json-log chose (text when the
// flags did not parse); --check's verdict is printed.
func lovelockd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	m := &daemonCmd{stdout: stdout, stderr: stderr}
	err := m.app().RunContext(ctx, args)
	var failed checkFailed
	switch {
	case err == nil:
		return 0
	case errors.As(err, &failed):
		fmt.Fprintf(stderr, "lovelockd --check: %v\n", failed.err)
		return 1
	}
	log := m.log
	if log == nil {
		log = newLogger(stderr, false)
	}
	log.Error("lovelockd failed", "err", err)
	return 1
}

// daemonCmd is one run of lovelockd: where it writes, and the logger its
// flags chose, once they are parsed.
type daemonCmd struct {
	stdout, stderr io.Writer
	log            *slog.Logger
}

func newLogger(w io.Writer, json bool) *slog.Logger {
	if json {
		return slog.New(slog.NewJSONHandler(w, nil))
	}
	return slog.New(slog.NewTextHandler(w, nil))
}

// checkFailed is the error --check found.
type checkFailed struct{ err error }

func (e checkFailed) Error() string { return e.err.Error() }
func (e checkFailed) Unwrap() error { return e.err }

func (m *daemonCmd) app() *ucli.App {
	def := config.Defaults()
	return &ucli.App{
		Name:    "lovelockd",
		Usage:   "own a DPU's data plane: steering programs, rules, local API, metrics",
		Version: buildinfo.Version,
		Description: "lovelockd loads Lovelock's steering programs, pins them under the bpffs and attaches\n" +
			"them to interfaces with pinned BPF links. A restart adopts what is pinned instead of\n" +
			"reattaching, then restores attachments and rules from the state file. SIGTERM stops the\n" +
			"daemon but leaves the data plane attached; 'lovelock iface detach' detaches it.\n\n" +
			"Flags override the config file (" + config.DefaultPath + ").",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "config", Value: config.DefaultPath, Usage: "configuration file (YAML or JSON)"},
			&ucli.StringFlag{Name: "pin-dir", Usage: "pin directory on a bpffs (default " + def.PinDir + ")"},
			&ucli.StringFlag{Name: "state", Usage: "state file (default " + def.State + ")"},
			&ucli.StringFlag{Name: "socket", Usage: "API unix socket (default " + def.Socket + ")"},
			&ucli.StringFlag{Name: "metrics", Usage: "Prometheus listen address, \"off\" to disable (default " + def.Metrics + ")"},
			&ucli.StringFlag{Name: "rules", Usage: "rule file applied when the state file holds no rules"},
			&ucli.StringSliceFlag{Name: "xdp", Usage: "attach XDP (native mode) to this interface at start (repeatable)"},
			&ucli.StringSliceFlag{Name: "xdp-generic", Usage: "attach XDP in generic mode, for drivers without XDP (repeatable)"},
			&ucli.StringSliceFlag{Name: "tc-egress", Usage: "attach the TC egress classifier to this interface (repeatable)"},
			&ucli.StringFlag{Name: "msg-cluster", Usage: "run the messaging routing agent with this cluster file (docs/messaging.md)"},
			&ucli.StringFlag{Name: "msg-node", Usage: "this node's name in the messaging cluster file"},
			&ucli.StringFlag{Name: "msg-transport", Usage: "the agent's transport: udp (kernel sockets, the default) or xdp (AF_XDP on --msg-iface)"},
			&ucli.StringSliceFlag{Name: "msg-iface", Usage: "with --msg-transport xdp: an interface the agent receives on (repeatable)"},
			&ucli.BoolFlag{Name: "msg-multi-buffer", Value: true, Usage: "with --msg-transport xdp: bind the AF_XDP sockets with XDP_USE_SG, so bundles up to the MTU take the AF_XDP path " +
				"(false: one XDP buffer, 3478 B on veth); where the driver refuses it, single-buffer sockets and the service reports degraded"},
			&ucli.BoolFlag{Name: "json-log", Usage: "log as JSON instead of text"},
			&ucli.BoolFlag{Name: "check", Usage: "only check the config file with the flags applied, the state file and the rule file (parsed and compiled), " +
				"print \"config OK\" or the error and exit 0 or 1; touches neither the data plane nor the API socket"},
		},
		Before: func(c *ucli.Context) error {
			m.log = newLogger(m.stderr, c.Bool("json-log"))
			return nil
		},
		Action:    m.run,
		Writer:    m.stdout,
		ErrWriter: m.stderr,
		// The error is logged once, by lovelockd, with the exit status.
		ExitErrHandler: func(*ucli.Context, error) {},
	}
}

func (m *daemonCmd) run(c *ucli.Context) error {
	cfg, err := configOf(c)
	if c.Bool("check") {
		if err == nil {
			var notes []string
			notes, err = daemon.Check(cfg)
			for _, n := range notes {
				fmt.Fprintf(m.stderr, "note: %s\n", n)
			}
		}
		if err != nil {
			return checkFailed{err}
		}
		fmt.Fprintln(m.stdout, "config OK")
		return nil
	}
	if err != nil {
		return err
	}

	// Everything lovelockd serves on first: a start that fails there
	// (another lovelockd on the socket, the metrics address taken) must
	// not have opened, upgraded or reconciled the data plane.
	ln, err := daemon.Listen(cfg)
	if err != nil {
		return err
	}
	d, err := daemon.New(cfg, m.log)
	if err != nil {
		ln.Close()
		return err
	}
	defer d.Close()
	return d.Run(c.Context, ln)
}

// configOf reads the config file, applies the flags over it and validates
// the result: a flag may fix what the file has wrong.
func configOf(c *ucli.Context) (config.Config, error) {
	cfg, err := config.Read(c.String("config"), c.IsSet("config"))
	if err != nil {
		return cfg, err
	}
	for flag, dst := range map[string]*string{"pin-dir": &cfg.PinDir, "state": &cfg.State, "socket": &cfg.Socket, "metrics": &cfg.Metrics, "rules": &cfg.Rules} {
		if c.IsSet(flag) {
			*dst = c.String(flag)
		}
	}
	cfg.Normalize()
	cfg.Interfaces = append(cfg.Interfaces, interfaceFlags(c)...)
	if c.IsSet("msg-cluster") || c.IsSet("msg-node") || c.IsSet("msg-transport") || c.IsSet("msg-iface") || c.IsSet("msg-multi-buffer") {
		m := config.Messaging{}
		if cfg.Messaging != nil {
			m = *cfg.Messaging
		}
		for flag, dst := range map[string]*string{"msg-cluster": &m.Cluster, "msg-node": &m.Node, "msg-transport": &m.Transport} {
			if c.IsSet(flag) {
				*dst = c.String(flag)
			}
		}
		if c.IsSet("msg-iface") {
			m.Interfaces = c.StringSlice("msg-iface")
		}
		if c.IsSet("msg-multi-buffer") {
			on := c.Bool("msg-multi-buffer")
			m.MultiBuffer = &on
		}
		cfg.Messaging = &m
	}
	return cfg, cfg.Validate()
}
