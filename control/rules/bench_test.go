package rules

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// bigSet makes n rules in nine shapes whose matches are pairwise disjoint,
// so that they may share one priority (onePrio) or have one each.
func bigSet(n int, onePrio bool) *Set {
	s := &Set{Default: Pass(), Rules: make([]Rule, 0, n)}
	tcp, udp := new(uint8(6)), new(uint8(17))
	for i := range n {
		var m Match
		u := uint32(i)
		switch i % 8 {
		case 0:
			m = Match{Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24), Proto: tcp, Dport: new(uint16(443))}
		case 1:
			m = Match{Src: netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, byte(i >> 8), byte(i)}), 48), Proto: tcp}
		case 2:
			m = Match{Dst: netip.MustParsePrefix("0.0.0.0/0"), Proto: udp, Dport: new(uint16(i))}
		case 3:
			m = Match{Tenant: new(u), Type: new(wire.TypeBundle)}
		case 4:
			m = Match{Tenant: new(u), Rank: &RankRange{16 * u, 16*u + 9}}
		case 5:
			m = Match{Iface: fmt.Sprint("eth", i%10), Proto: tcp, Sport: new(uint16(i)), Dst: netip.MustParsePrefix("192.168.0.0/16")}
		case 6:
			m = Match{Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 16, byte(i >> 8), byte(i)}), 32), Proto: tcp}
		case 7:
			m = Match{Region: new(u), Type: new(wire.TypePing), Tenant: new(1<<31 + u)}
		}
		prio := uint32(7)
		if !onePrio {
			prio = uint32(n - i)
		}
		s.Rules = append(s.Rules, Rule{Name: fmt.Sprint("r", i), Priority: prio, Match: m, Action: XSK(u % 64)})
	}
	return s
}

// TestCompileLarge compiles the most rules the data plane counts, all at
// one priority, which makes the overlap check compare every pair of
// shapes; then one overlapping rule must be found by name.
func TestCompileLarge(t *testing.T) {
	s := bigSet(MaxID, true)
	tcp := new(uint8(6))
	start := time.Now()
	rs, err := Compile(s, resolveAll, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d rules: %d shapes, %d entries in %v", len(s.Rules), len(rs.Shapes), len(rs.Entries), time.Since(start).Round(time.Millisecond))
	// Rules 4, 12, 20, ... have rank ranges of two blocks.
	if blocks := (MaxID + 3) / 8; len(rs.Shapes) != 9 || len(rs.Entries) != MaxID+blocks {
		t.Errorf("%d shapes, %d entries", len(rs.Shapes), len(rs.Entries))
	}
	// r40001 is an IPv6 /48 rule; a rule inside its prefix clashes.
	s.Rules[len(s.Rules)-1] = Rule{Name: "clash", Priority: 7, Action: Drop(),
		Match: Match{Src: netip.MustParsePrefix("fd00:9c41:0:1::/64"), Proto: tcp}}
	err = Validate(s, resolveAll, 0)
	if err == nil || !strings.Contains(err.Error(), `rules 40002 "r40001" and 65535 "clash" both have priority 7 and both match src fd00:9c41:0:1::/64, proto tcp`) {
		t.Errorf("err = %v", err)
	}
}

// BenchmarkCompile compiles 65535 rules (the data plane's most) in nine
// shapes, with distinct priorities and with one shared priority (every
// shape pair then goes through the overlap check), against a baseline in
// the same run: hashing every rule's key into a Go map once, the least any
// tuple-space compiler does.
func BenchmarkCompile(b *testing.B) {
	for _, onePrio := range []bool{false, true} {
		s := bigSet(MaxID, onePrio)
		name := "rules=65535/priorities=distinct"
		if onePrio {
			name = "rules=65535/priorities=one"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Compile(s, resolveAll, 0); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/MaxID, "ns/rule")
		})
	}
	s := bigSet(MaxID, false)
	rs, err := Compile(s, resolveAll, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("baseline=map-insert-per-entry", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m := make(map[bpf.RuleKey]bpf.RuleVal)
			for _, e := range rs.Entries {
				m[e.Key] = e.Val
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/MaxID, "ns/rule")
	})
}
