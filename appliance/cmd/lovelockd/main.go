// Command lovelockd is the Lovelock daemon: it owns a DPU's data plane. At
// start it adopts the steering programs pinned under the bpffs (or loads and
// pins them), reconciles attachments and rules with its state file, then
// serves the local API (unix socket, root only) and Prometheus metrics until
// it is stopped. Stopping it never detaches the data plane.
package main

import (
	"context"
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
	defer stop()
	if err := app().RunContext(ctx, os.Args); err != nil {
		slog.Error("lovelockd failed", "err", err)
		os.Exit(1)
	}
}

func app() *ucli.App {
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
		},
		Action: run,
	}
}

func run(c *ucli.Context) error {
	var handler slog.Handler = slog.NewTextHandler(os.Stderr, nil)
	if c.Bool("json-log") {
		handler = slog.NewJSONHandler(os.Stderr, nil)
	}
	log := slog.New(handler)

	cfg, err := config.Load(c.String("config"), c.IsSet("config"))
	if err != nil {
		return err
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
	if err := cfg.Validate(); err != nil {
		return err
	}

	// Everything lovelockd serves on first: a start that fails there
	// (another lovelockd on the socket, the metrics address taken) must
	// not have opened, upgraded or reconciled the data plane.
	ln, err := daemon.Listen(cfg)
	if err != nil {
		return err
	}
	d, err := daemon.New(cfg, log)
	if err != nil {
		ln.Close()
		return err
	}
	defer d.Close()
	return d.Run(c.Context, ln)
}
