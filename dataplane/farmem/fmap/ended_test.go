package fmap

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The ended-write program writes endedChunks chunks of a region that its
// buffer holds whole (so nothing is written back while it runs) and exits
// without Close; the ended-read program maps the region read-only and checks
// those chunks.
const (
	endedSize   = 1 << 20
	endedChunks = 4
)

func endedByte(i int) byte { return byte(i%251 + 1) }

// TestOpenAfterEndedMapping: a program writes and exits without Close, and
// the agent's write-back of its dirty chunks is held back; a read-only Map
// of the region made right after the exit must wait for that write-back and
// read the new bytes, or fail saying why it could not. Before, the open went
// ahead at once and the reader read the old bytes (zeros).
func TestOpenAfterEndedMapping(t *testing.T) {
	for _, tc := range []struct {
		name      string
		wait      time.Duration // Agent.WriteBackWait
		failWrite bool          // the held write-back fails once let go
		release   bool          // let the write-back go once the open waits
		want      string        // in the reader's output
	}{
		{name: "write-back lands", release: true, want: "READ OK"},
		{name: "write-back fails", release: true, failWrite: true, want: "which ended without Close, failed"},
		{name: "write-back outlasts the wait", wait: 50 * time.Millisecond, want: "is still writing back after 50ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := startAgentOf(t, &Agent{WriteBackWait: tc.wait})
			be := a.add(1, NewMemBackend(endedSize))
			gate := make(chan struct{})
			be.writeGate.Store(&gate)
			// Registered after the agent's cleanup, so it runs first: the
			// agent's stop waits for the held write-back.
			opened := false
			t.Cleanup(func() {
				if !opened {
					close(gate)
				}
			})
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			runHelper(t, ctx, "ended-write", "FMAP_SOCK="+a.sock)

			waiting := a.log.logged("open waits for the write-back")
			type result struct {
				out string
				err error
			}
			read := make(chan result, 1)
			go func() {
				cmd := exec.CommandContext(ctx, os.Args[0], "-test.count=1")
				cmd.Env = append(os.Environ(), helperEnv+"=ended-read", "FMAP_SOCK="+a.sock)
				out, err := cmd.CombinedOutput()
				read <- result{string(out), err}
			}()
			var r result
			select {
			case r = <-read:
				t.Fatalf("the read-only Map did not wait for the write-back of the ended mapping: %v\n%s", r.err, r.out)
			case <-waiting:
			}
			if tc.failWrite {
				be.failWrites.Store(true)
			}
			if tc.release {
				opened = true
				close(gate)
			}
			r = <-read
			t.Log(strings.TrimSpace(r.out))
			if r.err != nil || !strings.Contains(r.out, tc.want) {
				t.Fatalf("reader: %v, want %q in its output:\n%s", r.err, tc.want, r.out)
			}
		})
	}
}

func helperEndedWrite() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := Map(ctx, os.Getenv("FMAP_SOCK"), RegionRef{ID: 1}, Options{BufferBytes: endedSize})
	if err != nil {
		return err
	}
	b := m.Bytes()
	for i := range endedChunks * DefaultChunkSize {
		b[i] = endedByte(i)
	}
	st, err := m.Stats(ctx)
	if err != nil {
		return err
	}
	// A write fault installs its chunk dirty: every chunk written is dirty
	// until written back.
	if st.Writebacks != 0 || st.Resident != endedChunks {
		return fmt.Errorf("stats %+v: want %d chunks resident, none written back", st, endedChunks)
	}
	return nil // exit with the mapping open and its chunks dirty
}

// helperEndedRead prints READ OK when it reads what ended-write wrote, MAP
// FAILED and the error when its Map fails, and fails when it reads other
// bytes.
func helperEndedRead() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := Map(ctx, os.Getenv("FMAP_SOCK"), RegionRef{ID: 1, ReadOnly: true}, Options{})
	if err != nil {
		fmt.Println("MAP FAILED:", err)
		return nil
	}
	b := m.Bytes()
	for i := range endedChunks * DefaultChunkSize {
		if b[i] != endedByte(i) {
			return fmt.Errorf("byte %d (chunk %d) is %#x, want %#x: read before the ended mapping's write-back", i, i/DefaultChunkSize, b[i], endedByte(i))
		}
	}
	fmt.Println("READ OK")
	return m.Close()
}
