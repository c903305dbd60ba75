package messaging

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func validConfig() Config {
	c := Defaults()
	c.Workers = 2
	c.Nodes = []Node{
		{Name: "a", Agent: netip.MustParseAddrPort("10.0.0.1:61440"), Clients: []ClientSpec{
			{Name: "p0", Addr: netip.MustParseAddrPort("10.0.1.1:7000"), Ranks: Range(0, 3)},
			{Name: "p1", Addr: netip.MustParseAddrPort("10.0.1.1:7001"), Ranks: Range(4, 7)},
		}},
		{Name: "b", Agent: netip.MustParseAddrPort("10.0.0.2:61440"), Clients: []ClientSpec{
			{Name: "p0", Addr: netip.MustParseAddrPort("10.0.1.2:7000"), Ranks: Ranks{{8, 9}, {20, 20}}},
		}},
	}
	return c
}

func TestValidate(t *testing.T) {
	if err := validConfig().Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"mode", func(c *Config) { c.Mode = "turbo" }, `mode "turbo"`},
		{"transfer size small", func(c *Config) { c.TransferSize = 100 }, "transfer_size 100 outside 128..65507"},
		{"transfer size big", func(c *Config) { c.TransferSize = 70000 }, "transfer_size 70000"},
		{"buffers", func(c *Config) { c.BuffersPerDest = 65 }, "buffers_per_dest 65 outside 1..64"},
		{"no buffers", func(c *Config) { c.BuffersPerDest = 0 }, "buffers_per_dest 0"},
		{"workers", func(c *Config) { c.Workers = 0 }, "workers 0"},
		{"flush timeout", func(c *Config) { c.FlushTimeout = 0 }, "flush_timeout 0s"},
		{"idle timeout", func(c *Config) { c.IdleTimeout = Duration(2 * time.Minute) }, "idle_timeout 2m0s"},
		{"rto", func(c *Config) { c.RetransmitTimeout = Duration(time.Microsecond) }, "retransmit_timeout 1µs"},
		{"peer timeout", func(c *Config) { c.PeerTimeout = Duration(20 * time.Millisecond) }, "peer_timeout 20ms must be at least 4 retransmit_timeouts"},
		{"max message", func(c *Config) { c.MaxMessageSize = 0 }, "max_message_size 0"},
		{"shards", func(c *Config) { c.SenderShards = 65 }, "sender_shards 65"},
		{"no nodes", func(c *Config) { c.Nodes = nil }, "nodes: none configured"},
		{"node name", func(c *Config) { c.Nodes[1].Name = "" }, "nodes[1]: name is empty"},
		{"node twice", func(c *Config) { c.Nodes[1].Name = "a" }, `node "a": name used twice`},
		{"no agent", func(c *Config) { c.Nodes[0].Agent = netip.AddrPort{} }, `node "a" agent: address "invalid AddrPort" is not a usable ip:port`},
		{"agent port", func(c *Config) { c.Nodes[0].Agent = netip.MustParseAddrPort("10.0.0.1:0") }, "needs a port (Lovelock's is 61440)"},
		{"same address", func(c *Config) { c.Nodes[1].Agent = c.Nodes[0].Agent }, `address 10.0.0.1:61440 is also node "a" agent's`},
		{"client twice", func(c *Config) { c.Nodes[0].Clients[1].Name = "p0" }, `client "p0": name used twice`},
		{"client address", func(c *Config) { c.Nodes[0].Clients[1].Addr = c.Nodes[0].Clients[0].Addr }, "is also node"},
		{"ranks overlap", func(c *Config) { c.Nodes[1].Clients[0].Ranks = Range(3, 3) }, "rank 3 belongs to both"},
		{"rank range empty", func(c *Config) { c.Nodes[1].Clients[0].Ranks = Ranks{{5, 2}} }, "rank range 5-2 is empty"},
		{"reserved rank", func(c *Config) { c.Nodes[1].Clients[0].Ranks = Range(4294967290, 4294967295) }, "rank 4294967295 is reserved"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.edit(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v\nwant an error containing %q", err, tc.want)
			}
		})
	}
	// ModeNone needs no agent addresses.
	c := validConfig()
	c.Mode = ModeNone
	c.Nodes[0].Agent, c.Nodes[1].Agent = netip.AddrPort{}, netip.AddrPort{}
	if err := c.Validate(); err != nil {
		t.Errorf("mode none without agents: %v", err)
	}
}

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig([]byte(`
mode: host
tenant: 3
transfer_size: 8192
flush_timeout: 2ms
idle_timeout: 300us
workers: 4
nodes:
  - name: n0
    agent: 10.0.0.1:61440
    clients:
      - {name: app, addr: "10.0.0.1:7000", ranks: "0-3,8"}
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode != ModeHost || c.Tenant != 3 || c.TransferSize != 8192 || c.FlushTimeout.D() != 2*time.Millisecond ||
		c.IdleTimeout.D() != 300*time.Microsecond || c.Workers != 4 || c.BuffersPerDest != DefaultBuffersPerDest {
		t.Fatalf("parsed %+v", c)
	}
	if got := c.Nodes[0].Clients[0].Ranks.String(); got != "0-3,8" {
		t.Fatalf("ranks %q", got)
	}
	if _, err := ParseConfig([]byte("tranfser_size: 1\nnodes: []\n")); err == nil || !strings.Contains(err.Error(), "unknown field") {
		t.Fatalf("unknown field: %v", err)
	}
	if _, err := ParseConfig([]byte("flush_timeout: soon\n")); err == nil {
		t.Fatal("bad duration accepted")
	}
	// JSON round trip.
	b, err := json.Marshal(validConfig())
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseConfig(b)
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if back.Nodes[1].Clients[0].Ranks.String() != "8-9,20" || back.FlushTimeout != DefaultFlushTimeout {
		t.Fatalf("round trip: %s", b)
	}
}

func TestRanks(t *testing.T) {
	r, err := ParseRanks(" 0-3, 8 ,10-11")
	if err != nil || r.String() != "0-3,8,10-11" || r.Count() != 7 || !r.Contains(11) || r.Contains(9) {
		t.Fatalf("ParseRanks = %v (%d), %v", r, r.Count(), err)
	}
	if got := r.All(); len(got) != 7 || got[4] != 8 {
		t.Fatalf("All = %v", got)
	}
	for _, bad := range []string{"x", "1-", "3-1", "-1", "1,,2", "4294967296"} {
		if _, err := ParseRanks(bad); err == nil {
			t.Errorf("ParseRanks(%q) accepted", bad)
		}
	}
	if r, err := ParseRanks(""); err != nil || len(r) != 0 {
		t.Errorf("empty: %v, %v", r, err)
	}
}

func TestEndpoint(t *testing.T) {
	a := AgentEndpoint(513, 7)
	if a.Node() != 513 || a.IsClient() || a.Worker() != 7 || a.String() != "n513/w7" {
		t.Fatalf("agent endpoint %v", a)
	}
	c := ClientEndpoint(2, 511, 63)
	if c.Node() != 2 || !c.IsClient() || c.Client() != 511 || c.Shard() != 63 || c.String() != "n2/c511.s63" {
		t.Fatalf("client endpoint %v", c)
	}
	eps := validConfig().WorkerEndpoints(1)
	if len(eps) != 2 || eps[1] != AgentEndpoint(1, 1) {
		t.Fatalf("WorkerEndpoints = %v", eps)
	}
	if _, err := validConfig().NodeIndex("zz"); err == nil {
		t.Fatal("unknown node found")
	}
}

func TestRankTable(t *testing.T) {
	c := validConfig()
	tab := newRankTable(c, func(n, cl int) int32 { return int32(n*10 + cl) })
	for rank, want := range map[uint32]int32{0: 0, 7: 1, 8: 10, 20: 10, 10: -1, 21: -1, 1 << 30: -1} {
		if got := tab.lookup(rank); got != want {
			t.Errorf("dense lookup(%d) = %d, want %d", rank, got, want)
		}
	}
	c.Nodes[1].Clients[0].Ranks = Ranks{{1 << 30, 1<<30 + 1}}
	tab = newRankTable(c, func(n, cl int) int32 { return int32(n*10 + cl) })
	if tab.dense != nil || tab.lookup(1<<30+1) != 10 || tab.lookup(5) != 1 || tab.lookup(9) != -1 {
		t.Errorf("sparse table wrong")
	}
}
