// Command lovelockd is the Lovelock daemon: it owns a DPU's data plane. At
// start it adopts the steering program pinned under the bpffs (or loads and
// pins one) and attaches it to the configured interfaces through pinned BPF
// links, then reports the data plane's counters until it is stopped. Stopping
// it never detaches the data plane: packets keep flowing without it.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/lovelock-dpu/lovelock/appliance"
	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/attach"
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
	return &ucli.App{
		Name:    "lovelockd",
		Usage:   "own a DPU's data plane: attach the steering program and keep it running",
		Version: appliance.Version,
		Description: "lovelockd loads Lovelock's XDP steering program, pins it under the bpffs and attaches\n" +
			"it to the given interfaces with pinned BPF links. A restart adopts what is pinned instead\n" +
			"of reattaching; SIGTERM stops the daemon but leaves the data plane attached.",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "bpffs", Value: attach.DefaultDir, Usage: "pin directory on a bpffs mount"},
			&ucli.StringSliceFlag{Name: "iface", Usage: "interface to attach the steering program to (repeatable)"},
			&ucli.StringFlag{Name: "xdp-mode", Value: string(attach.ModeNative), Usage: "XDP attach mode: native or generic (generic only for drivers without XDP)"},
			&ucli.UintFlag{Name: "port", Value: 61440, Usage: "Lovelock UDP port"},
			&ucli.DurationFlag{Name: "stats-interval", Value: 30 * time.Second, Usage: "how often to log the data plane's counters (0: never)"},
		},
		Action: run,
	}
}

func run(c *ucli.Context) error {
	port := c.Uint("port")
	if port == 0 || port > 65535 {
		return fmt.Errorf("--port %d: want 1-65535", port)
	}
	cfg := attach.Config{
		Dir:        c.String("bpffs"),
		Port:       uint16(port),
		Interfaces: c.StringSlice("iface"),
		Mode:       attach.Mode(c.String("xdp-mode")),
	}
	res, err := attach.Ensure(cfg)
	if err != nil {
		return err
	}
	slog.Info("data plane ready", "version", appliance.Version, "pins", cfg.Dir,
		"loaded", res.Loaded, "attached", res.Attached, "adopted", res.Adopted)

	interval := c.Duration("stats-interval")
	if interval <= 0 {
		<-c.Context.Done()
		slog.Info("stopping; the data plane stays attached")
		return nil
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-c.Context.Done():
			slog.Info("stopping; the data plane stays attached")
			return nil
		case <-tick.C:
			stats, err := bpf.ReadPinnedStats(cfg.Dir)
			if err != nil {
				slog.Warn("read counters", "err", err)
				continue
			}
			attrs := make([]any, 0, 2*len(stats))
			for i, s := range stats {
				attrs = append(attrs, bpf.Stat(i).String(), s.Packets)
			}
			slog.Info("counters", attrs...)
		}
	}
}
