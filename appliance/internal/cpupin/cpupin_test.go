package cpupin

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// helperEnv makes the test binary a child with threads of its own.
const helperEnv = "CPUPIN_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		helper()
		return
	}
	os.Exit(m.Run())
}

// helper parks goroutines on threads of their own, says "ready", and then,
// for each "spawn" line on stdin, parks 8 more and prints their thread ids:
// threads started after the test pinned it. It exits at the end of stdin.
func helper() {
	park := func(n int) []int {
		tids := make(chan int)
		for range n {
			go func() {
				runtime.LockOSThread() // never unlocked: the thread stays this goroutine's
				tids <- unix.Gettid()
				select {}
			}()
		}
		var out []int
		for range n {
			out = append(out, <-tids)
		}
		return out
	}
	park(4)
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		fmt.Println(strings.Trim(fmt.Sprint(park(8)), "[]"))
	}
}

// allowed is Cpus_allowed_list of each thread of pid, by thread id.
func allowed(t *testing.T, pid int) map[int]string {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, task := range tasks {
		tid, _ := strconv.Atoi(task.Name())
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/status", pid, tid))
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
				out[tid] = strings.TrimSpace(v)
			}
		}
		if _, ok := out[tid]; !ok {
			t.Fatalf("thread %d: no Cpus_allowed_list in its status", tid)
		}
	}
	return out
}

// TestPinRestore pins a child's every thread to CPU 0 (there on a 1-CPU
// machine too), checks each thread's Cpus_allowed_list, restores, and
// checks that each is back to what it was; with spawn, threads the child
// starts while pinned inherit CPU 0 and are restored to the process's mask.
func TestPinRestore(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		cmd        *exec.Cmd
		ready      bool // the child says "ready" once its threads run
		minThreads int
		spawn      bool
	}{
		{"sleep", exec.Command("sleep", "10"), false, 1, false},
		{"threads", func() *exec.Cmd {
			c := exec.Command(self)
			c.Env = append(os.Environ(), helperEnv+"=1")
			return c
		}(), true, 5, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdin, err := tc.cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			stdout, err := tc.cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			tc.cmd.Stderr = os.Stderr
			if err := tc.cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tc.cmd.Process.Kill(); _ = tc.cmd.Wait() })
			out := bufio.NewReader(stdout)
			if tc.ready {
				if line, err := out.ReadString('\n'); err != nil || line != "ready\n" {
					t.Fatalf("child said %q, %v; want ready", line, err)
				}
			}
			pid := tc.cmd.Process.Pid
			before := allowed(t, pid)
			procBefore := before[pid]
			if len(before) < tc.minThreads {
				t.Fatalf("child has %d threads, want at least %d", len(before), tc.minThreads)
			}

			s, err := Pin(pid, 0)
			if err != nil {
				t.Fatal(err)
			}
			pinned := allowed(t, pid)
			if tc.spawn {
				if _, err := io.WriteString(stdin, "spawn\n"); err != nil {
					t.Fatal(err)
				}
				line, err := out.ReadString('\n')
				if err != nil {
					t.Fatalf("spawn: %v", err)
				}
				pinned = allowed(t, pid)
				fresh := 0
				for f := range strings.FieldsSeq(line) {
					tid, err := strconv.Atoi(f)
					if err != nil {
						t.Fatalf("spawn said %q", line)
					}
					if _, ok := before[tid]; !ok {
						fresh++
					}
				}
				if fresh == 0 {
					t.Fatalf("spawn started no new thread (%q); the test needs one", line)
				}
			}
			for tid, list := range pinned {
				if list != "0" {
					t.Errorf("pinned: thread %d allowed on %q, want 0", tid, list)
				}
			}

			if err := s.Restore(); err != nil {
				t.Fatal(err)
			}
			for tid, list := range allowed(t, pid) {
				want, ok := before[tid]
				if !ok {
					want = procBefore // started while pinned
				}
				if list != want {
					t.Errorf("restored: thread %d allowed on %q, want %q", tid, list, want)
				}
			}
		})
	}
}

// TestThread checks that Thread pins the calling thread, that a child it
// forks inherits the pin, and that the thread's mask is back afterwards.
func TestThread(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	self := func() string { return allowedTask(t, os.Getpid(), unix.Gettid()) }
	before := self()
	cmd := exec.Command("sleep", "10")
	err := Thread(0, func() error {
		if got := self(); got != "0" {
			t.Errorf("inside Thread: allowed on %q, want 0", got)
		}
		return cmd.Start()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if got := allowed(t, cmd.Process.Pid)[cmd.Process.Pid]; got != "0" {
		t.Errorf("child forked inside Thread: allowed on %q, want 0", got)
	}
	if got := self(); got != before {
		t.Errorf("after Thread: allowed on %q, want %q as before", got, before)
	}
}

func allowedTask(t *testing.T, pid, tid int) string {
	t.Helper()
	list, ok := allowed(t, pid)[tid]
	if !ok {
		t.Fatalf("no thread %d in process %d", tid, pid)
	}
	return list
}

func TestUsable(t *testing.T) {
	for _, tc := range []struct {
		cpus []int
		want bool
	}{
		{[]int{0}, true},
		{nil, true},
		// The last CPU a mask holds: no machine this runs on has 1024.
		{[]int{0, 1023}, false},
	} {
		got, err := Usable(tc.cpus...)
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("Usable(%v) = %v, want %v", tc.cpus, got, tc.want)
		}
	}
}
