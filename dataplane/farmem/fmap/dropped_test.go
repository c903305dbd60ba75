package fmap

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The dropped program maps droppedChunks chunks, writes the first, and
// drops its Mapping (keeping only Bytes) without Close, as a program that
// maps for its lifetime and lets exit end the mapping does. The GC then
// finalizes the Mapping's connection.
const droppedChunks = 32

// droppedByte is what the dropped program writes at byte i, in round r.
func droppedByte(i, r int) byte { return byte(i/DefaultChunkSize*5 + i%241 + r*3 + 1) }

// TestDroppedMapping: a program that no longer references its Mapping,
// only its bytes, keeps a working mapping until it exits, and its writes
// reach the region. Before, the GC's finalizer closed the socket to the
// agent, which took it for the program's exit: it wrote back, stopped
// serving the faults, and the program's next touch blocked for ever.
func TestDroppedMapping(t *testing.T) {
	a := startAgent(t)
	be := a.add(1, NewMemBackend(droppedChunks*DefaultChunkSize))
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	out := runHelper(t, ctx, "dropped", "FMAP_SOCK="+a.sock)
	t.Log(out)
	lines := a.log.wait(t, "fmap mapping ended\"")
	for _, l := range lines {
		if strings.Contains(l, "level=WARN") {
			t.Errorf("agent: %s", l)
		}
	}
	got := make([]byte, droppedChunks*DefaultChunkSize)
	be.ReadAt(got, 0)
	for i := range got {
		if got[i] != droppedByte(i, 1) {
			t.Fatalf("backend byte %d (chunk %d) is %#x, want %#x: a write made after the Mapping was dropped is lost",
				i, i/DefaultChunkSize, got[i], droppedByte(i, 1))
		}
	}
}

func helperDropped() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, fd, ino, err := mapAndDrop(ctx)
	if err != nil {
		return err
	}
	// Wait for the GC to finalize the dropped Mapping's connection: its
	// descriptor closes.
	deadline := time.Now().Add(20 * time.Second)
	for {
		runtime.GC()
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Ino != ino {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the dropped Mapping's connection was not finalized in 20 s")
		}
		runtime.Gosched()
	}
	if !socketOpen(ino) {
		return fmt.Errorf("the GC closed the connection to the host agent while the mapping is in use: the agent ends it and its next faults block")
	}
	done := make(chan struct{})
	go func() {
		for i := range b {
			b[i] = droppedByte(i, 1) // chunk 0 again (written back when the agent took the close for an exit), then the absent ones
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		return fmt.Errorf("writes after the Mapping was dropped blocked for 20 s: the agent no longer serves the mapping")
	}
	return nil // exit without Close: the agent writes back
}

// mapAndDrop maps the region, writes chunk 0, and returns the bytes and
// the connection's descriptor and inode, leaving the Mapping unreachable.
//
//go:noinline
func mapAndDrop(ctx context.Context) ([]byte, int, uint64, error) {
	m, err := Map(ctx, os.Getenv("FMAP_SOCK"), RegionRef{ID: 1}, Options{BufferBytes: droppedChunks * DefaultChunkSize})
	if err != nil {
		return nil, 0, 0, err
	}
	b := m.Bytes()
	for i := range DefaultChunkSize {
		b[i] = droppedByte(i, 0)
	}
	rc, err := m.conn.SyscallConn()
	if err != nil {
		return nil, 0, 0, err
	}
	fd := -1
	rc.Control(func(f uintptr) { fd = int(f) })
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, 0, 0, err
	}
	return b, fd, st.Ino, nil
}

// socketOpen reports whether this process still has a descriptor of the
// socket with inode ino.
func socketOpen(ino uint64) bool {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return false
	}
	want := fmt.Sprintf("socket:[%d]", ino)
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && l == want {
			return true
		}
	}
	return false
}
