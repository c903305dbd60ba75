package ingestservice

import (
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/kserve"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

func validAgent() Config {
	return Config{Listen: netip.MustParseAddrPort("10.77.0.12:61440"), HostListen: netip.MustParseAddrPort("10.77.12.2:61441"),
		Models: []ModelConfig{{Name: "checksum"}, {Name: "mlp"}}}
}

func TestConfigValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		f    func(*Config)
		want string // "" for valid
	}{
		"valid":                      {func(*Config) {}, ""},
		"xdp":                        {func(c *Config) { c.Transport, c.Interfaces = "xdp", []string{"p0"} }, ""},
		"no listen":                  {func(c *Config) { c.Listen = netip.AddrPort{} }, "listen"},
		"listen on every address":    {func(c *Config) { c.Listen = netip.MustParseAddrPort("0.0.0.0:61440") }, "listen 0.0.0.0:61440 is every address"},
		"listen on every v6 address": {func(c *Config) { c.Listen = netip.MustParseAddrPort("[::]:61440") }, "listen [::]:61440 is every address"},
		"same addresses":             {func(c *Config) { c.HostListen = c.Listen }, "host_listen equals listen"},
		"bad transport":              {func(c *Config) { c.Transport = "rdma" }, "want udp or xdp"},
		"xdp, no ifaces":             {func(c *Config) { c.Transport = "xdp" }, "needs interfaces"},
		"no models":                  {func(c *Config) { c.Models = nil }, "no models"},
		"bad policy":                 {func(c *Config) { c.Policy = "random" }, "unknown policy"},
		"unknown pool":               {func(c *Config) { c.Tenants = []TenantConfig{{ID: 1, Models: []string{"mlp"}, Pool: "x"}} }, `no pool "x"`},
		"ungranted model":            {func(c *Config) { c.Tenants = []TenantConfig{{ID: 1, Models: []string{"resnet"}}} }, "not configured"},
		"model twice":                {func(c *Config) { c.Models = append(c.Models, ModelConfig{Name: "mlp"}) }, "twice"},
		"negative streams":           {func(c *Config) { c.GRPCMaxStreams = -1 }, "grpc_max_streams -1"},
		"budget below one message":   {func(c *Config) { c.GRPCMemoryBudget = 256 << 20 }, "grpc_memory_budget 256MiB"},
		"budget of one message":      {func(c *Config) { c.GRPCMemoryBudget = farmem.Size(kserve.DecodeCost(9 << 20)) }, ""},
		"host address":               {func(c *Config) { c.HostPeer, c.HostSocket = "10.77.12.1", "/run/lovelock/ingest.sock" }, ""},
		"host link":                  {func(c *Config) { c.HostPeer, c.HostSocket = "10.77.12.0/24", "/run/lovelock/" }, ""},
		"host v6 address":            {func(c *Config) { c.HostPeer = "fd77:12::1" }, ""},
		"host peer not an address":   {func(c *Config) { c.HostPeer = "gpu0" }, `host_peer "gpu0": want the GPU host's address`},
		"host peer with host bits":   {func(c *Config) { c.HostPeer = "10.77.12.1/24" }, "host_peer 10.77.12.1/24 has host bits set"},
		"host peer mapped":           {func(c *Config) { c.HostPeer = "::ffff:10.77.12.0/120" }, `host_peer "::ffff:10.77.12.0/120"`},
		"relative host socket":       {func(c *Config) { c.HostSocket = "ingest.sock" }, `host_socket "ingest.sock": want an absolute path`},
		"host socket through ..":     {func(c *Config) { c.HostSocket = "/run/lovelock/../../tmp/" }, "without . or .."},
		"budget for a larger message": {func(c *Config) {
			c.GRPCMemoryBudget, c.GRPCMaxMessage = farmem.Size(kserve.DecodeCost(9<<20)), 17<<20
		}, "raise the budget"},
	} {
		c := validAgent()
		tc.f(&c)
		err := c.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}

// TestKServeOptions: the gRPC front end's message limit follows the
// largest input a model takes (8 MiB, the host's default slot, without
// max_input), not kserve's 64 MiB default; grpc_max_message and the
// stream, connection and memory limits pass through.
func TestKServeOptions(t *testing.T) {
	c := validAgent()
	c.Models[1].MaxInput = 1 << 20
	if o := c.kserveOptions("v"); o.MaxInput != 8<<20 || o.MaxRecvMsgSize != 0 || o.Version != "v" {
		t.Errorf("a model without max_input: %+v, want MaxInput 8 MiB", o)
	}
	c.Models[0].MaxInput = 2 << 20
	if o := c.kserveOptions("v"); o.MaxInput != 2<<20 {
		t.Errorf("models of max_input 2 and 1 MiB: %+v, want MaxInput 2 MiB", o)
	}
	c.GRPCMaxMessage, c.GRPCMaxStreams, c.GRPCMaxConnections, c.GRPCMemoryBudget = 32<<20, 4, 3, 2<<30
	if o := c.kserveOptions("v"); o.MaxRecvMsgSize != 32<<20 || o.MaxConcurrentStreams != 4 || o.MaxConnections != 3 || o.MemoryBudget != 2<<30 {
		t.Errorf("grpc_max_message 32 MiB, streams 4, connections 3, memory budget 2 GiB: %+v", o)
	}
}

func TestHostConfigValidate(t *testing.T) {
	valid := func() HostConfig {
		return HostConfig{Listen: netip.MustParseAddrPort("10.77.12.1:61441"), DPU: netip.MustParseAddrPort("10.77.12.2:61441"),
			GPUs: []GPUConfig{{Card: "H100-80GB"}}, Socket: "/run/x.sock", Models: []string{"checksum"}}
	}
	for name, tc := range map[string]struct {
		f    func(*HostConfig)
		want string
	}{
		"valid":         {func(*HostConfig) {}, ""},
		"cuda, no gpus": {func(c *HostConfig) { c.Device, c.GPUs = "cuda", nil }, ""},
		"no dpu":        {func(c *HostConfig) { c.DPU = netip.AddrPort{} }, "dpu"},
		"bad device":    {func(c *HostConfig) { c.Device = "tpu" }, "want shm or cuda"},
		"shm, no gpus":  {func(c *HostConfig) { c.GPUs = nil }, "needs gpus"},
		"bad card":      {func(c *HostConfig) { c.GPUs = []GPUConfig{{Card: "V100"}} }, "V100"},
		"no socket":     {func(c *HostConfig) { c.Socket = "" }, "socket is empty"},
		"unknown model": {func(c *HostConfig) { c.Models = []string{"resnet"} }, "resnet"},
	} {
		c := valid()
		tc.f(&c)
		err := c.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}

// TestRules: inputs to the agent's address go to its AF_XDP socket (xdp)
// or the kernel (udp), the host's control traffic to the kernel, all at
// lovelockd's reserved priority, and they compile with an empty operator
// set.
func TestRules(t *testing.T) {
	in := wire.TypeIngestInput
	for _, tc := range []struct {
		name   string
		f      func(*Config)
		action rules.Action
	}{
		{"udp", func(*Config) {}, rules.Pass()},
		{"xdp", func(c *Config) { c.Transport, c.Interfaces = "xdp", []string{"p0"} }, rules.XSK(0)},
	} {
		c := validAgent()
		tc.f(&c)
		rs := Rules(c, wire.DefaultPort)
		if len(rs) != 2 {
			t.Fatalf("%s: %d rules, want 2", tc.name, len(rs))
		}
		for _, r := range rs {
			if !strings.HasPrefix(r.Name, api.OwnedRulePrefix) || r.Priority != api.OwnedPriority {
				t.Errorf("%s: rule %s not lovelockd's reserved", tc.name, r.Name)
			}
		}
		if m := rs[0].Match; m.Type == nil || *m.Type != in || m.Dst != netip.MustParsePrefix("10.77.0.12/32") || rs[0].Action != tc.action {
			t.Errorf("%s: input rule %+v", tc.name, rs[0])
		}
		if rs[1].Action != rules.Pass() || rs[1].Match.Dst != netip.MustParsePrefix("10.77.12.2/32") {
			t.Errorf("%s: host rule %+v", tc.name, rs[1])
		}
		set := rules.Set{Default: rules.Drop(), Rules: rs}
		if _, err := rules.Compile(&set, func(string) (int, error) { return 2, nil }, wire.DefaultPort); err != nil {
			t.Errorf("%s: rules do not compile: %v", tc.name, err)
		}
	}
}

// TestHostDefaults: without host_peer the agent hears registrations only
// from host_listen's link (the network of the interface that holds its
// address), without host_socket only naming a socket in lovelockd's run
// directory; where the link cannot be told, lovelockd says to set
// host_peer rather than hear everyone.
func TestHostDefaults(t *testing.T) {
	ipnet := func(s string) net.Addr {
		ip, n, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		n.IP = ip
		return n
	}
	// dpu2 on the testbed: lo, p0 on the fabric, pf0hpf towards gpu0.
	dpu2 := []net.Addr{ipnet("127.0.0.1/8"), ipnet("10.77.0.12/24"), ipnet("fd77::12/64"), ipnet("10.77.12.2/24"), ipnet("fd77:12::2/64")}
	for _, tc := range []struct {
		name              string
		listen            string
		peer, socket      string // configured
		addrs             []net.Addr
		wantPeer, wantSoc string
		wantErr           string
	}{
		{name: "testbed", listen: "10.77.12.2:61441", addrs: dpu2, wantPeer: "10.77.12.0/24", wantSoc: "/run/lovelock/"},
		{name: "v6 host link", listen: "[fd77:12::2]:61441", addrs: dpu2, wantPeer: "fd77:12::/64", wantSoc: "/run/lovelock/"},
		{name: "configured", listen: "10.77.12.2:61441", peer: "10.77.12.1", socket: "/run/gpu/ingest.sock", wantPeer: "10.77.12.1/32", wantSoc: "/run/gpu/ingest.sock"},
		{name: "unspecified listen", listen: "0.0.0.0:61441", addrs: dpu2, wantErr: "host_listen 0.0.0.0:61441 is every address"},
		{name: "listen on no interface", listen: "10.77.13.2:61441", addrs: dpu2, wantErr: "host_listen 10.77.13.2 is on no interface"},
		{name: "point-to-point address", listen: "10.77.12.2:61441", addrs: []net.Addr{ipnet("10.77.12.2/32")}, wantErr: "has no network of its own"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validAgent()
			c.HostListen, c.HostPeer, c.HostSocket = netip.MustParseAddrPort(tc.listen), tc.peer, tc.socket
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			cfg := c.agentConfig()
			err := c.hostDefaults(&cfg, "/run/lovelock", func() ([]net.Addr, error) { return tc.addrs, nil })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "set host_peer") {
					t.Fatalf("%v, want an error containing %q that says to set host_peer", err, tc.wantErr)
				}
				return
			}
			if err != nil || cfg.HostPeer.String() != tc.wantPeer || cfg.HostSocket != tc.wantSoc {
				t.Fatalf("host_peer %v, host_socket %q, %v; want %s, %q", cfg.HostPeer, cfg.HostSocket, err, tc.wantPeer, tc.wantSoc)
			}
			if err := cfg.Validate(); err != nil {
				t.Errorf("the agent refuses the defaults: %v", err)
			}
		})
	}
}

// TestRelativeAPISocket: lovelockd started with a relative --socket gives
// the ingest service a host_socket default the agent accepts: the
// directory it runs in (before, "./", which the agent refused as not
// absolute, so the service never started).
func TestRelativeAPISocket(t *testing.T) {
	c := validAgent()
	c.HostPeer = "10.77.12.1"
	s := New(c, wire.DefaultPort, "lovelockd.sock", slog.New(slog.DiscardHandler))
	cfg := c.agentConfig()
	if err := c.hostDefaults(&cfg, s.runDir, func() ([]net.Addr, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.HostSocket != wd+"/" {
		t.Errorf("host_socket %q, want the working directory %q", cfg.HostSocket, wd+"/")
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("the agent refuses the default: %v", err)
	}
}
