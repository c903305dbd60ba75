package ingestservice

import (
	"bytes"
	"encoding/binary"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// TestPlanFragments: a client that does not size its datagrams to the MTU
// (lovelock infer --mtu 0) sends inputs in IP fragments, which carry no
// Lovelock type; under an operator's default of drop the rules Plan
// reserves pass them to the kernel on either transport (the AF_XDP agent
// reads its kernel socket too), as they do the host's control datagrams.
func TestPlanFragments(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    func(*Config)
	}{
		{"udp", func(*Config) {}},
		{"xdp", func(c *Config) { c.Transport, c.Interfaces = "xdp", []string{"p0"} }},
	} {
		c := validAgent()
		tc.f(&c)
		needs, err := New(c, wire.DefaultPort, "/run/lovelock/lovelockd.sock", slog.New(slog.DiscardHandler)).Plan()
		if err != nil {
			t.Fatal(err)
		}
		resolve := func(string) (int, error) { return 2, nil }
		set := rules.Set{Default: rules.Drop(), Rules: needs.Rules}
		if _, err := rules.Compile(&set, resolve, wire.DefaultPort); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		cl, err := rules.NewClassifier(&set, resolve, wire.DefaultPort)
		if err != nil {
			t.Fatal(err)
		}
		input := make([]byte, 20000)
		input[wire.OffsetVersion], input[wire.OffsetType] = wire.Version, byte(wire.TypeIngestInput)
		binary.BigEndian.PutUint32(input[wire.OffsetLength:], uint32(len(input)-wire.HeaderLen))
		ctrl := bytes.Clone(input)
		ctrl[wire.OffsetType] = byte(wire.TypeIngestCtrl)
		client := netip.MustParseAddrPort("10.77.0.1:40000")
		for _, d := range []struct {
			what   string
			frames [][]byte
		}{
			{"input", testenv.UDPFrames(client, c.Listen, input, 1500)},
			{"host control", testenv.UDPFrames(netip.MustParseAddrPort("10.77.12.1:40000"), c.HostListen, ctrl, 1500)},
		} {
			for i, f := range d.frames {
				if v := cl.Classify(f, 2); v.Action != bpf.ActionPass {
					t.Errorf("%s: %s fragment %d of %d: %v (rule %d), want pass", tc.name, d.what, i+1, len(d.frames), v.Action, v.RuleID)
				}
			}
		}
	}
}
