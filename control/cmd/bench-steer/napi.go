package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	llnetns "github.com/lovelock-dpu/lovelock/control/netns"
)

// setThreaded makes the NAPI instances of f run in kernel threads of their
// own (/sys/class/net/<dev>/threaded) instead of in softirq on the CPU that
// scheduled them, and pins those threads to cpu (unless cpu < 0). On veth,
// that CPU is the sender's: without this, dut's XDP runs on the
// generator's core.
//
// A network device's sysfs directory is visible only through a sysfs
// mounted from its own network namespace (llnetns.DoSysfs).
func setThreaded(f iface, cpu int) (pids []int, err error) {
	err = llnetns.DoSysfs(f.ns, func() error {
		return os.WriteFile("/sys/class/net/"+f.name+"/threaded", []byte("1"), 0)
	})
	if err != nil {
		return nil, fmt.Errorf("threaded NAPI on %s: %w", f.name, err)
	}
	if pids, err = kthreads("napi/" + f.name + "-"); err == nil && len(pids) == 0 {
		err = errors.New("no such kernel thread")
	}
	if err != nil {
		return nil, fmt.Errorf("NAPI thread of %s: %w", f.name, err)
	}
	if cpu < 0 {
		return pids, nil
	}
	var set unix.CPUSet
	set.Set(cpu)
	for _, pid := range pids {
		if err := unix.SchedSetaffinity(pid, &set); err != nil {
			return nil, fmt.Errorf("pin NAPI thread %d of %s to CPU %d: %w", pid, f.name, cpu, err)
		}
	}
	return pids, nil
}

// kthreads returns the tasks whose name starts with prefix. NAPI threads
// are named napi/<dev>-<napi id>.
func kthreads(prefix string) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/comm")
		if err != nil {
			continue
		}
		// Kernels before 6.x cut a task's name to 15 bytes.
		comm := strings.TrimSuffix(string(b), "\n")
		if strings.HasPrefix(comm, prefix) || (len(comm) == 15 && strings.HasPrefix(prefix, comm)) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// taskCPU returns the CPU time (user + system) of task pid so far, or 0
// once it is gone.
func taskCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// pid (comm) state ...: fields from state on; utime and stime are
	// fields 14 and 15 of the line, in USER_HZ (100 on Linux) ticks.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseUint(f[11], 10, 64)
	s, _ := strconv.ParseUint(f[12], 10, 64)
	return time.Duration(u+s) * (time.Second / 100)
}
