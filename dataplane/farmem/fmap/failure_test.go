package fmap

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

const syncErrSize = 1 << 20

// TestSyncReportsWriteBackErrors makes the backend fail writes while a
// program has dirty chunks: its Sync must fail (and the chunks stay dirty),
// and once the backend works again a second Sync must write everything.
func TestSyncReportsWriteBackErrors(t *testing.T) {
	a := startAgent(t)
	be := a.add(1, NewMemBackend(syncErrSize))
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=syncerr", "FMAP_SOCK="+a.sock)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	expect := func(prefix string) string {
		t.Helper()
		for lines.Scan() {
			if strings.HasPrefix(lines.Text(), prefix) {
				return lines.Text()
			}
		}
		cmd.Wait()
		t.Fatalf("program ended before printing %s", prefix)
		return ""
	}

	expect("WRITTEN")
	be.failWrites.Store(true)
	io.WriteString(stdin, "go\n")
	l := expect("SYNC1")
	t.Log(l)
	if !strings.Contains(l, "injected write error") {
		t.Fatalf("Sync with a failing backend: %q, want the injected error", l)
	}
	be.failWrites.Store(false)
	io.WriteString(stdin, "go\n")
	t.Log(expect("SYNC2"))
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("program: %v", err)
	}
	got := make([]byte, syncErrSize)
	be.ReadAt(got, 0)
	for i, v := range got {
		if v != byte(i%251) {
			t.Fatalf("byte %d is %d after the second Sync, want %d", i, v, byte(i%251))
		}
	}
}

func helperSyncErr() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The whole region fits the buffer: nothing is evicted, so only Sync
	// writes back.
	m, err := Map(ctx, os.Getenv("FMAP_SOCK"), RegionRef{ID: 1}, Options{BufferBytes: syncErrSize})
	if err != nil {
		return err
	}
	b := m.Bytes()
	for i := range b {
		b[i] = byte(i % 251)
	}
	in := bufio.NewReader(os.Stdin)
	fmt.Println("WRITTEN")
	in.ReadString('\n')
	err = m.Sync(ctx)
	fmt.Printf("SYNC1 %v\n", err)
	if err == nil {
		return fmt.Errorf("Sync succeeded against a failing backend")
	}
	in.ReadString('\n')
	if err := m.Sync(ctx); err != nil {
		return fmt.Errorf("second Sync: %w", err)
	}
	fmt.Println("SYNC2 ok")
	return m.Close()
}
