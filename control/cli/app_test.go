package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ucli "github.com/urfave/cli/v2"
)

// TestHelp checks that every command answers --help with its usage, so a
// newcomer can find their way from `lovelock --help` down.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{
		{"--help"},
		{"plan", "--help"},
		{"testbed", "--help"},
		{"testbed", "up", "--help"},
		{"testbed", "down", "--help"},
		{"testbed", "status", "--help"},
		{"testbed", "exec", "--help"},
		{"testbed", "traffic", "--help"},
		{"iface", "--help"},
		{"iface", "attach", "--help"},
		{"iface", "detach", "--help"},
		{"iface", "list", "--help"},
		{"rule", "--help"},
		{"rule", "add", "--help"},
		{"rule", "del", "--help"},
		{"rule", "list", "--help"},
		{"rules", "--help"},
		{"rules", "apply", "--help"},
		{"stats", "--help"},
		{"capture", "--help"},
		{"image", "--help"},
		{"msg", "stats", "--help"},
		{"infer", "--help"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			var out bytes.Buffer
			app := App(&out, &out)
			if err := app.Run(append([]string{"lovelock"}, args...)); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out.String(), "USAGE:") {
				t.Errorf("no usage in:\n%s", out.String())
			}
		})
	}
}

// TestHelpRequired: help marks the flags a command cannot run without
// "(required)", never with their zero value as a default, and gives
// optional ones their default.
func TestHelpRequired(t *testing.T) {
	for _, tc := range []struct {
		cmd  string
		flag string // the flag's help line starts with it
		want string // and ends with it
	}{
		{"rule add", "--name value", "(required)"},
		{"rule add", "--action value", "(required)"},
		{"rule add", "--priority value", "(default: 0)"},
		{"rules apply", "--file value, -f value", "(required)"},
		{"image flash", "--bfb value", "(required)"},
		{"sched simulate", "--trace value", "(required)"},
		{"sched synth", "--out value", "(required)"},
		{"graph gen", "--scale value", "(required)"},
		{"graph gen", "--out FILE, -w FILE", "(required)"},
		{"graph convert", "--out FILE, -w FILE", "(required)"},
		{"graph run", "--app value", "(required)"},
		{"graph run", "--graph FILE", "(required)"},
		{"graph gen", "--edge-factor value", "(default: 16)"},
		// Flags whose 0 picks a default say which.
		{"graph run", "--iterations value", "PageRank iterations (default: 20)"},
		{"graph run", "--workers value", "(default: GOMAXPROCS)"},
		{"infer", "--concurrency value", "(default: 1, or 1024 with --rate)"},
	} {
		t.Run(tc.cmd+" "+tc.flag, func(t *testing.T) {
			var out bytes.Buffer
			if err := App(&out, &out).Run(append(append([]string{"lovelock"}, strings.Fields(tc.cmd)...), "--help")); err != nil {
				t.Fatal(err)
			}
			var line string
			for _, l := range strings.Split(out.String(), "\n") {
				if strings.HasPrefix(strings.TrimSpace(l), tc.flag+" ") {
					line = strings.TrimSpace(l)
				}
			}
			if !strings.HasSuffix(line, tc.want) {
				t.Errorf("help line %q, want it to end with %q\n%s", line, tc.want, out.String())
			}
			if tc.want == "(required)" && strings.Contains(line, "default:") {
				t.Errorf("help line %q gives a required flag a default", line)
			}
		})
	}
}

func TestUnknownCommand(t *testing.T) {
	var out bytes.Buffer
	err := App(&out, &out).Run([]string{"lovelock", "frobnicate"})
	if err == nil || !strings.Contains(err.Error(), `unknown command "frobnicate"`) {
		t.Errorf("unknown command: err = %v, want a clear error", err)
	}
}

// TestStrayArgs: a mistyped subcommand or an argument a command does not
// take is refused, naming it and the command's --help, instead of running
// the group's own action (`rules aply` listed the live rules) or being
// ignored. Nothing here reaches a daemon.
func TestStrayArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, `lovelock: unknown command "frobnicate"; see 'lovelock --help'`},
		{[]string{"rules", "aply", "new.yaml"}, `lovelock rules: unknown command "aply"; see 'lovelock rules --help'`},
		{[]string{"rules", "-o", "json", "aply"}, `lovelock rules: unknown command "aply"`},
		{[]string{"iface", "bogus"}, `lovelock iface: unknown command "bogus"; see 'lovelock iface --help'`},
		{[]string{"sched", "bogus"}, `lovelock sched: unknown command "bogus"; see 'lovelock sched --help'`},
		{[]string{"msg", "bogus"}, `lovelock msg: unknown command "bogus"; see 'lovelock msg --help'`},
		{[]string{"testbed", "bogus"}, `lovelock testbed: unknown command "bogus"; see 'lovelock testbed --help'`},
		{[]string{"services", "extra"}, `lovelock services: unexpected argument "extra": it takes no arguments, only flags; see 'lovelock services --help'`},
		{[]string{"status", "extra"}, `lovelock status: unexpected argument "extra": it takes no arguments, only flags; see 'lovelock status --help'`},
		{[]string{"stats", "extra", "-o", "json"}, `lovelock stats: unexpected argument "extra": it takes no arguments`},
		{[]string{"rule", "list", "extra"}, `lovelock rule list: unexpected argument "extra": it takes no arguments, only flags; see 'lovelock rule list --help'`},
		{[]string{"rules", "apply", "-f", "x.yaml", "extra"}, `lovelock rules apply: unexpected argument "extra": it takes no arguments`},
		{[]string{"ingest", "stats", "extra"}, `lovelock ingest stats: unexpected argument "extra"`},
		{[]string{"plan", "extra"}, `lovelock plan: unexpected argument "extra": it takes no arguments`},
		{[]string{"infer", "extra"}, `lovelock infer: unexpected argument "extra": it takes no arguments`},
		{[]string{"testbed", "up", "extra"}, `lovelock testbed up: unexpected argument "extra": it takes no arguments`},
		{[]string{"rule", "del", "a", "b"}, `lovelock rule del: unexpected argument "b": it takes only NAME; see 'lovelock rule del --help'`},
		{[]string{"iface", "attach", "p0", "p1"}, `lovelock iface attach: unexpected argument "p1": it takes only IFACE`},
		{[]string{"iface", "detach", "p0", "p1"}, `lovelock iface detach: unexpected argument "p1"`},
		{[]string{"mem", "free", "1", "2"}, `lovelock mem free: unexpected argument "2"`},
		{[]string{"graph", "info", "a.csr", "b.csr"}, `lovelock graph info: unexpected argument "b.csr"`},
		{[]string{"graph", "convert", "a.txt", "b.txt", "--out", "x.csr"}, `lovelock graph convert: unexpected argument "b.txt"`},
		{[]string{"image", "inspect", "a.bfb", "b.bfb"}, `lovelock image inspect: unexpected argument "b.bfb"`},
		{[]string{"testbed", "traffic", "host0", "host1"}, `lovelock testbed traffic: unexpected argument "host1"`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out bytes.Buffer
			args := append([]string{"lovelock", "--socket", filepath.Join(t.TempDir(), "none.sock")}, tc.args...)
			err := Run(context.Background(), App(&out, &out), args)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q\n%s", err, tc.want, out.String())
			}
		})
	}
}

// TestEveryCommandRefusesStrayArgs walks the whole command tree: a group
// refuses an argument that names none of its commands, a command without
// ArgsUsage one it does not take. The commands' own actions are replaced
// first, so a command that ignores the argument does nothing here.
func TestEveryCommandRefusesStrayArgs(t *testing.T) {
	var walk func(path []string, cmds []*ucli.Command)
	walk = func(path []string, cmds []*ucli.Command) {
		for _, cmd := range cmds {
			p := append(slices.Clone(path), cmd.Name)
			if len(cmd.Subcommands) > 0 {
				walk(p, cmd.Subcommands)
			} else if strings.TrimSpace(cmd.ArgsUsage) != "" {
				continue // checked by its action: TestStrayArgs
			}
			t.Run(strings.Join(p, " "), func(t *testing.T) {
				app := App(io.Discard, io.Discard)
				c := findCommand(app.Commands, p)
				name := strings.Join(append([]string{"lovelock"}, p...), " ")
				want := fmt.Sprintf("%s: unexpected argument \"zzz\": it takes no arguments, only flags; see '%[1]s --help'", name)
				if len(c.Subcommands) > 0 {
					want = fmt.Sprintf("%s: unknown command \"zzz\"; see '%[1]s --help'", name)
				} else {
					c.Action = func(*ucli.Context) error { return errors.New("the action ran") }
				}
				// Required flags left out: the argument is refused first.
				err := Run(context.Background(), app, append([]string{"lovelock", "--socket", filepath.Join(t.TempDir(), "none.sock")}, append(p, "zzz")...))
				if err == nil || err.Error() != want {
					t.Errorf("err = %v, want %q", err, want)
				}
			})
		}
	}
	walk(nil, App(io.Discard, io.Discard).Commands)
}

func findCommand(cmds []*ucli.Command, path []string) *ucli.Command {
	for _, c := range cmds {
		if c.Name == path[0] {
			if len(path) == 1 {
				return c
			}
			return findCommand(c.Subcommands, path[1:])
		}
	}
	return nil
}

// TestIDFlagsPast32Bits: a tenant or region ID past 32 bits is refused
// before anything is sent, naming the flag. Before, it was cut to 32 bits:
// infer --tenant 4294967296 sent as tenant 0 (infrastructure) and said so,
// mem create made a tenant-0 region, graph run --region 4294967297 ran on
// region 1.
func TestIDFlagsPast32Bits(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"mem", "create", "--tenant", "4294967296", "--size", "1MiB"}, "--tenant 4294967296: want 0 to 4294967295"},
		{[]string{"mem", "regions", "--tenant", "4294967296"}, "--tenant 4294967296: want 0 to 4294967295"},
		{[]string{"mem", "free", "3", "--tenant", "18446744073709551615"}, "--tenant 18446744073709551615: want 0 to 4294967295"},
		{[]string{"graph", "run", "--app", "bfs", "--graph", "g.csr", "--region", "4294967297"}, "--region 4294967297: want 0 to 4294967295"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out bytes.Buffer
			args := append([]string{"lovelock", "--socket", filepath.Join(t.TempDir(), "none.sock")}, tc.args...)
			err := Run(context.Background(), App(&out, &out), args)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q\n%s", err, tc.want, out.String())
			}
		})
	}
}
