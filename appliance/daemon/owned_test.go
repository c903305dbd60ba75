package daemon

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/lovelock-dpu/lovelock/appliance/service/msgservice"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
)

func ownedForTest() []rules.Rule {
	eps := []messaging.Endpoint{messaging.AgentEndpoint(1, 0), messaging.AgentEndpoint(1, 1)}
	return msgservice.Rules(netip.MustParseAddrPort("10.77.11.2:61440"), 0, eps, []string{"pf0hpf", "p0"})
}

// TestOperatorSet: operators' sets may not use the reserved names or
// priorities; a listed owned rule applied back is ignored.
func TestOperatorSet(t *testing.T) {
	owned := ownedForTest()
	op := rules.Rule{Name: "mine", Priority: 100, Action: rules.Pass()}
	listed := owned[0]
	listed.ID = 42
	got, err := operatorSet(rules.Set{Rules: []rules.Rule{op, listed}}, owned)
	if err != nil || len(got.Rules) != 1 || got.Rules[0].Name != "mine" {
		t.Errorf("listed set applied back: %v, %+v", err, got.Rules)
	}
	edited := owned[0]
	edited.Action = rules.Drop()
	for _, c := range []struct {
		r    rules.Rule
		want string
	}{
		{edited, `names starting with "lovelockd:" belong to lovelockd`},
		{rules.Rule{Name: "lovelockd:mine", Priority: 1, Action: rules.Pass()}, "rename it"},
		{rules.Rule{Name: "top", Priority: api.OwnedPriority, Action: rules.Pass()}, "priority 4000000000 is in the band"},
	} {
		_, err := operatorSet(rules.Set{Rules: []rules.Rule{op, c.r}}, owned)
		var bad *api.BadRequestError
		if !errors.As(err, &bad) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want a bad request with %q", c.r.Name, err, c.want)
		}
	}
}

// TestShadowed: operator rules that can match the agent's traffic are
// reported, the others not.
func TestShadowed(t *testing.T) {
	owned := ownedForTest()
	set, err := rules.Parse([]byte(`
rules:
  - {name: all-udp-to-port, priority: 100, match: {iface: pf0hpf, proto: udp, dport: 61440}, action: pass}
  - {name: tenant0, priority: 100, match: {tenant: 0}, action: drop}
  - {name: agent-host, priority: 100, match: {dst: 10.77.0.0/16}, action: pass}
  - {name: rank-range, priority: 100, match: {rank: 65530-65540}, action: pass}
  - {name: other-tenant, priority: 100, match: {tenant: 7}, action: drop}
  - {name: other-iface, priority: 100, match: {iface: eth9}, action: drop}
  - {name: other-dst, priority: 100, match: {dst: 10.77.12.0/24}, action: drop}
  - {name: tcp, priority: 100, match: {proto: tcp}, action: drop}
  - {name: mem, priority: 100, match: {type: mem-read}, action: drop}
  - {name: other-rank, priority: 100, match: {rank: 5}, action: drop}
  - {name: v6, priority: 100, match: {src: "fd00::/8"}, action: drop}
  - {name: other-port, priority: 100, match: {proto: udp, dport: 7000}, action: drop}
`))
	if err != nil {
		t.Fatal(err)
	}
	w := shadowed(*set, owned, 61440)
	var got []string
	for _, s := range w {
		got = append(got, strings.Split(s, `"`)[1])
	}
	want := []string{"all-udp-to-port", "tenant0", "agent-host", "rank-range"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("shadowed %v, want %v\n%s", got, want, strings.Join(w, "\n"))
	}
	if len(w) > 0 && !strings.Contains(w[0], "lovelockd:msg/pf0hpf/w0/bundle and 3 more") {
		t.Errorf("warning %q", w[0])
	}
}
