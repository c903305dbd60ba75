package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/lovelock-dpu/lovelock/appliance/internal/cpupin"
)

// The pinned layout's CPUs: the DPU's agent on one of its own, every other
// party on the host's, as bench-ingest splits host and DPU.
const (
	hostCPU = 0
	dpuCPU  = 1
)

// pinnedLayout names the pinned layout in its verdict lines.
const pinnedLayout = "DPU on its own CPU"

// pinnedSection measures both paths at n requesters with dpu0's agent on
// a CPU of its own and prints them (-pinned), or says why it cannot.
func (b *bench) pinnedSection(ctx context.Context, n int) error {
	usable, err := cpupin.Usable(hostCPU, dpuCPU)
	if err != nil {
		return err
	}
	var rows map[string][2]point
	if usable {
		if rows, err = b.pinnedRows(ctx, n); err != nil {
			return err
		}
	}
	return writePinned(os.Stdout, n, rows)
}

// pinnedRows measures reads and writes at n requesters, directly and
// through the agent, with the parties pinned (pinLayout) for both paths,
// so that the agent's hop is the only difference; every process's and
// thread's affinity is restored before it returns.
func (b *bench) pinnedRows(ctx context.Context, n int) (rows map[string][2]point, err error) {
	restore, err := b.pinLayout()
	if err != nil {
		return nil, err
	}
	defer func() {
		if rerr := restore(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("the pinned layout: restore the affinity (the later sections would run pinned): %w", rerr))
		}
	}()
	unsteer, err := b.steerLayout()
	if err != nil {
		return nil, err
	}
	defer func() {
		if rerr := unsteer(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("the pinned layout: turn receive steering off again: %w", rerr))
		}
	}()
	rows = map[string][2]point{}
	for _, write := range []bool{false, true} {
		d, err := b.chunks(ctx, memAddr, n, write, 0)
		if err != nil {
			return nil, err
		}
		a, err := b.chunks(ctx, agentAddr, n, write, 0)
		if err != nil {
			return nil, err
		}
		rows[opName(write)] = [2]point{d, a}
	}
	return rows, nil
}

// pinLayout pins dpu0's lovelockd to dpuCPU and this process (the
// requesters), host0's and mem0's lovelockd to hostCPU, every thread of
// each, and returns a function that restores them all.
func (b *bench) pinLayout() (restore func() error, err error) {
	parties := []struct {
		who      string
		pid, cpu int
	}{
		{"dpu0's lovelockd", b.cluster.DPU.Cmd.Process.Pid, dpuCPU},
		{"mem0's lovelockd", b.cluster.Mem.Cmd.Process.Pid, hostCPU},
		{"host0's lovelockd", b.cluster.Host.Cmd.Process.Pid, hostCPU},
		{"this process", os.Getpid(), hostCPU},
	}
	var saved []*cpupin.Saved
	restore = func() error {
		var errs []error
		for i := len(saved) - 1; i >= 0; i-- {
			errs = append(errs, saved[i].Restore())
		}
		return errors.Join(errs...)
	}
	for _, p := range parties {
		s, err := cpupin.Pin(p.pid, p.cpu)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("the pinned layout (-pinned=false skips it): %s: %w", p.who, err), restore())
		}
		saved = append(saved, s)
	}
	return restore, nil
}

// steerLayout runs each node's kernel receive work on its node's CPU
// (cpupin.SteerAll: RPS on every interface): host0's and mem0's on
// hostCPU, dpu0's on dpuCPU, so that dpu0's forwarding on (a)'s path and
// its agent's sockets on (b)'s are the DPU's work, and the host's and the
// memory node's receive work stays on theirs whichever node sent. It
// returns a function that turns steering off again, the testbed's default.
func (b *bench) steerLayout() (unsteer func() error, err error) {
	unsteer, err = cpupin.SteerAll(map[string]int{
		b.spec.Namespace("host0"): hostCPU, b.spec.Namespace("mem0"): hostCPU, b.spec.Namespace("dpu0"): dpuCPU,
	})
	if err != nil {
		return nil, fmt.Errorf("the pinned layout (-pinned=false skips it): %w", err)
	}
	return unsteer, nil
}

// writePinned prints the pinned layout's section: its table and verdict
// lines from rows (op → direct, via agent, at n requesters), or, with no
// rows, that it was not measured for want of the CPUs.
func writePinned(w io.Writer, n int, rows map[string][2]point) error {
	fmt.Fprintf(w, "\n%d requesters (the -requesters maximum), DPU agent on a CPU of its own: dpu0's lovelockd and kernel receive work on CPU %d; this process (the requesters), host0's and mem0's lovelockd and kernel receive work on CPU %d, on both paths\n",
		n, dpuCPU, hostCPU)
	if rows == nil {
		_, err := fmt.Fprintf(w, "not measured: needs 2 CPUs (CPUs %d and %d in this process's affinity mask)\n", hostCPU, dpuCPU)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, pairHeader)
	for _, op := range []string{"read", "write"} {
		if pair, ok := rows[op]; ok {
			fmt.Fprintln(tw, pairRow(op, n, pair[0], pair[1]))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, op := range []string{"read", "write"} {
		verdictRows := map[int][2]point{}
		if pair, ok := rows[op]; ok {
			verdictRows[n] = pair
		}
		if _, err := fmt.Fprintln(w, layoutTargetLine(pinnedLayout, op, verdictRows)); err != nil {
			return err
		}
	}
	return nil
}

func opName(write bool) string {
	if write {
		return "write"
	}
	return "read"
}
