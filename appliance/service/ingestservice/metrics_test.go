package ingestservice

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/agent"
)

// TestAgentLatencyUnmeasured: the latency quantiles are absent until a
// request completed; before, they read 0 s as if measured.
func TestAgentLatencyUnmeasured(t *testing.T) {
	count := func(st agent.Stats) int {
		ch := make(chan prometheus.Metric, 256)
		collectAgent(ch, st)
		close(ch)
		n := 0
		for m := range ch {
			if strings.Contains(m.Desc().String(), `"lovelock_ingest_latency_seconds"`) {
				n++
			}
		}
		return n
	}
	if n := count(agent.Stats{Received: 3}); n != 0 {
		t.Errorf("%d latency series with no request completed, want none", n)
	}
	if n := count(agent.Stats{Completed: 2, P50: time.Millisecond, P99: 2 * time.Millisecond}); n != 2 {
		t.Errorf("%d latency series after 2 completed, want 2", n)
	}
}
