package daemon

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// collector exports the data plane's counters at scrape time, straight from
// the BPF maps, so metrics never lag the data plane.
type collector struct{ d *Daemon }

var (
	verdictPackets = prometheus.NewDesc("lovelock_steer_packets_total", "Packets seen by the steering data plane, by counter.", []string{"counter"}, nil)
	verdictBytes   = prometheus.NewDesc("lovelock_steer_bytes_total", "Bytes seen by the steering data plane, by counter.", []string{"counter"}, nil)
	rulePackets    = prometheus.NewDesc("lovelock_rule_packets_total", "Packets matched by each rule (rule \"default\": no rule matched).", []string{"rule", "id", "action"}, nil)
	ruleBytes      = prometheus.NewDesc("lovelock_rule_bytes_total", "Bytes matched by each rule.", []string{"rule", "id", "action"}, nil)
	upDesc         = prometheus.NewDesc("lovelock_stats_up", "1 when the data plane's counters could be read.", nil, nil)

	msgBytes    = prometheus.NewDesc("lovelock_msg_sent_bytes_total", "Bundle bytes the messaging agent sent, by next hop (first transmissions).", []string{"dest"}, nil)
	msgMessages = prometheus.NewDesc("lovelock_msg_sent_messages_total", "Messages the messaging agent sent, by next hop.", []string{"dest"}, nil)
	msgBundles  = prometheus.NewDesc("lovelock_msg_sent_bundles_total", "Bundles the messaging agent sent, by next hop.", []string{"dest"}, nil)
	msgFlushes  = prometheus.NewDesc("lovelock_msg_flushes_total", "Bundles sent, by next hop and the reason they were closed.", []string{"dest", "reason"}, nil)
	msgRetrans  = prometheus.NewDesc("lovelock_msg_retransmits_total", "Bundles sent again, by next hop.", []string{"dest"}, nil)
	msgRecv     = prometheus.NewDesc("lovelock_msg_received_messages_total", "Messages the messaging agent received.", nil, nil)
	msgDrops    = prometheus.NewDesc("lovelock_msg_drops_total", "Messages or datagrams the messaging agent dropped, by reason.", []string{"reason"}, nil)
	msgPath     = prometheus.NewDesc("lovelock_msg_transport_datagrams_total",
		"Datagrams of the messaging agent's transports (transport xdp), by worker, path (xsk: an AF_XDP socket, kernel: the kernel UDP socket beside them), interface and direction.",
		[]string{"worker", "path", "iface", "dir"}, nil)
	msgXSKDrops = prometheus.NewDesc("lovelock_msg_xsk_dropped_total", "Frames the kernel dropped for an agent worker's AF_XDP socket (RX ring full, no fill frame).",
		[]string{"worker", "iface"}, nil)
)

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{verdictPackets, verdictBytes, rulePackets, ruleBytes, upDesc,
		msgBytes, msgMessages, msgBundles, msgFlushes, msgRetrans, msgRecv, msgDrops, msgPath, msgXSKDrops} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.collectMessaging(ch)
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
	ch <- prometheus.MustNewConstMetric(rulePackets, prometheus.CounterValue, float64(st.Default.Packets), "default", "0", "default")
	ch <- prometheus.MustNewConstMetric(ruleBytes, prometheus.CounterValue, float64(st.Default.Bytes), "default", "0", "default")
	for _, r := range st.Rules {
		id := strconv.FormatUint(uint64(r.ID), 10)
		ch <- prometheus.MustNewConstMetric(rulePackets, prometheus.CounterValue, float64(r.Counter.Packets), r.Name, id, r.Action)
		ch <- prometheus.MustNewConstMetric(ruleBytes, prometheus.CounterValue, float64(r.Counter.Bytes), r.Name, id, r.Action)
	}
}

// collectMessaging exports the messaging agent's counters, when one runs.
func (c *collector) collectMessaging(ch chan<- prometheus.Metric) {
	a := c.d.agent.Load()
	if a == nil {
		return
	}
	st := a.Stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for _, d := range st.Destinations {
		counter(msgBytes, d.Bytes, d.Name)
		counter(msgMessages, d.Messages, d.Name)
		counter(msgBundles, d.Bundles, d.Name)
		counter(msgRetrans, d.Retransmits, d.Name)
		counter(msgFlushes, d.Flushes.Full, d.Name, "full")
		counter(msgFlushes, d.Flushes.Timeout, d.Name, "timeout")
		counter(msgFlushes, d.Flushes.Idle, d.Name, "idle")
		counter(msgFlushes, d.Flushes.Explicit, d.Name, "explicit")
	}
	counter(msgRecv, st.Received.Messages)
	dr := st.Drops
	for reason, v := range map[string]uint64{
		"malformed": dr.Malformed, "bad_bundle": dr.BadBundle, "bad_credit": dr.BadCredit, "unknown_rank": dr.UnknownRank,
		"wrong_tenant": dr.WrongTenant, "wrong_dest": dr.WrongDest, "out_of_window": dr.OutOfWindow, "oversize": dr.Oversize,
		"orphans": dr.Orphans, "too_many_links": dr.TooManyLinks, "dead_peer": dr.DeadPeer, "send_errors": dr.SendErrors,
		"mailbox": dr.Mailbox,
	} {
		counter(msgDrops, v, reason)
	}
	for _, p := range c.d.transportStats() {
		w := strconv.Itoa(p.Worker)
		counter(msgPath, p.RX, w, p.Path, p.Interface, "rx")
		counter(msgPath, p.TX, w, p.Path, p.Interface, "tx")
		if p.Path == "xsk" {
			counter(msgXSKDrops, p.Dropped, w, p.Interface)
		}
	}
}
