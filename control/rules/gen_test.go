package rules

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// The generator behind the differential test and the benchmarks: rule sets
// built from templates (each template one family of mask shapes) and packets
// aimed at their rules, mutated now and then into malformed ones.

var (
	genV4Nets = []netip.Prefix{
		netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("10.2.0.0/16"),
		netip.MustParsePrefix("192.168.7.0/24"), netip.MustParsePrefix("172.16.0.0/12"),
	}
	genV6Nets = []netip.Prefix{
		netip.MustParsePrefix("fd00:1::/32"), netip.MustParsePrefix("fd00:9::/32"), netip.MustParsePrefix("2001:db8::/32"),
	}
	genPorts   = []uint16{22, 23, 53, 80, 443, 4791, 8080}
	genTenants = []uint32{0, 1, 2, 3, 7, 0xffffffff}
	genRanks   = []uint32{0, 1, 5, 7, 8, 15, 16, 31, 63, 100, 150, 199, 200, 255, 256, 4096, 0xfffffff0, 0xffffffff}
)

type gen struct {
	r      *rand.Rand
	port   uint16
	ifaces []string
}

func newGen(seed uint64, port uint16) *gen {
	return &gen{r: rand.New(rand.NewPCG(seed, 0x5eed)), port: port, ifaces: harnessIfaces}
}

func pick[T any](r *rand.Rand, vs []T) T { return vs[r.IntN(len(vs))] }

// addrIn returns a random address inside p.
func (g *gen) addrIn(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		if g.r.IntN(2) == 1 {
			b[i/8] |= 0x80 >> (i % 8)
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// prefixOf returns the prefix of length bits around a random address of a
// pool network.
func (g *gen) prefixOf(v6 bool, bits int) netip.Prefix {
	nets := genV4Nets
	if v6 {
		nets = genV6Nets
	}
	p, _ := g.addrIn(pick(g.r, nets)).Prefix(bits)
	return p
}

func (g *gen) rank() uint32 {
	if g.r.IntN(4) == 0 {
		return g.r.Uint32()
	}
	return pick(g.r, genRanks)
}

func (g *gen) llType() wire.Type { return pick(g.r, wire.Types()) }

// template makes matches of one family of shapes. shared says whether rules
// of one template may share a priority: their matches then differ in an
// exact field or in a prefix of one fixed length, so no packet matches two.
type template struct {
	name   string
	shared bool
	make   func(g *gen, fixed int) Match
	band   int // priority band: narrower templates higher
}

var templates = []template{
	{"proto-dport", true, func(g *gen, _ int) Match {
		return Match{Proto: new(pick(g.r, []uint8{6, 17})), Dport: new(pick(g.r, genPorts))}
	}, 6},
	{"dst4", true, func(g *gen, fixed int) Match { return Match{Dst: g.prefixOf(false, []int{16, 24, 32}[fixed%3])} }, 5},
	{"src6", true, func(g *gen, fixed int) Match { return Match{Src: g.prefixOf(true, []int{32, 48, 64, 128}[fixed%4])} }, 5},
	{"type-rank-range", false, func(g *gen, _ int) Match {
		lo := g.rank()
		hi := lo + uint32(g.r.IntN(40))
		if hi < lo {
			hi = 0xffffffff
		}
		return Match{Type: new(g.llType()), Rank: &RankRange{Lo: lo, Hi: hi}}
	}, 9},
	{"tenant", true, func(g *gen, _ int) Match { return Match{Tenant: new(pick(g.r, genTenants))} }, 4},
	{"iface", true, func(g *gen, _ int) Match { return Match{Iface: pick(g.r, g.ifaces)} }, 2},
	{"iface-udp-sport", true, func(g *gen, _ int) Match {
		return Match{Iface: pick(g.r, g.ifaces), Proto: new(uint8(17)), Sport: new(pick(g.r, genPorts))}
	}, 8},
	{"region-type", true, func(g *gen, _ int) Match { return Match{Region: new(g.rank()), Type: new(g.llType())} }, 10},
	{"src4-dst4-tcp-dport", true, func(g *gen, _ int) Match {
		return Match{Src: g.prefixOf(false, 32), Dst: g.prefixOf(false, 24), Proto: new(uint8(6)), Dport: new(pick(g.r, genPorts))}
	}, 11},
	{"icmp", true, func(g *gen, _ int) Match {
		if g.r.IntN(2) == 0 {
			return Match{Proto: new(uint8(1)), Src: netip.MustParsePrefix("0.0.0.0/0")}
		}
		return Match{Proto: new(uint8(58)), Dst: netip.MustParsePrefix("::/0")}
	}, 3},
	{"all", false, func(*gen, int) Match { return Match{} }, 0},
	{"dst6-udp-dport", true, func(g *gen, _ int) Match {
		return Match{Dst: g.prefixOf(true, 64), Proto: new(uint8(17)), Dport: new(pick(g.r, genPorts))}
	}, 10},
	{"tenant-rank", true, func(g *gen, _ int) Match {
		r := g.rank()
		return Match{Tenant: new(pick(g.r, genTenants)), Rank: &RankRange{Lo: r, Hi: r}}
	}, 10},
	{"lovelock-port", false, func(g *gen, _ int) Match { return Match{Proto: new(uint8(17)), Dport: new(g.port)} }, 3},
	{"family", true, func(g *gen, _ int) Match {
		if g.r.IntN(2) == 0 {
			return Match{Src: netip.MustParsePrefix("0.0.0.0/0")}
		}
		return Match{Dst: netip.MustParsePrefix("::/0")}
	}, 1},
	{"tenant-rank-range", false, func(g *gen, _ int) Match {
		lo := uint32(g.r.IntN(300))
		return Match{Tenant: new(pick(g.r, genTenants)), Rank: &RankRange{Lo: lo, Hi: lo + uint32(g.r.IntN(100))}}
	}, 9},
	{"src4-proto", true, func(g *gen, _ int) Match {
		return Match{Src: g.prefixOf(false, 8), Proto: new(pick(g.r, []uint8{6, 17, 1, 47}))}
	}, 4},
}

func (g *gen) action() Action {
	switch g.r.IntN(4) {
	case 0:
		return Pass()
	case 1:
		return Drop()
	case 2:
		return Redirect(pick(g.r, []string{"v1", "v3", "ext"}))
	}
	return XSK(uint32(g.r.IntN(64)))
}

// ruleSet makes a set of templates × rules with unique priorities, except
// within shared groups whose matches are pairwise disjoint. It retries with
// fewer templates until the set compiles (within MaxShapes).
func (g *gen) ruleSet(tb testing.TB, resolve Resolver, maxRules int) *Set {
	tb.Helper()
	for attempt := 0; ; attempt++ {
		s := g.tryRuleSet(maxRules, attempt)
		if _, err := Compile(s, resolve, g.port); err == nil {
			return s
		} else if attempt > 50 {
			tb.Fatalf("generator: no valid set after %d attempts: %v", attempt, err)
		}
	}
}

func (g *gen) tryRuleSet(maxRules, attempt int) *Set {
	nt := max(3, 6+g.r.IntN(7)-attempt/5)
	order := g.r.Perm(len(templates))[:nt]
	prios := g.r.Perm(1 << 16) // unique priorities, taken in turn
	next := 0
	// Broad templates mostly rank below narrow ones, so that narrow rules
	// get packets too; now and then one ranks above all.
	prio := func(band int) uint32 {
		next++
		if g.r.IntN(10) == 0 {
			band = 16
		}
		return uint32(band<<16 | prios[next-1])
	}
	s := &Set{Default: g.action()}
	for _, ti := range order {
		t := templates[ti]
		shared := t.shared && g.r.IntN(2) == 0
		groupPrio := prio(t.band)
		fixed := g.r.IntN(12)
		seen := map[string]bool{}
		n := 1 + g.r.IntN(max(1, maxRules/nt))
		if t.name == "all" || t.name == "lovelock-port" {
			n = 1
		}
		for range n {
			m := t.make(g, fixed)
			key := fmt.Sprintf("%+v", matchKey(m))
			if seen[key] {
				continue
			}
			seen[key] = true
			p := groupPrio
			if !shared {
				p = prio(t.band)
			}
			s.Rules = append(s.Rules, Rule{Name: fmt.Sprintf("%s-%d", t.name, len(s.Rules)), Priority: p, Match: m, Action: g.action()})
		}
	}
	// Some explicit IDs, to mix assigned and given ones.
	for i := range s.Rules {
		if g.r.IntN(4) == 0 {
			s.Rules[i].ID = uint32(MaxID - i)
		}
	}
	return s
}

// matchKey is a comparable view of a match, for deduplication.
func matchKey(m Match) any {
	deref := func(p any) any {
		switch v := p.(type) {
		case *uint8:
			if v != nil {
				return *v
			}
		case *uint16:
			if v != nil {
				return *v
			}
		case *uint32:
			if v != nil {
				return *v
			}
		case *wire.Type:
			if v != nil {
				return *v
			}
		case *RankRange:
			if v != nil {
				return *v
			}
		}
		return nil
	}
	return []any{m.Iface, m.Src, m.Dst, deref(m.Proto), deref(m.Sport), deref(m.Dport), deref(m.Type),
		deref(m.Tenant), deref(m.Rank), deref(m.Region)}
}

// packet makes a frame and an ingress interface: often one aimed at a rule
// of s (its fields chosen to match, the rest at random), otherwise random,
// and now and then mutated.
func (g *gen) packet(tb testing.TB, s *Set) ([]byte, string) {
	var m Match
	if len(s.Rules) > 0 && g.r.IntN(10) < 7 {
		m = s.Rules[g.r.IntN(len(s.Rules))].Match
	}
	iface := m.Iface
	if iface == "" {
		iface = pick(g.r, g.ifaces)
	}
	var p pkt
	if g.r.IntN(40) == 0 && !m.Src.IsValid() && !m.Dst.IsValid() {
		return g.mutate((pkt{vlan: g.r.IntN(4) == 0}).build(tb)), iface // ARP
	}
	v6 := g.r.IntN(2) == 0
	for _, pf := range []netip.Prefix{m.Src, m.Dst} {
		if pf.IsValid() {
			v6 = pf.Addr().Is6()
		}
	}
	addrFor := func(pf netip.Prefix) netip.Addr {
		if pf.IsValid() {
			return g.addrIn(pf)
		}
		nets := genV4Nets
		if v6 {
			nets = genV6Nets
		}
		if g.r.IntN(8) == 0 {
			return g.addrIn(netip.PrefixFrom(nets[0].Addr(), 0))
		}
		return g.addrIn(pick(g.r, nets))
	}
	p.src, p.dst = addrFor(m.Src), addrFor(m.Dst)
	p.vlan = g.r.IntN(5) == 0
	switch {
	case m.Proto != nil:
		p.proto = *m.Proto
	case m.hasLovelock():
		p.proto = 17
	default:
		p.proto = pick(g.r, []uint8{6, 17, 17, 17, 1, 58, 47})
	}
	port := func(want *uint16) uint16 {
		if want != nil {
			return *want
		}
		if g.r.IntN(3) == 0 {
			return uint16(g.r.Uint32())
		}
		return pick(g.r, genPorts)
	}
	p.sport, p.dport = port(m.Sport), port(m.Dport)
	if m.hasLovelock() || (p.proto == 17 && g.r.IntN(3) == 0) {
		p.dport = g.port
	}
	if p.proto == 17 && p.dport == g.port {
		t := g.llType()
		if m.Type != nil {
			t = *m.Type
		}
		tenant := pick(g.r, genTenants)
		if m.Tenant != nil {
			tenant = *m.Tenant
		}
		rank := g.rank()
		switch {
		case m.Rank != nil:
			rank = m.Rank.Lo + uint32(g.r.Int64N(int64(m.Rank.Hi)-int64(m.Rank.Lo)+1))
		case m.Region != nil:
			rank = *m.Region
		}
		p.ll = llHeader(t, tenant, rank)
	}
	p.payload = make([]byte, g.r.IntN(64))
	if g.r.IntN(30) == 0 {
		p.payload = make([]byte, g.r.IntN(1400))
	}
	if g.r.IntN(25) == 0 {
		p.frag = fragKind(1 + g.r.IntN(2))
	}
	if v6 && g.r.IntN(6) == 0 {
		for range 1 + g.r.IntN(3) {
			p.ext = append(p.ext, pick(g.r, []uint8{0, 60, 44}))
		}
	}
	return g.mutate(p.build(tb)), iface
}

// mutate leaves most frames alone and breaks the rest in one of the ways
// the parser checks for, or at random.
func (g *gen) mutate(f []byte) []byte {
	if g.r.IntN(7) != 0 {
		return f
	}
	l3 := 14
	if binary.BigEndian.Uint16(f[12:]) == 0x8100 {
		l3 = 18
	}
	switch g.r.IntN(7) {
	case 0: // cut anywhere
		f = f[:14+g.r.IntN(len(f)-13)]
	case 1: // any byte
		f[g.r.IntN(len(f))] = byte(g.r.Uint32())
	case 2: // IP version and header length
		if len(f) > l3 {
			f[l3] = byte(g.r.IntN(256))
		}
	case 3: // a byte of the L4 or Lovelock header
		if n := len(f) - l3 - 20; n > 0 {
			f[l3+20+g.r.IntN(min(n, 80))] = byte(g.r.Uint32())
		}
	case 4: // the last bytes: payload cut, or padding
		if g.r.IntN(2) == 0 && len(f) > 15 {
			f = f[:len(f)-1-g.r.IntN(min(len(f)-15, 8))]
		} else {
			f = append(f, make([]byte, 1+g.r.IntN(16))...)
		}
	case 5: // IPv4 fragment field
		if len(f) >= l3+8 && f[l3]>>4 == 4 {
			binary.BigEndian.PutUint16(f[l3+6:], pick(g.r, []uint16{0x2000, 0x0001, 0x4000, 0x8000}))
		}
	case 6: // a UDP length field, wherever the UDP header would be
		if i := l3 + 20 + 4; len(f) >= i+2 && f[l3]>>4 == 4 {
			binary.BigEndian.PutUint16(f[i:], uint16(g.r.IntN(100)))
		}
	}
	return f[:min(len(f), maxRunLen)]
}
