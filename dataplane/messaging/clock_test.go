package messaging

import (
	"sync"
	"testing"
	"time"
)

// manualClock is a Clock that moves only when a test advances it.
type manualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers map[*manualTimer]struct{}
	// quiet, when set, reports that no datagram is in flight (memnet's
	// Queued is 0): step waits for it too.
	quiet func() bool
}

type manualTimer struct {
	at time.Time
	f  func()
}

func newManualClock() *manualClock {
	return &manualClock{now: time.Unix(1_000_000, 0), timers: map[*manualTimer]struct{}{}}
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{at: c.now.Add(d), f: f}
	if d <= 0 {
		go f()
		return func() bool { return false }
	}
	c.timers[t] = struct{}{}
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, ok := c.timers[t]
		delete(c.timers, t)
		return ok
	}
}

// Advance moves the clock on by d and fires the timers that came due.
func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []func()
	for t := range c.timers {
		if !t.at.After(c.now) {
			due = append(due, t.f)
			delete(c.timers, t)
		}
	}
	c.mu.Unlock()
	for _, f := range due {
		f()
	}
}

// step waits until no datagram is in flight (when the clock knows how to
// tell: quiet) and a timer due within d is armed (the goroutines that run
// on the clock went back to waiting for it), and then advances the clock by
// d. Waiting for the network keeps the clock from running ahead of
// datagrams that real time is still carrying, or that a goroutine the
// machine has not scheduled yet has still to answer; a loaded machine can
// leave one unscheduled for many milliseconds. Neither wait is forever: a
// timer may never be armed within d (armedWait), and a test may keep
// datagrams in flight on purpose (quietWait).
func (c *manualClock) step(d time.Duration) {
	const armedWait, quietWait = time.Millisecond, 250 * time.Millisecond
	start := time.Now()
	for {
		c.mu.Lock()
		armed := c.armedWithin(d)
		c.mu.Unlock()
		quiet := c.quiet == nil || c.quiet()
		waited := time.Since(start)
		if (armed || waited >= armedWait) && (quiet || waited >= quietWait) {
			break
		}
		time.Sleep(20 * time.Microsecond)
	}
	c.Advance(d)
}

func (c *manualClock) armedWithin(d time.Duration) bool {
	for t := range c.timers {
		if !t.at.After(c.now.Add(d)) {
			return true
		}
	}
	return false
}

// advanceUntil steps the clock by d until cond holds, at most max times.
func (c *manualClock) advanceUntil(t testing.TB, d time.Duration, max int, what string, cond func() bool) {
	t.Helper()
	for i := 0; !cond(); i++ {
		if i == max {
			t.Fatalf("%s: not after %d steps of %v", what, max, d)
		}
		c.step(d)
	}
}
