package memservice

import (
	"encoding/binary"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// memDatagram is a far-memory datagram of type typ with n payload bytes.
func memDatagram(typ wire.Type, n int) []byte {
	d := make([]byte, wire.HeaderLen+n)
	d[wire.OffsetVersion], d[wire.OffsetType] = wire.Version, byte(typ)
	binary.BigEndian.PutUint32(d[wire.OffsetLength:], uint32(n))
	return d
}

// TestAgentFragments runs the agent's traffic through the steering program
// with the rules Plan reserves and an operator's default of drop: a write
// of max_datagram (8972 bytes by default) arrives on a 1500-byte MTU in IP
// fragments, which carry neither the Lovelock type nor the source port
// AgentRules match on, and every one must pass to the kernel, as must a
// memory node's fragmented reply and a request that fits one packet.
func TestAgentFragments(t *testing.T) {
	testenv.RequirePriv(t)
	svc := NewAgent(AgentConfig{AgentConfig: farmem.AgentConfig{Listen: netip.MustParseAddrPort("10.77.0.10:61440"),
		Servers: []farmem.ServerSpec{{Addr: netip.MustParseAddrPort("10.77.0.20:61440")}}}}, wire.DefaultPort, slog.New(slog.DiscardHandler))
	needs, err := svc.Plan()
	if err != nil {
		t.Fatal(err)
	}
	set := rules.Set{Default: rules.Drop(), Rules: needs.Rules}
	rs, err := rules.Compile(&set, resolve, wire.DefaultPort)
	if err != nil {
		t.Fatal(err)
	}
	s, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Apply(rs); err != nil {
		t.Fatal(err)
	}
	host, agent := netip.MustParseAddrPort("10.77.0.1:40000"), netip.MustParseAddrPort("10.77.0.10:61440")
	server, agentOut := netip.MustParseAddrPort("10.77.0.20:61440"), netip.MustParseAddrPort("10.77.0.10:45000")
	max := farmem.DefaultMaxDatagram - wire.HeaderLen
	for _, c := range []struct {
		name   string
		frames [][]byte
	}{
		{"write in one packet", testenv.UDPFrames(host, agent, memDatagram(wire.TypeMemWrite, 1400), 1500)},
		{"write of max_datagram", testenv.UDPFrames(host, agent, memDatagram(wire.TypeMemWrite, max), 1500)},
		{"reply of max_datagram", testenv.UDPFrames(server, agentOut, memDatagram(wire.TypeMemReply, max), 1500)},
	} {
		for i, f := range c.frames {
			ret, err := s.XDP.Run(&ebpf.RunOptions{Data: f})
			if err != nil {
				t.Fatal(err)
			}
			if ret != 2 { // XDP_PASS
				t.Errorf("%s: frame %d of %d: XDP verdict %d, want pass (2)", c.name, i+1, len(c.frames), ret)
			}
		}
	}
}
