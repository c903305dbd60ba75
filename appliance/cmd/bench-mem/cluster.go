package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/testbed"
)

// The testbed's far-memory addresses (docs/testbed.md): mem0's and dpu0's
// uplink addresses, on the Lovelock port.
const (
	memAddr   = "10.77.0.20:61440"
	agentAddr = "10.77.0.10:61440"
)

// daemon is a lovelockd running in a testbed node.
type daemon struct {
	node   string
	socket string
	cmd    *exec.Cmd
}

func (d *daemon) client() *api.Client { return api.NewClient(d.socket) }

// cpu returns the CPU time the daemon has used, from /proc.
func (d *daemon) cpu() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", d.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses: utime and
	// stime are the 12th and 13th of them, in clock ticks (100 Hz on Linux).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: short", d.cmd.Process.Pid)
	}
	ut, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// cluster is far memory's three lovelockds.
type cluster struct {
	dir            string
	mem, dpu, host *daemon
	hostSocket     string
}

func startCluster(ctx context.Context, spec testbed.Spec, bin string) (*cluster, error) {
	dir, err := os.MkdirTemp("", "bench-mem-")
	if err != nil {
		return nil, err
	}
	c := &cluster{dir: dir, hostSocket: filepath.Join(dir, "farmem.sock")}
	configs := map[string]string{
		"mem0":  fmt.Sprintf("memory_server: {addr: %q, state_dir: %q, capacity: 4GiB}\n", memAddr, filepath.Join(dir, "mem0-state")),
		"dpu0":  fmt.Sprintf("far_memory: {listen: %q, servers: [{addr: %q}]}\n", agentAddr, memAddr),
		"host0": fmt.Sprintf("far_memory_host: {agent: %q, socket: %q}\n", agentAddr, c.hostSocket),
	}
	for _, node := range []string{"mem0", "dpu0", "host0"} {
		d, err := c.start(spec, bin, node, configs[node])
		if err != nil {
			c.stop()
			return nil, err
		}
		switch node {
		case "mem0":
			c.mem = d
		case "dpu0":
			c.dpu = d
		case "host0":
			c.host = d
		}
	}
	for _, d := range []*daemon{c.mem, c.dpu, c.host} {
		if err := waitRunning(ctx, d); err != nil {
			c.stop()
			return nil, err
		}
	}
	return c, nil
}

func (c *cluster) start(spec testbed.Spec, bin, node, config string) (*daemon, error) {
	cfg := filepath.Join(c.dir, node+".yaml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(c.dir, node+".log"))
	if err != nil {
		return nil, err
	}
	pins := filepath.Join("/sys/fs/bpf", spec.Prefix+node)
	if err := os.MkdirAll(pins, 0o700); err != nil {
		return nil, fmt.Errorf("%s: pin directory: %w", node, err)
	}
	d := &daemon{node: node, socket: filepath.Join(c.dir, node+".sock")}
	d.cmd = exec.Command(bin, "--config", cfg, "--pin-dir", filepath.Join(pins, "lovelock"),
		"--state", filepath.Join(c.dir, node+".state.json"), "--socket", d.socket, "--metrics", "off")
	d.cmd.Stdout, d.cmd.Stderr = log, log
	// Forked from a thread inside the node, lovelockd lives in its netns.
	if err := spec.Run(node, d.cmd.Start); err != nil {
		return nil, fmt.Errorf("start lovelockd in %s: %w", node, err)
	}
	return d, nil
}

// waitRunning waits until d's far-memory service runs.
func waitRunning(ctx context.Context, d *daemon) error {
	deadline := time.Now().Add(20 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		svcs, err := d.client().Services(ctx)
		if err == nil && len(svcs) == 1 && svcs[0].State == api.ServiceRunning {
			return nil
		}
		if err != nil {
			last = err.Error()
		} else if len(svcs) == 1 {
			last = fmt.Sprintf("%s %s %s", svcs[0].Name, svcs[0].State, svcs[0].Error)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("lovelockd on %s: far memory not running: %s (its log: %s)", d.node, last, strings.TrimSuffix(d.socket, ".sock")+".log")
}

func (c *cluster) stop() {
	for _, d := range []*daemon{c.host, c.dpu, c.mem} {
		if d == nil || d.cmd.Process == nil {
			continue
		}
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		_ = d.cmd.Wait()
	}
	for _, node := range []string{"mem0", "dpu0", "host0"} {
		_ = os.RemoveAll(filepath.Dir(filepath.Join("/sys/fs/bpf", *prefix+node, "lovelock")))
	}
	_ = os.RemoveAll(c.dir)
}
