package msgservice

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
)

var (
	msgBytes    = prometheus.NewDesc("lovelock_msg_sent_bytes_total", "Bundle bytes the messaging agent's transport took, by next hop (first transmissions; refused ones are send errors).", []string{"dest"}, nil)
	msgMessages = prometheus.NewDesc("lovelock_msg_sent_messages_total", "Messages the messaging agent sent, by next hop.", []string{"dest"}, nil)
	msgBundles  = prometheus.NewDesc("lovelock_msg_sent_bundles_total", "Bundles the messaging agent sent, by next hop.", []string{"dest"}, nil)
	msgFlushes  = prometheus.NewDesc("lovelock_msg_flushes_total", "Bundles sent, by next hop and the reason they were closed.", []string{"dest", "reason"}, nil)
	msgRetrans  = prometheus.NewDesc("lovelock_msg_retransmits_total", "Bundles sent again, by next hop.", []string{"dest"}, nil)
	msgRecv     = prometheus.NewDesc("lovelock_msg_received_messages_total", "Messages the messaging agent received.", nil, nil)
	msgDrops    = prometheus.NewDesc("lovelock_msg_drops_total", "Messages or datagrams the messaging agent dropped, by reason.", []string{"reason"}, nil)
	msgRefused  = prometheus.NewDesc("lovelock_msg_refused_bundles_total",
		"Bundles the messaging agent left unacknowledged for their senders to send again (nothing lost), by reason: draining (stopping), "+
			"unconfirmed (a link met in mid-stream, until its sender confirmed where it starts).",
		[]string{"reason"}, nil)
	msgPath = prometheus.NewDesc("lovelock_msg_transport_datagrams_total",
		"Datagrams of the messaging agent's transports (transport xdp), by worker, path (xsk: an AF_XDP socket, kernel: the kernel UDP socket beside them), interface and direction.",
		[]string{"worker", "path", "iface", "dir"}, nil)
	msgXSKDrops = prometheus.NewDesc("lovelock_msg_xsk_dropped_total", "Frames the kernel dropped for an agent worker's AF_XDP socket (RX ring full, no fill frame).",
		[]string{"worker", "iface"}, nil)
)

// Describe implements prometheus.Collector.
func (s *Service) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{msgBytes, msgMessages, msgBundles, msgFlushes, msgRetrans, msgRecv, msgDrops, msgRefused, msgPath, msgXSKDrops} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: the agent's counters, when it
// runs.
func (s *Service) Collect(ch chan<- prometheus.Metric) {
	if st, ok := s.AgentStats(); ok {
		collect(st, ch)
	}
}

// collect sends the metrics of an agent's counters st.
func collect(st messaging.Stats, ch chan<- prometheus.Metric) {
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
	counter(msgRefused, st.Received.Refused, "draining")
	counter(msgRefused, st.Received.Unconfirmed, "unconfirmed")
	dr := st.Drops
	for reason, v := range map[string]uint64{
		"malformed": dr.Malformed, "bad_bundle": dr.BadBundle, "bad_credit": dr.BadCredit, "unknown_rank": dr.UnknownRank,
		"wrong_tenant": dr.WrongTenant, "wrong_dest": dr.WrongDest, "out_of_window": dr.OutOfWindow, "oversize": dr.Oversize,
		"orphans": dr.Orphans, "too_many_links": dr.TooManyLinks, "stale_gap": dr.StaleGap, "dead_peer": dr.DeadPeer, "send_errors": dr.SendErrors,
		"mailbox": dr.Mailbox,
	} {
		counter(msgDrops, v, reason)
	}
	for _, p := range st.Transport {
		w := strconv.Itoa(p.Worker)
		counter(msgPath, p.RX, w, p.Path, p.Interface, "rx")
		counter(msgPath, p.TX, w, p.Path, p.Interface, "tx")
		if p.Path == "xsk" {
			counter(msgXSKDrops, p.Dropped, w, p.Interface)
		}
	}
}
