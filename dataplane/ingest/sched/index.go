package sched

import "math/bits"

// States: a GPU's memory-slice mask (8 bits) and whether it holds its one
// media-extension instance (bit 8). GPUs in the same state of the same card
// are interchangeable for placement, so policies score states, not GPUs, and
// a decision costs the same for 10 GPUs or 10,000.
const numStates = 512

const meBit = 1 << 8

// bucket is the set of GPUs in one state, as a bitset over GPU numbers.
type bucket struct {
	words []uint64
	n     int
}

func (b *bucket) add(g int) {
	b.words[g>>6] |= 1 << (g & 63)
	b.n++
}

func (b *bucket) del(g int) {
	b.words[g>>6] &^= 1 << (g & 63)
	b.n--
}

// min returns the lowest-numbered GPU in the bucket, or -1.
func (b *bucket) min() int {
	if b.n == 0 {
		return -1
	}
	for i, w := range b.words {
		if w != 0 {
			return i<<6 | bits.TrailingZeros64(w)
		}
	}
	return -1
}
