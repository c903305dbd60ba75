package fmap

import (
	"math"
	"os"
	"slices"
	"testing"

	"github.com/lovelock-dpu/lovelock/control/testenv"
)

func TestLRU(t *testing.T) {
	// Each step is an operation; after it the list reads want, front first.
	type step struct {
		op   string // push or remove
		i    int
		want []int
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"push orders by recency", []step{
			{"push", 0, []int{0}}, {"push", 1, []int{1, 0}}, {"push", 2, []int{2, 1, 0}},
		}},
		{"push of a member moves it to the front", []step{
			{"push", 0, []int{0}}, {"push", 1, []int{1, 0}}, {"push", 2, []int{2, 1, 0}},
			{"push", 0, []int{0, 2, 1}}, {"push", 0, []int{0, 2, 1}}, {"push", 1, []int{1, 0, 2}},
		}},
		{"remove head, middle, tail and absent", []step{
			{"push", 0, nil}, {"push", 1, nil}, {"push", 2, nil}, {"push", 3, []int{3, 2, 1, 0}},
			{"remove", 3, []int{2, 1, 0}}, {"remove", 1, []int{2, 0}}, {"remove", 0, []int{2}},
			{"remove", 0, []int{2}}, {"remove", 2, []int{}}, {"push", 1, []int{1}},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := newLRU(4)
			for si, s := range tc.steps {
				switch s.op {
				case "push":
					l.pushFront(s.i)
				case "remove":
					l.remove(s.i)
				}
				if s.want == nil {
					continue
				}
				var got []int
				for v := l.front(); v >= 0; v = int(l.next[v]) {
					got = append(got, v)
				}
				var back []int
				for v := l.back(); v >= 0; v = l.newer(v) {
					back = append(back, v)
				}
				slices.Reverse(back)
				if !slices.Equal(got, s.want) && !(len(got) == 0 && len(s.want) == 0) {
					t.Fatalf("step %d (%s %d): list %v, want %v", si, s.op, s.i, got, s.want)
				}
				if !slices.Equal(got, back) {
					t.Fatalf("step %d: forward %v and backward %v walks disagree", si, got, back)
				}
				if l.len() != len(s.want) {
					t.Fatalf("step %d: len %d, want %d", si, l.len(), len(s.want))
				}
				for i := range 4 {
					if l.has(i) != slices.Contains(s.want, i) {
						t.Fatalf("step %d: has(%d) = %v", si, i, l.has(i))
					}
				}
			}
		})
	}
}

func TestOptionsResolve(t *testing.T) {
	page := os.Getpagesize()
	cases := []struct {
		name                      string
		o                         Options
		size                      int64
		chunk, nchunks, cap, lowW int
		mapLen                    int
		wantErr                   bool
	}{
		{name: "defaults: 64 KiB chunks, a third of the region, 0.8", size: 96 << 20,
			chunk: 64 << 10, nchunks: 1536, cap: 512, lowW: 409, mapLen: 96 << 20},
		{name: "buffer rounds up to chunks; tail rounds to a page", o: Options{BufferBytes: 100 << 10}, size: 1<<20 + 1,
			chunk: 64 << 10, nchunks: 17, cap: 2, lowW: 1, mapLen: 1<<20 + page},
		{name: "buffer at least two chunks", o: Options{BufferBytes: 1}, size: 1 << 20,
			chunk: 64 << 10, nchunks: 16, cap: 2, lowW: 1, mapLen: 1 << 20},
		{name: "buffer at most the region, and then nothing is evicted ahead", o: Options{BufferBytes: 1 << 30, LoadFactor: 0.5}, size: 1 << 20,
			chunk: 64 << 10, nchunks: 16, cap: 16, lowW: 16, mapLen: 1 << 20},
		{name: "buffer of every byte there is: the whole region", o: Options{BufferBytes: math.MaxInt64}, size: 1 << 20,
			chunk: 64 << 10, nchunks: 16, cap: 16, lowW: 16, mapLen: 1 << 20},
		{name: "load factor sets the low-water mark", o: Options{BufferBytes: 512 << 10, LoadFactor: 0.5}, size: 1 << 20,
			chunk: 64 << 10, nchunks: 16, cap: 8, lowW: 4, mapLen: 1 << 20},
		{name: "chunk not a power of two", o: Options{ChunkSize: 3 * page}, size: 1 << 20, wantErr: true},
		{name: "chunk below a page", o: Options{ChunkSize: page / 2}, size: 1 << 20, wantErr: true},
		{name: "chunk above the largest", o: Options{ChunkSize: 2 * maxChunkSize}, size: 1 << 20, wantErr: true},
		{name: "largest chunk, larger than the region", o: Options{ChunkSize: maxChunkSize}, size: 1 << 20,
			chunk: maxChunkSize, nchunks: 1, cap: 1, lowW: 1, mapLen: 1 << 20},
		{name: "load factor above 1", o: Options{LoadFactor: 1.5}, size: 1 << 20, wantErr: true},
		{name: "load factor NaN", o: Options{LoadFactor: math.NaN()}, size: 1 << 20, wantErr: true},
		{name: "load factor +Inf", o: Options{LoadFactor: math.Inf(1)}, size: 1 << 20, wantErr: true},
		{name: "negative load factor", o: Options{LoadFactor: -0.5}, size: 1 << 20, wantErr: true},
		{name: "negative read-ahead", o: Options{ReadAhead: -1}, size: 1 << 20, wantErr: true},
		{name: "empty region", size: 0, wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := tc.o.resolve(tc.size)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("resolve(%+v, %d) = %+v, want an error", tc.o, tc.size, r)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.chunk != tc.chunk || r.nchunks != tc.nchunks || r.capacity != tc.cap || r.lowWater != tc.lowW || r.mapLen != tc.mapLen {
				t.Fatalf("resolve = chunk %d, %d chunks, capacity %d, low water %d, map %d; want %d, %d, %d, %d, %d",
					r.chunk, r.nchunks, r.capacity, r.lowWater, r.mapLen, tc.chunk, tc.nchunks, tc.cap, tc.lowW, tc.mapLen)
			}
		})
	}
}

// TestKernelFeatures checks the userfaultfd features the mapping needs on
// this kernel and logs the optional ones the docs discuss.
func TestKernelFeatures(t *testing.T) {
	testenv.RequirePriv(t)
	f, err := uffdFeatures()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("userfaultfd features %#x", f)
	for _, c := range []struct {
		name     string
		bit      uint64
		required bool
	}{
		{"UFFD_FEATURE_MISSING_SHMEM", featureMissingShmem, true},
		{"UFFD_FEATURE_WP_HUGETLBFS_SHMEM", featureWPHugetlbfsShmem, true},
		{"UFFD_FEATURE_WP_UNPOPULATED", featureWPUnpopulated, false},
		{"UFFD_FEATURE_WP_ASYNC", featureWPAsync, false},
	} {
		has := f&c.bit != 0
		t.Logf("%-32s %v", c.name, has)
		if c.required && !has {
			t.Errorf("%s missing: the mapping cannot work on this kernel", c.name)
		}
	}
}
