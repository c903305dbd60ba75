package msgservice

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
)

// statsCollector collects the metrics of fixed agent counters.
type statsCollector messaging.Stats

func (c statsCollector) Describe(ch chan<- *prometheus.Desc) { (&Service{}).Describe(ch) }
func (c statsCollector) Collect(ch chan<- prometheus.Metric) { collect(messaging.Stats(c), ch) }

// TestRefusedMetrics: bundles refused while draining and on an unconfirmed
// link are exported apart, each under its own reason.
func TestRefusedMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(statsCollector{Received: messaging.RecvStats{Refused: 2, Unconfirmed: 5}})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "lovelock_msg_refused_bundles_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" {
					got[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	if len(got) != 2 || got["draining"] != 2 || got["unconfirmed"] != 5 {
		t.Errorf("lovelock_msg_refused_bundles_total by reason: %v, want draining 2, unconfirmed 5", got)
	}
}
