package fmap

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	readAheadChunk  = 16 << 10
	readAheadChunks = 512
)

// TestReadAhead touches every page of a mapping in order (reading, or
// writing) or in a random order of chunks, with read-ahead on and off, and
// checks every byte, how many chunks were read ahead and how many faults
// fetched: a sequential scan is mostly read ahead, a random one hardly, and
// with read-ahead off nothing is. The buffer holds half the mapping, so
// read-ahead runs beside evictions.
func TestReadAhead(t *testing.T) {
	for _, tc := range []struct {
		name      string
		order     string // seq, rand
		write     bool
		readAhead int
		// want ReadAhead ≥ minAhead × chunks and Faults ≤ maxFaults × chunks
		minAhead, maxAhead, maxFaults float64
	}{
		{"sequential read", "seq", false, SuggestedReadAhead, 0.6, 1, 0.4},
		{"sequential write", "seq", true, SuggestedReadAhead, 0.6, 1, 0.4},
		{"sequential, off", "seq", false, 0, 0, 0, 1},
		{"random", "rand", false, SuggestedReadAhead, 0, 0.3, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := startAgent(t)
			mb := NewMemBackend(readAheadChunk * readAheadChunks)
			pattern := make([]byte, readAheadChunk*readAheadChunks)
			for i := range pattern {
				pattern[i] = byte(i*7 + i/4096)
			}
			mb.WriteAt(pattern, 0)
			be := a.add(1, mb)
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			out := runHelper(t, ctx, "readahead", "FMAP_SOCK="+a.sock, "FMAP_ORDER="+tc.order,
				fmt.Sprintf("FMAP_WRITE=%v", tc.write), fmt.Sprintf("FMAP_READAHEAD=%d", tc.readAhead))
			var ahead, faults int
			for l := range strings.Lines(out) {
				if f := strings.Fields(l); len(f) == 3 && f[0] == "STATS" {
					ahead, _ = strconv.Atoi(f[1])
					faults, _ = strconv.Atoi(f[2])
				}
			}
			t.Logf("%d chunks: %d read ahead, %d fetched by faults, %d backend reads", readAheadChunks, ahead, faults, be.reads.Load())
			n := float64(readAheadChunks)
			if float64(ahead) < tc.minAhead*n || float64(ahead) > tc.maxAhead*n {
				t.Errorf("%d chunks read ahead, want %.0f to %.0f", ahead, tc.minAhead*n, tc.maxAhead*n)
			}
			if float64(faults) > tc.maxFaults*n {
				t.Errorf("%d faults fetched a chunk, want at most %.0f", faults, tc.maxFaults*n)
			}
			// (The program's counts may miss a fetch or two still being
			// counted when it asked: a fetch wakes the thread first.)
			if r := be.reads.Load(); r < readAheadChunks {
				t.Errorf("%d backend reads: fewer than the %d chunks touched", r, readAheadChunks)
			}
			if tc.write {
				got := make([]byte, len(pattern))
				mb.ReadAt(got, 0)
				for i := 0; i < len(got); i += 4096 {
					if got[i] != ^pattern[i] {
						t.Fatalf("byte %d after Close: %d, want %d", i, got[i], ^pattern[i])
					}
				}
			}
		})
	}
}

// helperReadAhead touches the first byte of every page of region 1 in the
// order FMAP_ORDER says, checking it (and inverting it with FMAP_WRITE),
// and prints the agent's read-ahead and fault counts.
func helperReadAhead() error {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	ra, _ := strconv.Atoi(os.Getenv("FMAP_READAHEAD"))
	m, err := Map(ctx, os.Getenv("FMAP_SOCK"), RegionRef{ID: 1},
		Options{ChunkSize: readAheadChunk, BufferBytes: readAheadChunk * readAheadChunks / 2, ReadAhead: ra})
	if err != nil {
		return err
	}
	b := m.Bytes()
	write := os.Getenv("FMAP_WRITE") == "true"
	chunks := make([]int, readAheadChunks)
	for i := range chunks {
		chunks[i] = i
	}
	if os.Getenv("FMAP_ORDER") == "rand" {
		rand.New(rand.NewPCG(1, 2)).Shuffle(len(chunks), func(i, j int) { chunks[i], chunks[j] = chunks[j], chunks[i] })
	}
	for _, c := range chunks {
		for off := c * readAheadChunk; off < (c+1)*readAheadChunk; off += 4096 {
			want := byte(off*7 + off/4096)
			if b[off] != want {
				return fmt.Errorf("byte %d: %d, want %d", off, b[off], want)
			}
			if write {
				b[off] = ^want
			}
		}
	}
	st, err := m.Stats(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("STATS %d %d\n", st.ReadAhead, st.Faults)
	return m.Close()
}
