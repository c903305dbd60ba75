package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/lovelock-dpu/lovelock/appliance/internal/cpupin"
	"github.com/lovelock-dpu/lovelock/appliance/internal/memcluster"
	"github.com/lovelock-dpu/lovelock/control/testbed"
)

// The pinned layout's CPUs (-pinned), as bench-mem's: the DPU's agent on
// one of its own, every other party on the host's.
const (
	hostCPU = 0
	dpuCPU  = 1
)

// pinnedLayout names the pinned layout in the time target's verdict lines.
const pinnedLayout = "DPU on its own CPU"

// layoutName is the layout the verdict lines name: none for the shared
// one, whose lines stay as they were.
func layoutName(pinned bool) string {
	if pinned {
		return pinnedLayout
	}
	return ""
}

// layoutHeader is the line above the table that says the CPU layout, or
// "" for the shared one (nothing printed: its output stays as it was).
func layoutHeader(pinned bool) string {
	if !pinned {
		return ""
	}
	return fmt.Sprintf("CPU layout: %s: dpu0's lovelockd on CPU %d (started there again at each restart, before the row's timed part); this process (the graph engine, every thread), host0's, host1's and mem0's lovelockd on CPU %d, for every row including (a); each node's kernel receive work on its node's CPU (DPUs' on %[2]d)",
		pinnedLayout, dpuCPU, hostCPU)
}

// needCPUs is -pinned's check of Usable's answer: an error unless CPUs
// hostCPU and dpuCPU are both in this process's mask.
func needCPUs(usable bool, err error) error {
	if err != nil {
		return fmt.Errorf("-pinned: %w", err)
	}
	if !usable {
		return fmt.Errorf("-pinned needs 2 CPUs: CPUs %d and %d in this process's affinity mask (see taskset -p %d); run without -pinned for the shared layout",
			hostCPU, dpuCPU, os.Getpid())
	}
	return nil
}

// steerLayout runs each node's kernel receive work on its node's CPU
// (cpupin.SteerAll: RPS on every interface): host0's, host1's and mem0's
// on hostCPU, dpu0's and dpu1's on dpuCPU, so that the DPUs' forwarding is
// the DPUs' work on every path, and the hosts' and the memory node's
// receive work stays on theirs whichever node sent; on veth it would run
// on the sending CPU. It returns a function that turns steering off again,
// the testbed's default.
func steerLayout(spec testbed.Spec) (unsteer func() error, err error) {
	cpus := map[string]int{}
	for _, n := range []string{"host0", "host1", "mem0"} {
		cpus[spec.Namespace(n)] = hostCPU
	}
	for _, n := range []string{"dpu0", "dpu1"} {
		cpus[spec.Namespace(n)] = dpuCPU
	}
	if unsteer, err = cpupin.SteerAll(cpus); err != nil {
		return nil, fmt.Errorf("-pinned: %w", err)
	}
	return unsteer, nil
}

// layout pins the run's parties (-pinned); a nil *layout is the shared
// layout and does nothing.
type layout struct {
	// saved are the parties that ran before the layout, restored at the
	// end: mem0's, host0's, host1's lovelockd and this process. dpu0's
	// first lovelockd is pinned too but dropped from it at its first
	// restart (it is gone); the ones started since began on dpuCPU and
	// had no other mask to go back to.
	saved []*cpupin.Saved
	dpu   *cpupin.Saved // dpu0's first lovelockd until its restart
}

// pinLayout pins dpu0's lovelockd to dpuCPU and mem0's, host0's, host1's
// lovelockd and this process to hostCPU, every thread of each.
func pinLayout(cl *memcluster.Cluster, host1 *memcluster.Daemon) (*layout, error) {
	l := &layout{}
	parties := []struct {
		who      string
		pid, cpu int
	}{
		{"dpu0's lovelockd", cl.DPU.Cmd.Process.Pid, dpuCPU},
		{"mem0's lovelockd", cl.Mem.Cmd.Process.Pid, hostCPU},
		{"host0's lovelockd", cl.Host.Cmd.Process.Pid, hostCPU},
		{"host1's lovelockd", host1.Cmd.Process.Pid, hostCPU},
		{"this process", os.Getpid(), hostCPU},
	}
	for i, p := range parties {
		s, err := cpupin.Pin(p.pid, p.cpu)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("-pinned: %s: %w", p.who, err), l.restore())
		}
		if i == 0 {
			l.dpu = s
			continue
		}
		l.saved = append(l.saved, s)
	}
	return l, nil
}

// restartDPU restarts dpu0's lovelockd (a fresh agent for the next row).
// In the pinned layout the new one is forked from a thread on dpuCPU, so
// it runs there from its first instruction, and its every thread is
// pinned again before the caller times anything.
func (l *layout) restartDPU(ctx context.Context, cl *memcluster.Cluster, spec testbed.Spec, bin string) error {
	if l == nil {
		return cl.Restart(ctx, spec, bin, cl.DPU)
	}
	l.dpu = nil // the process it saved is about to exit
	if err := cpupin.Thread(dpuCPU, func() error { return cl.Restart(ctx, spec, bin, cl.DPU) }); err != nil {
		return err
	}
	if _, err := cpupin.Pin(cl.DPU.Cmd.Process.Pid, dpuCPU); err != nil {
		return fmt.Errorf("-pinned: dpu0's restarted lovelockd: %w", err)
	}
	return nil
}

// restore gives every party the mask it had before pinLayout, the last
// pinned first.
func (l *layout) restore() error {
	if l == nil {
		return nil
	}
	var errs []error
	for i := len(l.saved) - 1; i >= 0; i-- {
		errs = append(errs, l.saved[i].Restore())
	}
	if l.dpu != nil {
		errs = append(errs, l.dpu.Restore())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("-pinned: restore the affinity: %w", err)
	}
	return nil
}
