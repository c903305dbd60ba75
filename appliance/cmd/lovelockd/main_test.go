package main

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// TestStartFailsBeforeDataPlane: what lovelockd cannot serve on, a bad or
// taken metrics address or a socket another lovelockd answers on, fails
// the start before the data plane is touched: no pin directory appears.
// Before, lovelockd loaded and pinned its programs and applied rules, then
// failed to listen.
func TestStartFailsBeforeDataPlane(t *testing.T) {
	testenv.RequirePriv(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	busy := filepath.Join(t.TempDir(), "busy.sock")
	other, err := net.Listen("unix", busy) // answers: the kernel accepts into the backlog
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"metrics without port", []string{"--metrics", "127.0.0.1"}, `config: metrics "127.0.0.1": want HOST:PORT`},
		{"metrics port name", []string{"--metrics", "127.0.0.1:prometheus"}, "the port must be a number"},
		{"metrics taken", []string{"--metrics", taken.Addr().String()}, "another lovelockd, or another program, listens there"},
		{"socket taken", []string{"--socket", busy}, "another lovelockd serves it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := filepath.Join(dir, "lovelockd.yaml")
			if err := os.WriteFile(cfg, []byte("{}\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			pins := filepath.Join(testenv.BPFFS(t), "lovelock")
			args := append([]string{"lovelockd", "--config", cfg, "--pin-dir", pins, "--state", filepath.Join(dir, "state.json"),
				"--socket", filepath.Join(dir, "api.sock"), "--metrics", "off"}, tc.args...)
			err := app().RunContext(context.Background(), args)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
			if _, err := os.Stat(pins); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the data plane was opened before the start failed: %s: %v", pins, err)
			}
			if _, err := os.Stat(filepath.Join(dir, "api.sock")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("api socket left behind: %v", err)
			}
		})
	}
}
