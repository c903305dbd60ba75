package agent

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/memnet"
)

// TestConfigValidate: settings the agent cannot run with are refused when
// the config is checked, saying which and why, not later when a GPU host
// registers.
func TestConfigValidate(t *testing.T) {
	ck := []ModelConfig{{Name: "checksum"}}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "": valid
	}{
		{"valid", Config{Models: ck}, ""},
		{"no models", Config{}, "no models"},
		{"model twice", Config{Models: []ModelConfig{{Name: "checksum"}, {Name: "checksum"}}}, "configured twice"},
		{"negative duration", Config{Models: []ModelConfig{{Name: "checksum", Duration: -time.Second}}}, "negative setting"},
		{"tenant's unknown model", Config{Models: ck, Tenants: []TenantConfig{{ID: 1, Models: []string{"mlp"}}}}, `model "mlp" is not configured`},
		{"tenant's unknown pool", Config{Models: ck, Tenants: []TenantConfig{{ID: 1, Pool: "big"}}}, `no pool "big"`},
		{"zero reconfiguration", Config{Models: ck, Reconfig: 0}, ""},
		{"negative reconfiguration", Config{Models: ck, Reconfig: -time.Second}, "reconfig -1s is negative"},
		{"host address", Config{Models: ck, HostPeer: netip.MustParsePrefix("10.77.12.1/32"), HostSocket: "/run/lovelock/ingest.sock"}, ""},
		{"host link", Config{Models: ck, HostPeer: netip.MustParsePrefix("10.77.12.0/24"), HostSocket: "/run/lovelock/"}, ""},
		{"host prefix with host bits", Config{Models: ck, HostPeer: netip.MustParsePrefix("10.77.12.1/24")}, "host_peer 10.77.12.1/24 has host bits set"},
		{"relative socket", Config{Models: ck, HostSocket: "run/ingest.sock"}, `host_socket "run/ingest.sock": want an absolute path`},
		{"socket through ..", Config{Models: ck, HostSocket: "/run/lovelock/../tmp/"}, "without . or .."},
		{"socket directory twice slashed", Config{Models: ck, HostSocket: "/run/lovelock//"}, "without . or .."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestNewNeedsHost: an agent that is not told which GPU host it serves
// does not start: it would hear registrations from anyone.
func TestNewNeedsHost(t *testing.T) {
	nw := memnet.New(memnet.Options{})
	clients, _ := nw.Listen(dpuClientAddr)
	host, _ := nw.Listen(dpuHostAddr)
	base := Config{Clients: clients, Host: host, Importer: devmem.ShmImporter{}, Models: []ModelConfig{{Name: "checksum"}},
		HostPeer: netip.MustParsePrefix("10.1.0.1/32"), HostSocket: "/run/lovelock/ingest.sock"}
	for _, tc := range []struct {
		name  string
		tweak func(*Config)
		want  string
	}{
		{"both", func(*Config) {}, ""},
		{"no host_peer", func(c *Config) { c.HostPeer = netip.Prefix{} }, "no host_peer"},
		{"no host_socket", func(c *Config) { c.HostSocket = "" }, "no host_socket"},
	} {
		cfg := base
		tc.tweak(&cfg)
		_, err := New(cfg)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: New: %v, want %q", tc.name, err, tc.want)
		}
	}
}
