package daemon

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/api"
)

// metricsListenError says why the metrics address could not be listened
// on and what to do: only an address in use may be another lovelockd.
func metricsListenError(err error) error {
	var hint string
	switch {
	case errors.Is(err, unix.EADDRINUSE):
		hint = "another lovelockd, or another program, listens there: stop it, or set metrics: in the config or --metrics off"
	case errors.Is(err, unix.EADDRNOTAVAIL):
		hint = "the address is not on this node: fix metrics: in the config (e.g. 127.0.0.1:9477, or one of 'ip addr'), or --metrics off"
	case errors.Is(err, unix.EACCES):
		hint = "a privileged port: choose one above 1023 in metrics: in the config, or run lovelockd as root"
	default:
		hint = "check metrics: in the config, or set --metrics off"
	}
	return fmt.Errorf("metrics: %w (%s)", err, hint)
}

// collector exports the data plane's counters at scrape time, straight from
// the BPF maps, so metrics never lag the data plane.
type collector struct{ d *Daemon }

var (
	verdictPackets = prometheus.NewDesc("lovelock_steer_packets_total", "Packets seen by the steering data plane, by counter.", []string{"counter"}, nil)
	verdictBytes   = prometheus.NewDesc("lovelock_steer_bytes_total", "Bytes seen by the steering data plane, by counter.", []string{"counter"}, nil)
	rulePackets    = prometheus.NewDesc("lovelock_rule_packets_total", "Packets matched by each rule (rule \"default\": no rule matched).", []string{"rule", "id", "action"}, nil)
	ruleBytes      = prometheus.NewDesc("lovelock_rule_bytes_total", "Bytes matched by each rule.", []string{"rule", "id", "action"}, nil)
	ifacePackets   = prometheus.NewDesc("lovelock_steer_iface_packets_total", fmt.Sprintf("Packets seen by the steering data plane, by interface the hook ran on (TC egress: the interface the packet leaves by; %q: every ifindex from %d up; \"if<N>\": an ifindex with no interface now) and counter.", api.IfaceOther, bpf.IfaceOther), []string{"iface", "counter"}, nil)
	ifaceBytes     = prometheus.NewDesc("lovelock_steer_iface_bytes_total", "Bytes seen by the steering data plane, by interface and counter.", []string{"iface", "counter"}, nil)
	upDesc         = prometheus.NewDesc("lovelock_stats_up", "1 when the data plane's counters could be read.", nil, nil)
	healthyDesc    = prometheus.NewDesc("lovelock_healthy", "1 when lovelockd runs everything it was asked to (lovelock status: health ok), 0 when starting or degraded.", nil, nil)
	failuresDesc   = prometheus.NewDesc("lovelock_failures", "Things lovelockd was asked to run that do not run (lovelock status lists them).", nil, nil)
	attRunning     = prometheus.NewDesc("lovelock_attachment_running", "1 when the attachment's program runs on the live interface of its name, checked against the kernel.", []string{"iface", "hook"}, nil)
)

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{verdictPackets, verdictBytes, ifacePackets, ifaceBytes, rulePackets, ruleBytes, upDesc, healthyDesc, failuresDesc, attRunning} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	if st, err := c.d.Status(); err == nil {
		healthy := 0.0
		if st.Health == api.HealthOK {
			healthy = 1
		}
		ch <- prometheus.MustNewConstMetric(healthyDesc, prometheus.GaugeValue, healthy)
		ch <- prometheus.MustNewConstMetric(failuresDesc, prometheus.GaugeValue, float64(len(st.Failures)))
		for _, l := range st.Links {
			v := 0.0
			if l.Live {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(attRunning, prometheus.GaugeValue, v, l.Iface, string(l.Hook))
		}
	}
	st, err := c.d.Stats()
	if err != nil {
		ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, 1)
	for name, v := range st.Verdicts {
		ch <- prometheus.MustNewConstMetric(verdictPackets, prometheus.CounterValue, float64(v.Packets), name)
		ch <- prometheus.MustNewConstMetric(verdictBytes, prometheus.CounterValue, float64(v.Bytes), name)
	}
	for iface, cs := range st.Interfaces {
		for name, v := range cs {
			ch <- prometheus.MustNewConstMetric(ifacePackets, prometheus.CounterValue, float64(v.Packets), iface, name)
			ch <- prometheus.MustNewConstMetric(ifaceBytes, prometheus.CounterValue, float64(v.Bytes), iface, name)
		}
	}
	ch <- prometheus.MustNewConstMetric(rulePackets, prometheus.CounterValue, float64(st.Default.Packets), "default", "0", "default")
	ch <- prometheus.MustNewConstMetric(ruleBytes, prometheus.CounterValue, float64(st.Default.Bytes), "default", "0", "default")
	for _, r := range st.Rules {
		id := strconv.FormatUint(uint64(r.ID), 10)
		ch <- prometheus.MustNewConstMetric(rulePackets, prometheus.CounterValue, float64(r.Counter.Packets), r.Name, id, r.Action)
		ch <- prometheus.MustNewConstMetric(ruleBytes, prometheus.CounterValue, float64(r.Counter.Bytes), r.Name, id, r.Action)
	}
}
