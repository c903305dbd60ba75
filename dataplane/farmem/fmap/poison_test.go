package fmap

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/lovelock-dpu/lovelock/control/testenv"
)

const (
	fetchFailSize  = 1 << 20
	fetchFailChunk = 64 << 10
)

// TestFetchFailure makes the backend fail every read of chunk 1 while a
// program touches it. Within Options.FetchTimeout the agent keeps retrying,
// and a backend that comes back serves the fault with the right bytes
// (also with a negative timeout, which never gives up); past it the chunk
// is poisoned: the touch, and a second one, raise SIGBUS, which the
// program recovers as a panic at an address in chunk 1; the other chunks
// still read right, and Sync and Close report the poisoned chunk. A
// backend that says its data is lost (ErrLost) gets the chunk poisoned at
// once, though the timeout is an hour, with no retry. Stats.Retries counts
// the failed fetches that were tried again: all of them when the backend
// comes back, all but the last when the chunk is poisoned.
func TestFetchFailure(t *testing.T) {
	if f, err := uffdFeatures(); err == nil && f&featurePoison == 0 {
		t.Fatalf("this kernel's userfaultfd lacks UFFD_FEATURE_POISON (features %#x): the test needs Linux 6.6 or later", f)
	}
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		heal    bool // the backend works again 500 ms after the touch
		lost    bool // the backend's reads fail with ErrLost
		want    string
	}{
		{"backend comes back", 20 * time.Second, true, false, "DATA ok"},
		{"backend comes back, no timeout", -1, true, false, "DATA ok"},
		{"backend stays down", 300 * time.Millisecond, false, false, "POISONED"},
		{"backend lost", time.Hour, false, true, "POISONED"},
		{"backend lost, no timeout", -1, false, true, "POISONED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := startAgent(t)
			mb := NewMemBackend(fetchFailSize)
			pattern := make([]byte, fetchFailSize)
			for i := range pattern {
				pattern[i] = byte(i % 251)
			}
			mb.WriteAt(pattern, 0)
			be := a.add(1, mb)
			be.failReadAt.Store(1 + fetchFailChunk + 100)
			be.failLost.Store(tc.lost)

			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.count=1")
			cmd.Env = append(os.Environ(), helperEnv+"=fetchfail", "FMAP_SOCK="+a.sock,
				fmt.Sprintf("FMAP_TIMEOUT=%d", tc.timeout))
			stdout, _ := cmd.StdoutPipe()
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var out []string
			lines := bufio.NewScanner(stdout)
			for lines.Scan() {
				l := lines.Text()
				out = append(out, l)
				if l == "TOUCHING" && tc.heal {
					time.AfterFunc(500*time.Millisecond, func() { be.failReadAt.Store(0) })
				}
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("program: %v\n%s", err, strings.Join(out, "\n"))
			}
			all := strings.Join(out, "\n")
			t.Log(all)
			if !strings.Contains(all, tc.want) {
				t.Fatalf("program printed no %q", tc.want)
			}
			wantStats := "STATS retries>0 true poisoned 1"
			switch {
			case tc.heal:
				wantStats = "STATS retries>0 true poisoned 0"
			case tc.lost:
				wantStats = "STATS retries>0 false poisoned 1"
			}
			if !strings.Contains(all, wantStats) {
				t.Errorf("program printed no %q", wantStats)
			}
			// A retry is a failed fetch tried again: the one that got
			// the chunk poisoned is not (before, it counted too, and
			// with the backend down every failed fetch was a retry).
			// Fewer may be counted: a fault the kernel sent twice is
			// served twice, and one still backing off when the program
			// exits is never tried again.
			var retries int64 = -1
			for _, l := range out {
				fmt.Sscanf(l, "RETRIES %d", &retries)
			}
			failed := be.readsFailed.Load()
			switch {
			case retries < 0:
				t.Error("program printed no RETRIES line")
			case tc.heal && retries > failed:
				t.Errorf("%d retries counted for %d failed fetches, all served in the end: want at most one each", retries, failed)
			case !tc.heal && retries >= failed:
				t.Errorf("%d retries counted for %d failed fetches, the last of which got the chunk poisoned: want fewer", retries, failed)
			}
			if tc.heal {
				if strings.Contains(all, "POISONED") {
					t.Fatal("the chunk was poisoned though the backend came back within the timeout")
				}
				return
			}
			for _, w := range []string{"AGAIN poisoned", "OTHERS ok", "SYNC ", "CLOSE "} {
				if !strings.Contains(all, w) {
					t.Errorf("program printed no %q", w)
				}
			}
			for _, l := range out {
				if !strings.HasPrefix(l, "SYNC ") && !strings.HasPrefix(l, "CLOSE ") {
					continue
				}
				if !strings.Contains(l, "chunk 1 (bytes 65536-131071) poisoned") {
					t.Errorf("%q does not name the poisoned chunk", l)
				}
				if tc.lost && !strings.Contains(l, "its data is lost") {
					t.Errorf("%q does not say the data is lost", l)
				}
			}
		})
	}
}

// TestLostAfterCleanEviction: a chunk read once, evicted clean (its
// pages keep the write-protect markers a clean install sets), whose next
// fetch fails lost is poisoned for real: the touch raises SIGBUS. (Before,
// the poison stepped over the marked pages, the chunk was counted poisoned
// while its pages were not, and the touch waited for ever.)
func TestLostAfterCleanEviction(t *testing.T) {
	if f, err := uffdFeatures(); err == nil && f&featurePoison == 0 {
		t.Fatalf("this kernel's userfaultfd lacks UFFD_FEATURE_POISON (features %#x): the test needs Linux 6.6 or later", f)
	}
	a := startAgent(t)
	be := a.add(1, NewMemBackend(syncErrSize))
	be.failReadAt.Store(1 + DefaultChunkSize + 100) // chunk 1
	be.failReadSkip.Store(1)                        // its first fetch works
	be.failLost.Store(true)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	t.Log(runHelper(t, ctx, "lost-after-eviction", "FMAP_SOCK="+a.sock))
}

func helperLostAfterEviction() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := mapTwoChunks(ctx)
	if err != nil {
		return err
	}
	b := m.Bytes()
	// Chunk 1 read, then chunks 2 and 3 through the two-chunk buffer:
	// chunk 1 was evicted clean.
	for c := 1; c <= 3; c++ {
		if _, _, ok := testenv.ReadByte(b, c*DefaultChunkSize); !ok {
			return fmt.Errorf("chunk %d: SIGBUS on its first read", c)
		}
	}
	// The agent's cleaner evicts in the background, least recently used
	// first: until its first eviction ends, chunk 1 may still be resident,
	// and a touch rightly reads it (a loaded machine showed that).
	for st := (Stats{}); st.Evictions == 0; time.Sleep(time.Millisecond) {
		if st, err = m.Stats(ctx); err != nil {
			return err
		}
	}
	if _, ok, err := readWithin(ctx, m, DefaultChunkSize+7); err != nil {
		return fmt.Errorf("chunk 1, whose data is lost: %w", err)
	} else if ok {
		return errors.New("chunk 1, whose data is lost: a touch read a byte, want SIGBUS")
	}
	st, err := m.Stats(ctx)
	if err != nil {
		return err
	}
	if st.Poisoned != 1 {
		return fmt.Errorf("%d chunks poisoned, want 1", st.Poisoned)
	}
	if err := m.Sync(ctx); err == nil || !strings.Contains(err.Error(), "chunk 1 ") {
		return fmt.Errorf("Sync: %v, want it to name poisoned chunk 1", err)
	}
	m.Close()
	return nil
}

// helperFetchFail touches chunk 1 of region 1, whose fetch fails, and prints
// what it read, or where the SIGBUS hit, then checks the other chunks and
// reports Sync's and Close's errors.
func helperFetchFail() error {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	m, err := Map(ctx, os.Getenv("FMAP_SOCK"), RegionRef{ID: 1},
		Options{ChunkSize: fetchFailChunk, FetchTimeout: time.Duration(envInt("FMAP_TIMEOUT"))})
	if err != nil {
		return err
	}
	b := m.Bytes()
	// touch reads b[i]; a SIGBUS there comes back as the fault's address.
	touch := func(i int) (byte, uintptr, bool) { return testenv.ReadByte(b, i) }
	base := uintptr(unsafe.Pointer(&b[0]))
	const probe = fetchFailChunk + 4096 + 7
	fmt.Println("TOUCHING")
	v, fault, ok := touch(probe)
	if ok {
		if v != byte(probe%251) {
			return fmt.Errorf("byte %d reads %d, want %d", probe, v, byte(probe%251))
		}
		fmt.Println("DATA ok")
		if err := printStats(ctx, m); err != nil {
			return err
		}
		return m.Close()
	}
	if fault < base+fetchFailChunk || fault >= base+2*fetchFailChunk {
		return fmt.Errorf("SIGBUS at %#x, outside chunk 1 [%#x, %#x)", fault, base+fetchFailChunk, base+2*fetchFailChunk)
	}
	fmt.Printf("POISONED at offset %d\n", fault-base)
	if _, _, ok := touch(fetchFailChunk); ok {
		return fmt.Errorf("a second touch of the poisoned chunk read a byte")
	}
	fmt.Println("AGAIN poisoned")
	for _, i := range []int{0, 2*fetchFailChunk + 3, fetchFailSize - 1} {
		v, _, ok := touch(i)
		if !ok || v != byte(i%251) {
			return fmt.Errorf("byte %d of a good chunk: %d (read: %v), want %d", i, v, ok, byte(i%251))
		}
	}
	fmt.Println("OTHERS ok")
	if err := printStats(ctx, m); err != nil {
		return err
	}
	err = m.Sync(ctx)
	fmt.Printf("SYNC %v\n", err)
	if err == nil {
		return fmt.Errorf("Sync reported nothing with a poisoned chunk")
	}
	err = m.Close()
	fmt.Printf("CLOSE %v\n", err)
	if err == nil {
		return fmt.Errorf("Close reported nothing with a poisoned chunk")
	}
	return nil
}

func printStats(ctx context.Context, m *Mapping) error {
	st, err := m.Stats(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("STATS retries>0 %v poisoned %d\n", st.Retries > 0, st.Poisoned)
	fmt.Printf("RETRIES %d\n", st.Retries)
	return nil
}
