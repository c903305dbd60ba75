// Command lovelock is the Lovelock command line. See `lovelock --help`.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/lovelock-dpu/lovelock/control/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := cli.App(os.Stdout, os.Stderr).RunContext(ctx, os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "lovelock:", err)
		os.Exit(1)
	}
}
