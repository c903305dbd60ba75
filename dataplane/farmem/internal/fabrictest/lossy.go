// Package fabrictest holds far memory's test helpers: a transport wrapper
// that loses, duplicates and reorders datagrams, as a congested fabric
// would, while the sockets under it stay real.
package fabrictest

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
)

// Lossy wraps a transport and, on Send, drops a fraction Drop of the
// datagrams, sends a fraction Dup twice, and swaps neighbours with
// probability Reorder. The random source is seeded, so a failing run
// repeats. Dropped, Duplicated and Reordered count what it did.
type Lossy struct {
	transport.Transport
	Drop, Dup, Reorder float64

	mu  sync.Mutex
	rng *rand.Rand

	Dropped, Duplicated, Reordered atomic.Int64
}

// NewLossy wraps tr.
func NewLossy(tr transport.Transport, seed uint64, drop, dup, reorder float64) *Lossy {
	return &Lossy{Transport: tr, Drop: drop, Dup: dup, Reorder: reorder, rng: rand.New(rand.NewPCG(seed, 7))}
}

// Send implements transport.Transport.
func (l *Lossy) Send(pkts []transport.Packet) (int, error) {
	l.mu.Lock()
	out := make([]transport.Packet, 0, len(pkts)+2)
	for _, p := range pkts {
		switch r := l.rng.Float64(); {
		case r < l.Drop:
			l.Dropped.Add(1)
			continue
		case r < l.Drop+l.Dup:
			l.Duplicated.Add(1)
			out = append(out, p)
		}
		out = append(out, p)
		if n := len(out); n >= 2 && l.rng.Float64() < l.Reorder {
			out[n-1], out[n-2] = out[n-2], out[n-1]
			l.Reordered.Add(1)
		}
	}
	l.mu.Unlock()
	if _, err := transport.SendAll(l.Transport, out, nil); err != nil {
		return 0, err
	}
	return len(pkts), nil
}
