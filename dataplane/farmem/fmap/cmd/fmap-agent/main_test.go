package main

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem/fmap"
)

// TestMain lets the test binary be the agent: with FMAP_AGENT_DIR set it
// runs the command instead of the tests.
func TestMain(m *testing.M) {
	if dir := os.Getenv("FMAP_AGENT_DIR"); dir != "" {
		ctx, stop := context.WithCancel(context.Background())
		defer stop()
		if err := run(ctx, os.Getenv("FMAP_AGENT_SOCK"), dir); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		return
	}
	os.Exit(m.Run())
}

// TestAgentFiles runs the agent as a child process over a region file and
// maps it from the test process: writes through the mapping (buffer 1/8,
// so chunks are evicted) reach the file after Close, and the unchanged
// bytes are the file's.
func TestAgentFiles(t *testing.T) {
	testenv.RequirePriv(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	const size = 4<<20 + 3000
	orig := make([]byte, size)
	rand.NewChaCha8([32]byte{9}).Read(orig)
	if err := os.WriteFile(filepath.Join(dir, "5"), orig, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	agent := exec.CommandContext(ctx, os.Args[0])
	agent.Env = append(os.Environ(), "FMAP_AGENT_DIR="+dir, "FMAP_AGENT_SOCK="+sock)
	agent.Stderr = os.Stderr
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		agent.Process.Signal(os.Interrupt)
		agent.Wait()
	})

	var m *fmap.Mapping
	var err error
	for {
		if m, err = fmap.Map(ctx, sock, fmap.RegionRef{ID: 5}, fmap.Options{BufferBytes: size / 8}); err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("agent never came up: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := fmap.Map(ctx, sock, fmap.RegionRef{ID: 6}, fmap.Options{}); err == nil {
		t.Errorf("mapped region 6, which has no file")
	}
	b := m.Bytes()
	if !bytes.Equal(b, orig) {
		t.Fatalf("mapping differs from the region file before any write")
	}
	want := bytes.Clone(orig)
	rng := rand.New(rand.NewPCG(5, 5))
	for range 500 {
		off := rng.IntN(size - 100)
		v := byte(rng.Uint32())
		for i := range 100 {
			b[off+i], want[off+i] = v, v
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "5"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("region file after Close differs from what was written")
	}
}

// TestListenOwnerOnly: the agent's socket is owner-only from the moment it
// is bound: it is bound in a directory only the owner may enter and made
// 0600 there, and appears at its path only then. (Before, it was bound at
// its path with the umask's permissions and made 0600 after: anyone could
// connect in between, which the check at bind time here catches.)
func TestListenOwnerOnly(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.sock")
	var checked bool
	ln, err := listen(path, func(tmp string) {
		checked = true
		if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("at bind time, %s: %v, want nothing there yet", path, err)
		}
		if st, err := os.Stat(filepath.Dir(tmp)); err != nil || st.Mode().Perm() != 0o700 {
			t.Errorf("the directory the socket is bound in: %v, %v; want mode 0700", st.Mode(), err)
		}
		if st, err := os.Lstat(tmp); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("the bound socket: %v, %v; want mode 0600", st.Mode(), err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if !checked {
		t.Fatal("listen did not call bound")
	}
	st, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Type() != fs.ModeSocket || st.Mode().Perm() != 0o600 {
		t.Fatalf("%s: mode %v, want a socket with mode 0600", path, st.Mode())
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".fmap-agent-*")); len(left) != 0 {
		t.Fatalf("private bind directories left behind: %v", left)
	}
	// Served at its path after the rename.
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial %s: %v", path, err)
	}
	c.Close()
	if err := <-accepted; err != nil {
		t.Fatalf("accept: %v", err)
	}
}
