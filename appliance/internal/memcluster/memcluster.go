// Package memcluster starts far memory's lovelockd roles in the nodes of a
// netns testbed, for the benchmarks (bench-mem, bench-graph): the memory
// server on mem0, the far-memory agent on dpu0, the host agent on host0 and
// any further roles a benchmark asks for, each a lovelockd process forked
// inside its node with its own config, API socket, state and pin directory
// under one temporary directory, all removed by Stop.
package memcluster

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
	MemAddr   = "10.77.0.20:61440"
	AgentAddr = "10.77.0.10:61440"
)

// Daemon is a lovelockd running in a testbed node.
type Daemon struct {
	Node   string
	Socket string // its API socket
	Cmd    *exec.Cmd
	role   Role
}

// Client is an API client of the daemon.
func (d *Daemon) Client() *api.Client { return api.NewClient(d.Socket) }

// CPU returns the CPU time the daemon has used, from /proc.
func (d *Daemon) CPU() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", d.Cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses: utime and
	// stime are the 12th and 13th of them, in clock ticks (100 Hz on Linux).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: short", d.Cmd.Process.Pid)
	}
	ut, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// Role is one lovelockd to start: the node it runs in and its config. The
// name tells daemons apart when a node runs more than one (default Node).
type Role struct {
	Name, Node, Config string
}

// Cluster is far memory's lovelockds on a testbed.
type Cluster struct {
	Dir        string
	Mem        *Daemon // mem0: the memory server
	DPU        *Daemon // dpu0: the far-memory agent
	Host       *Daemon // host0: the host agent, through dpu0
	HostSocket string  // host0's far-memory socket (far_memory_host.socket)
	// Extra are the daemons of Options.Extra, by name.
	Extra  map[string]*Daemon
	prefix string
	all    []*Daemon
}

// Options add to the three standard roles.
type Options struct {
	// Capacity of mem0's memory server (default 4GiB).
	Capacity string
	// Extra roles, started after the standard ones; a config may use
	// {{dir}} for the cluster's directory.
	Extra []Role
	// AgentCache is dpu0's far_memory.cache section as a YAML flow
	// mapping (docs/farmem.md, DPU caches), e.g. `{size: 8MiB,
	// prefetcher: "off"}`; empty: no cache.
	AgentCache string
	// PreloadDir is mem0's preload_dir: creates over the network (through
	// dpu0) may preload files from it. Empty: they may not.
	PreloadDir string
}

// Start starts lovelockd (the binary bin) in mem0, dpu0 and host0, and the
// extra roles, and waits until each one's service runs.
func Start(ctx context.Context, spec testbed.Spec, bin string, o Options) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "memcluster-")
	if err != nil {
		return nil, err
	}
	if o.Capacity == "" {
		o.Capacity = "4GiB"
	}
	c := &Cluster{Dir: dir, HostSocket: filepath.Join(dir, "farmem.sock"), Extra: map[string]*Daemon{}, prefix: spec.Prefix}
	roles := []Role{
		{Node: "mem0", Config: fmt.Sprintf("memory_server: {addr: %q, state_dir: %q, capacity: %s, preload_dir: %q}\n",
			MemAddr, filepath.Join(dir, "mem0-state"), o.Capacity, o.PreloadDir)},
		{Node: "dpu0", Config: agentConfig(o.AgentCache)},
		{Node: "host0", Config: fmt.Sprintf("far_memory_host: {agent: %q, socket: %q}\n", AgentAddr, c.HostSocket)},
	}
	roles = append(roles, o.Extra...)
	for i, r := range roles {
		if r.Name == "" {
			r.Name = r.Node
		}
		r.Config = strings.ReplaceAll(r.Config, "{{dir}}", dir)
		d, err := c.start(spec, bin, r)
		if err != nil {
			c.Stop()
			return nil, err
		}
		switch {
		case i == 0:
			c.Mem = d
		case i == 1:
			c.DPU = d
		case i == 2:
			c.Host = d
		default:
			c.Extra[r.Name] = d
		}
	}
	for _, d := range c.all {
		if err := waitRunning(ctx, d); err != nil {
			c.Stop()
			return nil, err
		}
	}
	return c, nil
}

// agentConfig is dpu0's lovelockd config: the far-memory agent, with the
// cache section when one is given.
func agentConfig(cache string) string {
	if cache == "" {
		return fmt.Sprintf("far_memory: {listen: %q, servers: [{addr: %q}]}\n", AgentAddr, MemAddr)
	}
	return fmt.Sprintf("far_memory: {listen: %q, servers: [{addr: %q}], cache: %s}\n", AgentAddr, MemAddr, cache)
}

func (c *Cluster) pins(name string) string { return filepath.Join("/sys/fs/bpf", c.prefix+name) }

func (c *Cluster) start(spec testbed.Spec, bin string, r Role) (*Daemon, error) {
	cfg := filepath.Join(c.Dir, r.Name+".yaml")
	if err := os.WriteFile(cfg, []byte(r.Config), 0o600); err != nil {
		return nil, err
	}
	log, err := os.OpenFile(filepath.Join(c.Dir, r.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	pins := c.pins(r.Name)
	if err := os.MkdirAll(pins, 0o700); err != nil {
		return nil, fmt.Errorf("%s: pin directory: %w", r.Name, err)
	}
	d := &Daemon{Node: r.Node, Socket: filepath.Join(c.Dir, r.Name+".sock"), role: r}
	d.Cmd = exec.Command(bin, "--config", cfg, "--pin-dir", filepath.Join(pins, "lovelock"),
		"--state", filepath.Join(c.Dir, r.Name+".state.json"), "--socket", d.Socket, "--metrics", "off")
	d.Cmd.Stdout, d.Cmd.Stderr = log, log
	// Forked from a thread inside the node, lovelockd lives in its netns.
	if err := spec.Run(r.Node, d.Cmd.Start); err != nil {
		return nil, fmt.Errorf("start lovelockd in %s: %w", r.Node, err)
	}
	c.all = append(c.all, d)
	return d, nil
}

// waitRunning waits until d's one service runs.
func waitRunning(ctx context.Context, d *Daemon) error {
	deadline := time.Now().Add(20 * time.Second)
	var last string
	for time.Now().Before(deadline) && ctx.Err() == nil {
		svcs, err := d.Client().Services(ctx)
		if err == nil && len(svcs) == 1 && svcs[0].State == api.ServiceRunning {
			return nil
		}
		switch {
		case err != nil:
			last = err.Error()
		case len(svcs) != 1:
			last = fmt.Sprintf("%d services, want its one: %+v", len(svcs), svcs)
		default:
			last = fmt.Sprintf("%s %s %s", svcs[0].Name, svcs[0].State, svcs[0].Error)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The log goes with the cluster's directory when Start fails, so the
	// error carries its end.
	return fmt.Errorf("lovelockd on %s: far memory not running after 20s: %s; the end of its log:\n%s", d.Node, last, logTail(strings.TrimSuffix(d.Socket, ".sock")+".log", 20))
}

// logTail is the last n lines of the file at path, or why it cannot be read.
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Restart stops d and starts it again with the same config, and waits
// until its service runs: for a DPU agent, a fresh agent with empty caches
// and its adaptive switch on. Clients of it (host agents) retransmit until
// it answers again.
func (c *Cluster) Restart(ctx context.Context, spec testbed.Spec, bin string, d *Daemon) error {
	_ = d.Cmd.Process.Signal(syscall.SIGTERM)
	_ = d.Cmd.Wait()
	for i, x := range c.all {
		if x == d {
			c.all = append(c.all[:i], c.all[i+1:]...)
			break
		}
	}
	nd, err := c.start(spec, bin, d.role)
	if err != nil {
		return err
	}
	*d = *nd
	c.all[len(c.all)-1] = d
	return waitRunning(ctx, d)
}

// Stop stops every daemon (the last started first) and removes the
// cluster's directory and pin directories.
func (c *Cluster) Stop() {
	for i := len(c.all) - 1; i >= 0; i-- {
		d := c.all[i]
		if d.Cmd.Process == nil {
			continue
		}
		_ = d.Cmd.Process.Signal(syscall.SIGTERM)
		_ = d.Cmd.Wait()
	}
	for _, d := range c.all {
		_ = os.RemoveAll(c.pins(strings.TrimSuffix(filepath.Base(d.Socket), ".sock")))
	}
	_ = os.RemoveAll(c.Dir)
}
