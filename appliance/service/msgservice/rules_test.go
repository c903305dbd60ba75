package msgservice

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
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
