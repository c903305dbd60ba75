// Package cli is the `lovelock` command line: it configures and inspects a
// Lovelock node, drives the netns testbed, and runs the cluster planner. Each
// top-level command lives in its own file; all output goes to the app's
// Writer so tests run commands in-process.
package cli

import (
	"io"

	ucli "github.com/urfave/cli/v2"

	"github.com/lovelock-dpu/lovelock/control/buildinfo"
)

// App returns the lovelock command line, writing to stdout and stderr.
func App(stdout, stderr io.Writer) *ucli.App {
	app := &ucli.App{
		Name:    "lovelock",
		Usage:   "configure and inspect Lovelock DPU nodes, run the testbed, plan clusters",
		Version: buildinfo.Version,
		Description: "Lovelock turns a BlueField-class DPU into a headless cluster node. This tool talks to\n" +
			"the node's daemon (lovelockd), builds the network-namespace testbed used to develop and\n" +
			"demonstrate it, and evaluates the cost and energy model of DPU-hosted clusters.\n\n" +
			"Every command has --help; listing commands take --output json.",
		Flags: []ucli.Flag{socketFlag()},
		Commands: []*ucli.Command{
			ifaceCommand(),
			ruleCommand(),
			rulesCommand(),
			statsCommand(),
			captureCommand(),
			msgCommand(),
			servicesCommand(),
			memCommand(),
			graphCommand(),
			inferCommand(),
			ingestCommand(),
			statusCommand(),
			imageCommand(),
			testbedCommand(),
			planCommand(),
			schedCommand(),
		},
		Action: func(c *ucli.Context) error {
			if err := checkArgs(c, 0); err != nil {
				return err
			}
			return ucli.ShowAppHelp(c)
		},
		Writer:    stdout,
		ErrWriter: stderr,
		// Errors are printed once, by main, with the exit code it chooses.
		ExitErrHandler: func(*ucli.Context, error) {},
	}
	setupCommands(app)
	return app
}
