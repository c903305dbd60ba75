package hostagent

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
)

// leakRig is an extRig with testdata/worker.py's model leak, whose workers
// leave processes behind.
func leakRig(t *testing.T, tweak func(*Config)) *extRig {
	return newExtRig(t, func(c *Config) {
		c.RunTimeout = time.Second
		c.Models = append(c.Models, model.NewExternal("leak", 1, func(n int) int { return n }))
		if tweak != nil {
			tweak(c)
		}
	})
}

// readPid waits for worker.py's pid file dir/name.
func readPid(t *testing.T, dir, name string) int {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err == nil {
			pid, err := strconv.Atoi(string(b))
			if err != nil {
				t.Fatalf("pid file %s: %q", name, b)
			}
			return pid
		}
	}
	t.Fatalf("no pid file %s in 20s", name)
	return 0
}

// pidfdOf opens pid's process, which the test kills when it ends.
func pidfdOf(t *testing.T, pid int) int {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	t.Cleanup(func() {
		unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		unix.Close(fd)
	})
	return fd
}

// goneWithin waits up to d for pidfd's process to end.
func goneWithin(pidfd int, d time.Duration) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		if n, _ := unix.Poll(fds, 100); n > 0 {
			return true
		}
	}
	return false
}

// runRetrying runs a request, ringing again while the slot is refused as
// busy, as the DPU does with a retryable answer.
func (r *extRig) runRetrying(slot int, mdl string, input []byte) ingest.Ctrl {
	r.t.Helper()
	var c ingest.Ctrl
	for range 200 {
		if c = r.run(slot, mdl, input); c.Status != ingest.StatusOverloaded {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return c
}

func leakInput(mode byte) []byte {
	return append([]byte{mode}, bytes.Repeat([]byte("A"), 63)...)
}

// TestExternalLeftovers: a worker that overran the run timeout leaves a
// process behind that still holds the slot's output buffer (a forked
// child, with the mapping; a double-forked daemon, reparented away from
// the worker; a subprocess given only the descriptor, which it maps when
// it writes), and that process writes its late output over the next
// request's. The agent finds it by the buffer's inode in /proc and kills
// it before the slot goes to another request, so the next request on the
// slot, run by another worker, is answered with its own output. The child
// of a worker that is fine (a pool process), which holds every buffer as
// well, is left alone, and so are a daemon a worker that is fine
// double-forked (reparented out of its tree, holding the buffers and their
// descriptors; before, it was killed as a leftover of the lost worker's)
// and the new worker.
func TestExternalLeftovers(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode byte
	}{
		{"forked child", 'f'},
		{"double-forked daemon", 'd'},
		{"subprocess given the descriptor", 'x'},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := leakRig(t, nil)
			dir := t.TempDir()
			r.worker("affine", 1, dir, "keep-child")
			bystander := pidfdOf(t, readPid(t, dir, "bystander"))
			keeper := r.worker("affine", 2, dir, "keep-daemon")
			daemon := readPid(t, dir, "daemon")
			daemonfd := pidfdOf(t, daemon)
			for p := daemon; p > 1; {
				if p == keeper.Cmd.Process.Pid {
					t.Fatalf("the daemon (pid %d) is its worker's descendant", daemon)
				}
				if _, p, _ = procStat("/proc", p); p == 0 {
					break
				}
			}
			w1 := r.worker("leak", 1, dir)
			wantFailure(t, r.run(0, "leak", leakInput(tc.mode)), ingest.StatusModelFailed, "did not answer within 1s")
			holder := readPid(t, dir, "holder")
			hfd := pidfdOf(t, holder)
			r.waitWorkers("leak", 0, nil)
			r.worker("leak", 1, dir)
			b := bytes.Repeat([]byte("B"), 64)
			wantOK(t, r.runRetrying(0, "leak", b), len(b))
			// The leftover has written its late output, or never will.
			if !goneWithin(hfd, 20*time.Second) {
				t.Fatalf("the leftover (pid %d) still runs", holder)
			}
			if got := r.read(0, 1, len(b)); !bytes.Equal(got, b) {
				t.Fatalf("slot 0's output after request B: %q, want B's %q: the %s (pid %d) of the worker killed for overrunning request A wrote over it", got, b, tc.name, holder)
			}
			if exited, _ := w1.Wait(20 * time.Second); !exited {
				t.Fatalf("the worker that overran still runs:\n%s", w1.Output())
			}
			if !alive(bystander) {
				t.Error("the child of a worker that is fine was killed")
			}
			if !alive(daemonfd) {
				t.Errorf("the daemon (pid %d) a worker that is fine double-forked was killed", daemon)
			}
			if s := r.agent.Stats(); s.LeftoversKilled != 1 || s.Workers["leak"] != 1 || s.Workers["affine"] != 2 {
				t.Errorf("stats: %+v; want one leftover killed, the new worker and the other model's attached", s)
			}
			c := append([]byte("C"), bytes.Repeat([]byte("c"), 31)...)
			wantOK(t, r.run(1, "leak", c), len(c))
			if got := r.read(1, 1, len(c)); !bytes.Equal(got, c) {
				t.Fatalf("the new worker's output: %q, want %q", got, c)
			}
		})
	}
}

// signalWithoutCapKill sends sig through pidfd from a thread whose
// effective capabilities lack CAP_KILL: the kernel then lets it signal
// only its own user's processes (root's, here), as it lets a host agent
// that is not root, and answers EPERM for another user's.
func signalWithoutCapKill(pidfd int, sig unix.Signal) error {
	runtime.LockOSThread()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var caps [2]unix.CapUserData
	if err := unix.Capget(&hdr, &caps[0]); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	saved := caps
	caps[0].Effective &^= 1 << unix.CAP_KILL
	if err := unix.Capset(&hdr, &caps[0]); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	err := unix.PidfdSendSignal(pidfd, sig, nil, 0)
	if unix.Capset(&hdr, &saved[0]) == nil {
		runtime.UnlockOSThread()
	} // else the thread, locked, ends with its goroutine
	return err
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestExternalCannotKill: a process holding the slot buffers that the
// agent may not kill (another user's, and the agent without CAP_KILL)
// keeps the slot taken while it lives, with a warning naming it; doorbells
// for the slot are refused as overloaded meanwhile. Once its owner kills
// it, the next request runs. Both the worker itself (become user nobody
// mid-run) and a worker's leftover (a forked child become nobody).
func TestExternalCannotKill(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run the worker's processes as another user")
	}
	for _, tc := range []struct {
		name string
		mode byte
		attr string // the warning's attribute for the pid
	}{
		{"the worker", 'U', "pid"},
		{"a forked child", 'u', "holder_pid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &syncBuffer{}
			r := leakRig(t, func(c *Config) {
				c.signal = signalWithoutCapKill
				c.Logger = slog.New(slog.NewTextHandler(logs, nil))
			})
			dir := t.TempDir()
			w1 := r.worker("leak", 1, dir)
			wantFailure(t, r.run(0, "leak", leakInput(tc.mode)), ingest.StatusModelFailed, "did not answer within 1s")
			pid := w1.Cmd.Process.Pid
			if tc.mode == 'u' {
				pid = readPid(t, dir, "holder")
			}
			pfd := pidfdOf(t, pid)
			r.waitWorkers("leak", 0, nil)
			r.worker("leak", 1, dir)
			b := bytes.Repeat([]byte("B"), 64)
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
				wantFailure(t, r.run(0, "leak", b), ingest.StatusOverloaded, "GPU 0 slot 0 is still running an earlier request: retry")
			}
			warning := regexp.MustCompile(`level=WARN msg="[^"]*could not be killed[^\n]* ` + tc.attr + `=` + strconv.Itoa(pid) + `( |\n)`)
			if !warning.MatchString(logs.String()) {
				t.Errorf("no warning that pid %d could not be killed:\n%s", pid, logs)
			}
			if !alive(pfd) {
				t.Fatalf("pid %d was killed: the agent's kill, without CAP_KILL, should have failed", pid)
			}
			// Its owner kills it: the slot is free again.
			if err := unix.PidfdSendSignal(pfd, unix.SIGKILL, nil, 0); err != nil {
				t.Fatal(err)
			}
			wantOK(t, r.runRetrying(0, "leak", b), len(b))
			if got := r.read(0, 1, len(b)); !bytes.Equal(got, b) {
				t.Fatalf("slot 0's output after request B: %q, want %q", got, b)
			}
			if s := r.agent.Stats(); s.LeftoversKilled != 0 {
				t.Errorf("stats: %+v; want no leftover killed", s)
			}
			if strings.Contains(logs.String(), "killed a process left by a worker") {
				t.Errorf("the log says a process was killed:\n%s", logs)
			}
		})
	}
}

// TestExternalLostMidRun: a worker that goes away in the middle of a run,
// long before the run timeout, leaves behind a process that still maps the
// slot's output buffer and writes its late output over the next request's:
// a forked child of a worker that exits, or that closes its socket and
// lives on; or the worker's own process, alive after it closed its socket,
// or after it broke the protocol (a done for another request) and was
// disconnected. The request it ran fails as model-failed, with no bytes;
// the agent kills the worker's process if it still lives and the
// processes it left holding the slot buffers, and gives the slot to no
// other request before they are gone, so the next request on the slot,
// run by another worker, is answered with its own output.
func TestExternalLostMidRun(t *testing.T) {
	for _, tc := range []struct {
		name      string
		mode      byte
		want      string // in request A's answer
		child     bool   // the late writer is a child, in DIR/holder; else the worker
		leftovers uint64
	}{
		{"exits, leaving a forked child", 'e', "disconnected while running this request", true, 1},
		{"closes its socket, leaving a forked child", 'c', "disconnected while running this request", true, 1},
		{"closes its socket and writes late itself", 'w', "disconnected while running this request", false, 0},
		{"answers another request and writes late itself", 'p', `answered "done" for request`, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Far beyond the test's runs: the run timeout must not be
			// what ends request A.
			r := leakRig(t, func(c *Config) { c.RunTimeout = 20 * time.Second })
			dir := t.TempDir()
			w1 := r.worker("leak", 1, dir)
			holder := w1.Cmd.Process.Pid
			hfd := pidfdOf(t, holder)
			c := r.run(0, "leak", leakInput(tc.mode))
			wantFailure(t, c, ingest.StatusModelFailed, tc.want)
			if tc.child {
				holder = readPid(t, dir, "holder")
				hfd = pidfdOf(t, holder)
			}
			r.waitWorkers("leak", 0, nil)
			r.worker("leak", 1, dir)
			b := bytes.Repeat([]byte("B"), 64)
			wantOK(t, r.runRetrying(0, "leak", b), len(b))
			// The late writer has written, or never will.
			if !goneWithin(hfd, 20*time.Second) {
				t.Fatalf("the late writer (pid %d) still runs", holder)
			}
			if got := r.read(0, 1, len(b)); !bytes.Equal(got, b) {
				t.Fatalf("slot 0's output after request B: %q, want B's %q: pid %d, left by the worker lost while it ran request A, wrote over it", got, b, holder)
			}
			if exited, _ := w1.Wait(20 * time.Second); !exited {
				t.Fatalf("the worker lost mid-run still runs:\n%s", w1.Output())
			}
			if s := r.agent.Stats(); s.LeftoversKilled != tc.leftovers || s.WorkerLost != 1 || s.Workers["leak"] != 1 {
				t.Errorf("stats: %+v; want %d leftovers killed, one worker lost, the new worker attached", s, tc.leftovers)
			}
		})
	}
}

// TestExternalNoPidfd: where no pidfd can be opened (a kernel without
// them; the opener fails here), the agent kills nothing, since a kill by
// pid could hit another process given the same pid: a worker lost mid-run
// that it has no pidfd of, or a leftover it cannot open, keeps the slot
// taken while it lives, with a warning naming it; doorbells for the slot
// are refused as overloaded meanwhile. Once its owner kills it, the next
// request runs.
func TestExternalNoPidfd(t *testing.T) {
	for _, tc := range []struct {
		name  string
		model string
		input []byte
		child bool   // the process left is the worker's child, in DIR/holder
		warn  string // in the warning naming it
		attr  string // the warning's attribute for the pid
	}{
		{"the worker", "affine", trigger(-3, 1), false, "a worker lost mid-run cannot be killed", "pid"},
		{"a forked child", "leak", leakInput('f'), true, "cannot be killed (no pidfd)", "holder_pid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &syncBuffer{}
			var noPidfd atomic.Bool // every pidfd_open fails
			r := leakRig(t, func(c *Config) {
				c.Logger = slog.New(slog.NewTextHandler(logs, nil))
				c.pidfdOpen = func(pid, flags int) (int, error) {
					if noPidfd.Load() {
						return -1, unix.ENOSYS
					}
					return unix.PidfdOpen(pid, flags)
				}
			})
			dir := t.TempDir()
			if !tc.child {
				noPidfd.Store(true) // the worker attaches without a pidfd
			}
			w1 := r.worker(tc.model, 1, dir)
			if tc.child {
				noPidfd.Store(true) // the worker has one; its leftover will not
			}
			wantFailure(t, r.run(0, tc.model, tc.input), ingest.StatusModelFailed, "did not answer within 1s")
			pid := w1.Cmd.Process.Pid
			if tc.child {
				pid = readPid(t, dir, "holder")
				r.waitWorkers(tc.model, 0, nil)
			}
			pfd := pidfdOf(t, pid)
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
				wantFailure(t, r.run(0, tc.model, tc.input), ingest.StatusOverloaded, "GPU 0 slot 0 is still running an earlier request: retry")
			}
			warning := regexp.MustCompile(`level=WARN msg="[^"]*` + regexp.QuoteMeta(tc.warn) + `[^\n]* ` + tc.attr + `=` + strconv.Itoa(pid) + `( |\n)`)
			if !warning.MatchString(logs.String()) {
				t.Errorf("no warning that pid %d cannot be killed:\n%s", pid, logs)
			}
			if !alive(pfd) {
				t.Fatalf("pid %d was killed without a pidfd", pid)
			}
			// Its owner kills it: the slot is free again.
			if err := unix.PidfdSendSignal(pfd, unix.SIGKILL, nil, 0); err != nil {
				t.Fatal(err)
			}
			r.waitWorkers(tc.model, 0, nil)
			r.worker(tc.model, 1, dir)
			in := affineInput(1, 2)
			if c := r.runRetrying(0, tc.model, in); c.Status != ingest.StatusOK || int(c.Length) != len(in) {
				t.Fatalf("the next request: %s %q", c.Status, c.Text)
			}
			if s := r.agent.Stats(); s.LeftoversKilled != 0 {
				t.Errorf("stats: %+v; want no leftover killed", s)
			}
		})
	}
}
