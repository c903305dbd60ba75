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
	if err := cli.Run(ctx, cli.App(os.Stdout, os.Stderr), os.Args); err != nil {
		fmt.Fprintln(os.Stderr, cli.ErrorLine(err))
		os.Exit(1)
	}
}
