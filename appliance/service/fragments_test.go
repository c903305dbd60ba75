package service

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// TestFragmentRules: under an operator's default of drop, the fragments of
// datagrams to a service's address and from its peers pass, first and
// later ones alike, while its other traffic and fragments to other
// addresses keep the operator's verdict. Two services reserving rules for
// one address merge into one set that compiles.
func TestFragmentRules(t *testing.T) {
	svc, peer := netip.MustParseAddr("10.77.0.10"), netip.MustParseAddr("10.77.0.20")
	merged := Merge(map[string][]rules.Rule{
		"farmem": FragmentRules([]netip.Addr{svc}, []netip.Addr{peer}),
		"ingest": FragmentRules([]netip.Addr{svc, svc}, nil),
	})
	if len(merged) != 2 {
		t.Fatalf("merged %d rules, want 2 (one per address and direction): %+v", len(merged), merged)
	}
	udp, dns := uint8(17), uint16(53)
	set := rules.Set{Default: rules.Drop(), Rules: append([]rules.Rule{
		{Name: "dns", Priority: 10, Match: rules.Match{Proto: &udp, Dport: &dns}, Action: rules.Pass()},
	}, merged...)}
	if _, err := rules.Compile(&set, nil, 0); err != nil {
		t.Fatalf("fragment rules do not compile beside an operator's set: %v", err)
	}
	cl, err := rules.NewClassifier(&set, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte{0xa5}, 8000)
	ap := func(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }
	client := netip.MustParseAddr("10.77.0.1")
	for _, c := range []struct {
		name   string
		frames [][]byte
		want   bpf.Action
	}{
		{"fragments to the service", testenv.UDPFrames(ap(client, 40000), ap(svc, wire.DefaultPort), big, 1500), bpf.ActionPass},
		{"fragments from a peer", testenv.UDPFrames(ap(peer, wire.DefaultPort), ap(svc, 50000), big, 1500), bpf.ActionPass},
		{"fragments to another address", testenv.UDPFrames(ap(client, 40000), ap(netip.MustParseAddr("10.77.0.99"), wire.DefaultPort), big, 1500), bpf.ActionDrop},
		{"unfragmented udp to the service", testenv.UDPFrames(ap(client, 40000), ap(svc, 5000), big[:100], 1500), bpf.ActionDrop},
		{"operator's rule still applies", testenv.UDPFrames(ap(client, 40000), ap(svc, 53), big[:100], 1500), bpf.ActionPass},
	} {
		for i, f := range c.frames {
			if v := cl.Classify(f, 1); v.Action != c.want {
				t.Errorf("%s: frame %d of %d: %v (rule %d), want %v", c.name, i+1, len(c.frames), v.Action, v.RuleID, c.want)
			}
		}
	}
}
