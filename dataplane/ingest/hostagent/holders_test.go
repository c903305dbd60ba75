package hostagent

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/hostagent/workertest"
)

func newMemfd(t testing.TB, name string, size int) int {
	t.Helper()
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	return fd
}

// startHolder runs testdata/holder.py in mode with a copy of fd as its
// descriptor 3, and returns once it holds it.
func startHolder(t *testing.T, mode string, fd int) *exec.Cmd {
	t.Helper()
	pidfile := filepath.Join(t.TempDir(), "pid")
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(dup), "memfd")
	defer f.Close()
	cmd := exec.Command(workertest.Python(t), filepath.Join("testdata", "holder.py"), mode, pidfile)
	cmd.ExtraFiles = []*os.File{f}
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(pidfile); err == nil {
			return cmd
		}
		select {
		case <-exited:
			t.Fatalf("holder %s exited: %s", mode, out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("holder %s: no pid file in 20s", mode)
		}
	}
}

func findHolder(hs []holder, pid int) (string, bool) {
	for _, h := range hs {
		if h.pid == pid {
			return h.how, true
		}
	}
	return "", false
}

// TestProcScanner: a scan of /proc finds every process that maps a memfd
// or holds a descriptor of it, however it holds it (a thread's own
// descriptor table, a process whose first thread has exited), and only
// those: not the scanning process, which maps it too, nor holders of
// another memfd; a killed holder (a zombie until reaped) holds nothing.
func TestProcScanner(t *testing.T) {
	buf := newMemfd(t, "lovelock-ingest-test", 4096)
	other := newMemfd(t, "lovelock-ingest-other", 4096)
	id, err := fileIDOf(buf)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(buf, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	s := newProcScanner(map[fileID]string{id: "the test buffer"})
	for _, tc := range []struct {
		mode string
		fd   int
		want string // "": not a holder
	}{
		{"map", buf, "maps the test buffer"},
		{"fd", buf, "holds descriptor 3 of the test buffer"},
		{"thread-fd", buf, "holds descriptor 3 of the test buffer"},
		{"leader-exit", buf, "maps the test buffer"},
		{"map", other, ""},
		{"fd", other, ""},
	} {
		name := tc.mode
		if tc.fd == other {
			name += " another memfd"
		}
		t.Run(name, func(t *testing.T) {
			cmd := startHolder(t, tc.mode, tc.fd)
			pid := cmd.Process.Pid
			hs, err := s.scan()
			if err != nil {
				t.Fatal(err)
			}
			if how, _ := findHolder(hs, os.Getpid()); how != "" {
				t.Errorf("the scanning process is reported: %s", how)
			}
			how, _ := findHolder(hs, pid)
			again, _ := s.holds(pid)
			if how != tc.want || again != tc.want {
				t.Fatalf("holder %d: scan says %q, a look at it %q; want %q (%d processes, %d threads, %d descriptors, %d map lines, %d unreadable)",
					pid, how, again, tc.want, s.procs, s.threads, s.descriptors, s.mapLines, s.unreadable)
			}
			if tc.want == "" {
				return
			}
			// Killed, not yet reaped: a zombie, with no mappings or
			// descriptors left.
			cmd.Process.Kill()
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if how, _ := s.holds(pid); how == "" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("holder %d still holds the buffer 10s after it was killed", pid)
				}
			}
		})
	}
}

func TestParseMapsLine(t *testing.T) {
	for _, tc := range []struct {
		line string
		want fileID
		ok   bool
	}{
		{"7f1c2a000000-7f1c2a004000 rw-s 00000000 00:01 4242                       /memfd:lovelock-ingest-0 (deleted)", fileID{unix.Mkdev(0, 1), 4242}, true},
		{"55e251024000-55e251028000 r--p 00000000 103:02 1835019                   /usr/bin/cat", fileID{unix.Mkdev(0x103, 2), 1835019}, true},
		{"7ffd5a3e1000-7ffd5a402000 rw-p 00000000 00:00 0                          [stack]", fileID{}, false},
		{"7ffd5a3e1000-7ffd5a402000 rw-p 00000000 00:00", fileID{}, false},
		{"garbage", fileID{}, false},
	} {
		got, ok := parseMapsLine([]byte(tc.line))
		if got != tc.want || ok != tc.ok {
			t.Errorf("%q: %v %v, want %v %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}

func TestProcStat(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "7"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "7", "stat"), []byte("7 (a (b) c) S 42 7 7 0 -1 4194560 0 0 0 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	comm, ppid, err := procStat(dir, 7)
	if comm != "a (b) c" || ppid != 42 || err != nil {
		t.Fatalf("procStat: %q %d %v", comm, ppid, err)
	}
}

// BenchmarkScan scans this machine's /proc for one memfd, with n more
// processes (sleep, a few mappings and descriptors each) beside what runs.
func BenchmarkScan(b *testing.B) {
	fd := newMemfd(b, "lovelock-ingest-bench", 4096)
	id, err := fileIDOf(fd)
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{0, 1000} {
		b.Run(strconv.Itoa(n)+" more processes", func(b *testing.B) {
			for range n {
				cmd := exec.Command("sleep", "600")
				if err := cmd.Start(); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			}
			s := newProcScanner(map[fileID]string{id: "bench"})
			b.ResetTimer()
			for b.Loop() {
				if _, err := s.scan(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(s.procs), "procs")
			b.ReportMetric(float64(s.descriptors), "fds")
			b.ReportMetric(float64(s.mapLines), "maplines")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(max(s.procs, 1)), "ns/proc")
		})
	}
}
