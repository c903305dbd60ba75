package farmem

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// histogram is a fixed latency histogram: four buckets per power of two of
// nanoseconds, counted with atomics, so recording neither locks nor
// allocates. Percentiles are reported as the upper edge of their bucket
// (at most 19% above the true value).
type histogram struct {
	b [64 * 4]atomic.Uint64
}

func bucketOf(ns uint64) int {
	if ns < 4 {
		return int(ns)
	}
	e := bits.Len64(ns) - 1 // ns in [2^e, 2^(e+1))
	return e*4 + int(ns>>(e-2)&3)
}

// upper returns the exclusive upper edge of bucket i in nanoseconds.
func upper(i int) uint64 {
	if i < 4 {
		return uint64(i) + 1
	}
	e, m := i/4, uint64(i%4)
	return (4 + m + 1) << (e - 2)
}

func (h *histogram) record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.b[bucketOf(uint64(d))].Add(1)
}

// Latency is a latency summary.
type Latency struct {
	Count uint64 `json:"count"`
	// P50 and P99 in microseconds (the upper edge of their bucket).
	P50us float64 `json:"p50_us"`
	P99us float64 `json:"p99_us"`
	MaxUs float64 `json:"max_us"`
}

func (h *histogram) summary() Latency {
	var counts [len(histogram{}.b)]uint64
	var total uint64
	for i := range h.b {
		counts[i] = h.b[i].Load()
		total += counts[i]
	}
	l := Latency{Count: total}
	if total == 0 {
		return l
	}
	// The nearest rank, ceil(pct·total/100), in integers: rounding p·n to
	// the nearest instead reported 158 of 160 samples as p99, below the 2
	// slowest (1.25%).
	q := func(pct uint64) float64 {
		rank := max(1, (pct*total+99)/100)
		var c uint64
		for i, n := range counts {
			c += n
			if c >= rank {
				return float64(upper(i)) / 1e3
			}
		}
		return 0
	}
	l.P50us, l.P99us, l.MaxUs = q(50), q(99), q(100)
	return l
}

// ErrorCounts counts failed requests by kind.
type ErrorCounts struct {
	UnknownRegion uint64 `json:"unknown_region"`
	OutOfRange    uint64 `json:"out_of_range"`
	WrongTenant   uint64 `json:"wrong_tenant"`
	WriterBusy    uint64 `json:"writer_busy"`
	NotWriter     uint64 `json:"not_writer"`
	ReadOnly      uint64 `json:"read_only"`
	NoSpace       uint64 `json:"no_space"`
	BadRequest    uint64 `json:"bad_request"`
	IO            uint64 `json:"io"`
	Unavailable   uint64 `json:"unavailable"`
	NoServer      uint64 `json:"no_server"`
}

type statusCounters [numStatus]atomic.Uint64

func (s *statusCounters) count(st Status) {
	if int(st) < len(s) {
		s[st].Add(1)
	}
}

func (s *statusCounters) snapshot() ErrorCounts {
	return ErrorCounts{
		UnknownRegion: s[StatusUnknownRegion].Load(), OutOfRange: s[StatusOutOfRange].Load(),
		WrongTenant: s[StatusWrongTenant].Load(), WriterBusy: s[StatusWriterBusy].Load(),
		NotWriter: s[StatusNotWriter].Load(), ReadOnly: s[StatusReadOnly].Load(),
		NoSpace: s[StatusNoSpace].Load(), BadRequest: s[StatusBadRequest].Load(),
		IO: s[StatusIO].Load(), Unavailable: s[StatusUnavailable].Load(), NoServer: s[StatusNoServer].Load(),
	}
}

// LinkStats count one side of the protocol on one link: requests as a
// requester (Sent*, Retransmits, Timeouts) or as a responder (Received*,
// Duplicates, Stale).
type LinkStats struct {
	// Requests counts requests issued (requester) or executed
	// (responder); Datagrams and Bytes the datagrams and their bytes
	// sent, TX, and received, RX, first transmissions and
	// retransmissions alike.
	Requests    uint64 `json:"requests"`
	TXDatagrams uint64 `json:"tx_datagrams"`
	TXBytes     uint64 `json:"tx_bytes"`
	RXDatagrams uint64 `json:"rx_datagrams"`
	RXBytes     uint64 `json:"rx_bytes"`
	// Retransmits counts requests sent again after a timeout; Timeouts
	// requests that failed after every try (ErrUnavailable).
	Retransmits uint64 `json:"retransmits"`
	Timeouts    uint64 `json:"timeouts"`
	// Duplicates counts requests that arrived again and were answered
	// from the reply cache or ignored while in progress; Stale those below
	// their requester's floor (dropped); Evicted partial reassemblies
	// dropped for room.
	Duplicates uint64 `json:"duplicates"`
	Stale      uint64 `json:"stale"`
	Evicted    uint64 `json:"evicted"`
	// RepliesEvicted counts cached replies dropped before their
	// requester's floor passed them, for reply_cache, reply_cache_bytes or
	// a forgotten requester: a late duplicate of one is executed again.
	RepliesEvicted uint64 `json:"replies_evicted"`
	// Malformed counts datagrams that failed Decode, wrong-direction
	// records and replies to no outstanding request.
	Malformed uint64 `json:"malformed"`
	Orphans   uint64 `json:"orphans"`
	// Receives counts the receive calls that returned datagrams (a
	// blocking receive loop's wake-ups), Sends the batches of datagrams
	// handed to the transport: RXDatagrams / Receives and TXDatagrams /
	// Sends are how many datagrams share one.
	Receives uint64 `json:"receives"`
	Sends    uint64 `json:"sends"`
}

type linkCounters struct {
	requests, txDgrams, txBytes, rxDgrams, rxBytes atomic.Uint64
	retransmits, timeouts, duplicates, stale       atomic.Uint64
	evicted, malformed, orphans, repliesEvicted    atomic.Uint64
	receives, sends                                atomic.Uint64
}

func (c *linkCounters) snapshot() LinkStats {
	return LinkStats{
		Requests: c.requests.Load(), TXDatagrams: c.txDgrams.Load(), TXBytes: c.txBytes.Load(),
		RXDatagrams: c.rxDgrams.Load(), RXBytes: c.rxBytes.Load(), Retransmits: c.retransmits.Load(),
		Timeouts: c.timeouts.Load(), Duplicates: c.duplicates.Load(), Stale: c.stale.Load(),
		Evicted: c.evicted.Load(), RepliesEvicted: c.repliesEvicted.Load(), Malformed: c.malformed.Load(), Orphans: c.orphans.Load(),
		Receives: c.receives.Load(), Sends: c.sends.Load(),
	}
}

// sent counts one batch of datagrams handed to the transport.
func (c *linkCounters) sent(pkts, bytes int) {
	if pkts > 0 {
		c.sends.Add(1)
	}
	c.txDgrams.Add(uint64(pkts))
	c.txBytes.Add(uint64(bytes))
}

// sometimes lets one event in each interval through (to be logged) and
// counts the ones it holds back, without locks.
type sometimes struct {
	every time.Duration
	next  atomic.Int64 // Unix nanoseconds before which events are held back
	held  atomic.Uint64
}

// allow reports whether the event at now may be logged, and how many were
// held back since the last one that was.
func (s *sometimes) allow(now time.Time) (bool, uint64) {
	n := s.next.Load()
	if now.UnixNano() < n || !s.next.CompareAndSwap(n, now.Add(s.every).UnixNano()) {
		s.held.Add(1)
		return false, 0
	}
	return true, s.held.Swap(0)
}
