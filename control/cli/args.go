package cli

import (
	"context"
	"fmt"
	"reflect"
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
				if _, ok := f.(*ucli.BoolFlag); ok {
					return false
				}
				return true
			}
		}
	}
	return false // unknown (or help): urfave/cli reports it
}

// quietUsageErrors makes flag errors short: "lovelock rule add: invalid value
// "x" for flag -priority: …; see 'lovelock rule add --help'", instead of the
// error followed by the command's whole help. Required flags are checked the
// same way (urfave/cli prints the help before a missing required flag).
func quietUsageErrors(app *ucli.App) {
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
			for _, f := range c.Flags {
				if rf, ok := f.(ucli.RequiredFlag); ok && rf.IsRequired() {
					required = append(required, f.Names()[0])
					if v := reflect.ValueOf(f).Elem().FieldByName("Required"); v.IsValid() && v.CanSet() {
						v.SetBool(false)
					}
				}
			}
			if len(required) > 0 {
				before := c.Before
				c.Before = func(ctx *ucli.Context) error {
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
