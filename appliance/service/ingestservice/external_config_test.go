package ingestservice

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestHostConfigExternalModels(t *testing.T) {
	const base = `{"listen": "10.77.12.1:61441", "dpu": "10.77.12.2:61441", "gpus": [{"card": "H100-80GB"}], "socket": "/run/lovelock/ingest.sock"`
	for _, tc := range []struct {
		name, json, want string
	}{
		{"ok", `, "models": ["checksum", "mine", "fixed"], "worker_socket": "/run/lovelock/ingest-workers.sock", "run_timeout": "5s",
			"external_models": [{"name": "mine", "row_bytes": 256, "out_bytes_per_row": 64}, {"name": "fixed", "row_bytes": 1, "out_bytes": 8}]}`, ""},
		{"no worker socket", `, "models": ["mine"], "external_models": [{"name": "mine", "row_bytes": 4, "out_bytes": 4}]}`, "external_models need worker_socket"},
		{"worker socket alone", `, "models": ["checksum"], "worker_socket": "/w.sock"}`, "worker_socket without external_models"},
		{"same socket", `, "models": ["mine"], "worker_socket": "/run/lovelock/ingest.sock", "external_models": [{"name": "mine", "row_bytes": 4, "out_bytes": 4}]}`, "is also socket"},
		{"unknown model", `, "models": ["nope"]}`, `model "nope" is neither built in`},
		{"not listed", `, "models": ["checksum"], "worker_socket": "/w.sock", "external_models": [{"name": "mine", "row_bytes": 4, "out_bytes": 4}]}`, "external model mine is not in models"},
		{"both outputs", `, "models": ["mine"], "worker_socket": "/w.sock", "external_models": [{"name": "mine", "row_bytes": 4, "out_bytes": 4, "out_bytes_per_row": 4}]}`, "exactly one of out_bytes"},
		{"no output", `, "models": ["mine"], "worker_socket": "/w.sock", "external_models": [{"name": "mine", "row_bytes": 4}]}`, "exactly one of out_bytes"},
		{"no row", `, "models": ["mine"], "worker_socket": "/w.sock", "external_models": [{"name": "mine", "out_bytes": 4}]}`, "row_bytes 0"},
		{"built-in name", `, "models": ["mlp"], "worker_socket": "/w.sock", "external_models": [{"name": "mlp", "row_bytes": 4, "out_bytes": 4}]}`, "the name of a built-in model"},
		{"twice", `, "models": ["mine"], "worker_socket": "/w.sock", "external_models": [{"name": "mine", "row_bytes": 4, "out_bytes": 4}, {"name": "mine", "row_bytes": 4, "out_bytes": 4}]}`, "defined twice"},
		{"negative timeout", `, "models": ["mine"], "worker_socket": "/w.sock", "run_timeout": "-1s", "external_models": [{"name": "mine", "row_bytes": 4, "out_bytes": 4}]}`, "must not be negative"},
	} {
		var c HostConfig
		if err := json.Unmarshal([]byte(base+tc.json), &c); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		err := c.Validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error saying %q", tc.name, err, tc.want)
		}
	}
}

func TestHostConfigModels(t *testing.T) {
	c := HostConfig{Models: []string{"checksum", "mine", "fixed"}, ExternalModels: []ExternalModelConfig{
		{Name: "mine", RowBytes: 256, OutBytesPerRow: 64}, {Name: "fixed", RowBytes: 1, OutBytes: 8}}}
	ms := c.models()
	if len(ms) != 3 || ms[0].External || ms[0].Name != "checksum" {
		t.Fatalf("models: %+v", ms)
	}
	if m := ms[1]; !m.External || m.Name != "mine" || m.Multiple != 256 || m.OutputSize(1024) != 256 || m.Reference != nil {
		t.Errorf("mine: %+v", m)
	}
	if m := ms[2]; !m.External || m.Multiple != 1 || m.OutputSize(1) != 8 || m.OutputSize(1000) != 8 {
		t.Errorf("fixed: %+v", m)
	}
}
