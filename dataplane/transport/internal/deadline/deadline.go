// Package deadline makes a read that waits in the Go runtime's poller (on a
// net.PacketConn or an *os.File) end with a context: its deadline, and its
// cancellation, which no read deadline expresses by itself.
package deadline

import (
	"context"
	"sync"
	"time"
)

// aLongTimeAgo is a read deadline in the past: it wakes a waiting read.
var aLongTimeAgo = time.Unix(1, 0)

// Reader is what a deadline is set on.
type Reader interface {
	SetReadDeadline(time.Time) error
}

// Waker arms one read at a time of one Reader. Its zero value is ready.
type Waker struct {
	// mu and gen let a late context.AfterFunc of an earlier read tell that
	// its read is over and leave the deadline alone.
	mu  sync.Mutex
	gen uint64
}

// Arm sets r's read deadline to at (the zero time: none) and makes ctx's
// end move it into the past, waking the read. Call the returned func once
// the read returned: it disarms ctx and clears the deadline.
func (w *Waker) Arm(ctx context.Context, r Reader, at time.Time) (disarm func()) {
	w.mu.Lock()
	gen := w.gen
	_ = r.SetReadDeadline(at)
	w.mu.Unlock()
	stop := func() bool { return true }
	if ctx.Done() != nil {
		stop = context.AfterFunc(ctx, func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.gen == gen {
				_ = r.SetReadDeadline(aLongTimeAgo)
			}
		})
	}
	return func() {
		stop()
		w.mu.Lock()
		w.gen++
		_ = r.SetReadDeadline(time.Time{})
		w.mu.Unlock()
	}
}
