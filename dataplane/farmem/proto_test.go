package farmem

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// TestPackRoundTrip: records packed (several per datagram, large data split
// into FragUnit-aligned fragments) decode to the same fields, and the
// fragments cover the data exactly once.
func TestPackRoundTrip(t *testing.T) {
	peer := netip.MustParseAddrPort("10.0.0.1:61440")
	for _, tc := range []struct {
		name string
		max  int
		size int
	}{
		{"small in jumbo", 8972, 100},
		{"chunk in jumbo", 8972, 64 << 10},
		{"odd chunk in 1500", 1472, 64<<10 - 123},
		{"max chunk", 65507, MaxChunk},
		{"empty", 1472, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := make([]byte, tc.size)
			for i := range data {
				data[i] = byte(i * 7)
			}
			pk := newPacker(tc.max)
			pk.floor = 42
			// A small record first, so the write shares its first datagram.
			if err := pk.add(peer, 3, wire.TypeMemRead, Record{Op: OpSync, Region: 9, ID: 1}, nil, false); err != nil {
				t.Fatal(err)
			}
			if err := pk.add(peer, 3, wire.TypeMemWrite, Record{Op: OpWrite, Region: 9, ID: 2, Offset: 1 << 40, Size: uint32(tc.size), Aux: 5}, data, true); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, tc.size)
			covered := 0
			var recs []Record
			for _, p := range pk.out {
				if len(p.Data) > tc.max {
					t.Fatalf("datagram of %d bytes, max %d", len(p.Data), tc.max)
				}
				h, floor, rs, err := Decode(p.Data, recs[:0])
				if err != nil {
					t.Fatal(err)
				}
				recs = rs
				if floor != 42 || h.Tenant != 3 || h.Dst != 9 {
					t.Fatalf("header %+v floor %d", h, floor)
				}
				for _, r := range recs {
					if r.Op != OpWrite {
						continue
					}
					if r.ID != 2 || r.Offset != 1<<40 || r.Aux != 5 || r.Size != uint32(tc.size) {
						t.Fatalf("record %+v", r)
					}
					copy(got[r.Frag:], r.Data)
					covered += len(r.Data)
				}
			}
			if covered != tc.size || !bytes.Equal(got, data) {
				t.Fatalf("fragments cover %d of %d bytes, equal %v", covered, tc.size, bytes.Equal(got, data))
			}
		})
	}
}

// TestConfigValidate: each out-of-range knob is named.
func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"defaults", func(*Config) {}, ""},
		{"chunk not aligned", func(c *Config) { c.ChunkSize = 1000 }, "chunk_size"},
		{"chunk too big", func(c *Config) { c.ChunkSize = 2 << 20 }, "chunk_size"},
		{"datagram too small", func(c *Config) { c.MaxDatagram = 100 }, "max_datagram"},
		{"max below timeout", func(c *Config) { c.MaxRetransmitTimeout = 1; c.RetransmitTimeout = 5 }, "retransmit_timeout"},
		{"tries", func(c *Config) { c.Tries = 1000 }, "tries"},
		{"lease", func(c *Config) { c.LeaseTTL = 1 }, "lease_ttl"},
		{"reply cache bytes too small", func(c *Config) { c.ReplyCacheBytes = MinReplyCacheBytes - 1 }, "reply_cache_bytes"},
		{"reply cache bytes too big", func(c *Config) { c.ReplyCacheBytes = MaxReplyCacheBytes + 1 }, "reply_cache_bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Defaults()
			tc.edit(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
				t.Fatalf("got %v, want an error naming %s", err, tc.want)
			}
		})
	}
	if err := (AgentConfig{}).Validate(); err == nil {
		t.Fatal("agent config without servers validated")
	}
	node := ServerSpec{Addr: netip.MustParseAddrPort("10.0.0.1:7000")}
	if err := (AgentConfig{Servers: []ServerSpec{node, node}}).Validate(); err == nil || !strings.Contains(err.Error(), "list each memory node once") {
		t.Fatalf("a memory node listed twice: %v", err)
	}
}

// TestHistogram: percentiles land in the right bucket.
func TestHistogram(t *testing.T) {
	var h histogram
	for i := 1; i <= 1000; i++ {
		h.record(1000 * 1000) // 1 ms
	}
	for i := 0; i < 20; i++ {
		h.record(50 * 1000 * 1000) // 50 ms
	}
	s := h.summary()
	if s.Count != 1020 || s.P50us < 1000 || s.P50us > 1200 || s.P99us < 50000 || s.P99us > 60000 {
		t.Fatalf("%+v", s)
	}
}

// TestHistogramRanks: a percentile is the nearest rank, ceil(p·n): p99 is
// the latency that at least 99% of the samples do not exceed, so when more
// than 1% are slow it is a slow one.
func TestHistogramRanks(t *testing.T) {
	const fast, slow = time.Millisecond, 50 * time.Millisecond
	for _, tc := range []struct {
		name             string
		fast, slow       int
		p50Slow, p99Slow bool
	}{
		{"2 of 160 slow (1.25%)", 158, 2, false, true},
		{"1 of 160 slow", 159, 1, false, false},
		{"1 of 100 slow", 99, 1, false, false},
		{"2 of 100 slow", 98, 2, false, true},
		{"one sample", 1, 0, false, false},
		{"2 of 3 slow", 1, 2, true, true},
		{"1 of 2 slow", 1, 1, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h histogram
			for range tc.fast {
				h.record(fast)
			}
			for range tc.slow {
				h.record(slow)
			}
			s := h.summary()
			isSlow := func(us float64) bool { return us >= float64(slow.Microseconds()) }
			if s.Count != uint64(tc.fast+tc.slow) || isSlow(s.P50us) != tc.p50Slow || isSlow(s.P99us) != tc.p99Slow ||
				isSlow(s.MaxUs) != (tc.slow > 0) {
				t.Fatalf("%d fast, %d slow: %+v; want p50 slow %v, p99 slow %v", tc.fast, tc.slow, s, tc.p50Slow, tc.p99Slow)
			}
		})
	}
}

// FuzzDecode: Decode never panics; what it accepts re-encodes to the same
// bytes; what it rejects wraps wire's sentinels or ErrMalformed.
func FuzzDecode(f *testing.F) {
	f.Add(AppendDatagram(nil, wire.Header{Type: wire.TypeMemRead, Tenant: 1, Dst: 2}, 7, Record{Op: OpRead, Region: 2, ID: 9, Size: 100}))
	f.Add(AppendDatagram(nil, wire.Header{Type: wire.TypeMemWrite, Tenant: 1, Dst: 2}, 7,
		Record{Op: OpWrite, Region: 2, ID: 9, Size: 1000, Data: make([]byte, 512)},
		Record{Op: OpWrite, Region: 2, ID: 9, Size: 1000, Frag: 512, Data: make([]byte, 488)}))
	f.Add(AppendDatagram(nil, wire.Header{Type: wire.TypeMemReply}, 0, Record{Op: OpList, Data: make([]byte, 40)}))
	f.Add(AppendDatagram(nil, wire.Header{Type: wire.TypeMemReply, Dst: 5}, 0, Record{Op: OpFreed, Region: 5, Aux: NoticeVersion}))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, floor, recs, err := Decode(b, nil)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && wire.StatusOf(err) == wire.StatusNotLovelock {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		if len(recs) == 0 {
			t.Fatal("accepted a payload without records")
		}
		for _, r := range recs {
			if (r.Op == OpRead || r.Op == OpWrite) && r.Size > MaxChunk {
				t.Fatalf("accepted %v of %d bytes", r.Op, r.Size)
			}
			fragmented := h.Type != wire.TypeMemReply && r.Op == OpWrite ||
				h.Type == wire.TypeMemReply && r.Op == OpRead && r.Status == StatusOK
			switch {
			case fragmented && (uint64(r.Frag)+uint64(len(r.Data)) > uint64(r.Size) || r.Frag%FragUnit != 0):
				t.Fatalf("accepted a fragment out of place: %+v", r)
			case !fragmented && r.Frag != 0:
				t.Fatalf("accepted a fragment offset on an unfragmented record: %+v", r)
			}
		}
		re := AppendDatagram(nil, h, floor, recs...)
		// The flags word of records (bytes 2-3) is written as zero; inputs
		// with other bits there re-encode differently, so compare after
		// clearing them in the input.
		in := append([]byte(nil), b...)
		off := wire.HeaderLen + PreambleLen
		for _, r := range recs {
			in[off+2], in[off+3] = 0, 0
			off += RecordHdrLen + len(r.Data)
		}
		if !bytes.Equal(re, in) {
			t.Fatalf("re-encoded:\n got % x\nwant % x", re, in)
		}
	})
}

// TestAgentConfigYAML: the agent section as docs/farmem.md shows it parses
// (durations as text, Config's knobs inline) and validates.
func TestAgentConfigYAML(t *testing.T) {
	doc := `
chunk_size: 65536
max_datagram: 8972
retransmit_timeout: 20ms
max_retransmit_timeout: 500ms
tries: 14
window: 256
reassembly: 256
lease_ttl: 15s
reply_cache: 4096
reply_cache_bytes: 64MiB
listen: 10.0.0.10:61440
servers:
  - addr: 10.0.9.1:61440
    regions: [1, 2]
`
	var c AgentConfig
	if err := yaml.UnmarshalStrict([]byte(doc), &c); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.RetransmitTimeout.D() != 20*time.Millisecond || c.LeaseTTL.D() != 15*time.Second || c.ChunkSize != 64<<10 ||
		c.ReplyCacheBytes != 64<<20 || len(c.Servers) != 1 || c.Servers[0].Addr != netip.MustParseAddrPort("10.0.9.1:61440") || len(c.Servers[0].Regions) != 2 {
		t.Fatalf("parsed %+v", c)
	}
}

func TestLost(t *testing.T) {
	for _, tc := range []struct {
		err  error
		lost bool
	}{
		{nil, false},
		{fmt.Errorf("read: %w", ErrUnknownRegion), true},
		{fmt.Errorf("read: %w", ErrWrongTenant), true},
		{fmt.Errorf("read: %w", ErrOutOfRange), true},
		{fmt.Errorf("read: %w", ErrBadRequest), true},
		{fmt.Errorf("read: %w", ErrUnavailable), false},
		{fmt.Errorf("read: %w", ErrNoServer), false},
		{fmt.Errorf("read: %w", ErrIO), false},
		{fmt.Errorf("read: %w", ErrClosed), false},
		{errors.New("farmem: unknown region"), false}, // the words alone are not the sentinel
	} {
		if got := Lost(tc.err); got != tc.lost {
			t.Errorf("Lost(%v) = %v, want %v", tc.err, got, tc.lost)
		}
	}
}

// refusingTransport refuses datagrams to one address and, after closeAfter
// sends, says it is closed.
type refusingTransport struct {
	transport.Transport
	refuse     netip.AddrPort
	closeAfter int
	sent       []int // lengths of the datagrams handed to the network
}

func (r *refusingTransport) Send(pkts []transport.Packet) (int, error) {
	for i, p := range pkts {
		if len(r.sent) == r.closeAfter {
			return i, transport.ErrClosed
		}
		if p.Addr == r.refuse {
			return i, transport.ErrAddr
		}
		r.sent = append(r.sent, len(p.Data))
	}
	return len(pkts), nil
}

// TestFlushCountsSent: flush counts the datagrams and bytes the transport
// took, not those it refused, nor those left when it closed.
func TestFlushCountsSent(t *testing.T) {
	bad := netip.MustParseAddrPort("10.0.0.9:1")
	// A datagram each: one peer per record.
	peers := []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:1"), bad, netip.MustParseAddrPort("10.0.0.2:1"), netip.MustParseAddrPort("10.0.0.3:1")}
	for _, closeAfter := range []int{100, 2} {
		pk := newPacker(1000)
		for i, addr := range peers {
			if err := pk.add(addr, 3, wire.TypeMemRead, Record{Op: OpRead, Region: 9, ID: uint64(i + 1), Size: 10}, nil, false); err != nil {
				t.Fatal(err)
			}
		}
		tr := &refusingTransport{refuse: bad, closeAfter: closeAfter}
		pkts, n, err := pk.flush(tr)
		want := 0
		for _, l := range tr.sent {
			want += l
		}
		if wantPkts := min(3, closeAfter); len(tr.sent) != wantPkts {
			t.Fatalf("close after %d: the transport took %d datagrams, want %d", closeAfter, len(tr.sent), wantPkts)
		}
		if pkts != len(tr.sent) || n != want || (closeAfter < 100) != errors.Is(err, transport.ErrClosed) {
			t.Errorf("close after %d: flush says %d datagrams, %d bytes, %v; the transport took %d datagrams, %d bytes",
				closeAfter, pkts, n, err, len(tr.sent), want)
		}
	}
}
