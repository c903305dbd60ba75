package memservice

import (
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

func resolve(name string) (int, error) {
	if name == "p0" {
		return 3, nil
	}
	return 0, errors.New("no such interface")
}

// TestAgentRules: the agent's pass rules are reserved, compile with an
// operator's set that drops everything else, and match its traffic on the
// Lovelock port by type, elsewhere by port.
func TestAgentRules(t *testing.T) {
	cfg := farmem.AgentConfig{Listen: netip.MustParseAddrPort("10.77.0.10:61440"),
		Servers: []farmem.ServerSpec{{Addr: netip.MustParseAddrPort("10.77.0.20:61440")}, {Addr: netip.MustParseAddrPort("10.77.0.21:7000")}}}
	rs := AgentRules(cfg, wire.DefaultPort)
	var names []string
	for _, r := range rs {
		names = append(names, r.Name)
		if !api.IsOwned(r.Name) || r.Priority < api.OwnedPriority || r.Action.String() != "pass" {
			t.Errorf("rule %+v: want a reserved pass rule", r)
		}
	}
	if got := strings.Join(names, ","); got != "lovelockd:mem/host/mem-read,lovelockd:mem/host/mem-write,lovelockd:mem/server0,lovelockd:mem/server1" {
		t.Errorf("rules %s", got)
	}
	set := rules.Set{Default: rules.Drop(), Rules: append([]rules.Rule{{Name: "op", Priority: 10, Match: rules.Match{Iface: "p0"}, Action: rules.Drop()}}, rs...)}
	if _, err := rules.Compile(&set, resolve, wire.DefaultPort); err != nil {
		t.Fatalf("the agent's rules do not compile beside an operator's: %v", err)
	}
	cfg.Listen = netip.MustParseAddrPort("10.77.0.10:7100")
	if r := AgentRules(cfg, wire.DefaultPort)[0]; r.Name != "lovelockd:mem/host" || *r.Match.Dport != 7100 || r.Match.Type != nil {
		t.Errorf("off the Lovelock port: %+v", r)
	}
}

// TestConfigs: each section's errors say what to put there.
func TestConfigs(t *testing.T) {
	for _, c := range []struct {
		name string
		json string
		into interface{ Validate() error }
		want string
	}{
		{"server ok", `{"addr": "10.77.0.20:61440", "state_dir": "/var/lib/x", "capacity": "8GiB"}`, &ServerConfig{}, ""},
		{"server no addr", `{"state_dir": "/x", "capacity": 100}`, &ServerConfig{}, "addr"},
		{"server no dir", `{"addr": "10.77.0.20:61440", "capacity": 100}`, &ServerConfig{}, "state_dir is empty"},
		{"server no capacity", `{"addr": "10.77.0.20:61440", "state_dir": "/x"}`, &ServerConfig{}, "capacity is 0"},
		{"server max_regions", `{"addr": "10.77.0.20:61440", "state_dir": "/x", "capacity": 100, "max_regions": 64}`, &ServerConfig{}, ""},
		{"server bad max_regions", `{"addr": "10.77.0.20:61440", "state_dir": "/x", "capacity": 100, "max_regions": -1}`, &ServerConfig{}, "memory_server: farmem: config: max_regions -1"},
		{"server bad chunk", `{"addr": "10.77.0.20:61440", "state_dir": "/x", "capacity": 100, "chunk_size": 100}`, &ServerConfig{}, "chunk_size"},
		{"agent ok", `{"listen": "10.77.0.10:61440", "servers": [{"addr": "10.77.0.20:61440"}]}`, &AgentConfig{}, ""},
		{"agent no listen", `{"servers": [{"addr": "10.77.0.20:61440"}]}`, &AgentConfig{}, "listen"},
		{"agent no servers", `{"listen": "10.77.0.10:61440"}`, &AgentConfig{}, "no servers"},
		{"host ok", `{"agent": "10.77.0.10:61440"}`, &HostConfig{}, ""},
		{"host no agent", `{}`, &HostConfig{}, "far_memory_host: agent"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := json.Unmarshal([]byte(c.json), c.into); err != nil {
				t.Fatal(err)
			}
			err := c.into.Validate()
			if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
				t.Errorf("err = %v, want %q", err, c.want)
			}
		})
	}
	var s ServerConfig
	if err := json.Unmarshal([]byte(`{"capacity": "1.5GiB"}`), &s); err == nil {
		t.Error("capacity 1.5GiB accepted")
	}
}

// TestAgentCacheConfig: the far_memory section's cache knobs read as
// the docs write them, and a bad one stops lovelockd with its name.
func TestAgentCacheConfig(t *testing.T) {
	in := `{"listen": "10.77.0.10:61440", "servers": [{"addr": "10.77.0.20:61440"}],
		"cache": {"size": "256MiB", "entry_size": "1MiB", "prefetcher": "stride", "b_net": "1GiB", "window": 512,
			"regions": [{"region": 7, "prefetcher": "hints", "static": [{"offset": 0, "size": 1048576}]}]}}`
	var c AgentConfig
	if err := json.Unmarshal([]byte(in), &c); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	cc := c.Cache
	if cc.Size != 256<<20 || cc.EntrySize != 1<<20 || cc.Prefetcher != farmem.PrefetchStride || cc.BNet != 1<<30 ||
		len(cc.Regions) != 1 || *cc.Regions[0].Prefetcher != farmem.PrefetchHints || cc.Regions[0].Static[0].Size != 1<<20 {
		t.Fatalf("cache config %+v", cc)
	}
	c.Cache.EntrySize = 1000 // not a multiple of the chunk size
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "entry_size") {
		t.Fatalf("bad entry_size: %v", err)
	}
	if err := json.Unmarshal([]byte(`{"cache": {"prefetcher": "markov"}}`), &c); err == nil {
		t.Fatal("unknown prefetcher accepted")
	}
}
