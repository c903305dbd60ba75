package sched

import (
	"math"
	"time"
)

// soonest is a min segment tree over the GPUs of one card: for one profile,
// the time at which a slot of it frees on each GPU in use (math.MaxInt64 for
// GPUs not in use). Lovelock's decision to wait reads the root instead of
// scanning the fleet, and every change to a GPU costs O(log GPUs).
type soonest struct {
	size int
	val  []time.Duration
	arg  []int32
}

func newSoonest(n int) *soonest {
	size := 1
	for size < n {
		size <<= 1
	}
	t := &soonest{size: size, val: make([]time.Duration, 2*size), arg: make([]int32, 2*size)}
	for i := range t.val {
		t.val[i] = math.MaxInt64
	}
	for i := 0; i < size; i++ {
		t.arg[size+i] = int32(i)
	}
	for i := size - 1; i >= 1; i-- {
		t.arg[i] = t.arg[2*i]
	}
	return t
}

func (t *soonest) set(i int, v time.Duration) {
	i += t.size
	if t.val[i] == v {
		return
	}
	t.val[i] = v
	for i >>= 1; i >= 1; i >>= 1 {
		l, r := 2*i, 2*i+1
		if t.val[r] < t.val[l] {
			t.val[i], t.arg[i] = t.val[r], t.arg[r]
		} else {
			t.val[i], t.arg[i] = t.val[l], t.arg[l]
		}
	}
}

// min returns the soonest time and the GPU's index within the card.
func (t *soonest) min() (time.Duration, int) { return t.val[1], int(t.arg[1]) }
