package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
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
			err := (&daemonCmd{stdout: io.Discard, stderr: io.Discard}).app().RunContext(context.Background(), args)
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

// TestFatalErrorLog: the error lovelockd dies of goes through the handler
// its flags chose. Before, --json-log logged it as text.
func TestFatalErrorLog(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.yaml")
	for _, tc := range []struct {
		name string
		args []string
		json bool
	}{
		{"text", nil, false},
		{"json", []string{"--json-log"}, true},
		{"json=true", []string{"--json-log=true"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := lovelockd(context.Background(), append([]string{"lovelockd", "--config", missing}, tc.args...), &stdout, &stderr)
			if code != 1 {
				t.Errorf("exit %d, want 1", code)
			}
			var rec struct{ Level, Msg, Err string }
			err := json.Unmarshal(stderr.Bytes(), &rec)
			switch {
			case tc.json && (err != nil || rec.Level != "ERROR" || rec.Msg != "lovelockd failed" || !strings.Contains(rec.Err, "no such file")):
				t.Errorf("stderr %q: want one JSON record of the error (%v)", stderr.String(), err)
			case !tc.json && (err == nil || !strings.Contains(stderr.String(), `level=ERROR msg="lovelockd failed" err="config: open `)):
				t.Errorf("stderr %q: want a text record of the error", stderr.String())
			}
		})
	}
}

// TestCheck: --check loads the config, applies the flags, validates, and
// parses and compiles the rule file, then says "config OK" (exit 0) or the
// error (exit 1), without touching the data plane or the API socket.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	empty := write("empty.yaml", "{}\n")
	good := write("good-rules.yaml", "rules:\n  - {name: dns, priority: 5, match: {proto: udp, dport: 53}, action: drop}\n")
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string // "" for none
		stderr string
	}{
		{"defaults", []string{"--config", empty}, 0, "config OK\n", ""},
		{"rules", []string{"--config", empty, "--rules", good}, 0, "config OK\n", ""},
		{"rules in the config", []string{"--config", write("r.yaml", "rules: "+good+"\n")}, 0, "config OK\n", ""},
		{"example config", []string{"--config", "../../examples/lovelockd.yaml"}, 0, "config OK\n", ""},
		{"missing config", []string{"--config", filepath.Join(dir, "none.yaml")}, 1, "", "config: open "},
		{"unknown field", []string{"--config", write("typo.yaml", "prot: 7000\n")}, 1, "", `unknown field "prot"`},
		{"bad metrics flag", []string{"--config", empty, "--metrics", "9477"}, 1, "", `config: metrics "9477": want HOST:PORT`},
		{"bad metrics in the file", []string{"--config", write("m.yaml", "metrics: \"127.0.0.1\"\n")}, 1, "", `config: metrics "127.0.0.1"`},
		{"flag over the file's metrics", []string{"--config", write("m2.yaml", "metrics: \"127.0.0.1\"\n"), "--metrics", "off"}, 0, "config OK\n", ""},
		{"missing rule file", []string{"--config", empty, "--rules", filepath.Join(dir, "none-rules.yaml")}, 1, "", "rules file: open "},
		{"rule syntax", []string{"--config", empty, "--rules", write("bad.yaml", "rules:\n  - {name: a, action: teleport}\n")}, 1, "", `action "teleport"`},
		{"rules overlap", []string{"--config", empty, "--rules", write("overlap.yaml",
			"rules:\n  - {name: a, priority: 5, match: {proto: udp}, action: drop}\n  - {name: b, priority: 5, match: {dport: 53, proto: udp}, action: pass}\n")},
			1, "", `both have priority 5`},
		{"interface not here", []string{"--config", empty, "--rules", write("iface.yaml", "rules:\n  - {name: a, priority: 5, match: {iface: no-such-if0}, action: drop}\n")},
			0, "config OK\n", "interface no-such-if0 is not in this network namespace"},
		{"bad state file", []string{"--config", empty, "--state", write("state.json", "{")}, 1, "", "state file "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sub := t.TempDir()
			pins, sock := filepath.Join(sub, "pins"), filepath.Join(sub, "api.sock")
			args := append([]string{"lovelockd", "--check", "--pin-dir", pins, "--socket", sock, "--state", filepath.Join(sub, "state.json")}, tc.args...)
			var stdout, stderr bytes.Buffer
			code := lovelockd(context.Background(), args, &stdout, &stderr)
			if code != tc.code || stdout.String() != tc.stdout || !strings.Contains(stderr.String(), tc.stderr) {
				t.Errorf("exit %d, stdout %q, stderr %q; want %d, %q, stderr with %q", code, stdout.String(), stderr.String(), tc.code, tc.stdout, tc.stderr)
			}
			if tc.code == 1 && strings.Contains(stderr.String(), "level=") {
				t.Errorf("the check's error was logged, not printed: %q", stderr.String())
			}
			for _, p := range []string{pins, sock} {
				if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("--check created %s", p)
				}
			}
		})
	}
}
