package messaging

import (
	"context"
	"time"
)

// Clock is where an agent or a client reads the time and arms the protocol's
// timers: flush and idle timeouts, retransmission, probes, dead peers, the
// agent's drain. Nil (the default) is the system clock. Tests pass a clock
// they advance by hand, so that timers fire without the test sleeping.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed, unless
	// stop is called first; stop reports whether it stopped the call.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// clock is an owner's time: nanoseconds since its start, from the system
// clock (ext nil, the fast path) or from a Clock.
type clock struct {
	ext   Clock
	epoch time.Time
}

func newClock(ext Clock) clock {
	if ext == nil {
		return clock{epoch: time.Now()}
	}
	return clock{ext: ext, epoch: ext.Now()}
}

// now returns the time since the epoch.
func (k clock) now() int64 {
	if k.ext == nil {
		return int64(time.Since(k.epoch))
	}
	return int64(k.ext.Now().Sub(k.epoch))
}

// until returns a context that ends with ctx or at time at.
func (k clock) until(ctx context.Context, at int64) (context.Context, context.CancelFunc) {
	if k.ext == nil {
		return context.WithDeadline(ctx, k.epoch.Add(time.Duration(at)))
	}
	ctx, cancel := context.WithCancel(ctx)
	stop := k.ext.AfterFunc(time.Duration(at-k.now()), cancel)
	return ctx, func() { stop(); cancel() }
}

// alarm calls f once after the duration it was last set to; setting it
// again replaces what was set.
type alarm struct {
	k    clock
	f    func()
	t    *time.Timer // system clock
	stop func() bool // Clock
}

func (a *alarm) set(d time.Duration) {
	if a.k.ext == nil {
		if a.t == nil {
			a.t = time.AfterFunc(d, a.f)
		} else {
			a.t.Reset(d)
		}
		return
	}
	if a.stop != nil {
		a.stop()
	}
	a.stop = a.k.ext.AfterFunc(d, a.f)
}

func (a *alarm) cancel() {
	if a.t != nil {
		a.t.Stop()
	}
	if a.stop != nil {
		a.stop()
	}
}
