package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/appliance/internal/cpupin"
	"github.com/lovelock-dpu/lovelock/appliance/internal/memcluster"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem/graph"
	"golang.org/x/sys/unix"
)

// layoutRows are two apps' rows: PageRank's time target met and not met,
// BFS's met.
func layoutRows() []row {
	a := hits(graph.PageRank, pathA, 0)
	a.memBytes, a.time = 100e6, 2*time.Second
	c := hits(graph.PageRank, pathC, 100)
	c.memBytes, c.time = 91e6, 3*time.Second
	return []row{a, c, hits(graph.PageRank, pathD, 937), hits(graph.BFS, pathA, 0), hits(graph.BFS, pathStride, 917)}
}

// TestLayoutVerdicts: the shared layout's lines are graphVerdicts' to the
// byte; the pinned layout names itself in the time target's lines, after
// the app, and leaves the other targets' lines as they are.
func TestLayoutVerdicts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pinned bool
		rows   []row
		want   []string // the time target's lines
	}{
		{"shared", false, layoutRows(), []string{
			"target (c)-(e) run time within 10 % of (a) or better, pagerank: (c) static offsets not met (1.50×), (d) dynamic edge cache, adjacent (SODA) met (0.50×)",
			"target (c)-(e) run time within 10 % of (a) or better, bfs: (e) dynamic, stride met (1.00×)",
		}},
		{"pinned", true, layoutRows(), []string{
			"target (c)-(e) run time within 10 % of (a) or better, pagerank, DPU on its own CPU: (c) static offsets not met (1.50×), (d) dynamic edge cache, adjacent (SODA) met (0.50×)",
			"target (c)-(e) run time within 10 % of (a) or better, bfs, DPU on its own CPU: (e) dynamic, stride met (1.00×)",
		}},
		{"shared, no rows", false, nil, []string{
			"target (c)-(e) run time within 10 % of (a) or better: not measured (no rows)",
		}},
		{"pinned, no rows", true, nil, []string{
			"target (c)-(e) run time within 10 % of (a) or better, DPU on its own CPU: not measured (no rows)",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := layoutVerdicts(layoutName(tc.pinned), tc.rows)
			shared := graphVerdicts(tc.rows)
			if !tc.pinned && strings.Join(got, "\n") != strings.Join(shared, "\n") {
				t.Errorf("shared layout:\n%s\nwant graphVerdicts':\n%s", strings.Join(got, "\n"), strings.Join(shared, "\n"))
			}
			if len(got) != len(shared) {
				t.Fatalf("%d lines, want %d (graphVerdicts'):\n%s", len(got), len(shared), strings.Join(got, "\n"))
			}
			var timeLines []string
			for i, l := range got {
				if strings.HasPrefix(l, "target (c)-(e) run time") {
					timeLines = append(timeLines, l)
					continue
				}
				if l != shared[i] {
					t.Errorf("line %d: %q, want it as in the shared layout: %q", i, l, shared[i])
				}
			}
			if strings.Join(timeLines, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("time target:\n%s\nwant:\n%s", strings.Join(timeLines, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// TestLayoutHeader: the shared layout prints no layout line (its output
// stays as it was); the pinned one says where each party runs.
func TestLayoutHeader(t *testing.T) {
	if got := layoutHeader(false); got != "" {
		t.Errorf("shared layout: %q, want no line", got)
	}
	got := layoutHeader(true)
	for _, w := range []string{
		"CPU layout: DPU on its own CPU: ",
		"dpu0's lovelockd on CPU 1 (started there again at each restart",
		"this process (the graph engine, every thread), host0's, host1's and mem0's lovelockd on CPU 0, for every row including (a)",
	} {
		if !strings.Contains(got, w) {
			t.Errorf("pinned layout: %q lacks %q", got, w)
		}
	}
}

func TestNeedCPUs(t *testing.T) {
	boom := errors.New("sched_getaffinity: boom")
	for _, tc := range []struct {
		name   string
		usable bool
		err    error
		want   string // "" for no error
	}{
		{"usable", true, nil, ""},
		{"one CPU", false, nil, "-pinned needs 2 CPUs: CPUs 0 and 1 in this process's affinity mask"},
		{"mask unreadable", false, boom, "-pinned: sched_getaffinity: boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := needCPUs(tc.usable, tc.err)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("needCPUs = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)):
				t.Errorf("needCPUs = %v, want %q", err, tc.want)
			case tc.err != nil && !errors.Is(err, tc.err):
				t.Errorf("needCPUs = %v, does not wrap %v", err, tc.err)
			}
		})
	}
}

// mask is the CPUs thread or process tid may run on, as a list.
func mask(t *testing.T, tid int) string {
	t.Helper()
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(tid, &set); err != nil {
		t.Fatal(err)
	}
	var cpus []string
	for c := range 64 {
		if set.IsSet(c) {
			cpus = append(cpus, fmt.Sprint(c))
		}
	}
	return strings.Join(cpus, ",")
}

// TestPinLayout: pinLayout puts dpu0's process on CPU 1 and mem0's,
// host0's, host1's and this one on CPU 0, and restore gives each its
// mask back; the shared layout (nil) does nothing.
func TestPinLayout(t *testing.T) {
	if err := needCPUs(cpupin.Usable(hostCPU, dpuCPU)); err != nil {
		t.Fatal(err)
	}
	daemon := func() *memcluster.Daemon {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return &memcluster.Daemon{Cmd: cmd}
	}
	cl := &memcluster.Cluster{Mem: daemon(), DPU: daemon(), Host: daemon()}
	host1 := daemon()
	procs := map[string]int{"dpu0": cl.DPU.Cmd.Process.Pid, "mem0": cl.Mem.Cmd.Process.Pid,
		"host0": cl.Host.Cmd.Process.Pid, "host1": host1.Cmd.Process.Pid, "this process": os.Getpid()}
	before := map[string]string{}
	for who, pid := range procs {
		before[who] = mask(t, pid)
	}
	l, err := pinLayout(cl, host1)
	if err != nil {
		t.Fatal(err)
	}
	pinnedMasks := map[string]string{}
	for who, pid := range procs {
		pinnedMasks[who] = mask(t, pid)
	}
	if err := l.restore(); err != nil {
		t.Fatal(err)
	}
	for who, pid := range procs {
		want := "0"
		if who == "dpu0" {
			want = "1"
		}
		if pinnedMasks[who] != want {
			t.Errorf("%s pinned to CPUs %s, want %s", who, pinnedMasks[who], want)
		}
		if got := mask(t, pid); got != before[who] {
			t.Errorf("%s restored to CPUs %s, want %s", who, got, before[who])
		}
	}
	if err := (*layout)(nil).restore(); err != nil {
		t.Errorf("shared layout's restore: %v", err)
	}
}
