package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
)

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name     string
		path     string
		explicit bool
		want     string // error substring; "" for success
		check    func(Config) bool
	}{
		{"missing default file", filepath.Join(dir, "none.yaml"), false, "", func(c Config) bool { return c.Port == 61440 && c.PinDir == Defaults().PinDir }},
		{"missing explicit file", filepath.Join(dir, "none.yaml"), true, "no such file", nil},
		{"yaml over defaults", write("a.yaml", "port: 7000\ninterfaces:\n  - {iface: p0, hook: xdp, mode: generic}\n"), true, "",
			func(c Config) bool { return c.Port == 7000 && len(c.Interfaces) == 1 && c.State == Defaults().State }},
		{"unknown field", write("b.yaml", "prot: 7000\n"), true, `unknown field "prot"`, nil},
		{"bad hook", write("c.yaml", "interfaces: [{iface: p0, hook: tc-sideways}]\n"), true, `hook "tc-sideways"`, nil},
		{"bad mode", write("d.yaml", "interfaces: [{iface: p0, hook: xdp, mode: turbo}]\n"), true, `xdp mode "turbo"`, nil},
		{"empty iface", write("e.yaml", "interfaces: [{hook: xdp}]\n"), true, "iface is empty", nil},
		{"port zero", write("f.yaml", "port: 0\n"), true, "port must be", nil},
		{"messaging udp by default", write("g.yaml", "messaging: {cluster: c.yaml, node: dpu0}\n"), true, "",
			func(c Config) bool { return c.Messaging != nil && !c.Messaging.XDP() }},
		{"messaging xdp", write("h.yaml", "messaging: {cluster: c.yaml, node: dpu0, transport: xdp, interfaces: [pf0hpf, p0]}\n"), true, "",
			func(c Config) bool {
				return c.Messaging.XDP() && len(c.Messaging.Interfaces) == 2 && c.Messaging.MultiBufferOn()
			}},
		{"messaging xdp single-buffer", write("h2.yaml", "messaging: {cluster: c.yaml, node: dpu0, transport: xdp, interfaces: [p0], multi_buffer: false}\n"), true, "",
			func(c Config) bool { return c.Messaging.XDP() && !c.Messaging.MultiBufferOn() }},
		{"messaging multi_buffer with udp", write("j2.yaml", "messaging: {cluster: c.yaml, node: dpu0, multi_buffer: true}\n"), true,
			"multi_buffer applies to transport xdp only", nil},
		{"messaging xdp without interfaces", write("i.yaml", "messaging: {cluster: c.yaml, node: dpu0, transport: xdp}\n"), true,
			"transport xdp needs interfaces", nil},
		{"messaging interfaces with udp", write("j.yaml", "messaging: {cluster: c.yaml, node: dpu0, interfaces: [p0]}\n"), true,
			"apply to transport xdp only", nil},
		{"messaging unknown transport", write("k.yaml", "messaging: {cluster: c.yaml, node: dpu0, transport: rdma}\n"), true,
			`transport "rdma": want udp or xdp`, nil},
		{"messaging interface twice", write("l.yaml", "messaging: {cluster: c.yaml, node: dpu0, transport: xdp, interfaces: [p0, p0]}\n"), true,
			"p0 listed twice", nil},
		{"messaging without node", write("m.yaml", "messaging: {cluster: c.yaml}\n"), true, "needs both cluster", nil},
		{"metrics off", write("q.yaml", "metrics: off\n"), true, "", func(c Config) bool { return c.Metrics == "" }},
		// lovelockd listens on metrics before it opens the data plane,
		// but a typo is refused before it listens at all.
		{"metrics all addresses", write("q1.yaml", "metrics: \":9477\"\n"), true, "", func(c Config) bool { return c.Metrics == ":9477" }},
		{"metrics ipv6", write("q2.yaml", "metrics: \"[::1]:9477\"\n"), true, "", func(c Config) bool { return c.Metrics == "[::1]:9477" }},
		{"metrics host name", write("q3.yaml", "metrics: \"localhost:9477\"\n"), true, "", func(c Config) bool { return c.Metrics == "localhost:9477" }},
		{"metrics without port", write("q4.yaml", "metrics: \"127.0.0.1\"\n"), true,
			`config: metrics "127.0.0.1": want HOST:PORT, e.g. 127.0.0.1:9477, or off (missing port in address)`, nil},
		{"metrics port only", write("q5.yaml", "metrics: 9477\n"), true, `config: metrics "9477": want HOST:PORT`, nil},
		{"metrics port name", write("q6.yaml", "metrics: \"127.0.0.1:http\"\n"), true,
			`config: metrics "127.0.0.1:http": the port must be a number from 0 to 65535`, nil},
		{"metrics port too big", write("q7.yaml", "metrics: \"127.0.0.1:94770\"\n"), true,
			`config: metrics "127.0.0.1:94770": the port must be a number from 0 to 65535`, nil},
		{"metrics two colons", write("q8.yaml", "metrics: \"::1:9477\"\n"), true, `config: metrics "::1:9477": want HOST:PORT`, nil},
		{"unquoted off where a name is due", write("r.yaml", "far_memory: {listen: off}\n"), true, `quote the value, "off"`, nil},
		// YAML 1.1 reads an unquoted off as false.
		{"far-memory prefetcher off", write("n.yaml", "far_memory: {listen: \"10.0.0.1:61440\", servers: [{addr: \"10.0.0.2:61440\"}], cache: {size: 4MiB, prefetcher: off}}\n"), true, "",
			func(c Config) bool { return c.FarMemory != nil && c.FarMemory.Cache.Prefetcher == farmem.PrefetchOff }},
		{"far-memory prefetcher stride", write("o.yaml", "far_memory: {listen: \"10.0.0.1:61440\", servers: [{addr: \"10.0.0.2:61440\"}], cache: {size: 4MiB, prefetcher: stride}}\n"), true, "",
			func(c Config) bool { return c.FarMemory.Cache.Prefetcher == farmem.PrefetchStride }},
		{"far-memory prefetcher unknown", write("p.yaml", "far_memory: {listen: \"10.0.0.1:61440\", servers: [{addr: \"10.0.0.2:61440\"}], cache: {size: 4MiB, prefetcher: true}}\n"), true,
			"prefetcher true: want adjacent", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(tc.path, tc.explicit)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("err = %v, want it to mention %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(c) {
				t.Errorf("config %+v", c)
			}
		})
	}
}

// TestExamples: the example files in appliance/examples load.
func TestExamples(t *testing.T) {
	c, err := Load("../examples/lovelockd.yaml", true)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Messaging.XDP() || len(c.Interfaces) != 2 {
		t.Errorf("lovelockd.yaml: %+v", c)
	}
	cl, err := messaging.LoadConfig("../examples/cluster.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cl.Workers != 1 || cl.TransferSize != 1472 || cl.Nodes[0].Agent.Port() != c.Port {
		t.Errorf("cluster.yaml: workers %d, transfer size %d, agent %v", cl.Workers, cl.TransferSize, cl.Nodes[0].Agent)
	}
	data, err := os.ReadFile("../examples/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rules.Parse(data); err != nil {
		t.Error(err)
	}
}
