package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"

	ucli "github.com/urfave/cli/v2"
)

// Run runs app on args (args[0] is the program name) as the lovelock
// command does: flags may follow a command's arguments, as the docs write
// them (`lovelock iface attach p0 --hook tc-ingress`). urfave/cli v2 stops
// reading flags at the first argument, so Run moves each command's flags
// in front of its arguments first. Everything after "--" stays as it is, and
// so do the arguments of commands that take a command line of their own
// (ArgsUsage with " -- ", such as `testbed exec`).
func Run(ctx context.Context, app *ucli.App, args []string) error {
	return app.RunContext(ctx, reorderArgs(app, args))
}

// reorderArgs moves the flags of the command args name in front of its
// arguments.
func reorderArgs(app *ucli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	out := []string{args[0]}
	flags, cmds := app.Flags, app.Commands
	var leaf *ucli.Command
	i := 1
	// The command path: flags of each level stay where they are.
	for i < len(args) {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if isFlag(a) {
			out = append(out, a)
			if takesValue(flags, a) && i+1 < len(args) {
				out = append(out, args[i+1])
				i++
			}
			i++
			continue
		}
		var next *ucli.Command
		for _, c := range cmds {
			if c.HasName(a) {
				next = c
			}
		}
		if next == nil {
			break
		}
		out = append(out, a)
		leaf, flags, cmds = next, next.Flags, next.Subcommands
		i++
	}
	if leaf == nil || strings.Contains(leaf.ArgsUsage, " -- ") {
		return append(out, args[i:]...)
	}
	var moved, rest []string
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		if isFlag(a) {
			moved = append(moved, a)
			if takesValue(flags, a) && i+1 < len(args) {
				moved = append(moved, args[i+1])
				i++
			}
			continue
		}
		rest = append(rest, a)
	}
	out = append(out, moved...)
	return append(out, rest...)
}

func isFlag(a string) bool { return len(a) > 1 && a[0] == '-' }

// takesValue says whether the flag a (as written, "--x" or "-x", without
// "=value") needs the next argument as its value.
func takesValue(flags []ucli.Flag, a string) bool {
	if strings.Contains(a, "=") {
		return false
	}
	name := strings.TrimLeft(a, "-")
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				if df, ok := f.(ucli.DocGenerationFlag); ok {
					return df.TakesValue()
				}
				return true
			}
		}
	}
	return false // unknown (or help): urfave/cli reports it
}

// setupCommands walks app's command tree once App has built it. Usage
// errors become one line: "lovelock rule add: invalid value "x" for flag
// -priority: …; see 'lovelock rule add --help'", instead of the error
// followed by the command's whole help. Flags declared Required are checked
// the same way (urfave/cli prints the help before a missing required flag),
// and their help says "(required)" (requiredFlag). And
// every command refuses positional arguments it does not take (checkArgs):
// a group (a command with subcommands) one that names none of them, a
// command without ArgsUsage any; commands with ArgsUsage check theirs in
// their action with checkArgs.
func setupCommands(app *ucli.App) {
	onUsage := func(name string) ucli.OnUsageErrorFunc {
		return func(_ *ucli.Context, err error, _ bool) error {
			return fmt.Errorf("%s: %w; see '%s --help'", name, err, name)
		}
	}
	app.OnUsageError = onUsage("lovelock")
	var walk func(prefix string, cmds []*ucli.Command)
	walk = func(prefix string, cmds []*ucli.Command) {
		for _, c := range cmds {
			full := prefix + " " + c.Name
			c.OnUsageError = onUsage(full)
			var required []string
			for i, f := range c.Flags {
				if rf, ok := f.(requirable); ok && rf.IsRequired() {
					required = append(required, f.Names()[0])
					c.Flags[i] = requiredFlag{rf}
				}
			}
			// A group's arguments are known only once urfave/cli looked
			// for a subcommand among them: its action checks them. A
			// command's are checked before anything else, missing flags
			// included.
			noArgs := len(c.Subcommands) == 0 && strings.TrimSpace(c.ArgsUsage) == ""
			if len(c.Subcommands) > 0 {
				action := c.Action
				c.Action = func(ctx *ucli.Context) error {
					if err := checkArgs(ctx, 0); err != nil {
						return err
					}
					if action == nil {
						return ucli.ShowSubcommandHelp(ctx)
					}
					return action(ctx)
				}
			}
			if noArgs || len(required) > 0 {
				before := c.Before
				c.Before = func(ctx *ucli.Context) error {
					if noArgs {
						if err := checkArgs(ctx, 0); err != nil {
							return err
						}
					}
					var missing []string
					for _, n := range required {
						if !ctx.IsSet(n) {
							missing = append(missing, "--"+n)
						}
					}
					if len(missing) > 0 {
						return fmt.Errorf("%s: missing %s; see '%s --help'", full, strings.Join(missing, ", "), full)
					}
					if before != nil {
						return before(ctx)
					}
					return nil
				}
			}
			walk(full, c.Subcommands)
		}
	}
	walk("lovelock", app.Commands)
}

// checkArgs refuses the positional arguments of the command ctx runs past
// its first max, naming the first one and the command's --help: "lovelock
// rules: unknown command "aply"; see 'lovelock rules --help'" for a group,
// "lovelock status: unexpected argument "extra": it takes no arguments, only
// flags; see 'lovelock status --help'" otherwise. "help" (urfave/cli's help command)
// is not refused.
func checkArgs(ctx *ucli.Context, max int) error {
	if ctx.NArg() <= max {
		return nil
	}
	arg := ctx.Args().Get(max)
	if max == 0 && (arg == "help" || arg == "h") {
		return nil
	}
	name := "lovelock"
	if ctx.Command != nil && ctx.Command.HelpName != "" {
		name = ctx.Command.HelpName
	}
	switch {
	case isGroup(ctx.Command):
		return fmt.Errorf("%s: unknown command %q; see '%s --help'", name, arg, name)
	case max == 0:
		return fmt.Errorf("%s: unexpected argument %q: it takes no arguments, only flags; see '%s --help'", name, arg, name)
	}
	return fmt.Errorf("%s: unexpected argument %q: it takes only %s; see '%s --help'", name, arg, ctx.Command.ArgsUsage, name)
}

// isGroup says whether c has subcommands besides the help command urfave/cli
// adds to every command.
func isGroup(c *ucli.Command) bool {
	return c != nil && slices.ContainsFunc(c.Subcommands, func(s *ucli.Command) bool { return s.Name != "help" })
}

// requirable is what requiredFlag needs of a flag: every flag type of
// urfave/cli has it.
type requirable interface {
	ucli.DocGenerationFlag
	ucli.CategorizableFlag
	ucli.ActionableFlag
	ucli.RequiredFlag
}

// requiredFlag is a flag declared Required, as setupCommands sets it up:
// its help ends in "(required)" instead of its zero value as a default
// ("--scale value  log2 of the number of vertices (default: 0)"), and
// urfave/cli does not check it (IsRequired is false), setupCommands does.
type requiredFlag struct{ requirable }

func (f requiredFlag) String() string         { return ucli.FlagStringer(f) }
func (f requiredFlag) GetUsage() string       { return f.requirable.GetUsage() + " (required)" }
func (f requiredFlag) GetDefaultText() string { return "" }
func (f requiredFlag) IsRequired() bool       { return false }
