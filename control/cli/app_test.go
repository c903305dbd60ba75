package cli

import (
	"bytes"
	"strings"
	"testing"
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

func TestUnknownCommand(t *testing.T) {
	var out bytes.Buffer
	err := App(&out, &out).Run([]string{"lovelock", "frobnicate"})
	if err == nil || !strings.Contains(err.Error(), `unknown command "frobnicate"`) {
		t.Errorf("unknown command: err = %v, want a clear error", err)
	}
}
