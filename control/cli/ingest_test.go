package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/agent"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/hostagent"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
)

// TestHostRegistration: a host agent whose DPU stopped acknowledging it
// says so, and since when, instead of "registered".
func TestHostRegistration(t *testing.T) {
	for _, tc := range []struct {
		h    hostagent.Stats
		want string
	}{
		{hostagent.Stats{Registered: true, LastAck: 100 * time.Millisecond}, "registered with its DPU"},
		{hostagent.Stats{LastAck: 12*time.Second + 300*time.Millisecond}, "not registered: last ack from its DPU 12s ago; is the DPU's lovelockd running?"},
		{hostagent.Stats{LastAck: 40 * time.Millisecond}, "last ack from its DPU 40ms ago"},
		{hostagent.Stats{}, "not registered: no ack from its DPU yet"},
	} {
		if got := hostRegistration(&tc.h); !strings.Contains(got, tc.want) {
			t.Errorf("%+v: %q, want %q", tc.h, got, tc.want)
		}
	}
}

// TestNoLatencyMeasured: where no request completed, the stats say that no
// latency was measured, and a destination without bundles has no average
// bundle size. Before, they printed "latency p50 0s, p99 0s" (ingest),
// "p50 0 µs, p99 0 µs" (far memory) and an AVG BUNDLE of 0, as if measured.
func TestNoLatencyMeasured(t *testing.T) {
	running := func(names ...string) []api.ServiceStatus {
		var out []api.ServiceStatus
		for _, n := range names {
			out = append(out, api.ServiceStatus{Name: n, State: api.ServiceRunning})
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		svc     *fakeService
		args    []string
		want    []string // regexps
		notWant []string
	}{
		{"ingest agent", &fakeService{services: running(ingestAgent), svcStats: map[string]any{ingestAgent: agent.Stats{Received: 3}}},
			[]string{"ingest", "stats"}, []string{`latency: none measured \(no request completed\); scheduler: no decision yet;`}, []string{`p50 0s`, `0s per decision`}},
		{"ingest agent measured", &fakeService{services: running(ingestAgent),
			svcStats: map[string]any{ingestAgent: agent.Stats{Completed: 2, P50: 3 * time.Millisecond, P99: 5 * time.Millisecond, Decision: 4 * time.Microsecond}}},
			[]string{"ingest", "stats"}, []string{`latency p50 3ms, p99 5ms; scheduler 4µs per decision`}, nil},
		{"far-memory agent", &fakeService{services: running(memAgent), svcStats: map[string]any{memAgent: farmem.AgentStats{}}},
			[]string{"mem", "stats"}, []string{`latency to the memory node: none measured \(no request answered\)\n`}, []string{`p50 0 µs`}},
		{"far-memory agent measured", &fakeService{services: running(memAgent),
			svcStats: map[string]any{memAgent: farmem.AgentStats{Latency: farmem.Latency{Count: 4, P50us: 20, P99us: 80}}}},
			[]string{"mem", "stats"}, []string{`latency to the memory node: p50 20 µs, p99 80 µs \(4 requests\)\n`}, nil},
		{"host agent", &fakeService{services: running(memHost), svcStats: map[string]any{memHost: api.MemHostStats{}}},
			[]string{"mem", "stats"}, []string{`timeouts 0; latency: none measured \(no request answered\)\n`}, []string{`p50 0 µs`}},
		{"messaging", &fakeService{msg: &messaging.Stats{Role: "agent", Node: "dpu0", Destinations: []messaging.DestStats{
			{Name: "dpu1", Addr: "10.0.0.11:61440"}, {Name: "dpu2", Addr: "10.0.0.12:61440", Bytes: 3000, Messages: 9, Bundles: 2, AvgBundleBytes: 1500}}}},
			[]string{"msg", "stats"}, []string{`dpu1 +10\.0\.0\.11:61440 +0 +0 +0 +- +0`, `dpu2 +10\.0\.0\.12:61440 +3000 +9 +2 +1500 +0`}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := runFake(t, tc.svc, tc.args...)
			matchOutput(t, out, tc.want, tc.notWant)
		})
	}
}

// TestIngestReleasedUnrun: both agents' stats show the given-up requests
// the host released without running them (before, neither was counted:
// the host ran the model again and nobody got its output).
func TestIngestReleasedUnrun(t *testing.T) {
	for _, tc := range []struct {
		name string
		svc  string
		st   any
		want string
	}{
		{"ingest agent", ingestAgent, agent.Stats{HeldReleased: 2}, `doorbells 0 \(0 rung again\), results resent 0; held slots released unrun 2\n`},
		{"host agent", ingestHost, hostagent.Stats{ReleasedUnrun: 3}, `doorbells 0 \(0 repeated, 0 stale, 3 given up released unrun\); ran 0`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := runFake(t, &fakeService{services: []api.ServiceStatus{{Name: tc.svc, State: api.ServiceRunning}}, svcStats: map[string]any{tc.svc: tc.st}}, "ingest", "stats")
			matchOutput(t, out, []string{tc.want}, nil)
		})
	}
}
