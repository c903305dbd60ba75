package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	ucli "github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/control/testbed"
	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// testbedApp is a minimal app holding only the testbed command, with its
// output captured, so these tests do not depend on the rest of the CLI.
func testbedApp(out *bytes.Buffer) *ucli.App {
	app := &ucli.App{
		Name:           "lovelock",
		Writer:         out,
		ErrWriter:      out,
		Commands:       []*ucli.Command{testbedCommand()},
		ExitErrHandler: func(*ucli.Context, error) {}, // never os.Exit in a test
	}
	setupCommands(app) // as App does: `testbed up extra` must not bring it up
	return app
}

func runTestbedCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := testbedApp(&out).RunContext(t.Context(), append([]string{"lovelock"}, args...))
	return out.String(), err
}

func TestTestbedHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"testbed", "--help"}, []string{"up", "down", "status", "exec", "pf0hpf", "p0", "fabric", "br0", "mem0", "client", "gpu0", "--prefix", "ll-host0", "10.77.0.0/24"}},
		{[]string{"testbed", "up", "--help"}, []string{"safe to repeat", "--prefix", "bpffs"}},
		{[]string{"testbed", "down", "--help"}, []string{"<prefix><node>", "(ll-x- beside ll-)", "crash", "--prefix"}},
		{[]string{"testbed", "status", "--help"}, []string{"--output", "table or json", "--prefix"}},
		{[]string{"testbed", "exec", "--help"}, []string{"NODE -- COMMAND", "ip netns exec", "bpffs", "host0, host1, gpu0, dpu0, dpu1, dpu2, mem0, client, fabric"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, err := runTestbedCLI(t, tc.args...)
			if err != nil {
				t.Fatalf("error: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("help lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

func TestTestbedUsageErrors(t *testing.T) {
	prefix := fmt.Sprintf("lltc%dx-", os.Getpid()) // never created
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"testbed", "exec"}, "no node given; usage: lovelock testbed exec NODE -- COMMAND"},
		{[]string{"testbed", "exec", "dpu7", "--", "true"}, `unknown node "dpu7" (nodes: host0, host1, gpu0, dpu0`},
		{[]string{"testbed", "exec", "host0", "ping"}, "put -- between the node and the command"},
		{[]string{"testbed", "exec", "host0"}, "put -- between the node and the command"},
		{[]string{"testbed", "exec", "host0", "--"}, "no command after --"},
		{[]string{"testbed", "exec", "--prefix", prefix, "host0", "--", "true"}, "namespace " + prefix + "host0 does not exist; run 'lovelock testbed --prefix " + prefix + " up' first"},
		{[]string{"testbed", "status", "--output", "yaml"}, `unknown --output "yaml": want table or json`},
		{[]string{"testbed", "up", "extra"}, "takes no arguments"},
		{[]string{"testbed", "--prefix", "../etc", "down"}, "invalid prefix"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, err := runTestbedCLI(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v; want one containing %q", err, tc.want)
			}
		})
	}
}

// TestTestbedCommands drives up, status, exec and down as a user would.
func TestTestbedCommands(t *testing.T) {
	testenv.RequirePriv(t)
	prefix := fmt.Sprintf("lltc%d-", os.Getpid())
	spec := testbed.DefaultSpec()
	spec.Prefix = prefix
	t.Cleanup(func() {
		if err := testbed.Down(context.Background(), spec); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})

	out, err := runTestbedCLI(t, "testbed", "up", "--prefix", prefix)
	if err != nil {
		t.Fatalf("up: %v\n%s", err, out)
	}
	if !strings.Contains(out, "testbed "+prefix+": up (9 nodes, 8 links)") {
		t.Errorf("up output:\n%s", out)
	}
	if out, err = runTestbedCLI(t, "testbed", "--prefix", prefix, "up"); err != nil {
		t.Fatalf("second up: %v\n%s", err, out)
	}

	out, err = runTestbedCLI(t, "testbed", "status", "--prefix", prefix)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	t.Logf("status table:\n%s", out)
	for _, w := range []string{"complete (9 nodes, 8 links)", "NODE", "ADDRESSES", prefix + "host0", "dpu0/pf0hpf", "10.77.10.1/24", "port of br0", "fd77::20/64"} {
		if !strings.Contains(out, w) {
			t.Errorf("status table lacks %q", w)
		}
	}

	out, err = runTestbedCLI(t, "testbed", "status", "--prefix", prefix, "--output", "json")
	if err != nil {
		t.Fatalf("status json: %v", err)
	}
	var st testbed.Report
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status json does not parse: %v\n%s", err, out)
	}
	if !st.Complete || st.Prefix != prefix || len(st.Nodes) != 9 || len(st.Links) != 8 {
		t.Errorf("status json: complete %v, prefix %q, %d nodes, %d links; problems %v", st.Complete, st.Prefix, len(st.Nodes), len(st.Links), st.Problems)
	}

	t.Run("exec", func(t *testing.T) {
		// exec replaces the process, so run it in a child: this test binary,
		// re-entered through TestTestbedExecHelper.
		var want unix.Stat_t
		if err := unix.Stat(testbed.NetnsDir+"/"+spec.Namespace("host0"), &want); err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestTestbedExecHelper$", "-test.count=1")
		cmd.Env = append(os.Environ(), "LOVELOCK_TESTBED_EXEC_HELPER="+prefix)
		got, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("exec child: %v\n%s", err, got)
		}
		if !strings.Contains(string(got), fmt.Sprintf("net:[%d]", want.Ino)) {
			t.Errorf("command did not run in %s (netns inode %d):\n%s", spec.Namespace("host0"), want.Ino, got)
		}
		if !strings.Contains(string(got), "bpf_fs") {
			t.Errorf("bpffs not visible inside the node:\n%s", got)
		}
	})

	out, err = runTestbedCLI(t, "testbed", "down", "--prefix", prefix)
	if err != nil {
		t.Fatalf("down: %v\n%s", err, out)
	}
	out, err = runTestbedCLI(t, "testbed", "status", "--prefix", prefix, "-o", "json")
	// An absent testbed is reported, and the exit status says it is not up.
	if !errors.Is(err, ErrTestbedNotUp) || !strings.Contains(err.Error(), "testbed "+prefix+" is absent") {
		t.Fatalf("status after down: err = %v, want ErrTestbedNotUp saying it is absent", err)
	}
	st = testbed.Report{}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatal(err)
	}
	for _, n := range st.Nodes {
		if n.Present {
			t.Errorf("node %s still present after down", n.Name)
		}
	}
	entries, _ := os.ReadDir(testbed.NetnsDir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			t.Errorf("%s/%s left after down", testbed.NetnsDir, e.Name())
		}
	}
}

// TestTestbedUpHalfBuilt: when up fails partway, its error says how to
// remove what it built, with the prefix given; before, it named only the
// failure. A non-empty directory where mem0's namespace belongs stops up
// after host0 to dpu2 exist.
func TestTestbedUpHalfBuilt(t *testing.T) {
	testenv.RequirePriv(t)
	prefix := fmt.Sprintf("lltc%dh-", os.Getpid())
	spec := testbed.DefaultSpec()
	spec.Prefix = prefix
	block := testbed.NetnsDir + "/" + spec.Namespace("mem0")
	t.Cleanup(func() {
		if err := os.RemoveAll(block); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if err := testbed.Down(context.Background(), spec); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if err := os.MkdirAll(block+"/in-the-way", 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := runTestbedCLI(t, "testbed", "up", "--prefix", prefix)
	want := "testbed " + prefix + " is half-built (6 of 9 nodes): run 'lovelock testbed --prefix " + prefix + " down' to remove it"
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "node mem0") {
		t.Fatalf("up error = %v; want the mem0 failure and %q", err, want)
	}

	// Nothing built (an invalid prefix): the failure alone.
	if _, err := runTestbedCLI(t, "testbed", "up", "--prefix", "../x"); err == nil || strings.Contains(err.Error(), "half-built") {
		t.Errorf("up with an invalid prefix: %v; want an error without the half-built advice", err)
	}
}

// TestTestbedExecHelper is not a test on its own: TestTestbedCommands runs
// the test binary with LOVELOCK_TESTBED_EXEC_HELPER=<prefix>, and then this
// function becomes `lovelock testbed exec host0 -- sh -c ...`, which replaces
// the process. Run normally, it returns at once.
func TestTestbedExecHelper(t *testing.T) {
	prefix := os.Getenv("LOVELOCK_TESTBED_EXEC_HELPER")
	if prefix == "" {
		return
	}
	var out bytes.Buffer
	err := testbedApp(&out).Run([]string{"lovelock", "testbed", "--prefix", prefix, "exec", "host0", "--",
		"sh", "-c", "readlink /proc/self/ns/net; stat -f -c %T /sys/fs/bpf"})
	// Only reached if exec failed.
	t.Fatalf("exec returned: %v\n%s", err, out.String())
}
