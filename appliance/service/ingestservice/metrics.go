package ingestservice

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/agent"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/hostagent"
)

var (
	agentReqs     = prometheus.NewDesc("lovelock_ingest_requests_total", "Inference requests the DPU ingest agent finished, by outcome (ok, canceled by the caller, or the refusal's status).", []string{"outcome"}, nil)
	agentBytes    = prometheus.NewDesc("lovelock_ingest_bytes_total", "Bytes the DPU ingest agent moved, by direction (in: from clients; to_device, from_device: the host's slot buffers).", []string{"dir"}, nil)
	agentInFlight = prometheus.NewDesc("lovelock_ingest_in_flight", "Requests open on the DPU ingest agent.", nil, nil)
	agentQueued   = prometheus.NewDesc("lovelock_ingest_queued", "Requests waiting for a GPU slice.", nil, nil)
	agentHeld     = prometheus.NewDesc("lovelock_ingest_slots_held", "GPU slots held for requests already answered (given up on) that the host may still run: neither free nor in flight.", nil, nil)
	agentReleased = prometheus.NewDesc("lovelock_ingest_held_released_total", "Held slots freed because the host, rung for their given-up request, had no record of it and ran nothing.", nil, nil)
	agentLatency  = prometheus.NewDesc("lovelock_ingest_latency_seconds", "Latency from an input's first fragment to its result, by quantile, over the last 4096 results (absent until one completes).", []string{"quantile"}, nil)
	agentHost     = prometheus.NewDesc("lovelock_ingest_host_registered", "1 while a GPU host is registered with the DPU ingest agent.", nil, nil)
	agentRefused  = prometheus.NewDesc("lovelock_ingest_host_refused_total", "Control datagrams the DPU ingest agent refused: from outside host_peer, or registrations naming a handle socket host_socket does not allow.", nil, nil)
	hostRuns      = prometheus.NewDesc("lovelock_ingest_host_runs_total", "Models the GPU host agent ran, by outcome.", []string{"outcome"}, nil)
	hostDoorbells = prometheus.NewDesc("lovelock_ingest_host_doorbells_total", "Doorbells the GPU host agent took, by kind (new, repeat, stale, released: a given-up request it had no record of, nothing run).", []string{"kind"}, nil)
)

// Describe implements prometheus.Collector.
func (s *Service) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{agentReqs, agentBytes, agentInFlight, agentQueued, agentHeld, agentReleased, agentLatency, agentHost, agentRefused} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *Service) Collect(ch chan<- prometheus.Metric) {
	a := s.agent.Load()
	if a == nil {
		return
	}
	collectAgent(ch, a.Stats())
}

// collectAgent sends the ingest agent's metrics from st.
func collectAgent(ch chan<- prometheus.Metric, st agent.Stats) {
	counter := func(d *prometheus.Desc, v uint64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
	}
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	counter(agentReqs, st.Completed, "ok")
	counter(agentReqs, st.Canceled, "canceled")
	for k, v := range st.Refused {
		counter(agentReqs, v, k)
	}
	counter(agentBytes, st.BytesIn, "in")
	counter(agentBytes, st.BytesToDevice, "to_device")
	counter(agentBytes, st.BytesFromDevice, "from_device")
	gauge(agentInFlight, float64(st.InFlight))
	gauge(agentQueued, float64(st.Queued))
	gauge(agentHeld, float64(st.SlotsHeld))
	counter(agentReleased, st.HeldReleased)
	if st.Completed > 0 {
		// Over completed requests: with none, a 0 would read as measured.
		gauge(agentLatency, st.P50.Seconds(), "0.5")
		gauge(agentLatency, st.P99.Seconds(), "0.99")
	}
	reg := 0.0
	if st.Host != nil {
		reg = 1
	}
	gauge(agentHost, reg)
	counter(agentRefused, st.HostRefused)
}

// Describe implements prometheus.Collector.
func (s *HostService) Describe(ch chan<- *prometheus.Desc) {
	ch <- hostRuns
	ch <- hostDoorbells
}

// Collect implements prometheus.Collector.
func (s *HostService) Collect(ch chan<- prometheus.Metric) {
	a := s.agent.Load()
	if a == nil {
		return
	}
	collectHost(ch, a.Stats())
}

func collectHost(ch chan<- prometheus.Metric, st hostagent.Stats) {
	counter := func(d *prometheus.Desc, v uint64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
	}
	counter(hostRuns, st.Completed, "ok")
	counter(hostRuns, st.Failed, "failed")
	// Every doorbell is one kind: released ones ran nothing, so they are
	// not new. The counters are read one after another, so a doorbell
	// taken meanwhile may show in a kind and not yet in the total: never
	// below 0.
	other := st.Repeats + st.Stale + st.ReleasedUnrun
	counter(hostDoorbells, st.Doorbells-min(other, st.Doorbells), "new")
	counter(hostDoorbells, st.Repeats, "repeat")
	counter(hostDoorbells, st.Stale, "stale")
	counter(hostDoorbells, st.ReleasedUnrun, "released")
}
