package msgservice

import (
	"fmt"
	"net/netip"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// Rules returns the steering rules the messaging service reserves for an
// agent at agent on AF_XDP: for each interface, each worker w (eps[w] is
// its endpoint, messaging.Config.WorkerEndpoints) and each of the types
// bundle and credit, the datagrams to the worker's endpoint go to xsk:w.
// They match the agent's address too, so that traffic the DPU routes to
// another node's agent is left alone, and the tenant, so that other
// tenants' datagrams are not taken. The Lovelock fields imply UDP to the
// data plane's Lovelock port, which the agent's port must be.
func Rules(agent netip.AddrPort, tenant uint32, eps []messaging.Endpoint, ifaces []string) []rules.Rule {
	var out []rules.Rule
	dst := netip.PrefixFrom(agent.Addr().Unmap(), agent.Addr().Unmap().BitLen())
	for _, iface := range ifaces {
		for w, ep := range eps {
			for _, typ := range []wire.Type{wire.TypeBundle, wire.TypeCredit} {
				tenant, typ := tenant, typ
				out = append(out, rules.Rule{
					Name:     fmt.Sprintf("%smsg/%s/w%d/%s", api.OwnedRulePrefix, iface, w, typ),
					Priority: api.OwnedPriority,
					Match: rules.Match{
						Iface: iface, Dst: dst, Type: &typ, Tenant: &tenant,
						Rank: &rules.RankRange{Lo: uint32(ep), Hi: uint32(ep)},
					},
					Action: rules.XSK(uint32(w)),
				})
			}
		}
	}
	return out
}
