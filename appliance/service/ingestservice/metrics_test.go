package ingestservice

import (
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/agent"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/hostagent"
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

// TestHostDoorbellKinds: each doorbell shows as one kind; a given-up one
// the host had no record of is released, not new (before, it counted as
// new though nothing ran), and a kind read ahead of the total does not
// wrap the new count below 0.
func TestHostDoorbellKinds(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   hostagent.Stats
		want map[string]float64
	}{
		{"one of each", hostagent.Stats{Doorbells: 10, Repeats: 2, Stale: 1, ReleasedUnrun: 3},
			map[string]float64{"new": 4, "repeat": 2, "stale": 1, "released": 3}},
		{"kinds read after a doorbell the total missed", hostagent.Stats{Doorbells: 3, Repeats: 1, ReleasedUnrun: 3},
			map[string]float64{"new": 0, "repeat": 1, "stale": 0, "released": 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch := make(chan prometheus.Metric, 64)
			collectHost(ch, tc.st)
			close(ch)
			got := map[string]float64{}
			for m := range ch {
				if !strings.Contains(m.Desc().String(), `"lovelock_ingest_host_doorbells_total"`) {
					continue
				}
				var pb dto.Metric
				if err := m.Write(&pb); err != nil {
					t.Fatal(err)
				}
				got[pb.GetLabel()[0].GetValue()] = pb.GetCounter().GetValue()
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("doorbells by kind %v, want %v", got, tc.want)
			}
		})
	}
}
