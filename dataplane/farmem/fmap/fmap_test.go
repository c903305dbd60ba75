package fmap

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// TestExactData writes at random through a mapping whose buffer is 1/8 of
// the region, reads everything back after eviction, closes, and reads it
// again from a second process: every byte must match, in the backend too.
func TestExactData(t *testing.T) {
	testenv.RequirePriv(t)
	cases := []struct {
		name    string
		d       dataCase
		noClose bool
	}{
		{name: "64KiB chunks", d: dataCase{size: 8<<20 + 12345, chunk: 64 << 10, writes: 3000, seed: 1}},
		{name: "4KiB chunks", d: dataCase{size: 2<<20 + 100, chunk: 4 << 10, writes: 3000, seed: 2}},
		{name: "1MiB chunks", d: dataCase{size: 16 << 20, chunk: 1 << 20, writes: 500, seed: 3}},
		{name: "program exits without Close", d: dataCase{size: 4 << 20, chunk: 64 << 10, writes: 2000, seed: 4}, noClose: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := startAgent(t)
			d := tc.d
			d.buffer = d.size / 8
			be := a.add(1, NewMemBackend(d.size))
			be.WriteAt(d.initial(), 0)
			ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
			defer cancel()
			env := append(d.env(), "FMAP_SOCK="+a.sock)

			role := "write"
			if tc.noClose {
				role = "write-noclose"
			}
			out := runHelper(t, ctx, role, env...)
			logStats(t, out)
			nchunks := (d.size + int64(d.chunk) - 1) / int64(d.chunk)
			capacity := (d.buffer + int64(d.chunk) - 1) / int64(d.chunk)
			t.Logf("%d chunks, buffer %d chunks: %d chunk reads, %d chunk writes", nchunks, capacity, be.reads.Load(), be.writes.Load())
			if be.reads.Load() <= nchunks {
				t.Errorf("%d chunk reads for %d chunks: nothing was evicted and fetched again", be.reads.Load(), nchunks)
			}
			if be.writes.Load() <= capacity {
				t.Errorf("%d chunk writes with a buffer of %d chunks: no dirty chunk was written back on eviction", be.writes.Load(), capacity)
			}
			// The program has exited: the backend holds all its writes.
			if tc.noClose {
				waitWritten(t, be, d)
			}
			got := make([]byte, d.size)
			be.ReadAt(got, 0)
			if err := firstDiff(got, d.expected()); err != nil {
				t.Fatalf("backend after the writer ended: %v", err)
			}
			runHelper(t, ctx, "verify", env...)
		})
	}
}

// TestManyPrograms runs several programs against one agent at once, each
// with its own region, as on a host node: every region ends up exact.
func TestManyPrograms(t *testing.T) {
	a := startAgent(t)
	const programs = 3
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	cases := make([]dataCase, programs)
	bes := make([]*countingBackend, programs)
	for i := range programs {
		d := dataCase{size: 3<<20 + int64(i)*4096, chunk: 64 << 10, writes: 1500, seed: uint64(10 + i)}
		d.buffer = d.size / 8
		cases[i] = d
		bes[i] = a.add(uint64(10+i), NewMemBackend(d.size))
		bes[i].WriteAt(d.initial(), 0)
	}
	outs := make([]string, programs)
	errs := make([]error, programs)
	for i := range programs {
		wg.Go(func() {
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.count=1")
			cmd.Env = append(append(os.Environ(), helperEnv+"=write", "FMAP_SOCK="+a.sock,
				"FMAP_REGION="+strconv.Itoa(10+i)), cases[i].env()...)
			out, err := cmd.CombinedOutput()
			outs[i], errs[i] = string(out), err
		})
	}
	wg.Wait()
	for i := range programs {
		if errs[i] != nil {
			t.Fatalf("program %d: %v\n%s", i, errs[i], outs[i])
		}
		got := make([]byte, cases[i].size)
		bes[i].ReadAt(got, 0)
		if err := firstDiff(got, cases[i].expected()); err != nil {
			t.Errorf("region %d after its program closed: %v", 10+i, err)
		}
	}
}

// waitWritten waits for the agent to finish writing back a program that
// exited without Close: the agent notices at the connection's end, which
// races with the program's exit status reaching the test.
func waitWritten(t *testing.T, be *countingBackend, d dataCase) {
	want := d.expected()
	got := make([]byte, d.size)
	deadline := time.Now().Add(10 * time.Second)
	for {
		be.ReadAt(got, 0)
		if firstDiff(got, want) == nil || time.Now().After(deadline) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func logStats(t *testing.T, out string) {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "STATS") {
			t.Log(l)
		}
	}
}

// The exit-dirty program writes exitDirtyChunks chunks through a buffer of
// exitDirtyBuffer chunks and exits at once, without Close or reading
// anything back: the chunks written last are still resident and dirty when
// the kernel tears its memory down, before its socket closes.
const (
	exitDirtySize   = 2 << 20
	exitDirtyChunks = 12
	exitDirtyBuffer = 8
)

// exitDirtyByte is what the exit-dirty program writes at byte i.
func exitDirtyByte(i int) byte { return byte(i/DefaultChunkSize*7 + i%251 + 1) }

// TestExitWithDirtyChunks checks that the agent writes back the dirty
// chunks of a program that exited without Close, although it can no longer
// write-protect them (the program's mm is gone: ESRCH), and logs no error.
func TestExitWithDirtyChunks(t *testing.T) {
	a := startAgent(t)
	be := a.add(1, NewMemBackend(exitDirtySize))
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	out := runHelper(t, ctx, "exit-dirty", "FMAP_SOCK="+a.sock)
	logStats(t, out)
	lines := a.log.wait(t, "fmap mapping ended\"")
	for _, l := range lines {
		if strings.Contains(l, "level=WARN") {
			t.Errorf("agent: %s", l)
		}
	}
	got := make([]byte, exitDirtySize)
	be.ReadAt(got, 0)
	for i := range exitDirtyChunks * DefaultChunkSize {
		if got[i] != exitDirtyByte(i) {
			t.Fatalf("backend byte %d (chunk %d) is %#x, want %#x: a dirty chunk was not written back",
				i, i/DefaultChunkSize, got[i], exitDirtyByte(i))
		}
	}
}

func helperExitDirty() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := Map(ctx, os.Getenv("FMAP_SOCK"), RegionRef{ID: 1}, Options{BufferBytes: exitDirtyBuffer * DefaultChunkSize})
	if err != nil {
		return err
	}
	b := m.Bytes()
	for i := range exitDirtyChunks * DefaultChunkSize {
		b[i] = exitDirtyByte(i)
	}
	st, err := m.Stats(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("STATS %+v\n", st)
	if st.Resident == 0 || st.Writebacks == uint64(exitDirtyChunks) {
		return fmt.Errorf("stats %+v: want dirty chunks resident at exit", st)
	}
	return nil // exit with the mapping open and its last chunks dirty
}
