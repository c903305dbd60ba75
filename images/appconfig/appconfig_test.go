package appconfig

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseAndArgs(t *testing.T) {
	c, err := Parse([]byte(`{
		"hostname": "dpu0",
		"interfaces": [
			{"name": "p0", "addresses": ["10.0.2.15/24"], "gateway": "10.0.2.2", "xdp": "native"},
			{"name": "pf0hpf", "xdp": "generic", "tc_egress": true},
			{"name": "eth1", "mtu": 9000, "optional": true}
		],
		"lovelockd": {"args": ["--metrics", "off"]}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"--xdp", "p0", "--xdp-generic", "pf0hpf", "--tc-egress", "pf0hpf", "--metrics", "off"}
	if got := c.LovelockdArgs(); !slices.Equal(got, want) {
		t.Fatalf("args = %q, want %q", got, want)
	}
	if s := c.Steered(); len(s) != 2 || s[0].Name != "p0" || s[1].XDP != XDPGeneric {
		t.Fatalf("steered = %+v", s)
	}
}

func TestRejects(t *testing.T) {
	tests := map[string]string{
		"unknown field":   `{"interfaces": [], "lovelockd": {}, "colour": "blue"}`,
		"bad address":     `{"interfaces": [{"name": "eth0", "addresses": ["10.0.2.15"]}], "lovelockd": {}}`,
		"bad gateway":     `{"interfaces": [{"name": "eth0", "gateway": "x"}], "lovelockd": {}}`,
		"long name":       `{"interfaces": [{"name": "abcdefghijklmnop"}], "lovelockd": {}}`,
		"duplicate":       `{"interfaces": [{"name": "a"}, {"name": "a"}], "lovelockd": {}}`,
		"xdp mode":        `{"interfaces": [{"name": "a", "xdp": "offload"}], "lovelockd": {}}`,
		"mtu":             `{"interfaces": [{"name": "a", "mtu": 70000}], "lovelockd": {}}`,
		"old flags":       `{"interfaces": [], "lovelockd": {"xdp_mode": "native"}}`,
		"not json at all": `interfaces: []`,
	}
	for name, in := range tests {
		if _, err := Parse([]byte(in)); err == nil {
			t.Errorf("%s: Parse accepted %s", name, in)
		}
	}
}

// TestShippedConfigs keeps the configurations the image carries valid.
func TestShippedConfigs(t *testing.T) {
	files, err := filepath.Glob("../config/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no shipped configs found: %v", err)
	}
	for _, f := range files {
		c, err := Load(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Steered()) == 0 {
			t.Errorf("%s steers no interface", f)
		}
		if b, _ := os.ReadFile(f); !strings.HasSuffix(string(b), "\n") {
			t.Errorf("%s: no trailing newline", f)
		}
	}
}
