// Package cpupin pins processes and threads to CPUs for the benchmarks
// that model a host and its DPU on one machine (bench-ingest, bench-mem):
// host processes on one CPU, DPU processes on another, as a DPU's own Arm
// cores would separate them.
//
// A process is pinned by setting the mask of every thread listed in
// /proc/PID/task; threads it starts later inherit the mask of the thread
// that starts them, so the whole process stays on the CPU.
package cpupin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	llnetns "github.com/lovelock-dpu/lovelock/control/netns"
)

// maxPasses bounds how often Pin and Restore list a process's threads
// again while new ones keep appearing.
const maxPasses = 100

// Saved is the affinity of a process's threads before Pin changed it.
type Saved struct {
	pid int
	// proc is the process's mask before Pin (its main thread's): what
	// threads started since, which Pin never saw, are restored to.
	proc    unix.CPUSet
	threads map[int]unix.CPUSet
}

// Pin sets the mask of every thread of process pid to cpu alone and
// returns the masks they had, for Restore. A thread that exits meanwhile
// is skipped. On an error the threads already pinned are restored.
func Pin(pid, cpu int) (*Saved, error) {
	s := &Saved{pid: pid, threads: map[int]unix.CPUSet{}}
	if err := unix.SchedGetaffinity(pid, &s.proc); err != nil {
		return nil, fmt.Errorf("cpupin: affinity of process %d: %w", pid, err)
	}
	var one unix.CPUSet
	one.Set(cpu)
	first := true
	err := eachThread(pid, func(tid int) error {
		old := s.proc
		// A thread that appears in a later pass may have been started
		// by one already pinned: its mask is not what it had before.
		if first {
			if err := unix.SchedGetaffinity(tid, &old); err != nil {
				return err
			}
		}
		s.threads[tid] = old
		return unix.SchedSetaffinity(tid, &one)
	}, func() { first = false })
	if err != nil {
		_ = s.Restore()
		return nil, fmt.Errorf("cpupin: pin process %d to CPU %d: %w", pid, cpu, err)
	}
	return s, nil
}

// Restore sets every thread of the process back to the mask it had before
// Pin; threads started since get the mask the process had.
func (s *Saved) Restore() error {
	err := eachThread(s.pid, func(tid int) error {
		set, ok := s.threads[tid]
		if !ok {
			set = s.proc
		}
		return unix.SchedSetaffinity(tid, &set)
	}, func() {})
	if err != nil {
		return fmt.Errorf("cpupin: restore the affinity of process %d: %w", s.pid, err)
	}
	return nil
}

// eachThread calls fn once for each thread of process pid, listing
// /proc/PID/task again after each pass (and calling pass) until a listing
// shows no thread fn has not seen: a thread started during a pass by one
// fn had not reached yet is caught by the next. Threads that exit before
// fn reaches them (ESRCH) are skipped.
func eachThread(pid int, fn func(tid int) error, pass func()) error {
	seen := map[int]bool{}
	for range maxPasses {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return err
		}
		fresh := false
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil || seen[tid] {
				continue
			}
			seen[tid], fresh = true, true
			if err := fn(tid); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("thread %d: %w", tid, err)
			}
		}
		if !fresh {
			return nil
		}
		pass()
	}
	return fmt.Errorf("new threads still appearing after %d listings of /proc/%d/task", maxPasses, pid)
}

// Thread runs fn on the calling goroutine's OS thread pinned to cpu, then
// restores the thread's mask. A process that fn forks (exec.Cmd.Start)
// inherits the pinned mask, so its runtime is on cpu from its first
// instruction.
func Thread(cpu int, fn func() error) error {
	// Locked, so that the mask set and the one restored are the same
	// thread's (a caller that locked already stays locked).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return fmt.Errorf("cpupin: sched_getaffinity: %w", err)
	}
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("cpupin: pin the thread to CPU %d: %w", cpu, err)
	}
	defer unix.SchedSetaffinity(0, &old)
	return fn()
}

// Usable reports whether this process may run on each of cpus (its mask
// holds them): what pinning to them needs.
func Usable(cpus ...int) (bool, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(os.Getpid(), &set); err != nil {
		return false, fmt.Errorf("cpupin: sched_getaffinity: %w", err)
	}
	for _, c := range cpus {
		if !set.IsSet(c) {
			return false, nil
		}
	}
	return true, nil
}

// SteerReceive sets receive packet steering (RPS) on every interface but
// lo of the named network namespace (one under /run/netns, as the testbed
// makes them) to the CPUs in mask; a mask of 0 turns it off, the default.
// On veth the stack's receive work runs on the sending CPU, so a node's
// receive work would be charged to whichever node sent to it: RPS moves it
// onto the node's own CPU, as a NIC's interrupt on the receiving machine
// would. It writes the namespace's own sysfs from Go (netns.DoSysfs), so
// it needs no ip command.
func SteerReceive(name string, mask uint64) error {
	ns, err := netns.GetFromName(name)
	if err != nil {
		return fmt.Errorf("cpupin: receive steering: network namespace %s: %w", name, err)
	}
	defer ns.Close()
	err = llnetns.DoSysfs(ns, func() error {
		queues, err := filepath.Glob("/sys/class/net/*/queues/rx-*/rps_cpus")
		if err != nil {
			return err
		}
		for _, q := range queues {
			if strings.HasPrefix(q, "/sys/class/net/lo/") {
				continue
			}
			if err := os.WriteFile(q, []byte(strconv.FormatUint(mask, 16)), 0); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("cpupin: receive steering in network namespace %s: %w", name, err)
	}
	return nil
}

// SteerAll runs SteerReceive for each namespace with its CPU (netns name →
// CPU) and returns a function that turns steering off in all of them
// again. On an error the namespaces already steered are turned off.
func SteerAll(cpus map[string]int) (off func() error, err error) {
	off = func() error {
		var errs []error
		for ns := range cpus {
			errs = append(errs, SteerReceive(ns, 0))
		}
		return errors.Join(errs...)
	}
	for ns, cpu := range cpus {
		if err := SteerReceive(ns, 1<<cpu); err != nil {
			return nil, errors.Join(err, off())
		}
	}
	return off, nil
}
