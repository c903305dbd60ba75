package memservice

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
)

// collected returns the fully-qualified names of the metrics collectAgent
// sends for st.
func collected(st farmem.AgentStats) map[string]int {
	ch := make(chan prometheus.Metric, 1024)
	collectAgent(ch, st)
	close(ch)
	names := map[string]int{}
	for m := range ch {
		d := m.Desc().String() // Desc{fqName: "name", ...}
		name := d[strings.Index(d, `"`)+1:]
		names[name[:strings.Index(name, `"`)]]++
	}
	return names
}

// TestAgentMetricsUnmeasured: a latency nothing was measured for, a window
// hit rate before any window ended and a threshold not known yet are
// absent, not 0; fan-out and the agent's own latency are exported. Before,
// all three read 0 as if measured, and neither of the others existed.
func TestAgentMetricsUnmeasured(t *testing.T) {
	var none farmem.AgentStats
	got := collected(none)
	for _, name := range []string{"lovelock_mem_agent_latency_seconds", "lovelock_mem_agent_own_latency_seconds",
		"lovelock_mem_agent_cache_window_hit_rate", "lovelock_mem_agent_cache_threshold"} {
		if got[name] != 0 {
			t.Errorf("%s exported before anything was measured", name)
		}
	}
	if got["lovelock_mem_agent_fan_out_total"] != 1 {
		t.Errorf("lovelock_mem_agent_fan_out_total not exported")
	}
	var some farmem.AgentStats
	some.Latency = farmem.Latency{Count: 3, P50us: 10, P99us: 20}
	some.OwnLatency = farmem.Latency{Count: 1, P50us: 5, P99us: 5}
	some.Cache.Windows, some.Cache.WindowHitRate, some.Cache.Threshold = 1, 0.9, 0.25
	got = collected(some)
	for name, n := range map[string]int{"lovelock_mem_agent_latency_seconds": 2, "lovelock_mem_agent_own_latency_seconds": 2,
		"lovelock_mem_agent_cache_window_hit_rate": 1, "lovelock_mem_agent_cache_threshold": 1} {
		if got[name] != n {
			t.Errorf("%s: %d series, want %d", name, got[name], n)
		}
	}
}
