package msgservice

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

func ownedForTest() []rules.Rule {
	eps := []messaging.Endpoint{messaging.AgentEndpoint(1, 0), messaging.AgentEndpoint(1, 1)}
	return Rules(netip.MustParseAddrPort("10.77.11.2:61440"), 0, eps, []string{"pf0hpf", "p0"})
}

func fakeResolver(name string) (int, error) {
	switch name {
	case "pf0hpf":
		return 2, nil
	case "p0":
		return 3, nil
	}
	return 0, errors.New("no such interface")
}

// TestMessagingRules: one rule per interface, worker and type, in the reserved
// band and names, to the worker's queue; they compile beside an operator's
// set and together form one mask shape.
func TestMessagingRules(t *testing.T) {
	owned := ownedForTest()
	if len(owned) != 2*2*2 {
		t.Fatalf("%d rules, want 8", len(owned))
	}
	r := owned[3] // pf0hpf, worker 1, credit
	if r.Name != "lovelockd:msg/pf0hpf/w1/credit" || r.Priority != api.OwnedPriority || r.Action.String() != "xsk:1" ||
		r.Match.Rank.Lo != 65537 || r.Match.Dst.String() != "10.77.11.2/32" || !api.IsOwned(r.Name) {
		t.Errorf("rule %+v", r)
	}
	set := rules.Set{Default: rules.Pass(), Rules: append([]rules.Rule{{Name: "op", Priority: 10, Match: rules.Match{Iface: "p0"}, Action: rules.Drop()}}, owned...)}
	rs, err := rules.Compile(&set, fakeResolver, 61440)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.Shapes) != 2 {
		t.Errorf("%d shapes, want 2 (the operator's and lovelockd's)", len(rs.Shapes))
	}
}

// TestNeedsFragments: clients' bundles of the default transfer_size (16
// KiB) arrive at the agent in IP fragments, which carry no Lovelock type;
// under an operator's default of drop they pass to the kernel, where the
// agent's kernel socket reads them, and the agent's rules still send whole
// bundles to their worker.
func TestNeedsFragments(t *testing.T) {
	agent := netip.MustParseAddrPort("10.77.11.2:61440")
	cluster := messaging.Defaults()
	cluster.Workers = 1
	cluster.Nodes = []messaging.Node{{Name: "node0", Agent: agent,
		Clients: []messaging.ClientSpec{{Name: "a", Addr: netip.MustParseAddrPort("10.77.11.1:7000"), Ranks: messaging.Range(0, 1)}}}}
	needs, err := Needs(cluster, "node0", []string{"p0"})
	if err != nil {
		t.Fatal(err)
	}
	set := rules.Set{Default: rules.Drop(), Rules: needs.Rules}
	if _, err := rules.Compile(&set, fakeResolver, wire.DefaultPort); err != nil {
		t.Fatal(err)
	}
	cl, err := rules.NewClassifier(&set, fakeResolver, wire.DefaultPort)
	if err != nil {
		t.Fatal(err)
	}
	bundle := make([]byte, cluster.TransferSize)
	bundle[wire.OffsetVersion], bundle[wire.OffsetType] = wire.Version, byte(wire.TypeBundle)
	binary.BigEndian.PutUint32(bundle[wire.OffsetDst:], uint32(cluster.WorkerEndpoints(0)[0]))
	binary.BigEndian.PutUint32(bundle[wire.OffsetLength:], uint32(len(bundle)-wire.HeaderLen))
	client := netip.MustParseAddrPort("10.77.11.1:7000")
	frames := testenv.UDPFrames(client, agent, bundle, 1500)
	for i, f := range frames {
		if v := cl.Classify(f, 3); v.Action != rules.Pass().Verb {
			t.Errorf("fragment %d of %d: %v (rule %d), want pass", i+1, len(frames), v.Action, v.RuleID)
		}
	}
	// The same bundle in one frame (a jumbo MTU) goes to worker 0.
	if v := cl.Classify(testenv.UDPFrames(client, agent, bundle, 65535)[0], 3); v.Action.String() != "xsk" || v.Arg != 0 {
		t.Errorf("whole bundle: %v %d, want xsk 0", v.Action, v.Arg)
	}
}
