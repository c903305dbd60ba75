package fmap

// lru is an intrusive doubly linked list over chunk indices, most recently
// used at the front. It allocates once, at the mapping's size, so a fault
// never allocates to track a chunk.
type lru struct {
	prev, next []int32
	in         []bool
	head, tail int32
	n          int
}

const none = -1

func newLRU(n int) *lru {
	l := &lru{prev: make([]int32, n), next: make([]int32, n), in: make([]bool, n), head: none, tail: none}
	return l
}

// len reports how many chunks are on the list.
func (l *lru) len() int { return l.n }

// has reports whether chunk i is on the list.
func (l *lru) has(i int) bool { return l.in[i] }

// pushFront puts chunk i at the front, moving it there if it is on the list.
func (l *lru) pushFront(i int) {
	if l.in[i] {
		if l.head == int32(i) {
			return
		}
		l.remove(i)
	}
	l.in[i] = true
	l.n++
	l.prev[i], l.next[i] = none, l.head
	if l.head != none {
		l.prev[l.head] = int32(i)
	}
	l.head = int32(i)
	if l.tail == none {
		l.tail = int32(i)
	}
}

// remove takes chunk i off the list; it is a no-op for a chunk not on it.
func (l *lru) remove(i int) {
	if !l.in[i] {
		return
	}
	p, n := l.prev[i], l.next[i]
	if p != none {
		l.next[p] = n
	} else {
		l.head = n
	}
	if n != none {
		l.prev[n] = p
	} else {
		l.tail = p
	}
	l.in[i] = false
	l.n--
}

// back returns the least recently used chunk, or -1 when the list is empty.
func (l *lru) back() int { return int(l.tail) }

// front returns the most recently used chunk, or -1 when the list is empty.
func (l *lru) front() int { return int(l.head) }

// newer returns the chunk used just after i (toward the front), or -1.
func (l *lru) newer(i int) int { return int(l.prev[i]) }
