package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lovelock-dpu/lovelock/appliance/internal/cpupin"
	"github.com/lovelock-dpu/lovelock/control/testbed"
)

// child is the bench binary re-executed in one role, in one node, pinned to
// one CPU: a process of its own, so that its CPU time is the role's.
type child struct {
	role string
	cmd  *exec.Cmd
	log  string
}

// startChild re-executes this binary as role inside node's namespace (or
// the root one when node is empty), pinned to cpu, and waits until it says
// it is ready. The child inherits the namespace and the affinity of the
// locked thread that forks it, so its whole runtime is pinned from the
// first instruction.
func startChild(ctx context.Context, spec testbed.Spec, dir, node string, cpu int, role string, args ...string) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	c := &child{role: role, log: filepath.Join(dir, role+".log")}
	logf, err := os.OpenFile(c.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	c.cmd = exec.Command(self, append([]string{"-role", role}, args...)...)
	c.cmd.Stderr = logf
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	start := func() error { return cpupin.Thread(cpu, c.cmd.Start) }
	if node == "" {
		err = start()
	} else {
		err = spec.Run(node, start)
	}
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", role, err)
	}
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && strings.TrimSpace(line) != "ready" {
			err = fmt.Errorf("said %q", line)
		}
		ready <- err
	}()
	select {
	case err = <-ready:
	case <-time.After(20 * time.Second):
		err = errors.New("not ready after 20s")
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		c.stop()
		b, _ := os.ReadFile(c.log)
		return nil, fmt.Errorf("%s: %w (its log: %s)", role, err, strings.TrimSpace(string(b)))
	}
	return c, nil
}

// cpu returns the CPU time the child has used so far.
func (c *child) cpu() (time.Duration, error) { return procCPU(c.cmd.Process.Pid) }

// stop ends the child (SIGTERM, then SIGKILL after 5 s) and waits for it.
func (c *child) stop() {
	if c == nil || c.cmd.Process == nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// procCPU returns the user and system CPU time of process pid, all its
// threads, from /proc/PID/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(b)
}

// clockTick is USER_HZ: /proc reports CPU times in ticks of 10 ms on Linux
// whatever the kernel's HZ.
const clockTick = 10 * time.Millisecond

// parseStatCPU returns utime+stime of a /proc/PID/stat line. The command
// name, field 2, is in parentheses and may hold spaces and parentheses, so
// fields are counted from the last ')': utime and stime are fields 14 and
// 15 of the line, the 12th and 13th after it.
func parseStatCPU(stat []byte) (time.Duration, error) {
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("proc stat: no command name")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("proc stat: %d fields after the command name, want at least 13", len(f))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("proc stat: %w", err)
	}
	return time.Duration(ut+st) * clockTick, nil
}

// steerReceive makes each node's kernel receive work run on that node's
// CPU (cpupin.SteerAll): on veth it would run on the sending CPU, so the
// GPU host's TCP and UDP receive work would be charged to the client's CPU
// and the DPU's to the host's. The testbed is removed at the end, so it is
// never turned off.
func steerReceive(spec testbed.Spec, cpus map[string]int) error {
	byNS := map[string]int{}
	for node, cpu := range cpus {
		byNS[spec.Namespace(node)] = cpu
	}
	if _, err := cpupin.SteerAll(byNS); err != nil {
		return fmt.Errorf("RPS: %w", err)
	}
	return nil
}

// cpuBusy is how long cpu has been busy since boot (/proc/stat: user,
// nice, system, irq, softirq and steal), soft interrupts included, which
// per-process times leave out.
func cpuBusy(cpu int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	return parseCPUBusy(string(b), cpu)
}

func parseCPUBusy(stat string, cpu int) (time.Duration, error) {
	want := fmt.Sprintf("cpu%d ", cpu)
	for _, line := range strings.Split(stat, "\n") {
		if !strings.HasPrefix(line, want) {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 9 {
			return 0, fmt.Errorf("/proc/stat: short line %q", line)
		}
		var ticks uint64
		for _, i := range []int{1, 2, 3, 6, 7, 8} { // user nice system irq softirq steal
			v, err := strconv.ParseUint(f[i], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/stat: %q: %w", line, err)
			}
			ticks += v
		}
		return time.Duration(ticks) * clockTick, nil
	}
	return 0, fmt.Errorf("/proc/stat has no line for CPU %d", cpu)
}
