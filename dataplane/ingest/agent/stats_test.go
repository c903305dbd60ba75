package agent

import (
	"testing"
	"time"
)

// TestLatencyPercentiles: the agent's p50 and p99 are nearest-rank
// percentiles (the smallest latency at least p of the kept ones are at or
// below), as the load generator's are; before, they were one rank high:
// of 1..100 ms the p99 was the maximum, 100 ms, and of two latencies the
// p50 was the larger.
func TestLatencyPercentiles(t *testing.T) {
	for _, tc := range []struct {
		name     string
		n        int // latencies 1..n ms, added in reverse
		ring     int
		p50, p99 time.Duration
	}{
		{"none", 0, 16, 0, 0},
		{"one", 1, 16, 1 * time.Millisecond, 1 * time.Millisecond},
		{"two", 2, 16, 1 * time.Millisecond, 2 * time.Millisecond},
		{"hundred", 100, 128, 50 * time.Millisecond, 99 * time.Millisecond},
		{"thousand", 1000, 1024, 500 * time.Millisecond, 990 * time.Millisecond},
		// Only the last 100 are kept: 1..100 ms, added last.
		{"ring wrapped", 150, 100, 50 * time.Millisecond, 99 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l latencies
			l.init(tc.ring)
			for i := tc.n; i >= 1; i-- {
				l.add(time.Duration(i) * time.Millisecond)
			}
			p := l.percentiles(0.5, 0.99)
			if p[0] != tc.p50 || p[1] != tc.p99 {
				t.Errorf("p50 %v, p99 %v; want %v, %v", p[0], p[1], tc.p50, tc.p99)
			}
		})
	}
}
