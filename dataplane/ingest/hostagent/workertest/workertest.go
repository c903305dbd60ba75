// Package workertest runs Python workers of external ingest models
// (dataplane/ingest/python/lovelock_ingest.py) as child processes of a
// test, as the host agent's users run them. It finds an interpreter with
// NumPy (make deps installs Debian's python3-numpy) and fails the test,
// never skips it, when there is none. Nothing outside tests uses it.
package workertest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
)

// ModuleDir is the directory of lovelock_ingest.py: next to this source
// file where it was built, or else (a test binary carried to another
// machine, such as a lent GPU's, with a copy of the tree) in the tree
// that holds the working directory, found by walking up to its go.mod.
func ModuleDir() string {
	_, file, _, _ := runtime.Caller(0)
	built := filepath.Join(filepath.Dir(file), "..", "..", "python")
	if _, err := os.Stat(filepath.Join(built, "lovelock_ingest.py")); err == nil {
		return built
	}
	if root, err := RepoRoot(); err == nil {
		return filepath.Join(root, "dataplane", "ingest", "python")
	}
	return built
}

// RepoRoot walks up from the working directory to the directory with
// the repository's go.mod.
func RepoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		if dir == filepath.Dir(dir) {
			return "", fmt.Errorf("no go.mod in %s or above it: run the test binary from inside a copy of the repository", wd)
		}
	}
}

var (
	once   sync.Once
	python string
	tried  []string
)

// Python returns an interpreter that imports numpy: $LOVELOCK_PYTHON,
// python3 on PATH, or /usr/bin/python3 (PATH may lead to a pyenv or venv
// without Debian's packages).
func Python(tb testing.TB) string {
	tb.Helper()
	once.Do(func() {
		cands := []string{os.Getenv("LOVELOCK_PYTHON"), "python3", "/usr/bin/python3"}
		for _, c := range cands {
			if c == "" {
				continue
			}
			out, err := exec.Command(c, "-c", "import numpy").CombinedOutput()
			if err == nil {
				python = c
				return
			}
			tried = append(tried, c+": "+string(bytes.TrimSpace(out))+" "+err.Error())
		}
	})
	if python == "" {
		tb.Fatalf("no Python 3 with NumPy (make deps installs python3-numpy; or set LOVELOCK_PYTHON): %q", tried)
	}
	return python
}

// Process is a running worker.
type Process struct {
	Cmd    *exec.Cmd
	mu     sync.Mutex
	output bytes.Buffer
	exited chan struct{}
	err    error
}

type lockedWriter struct{ p *Process }

func (w lockedWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	return w.p.output.Write(b)
}

// Start runs python script args... with lovelock_ingest importable; the
// process is killed when the test ends.
func Start(tb testing.TB, script string, args ...string) *Process {
	tb.Helper()
	cmd := exec.Command(Python(tb), append([]string{script}, args...)...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+ModuleDir(), "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1")
	p := &Process{Cmd: cmd, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = lockedWriter{p}, lockedWriter{p}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start worker %s: %v", script, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	tb.Cleanup(func() {
		cmd.Process.Kill()
		<-p.exited
		if tb.Failed() {
			tb.Logf("worker %s %v output:\n%s", script, args, p.Output())
		}
	})
	return p
}

// Output returns what the worker printed so far (stdout and stderr).
func (p *Process) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.output.String()
}

// Wait waits up to timeout for the worker to exit: whether it did, and
// its error (an *exec.ExitError for a non-zero status).
func (p *Process) Wait(timeout time.Duration) (exited bool, err error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.exited:
		return true, p.err
	case <-t.C:
		return false, nil
	}
}

// Exited reports whether the worker has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}
