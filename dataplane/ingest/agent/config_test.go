package agent

import (
	"strings"
	"testing"
	"time"
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
