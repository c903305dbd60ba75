package rules

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// fuzzSet derives a rule set from spec, six bytes a rule: a template, a
// priority and four parameters. Priorities are unique (the rule's index in
// the low byte), so every derived set has no same-priority overlaps; shapes
// may still exceed MaxShapes, and the caller skips such sets.
func fuzzSet(spec []byte) *Set {
	s := &Set{Default: fuzzAction(0)}
	if len(spec) > 0 {
		s.Default = fuzzAction(spec[0])
		spec = spec[1:]
	}
	for i := 0; len(spec) >= 6 && i < 64; i++ {
		b := spec[:6]
		spec = spec[6:]
		r := Rule{Name: fmt.Sprint("r", i), Priority: uint32(b[1])<<8 | uint32(i), Action: fuzzAction(b[5])}
		p16 := uint16(b[3])<<8 | uint16(b[4])
		switch b[0] % 12 {
		case 0:
			r.Match = Match{Proto: new([]uint8{6, 17}[b[2]&1]), Dport: new(pick8(b[3], genPorts, p16))}
		case 1:
			r.Match = Match{Dst: mustPrefix(netip.AddrFrom4([4]byte{10, b[3], b[4], b[2]}), []int{0, 8, 16, 24, 32}[b[2]%5])}
		case 2:
			a := netip.AddrFrom16([16]byte{0xfd, 0, b[3], b[4], 0, b[2]})
			r.Match = Match{Src: mustPrefix(a, []int{0, 16, 32, 48, 128}[b[2]%5])}
		case 3:
			lo := uint32(b[3]) << (b[2] % 24)
			r.Match = Match{Type: new(wire.Types()[b[2]%10]), Rank: &RankRange{lo, lo + uint32(b[4])}}
		case 4:
			r.Match = Match{Tenant: new(uint32(b[2] % 4))}
		case 5:
			r.Match = Match{Iface: harnessIfaces[b[2]%5]}
		case 6:
			r.Match = Match{Region: new(uint32(b[3])), Type: new(wire.Types()[b[2]%10]), Tenant: new(uint32(b[4] % 3))}
		case 7:
			r.Match = Match{}
		case 8:
			r.Match = Match{Proto: new(uint8(1)), Src: netip.MustParsePrefix("0.0.0.0/0")}
		case 9:
			r.Match = Match{Iface: harnessIfaces[b[2]%5], Proto: new(uint8(17)), Sport: new(pick8(b[3], genPorts, p16))}
		case 10:
			r.Match = Match{Proto: new(b[2]), Src: mustPrefix(netip.AddrFrom4([4]byte{10, b[3], 0, 0}), 16)}
		case 11:
			r.Match = Match{Tenant: new(uint32(b[2] % 4)), Rank: &RankRange{uint32(b[3]), uint32(b[3]) + uint32(b[4]>>4)}}
		}
		s.Rules = append(s.Rules, r)
	}
	return s
}

func pick8[T any](b byte, vs []T, other T) T {
	if int(b) < len(vs) {
		return vs[b]
	}
	return other
}

func mustPrefix(a netip.Addr, bits int) netip.Prefix {
	p, _ := a.Prefix(bits)
	return p
}

func fuzzAction(b byte) Action {
	switch b % 4 {
	case 0:
		return Pass()
	case 1:
		return Drop()
	case 2:
		return Redirect([]string{"v1", "v3", "ext"}[b/4%3])
	}
	return XSK(uint32(b/4) % 64)
}

// FuzzClassify derives a rule set from spec and runs frame, arriving on
// one of the harness's interfaces, through the steering program and the Go
// reference classifier; any disagreement (rule, action, or the data plane's
// counters) fails. The seed corpus is in testdata/fuzz/FuzzClassify.
func FuzzClassify(f *testing.F) {
	h := newHarness(f, 0)
	valid := lovelock("10.1.2.3", "10.4.5.6", wire.TypeIngestInput, 1, 7).build(f)
	f.Add([]byte{0, 3, 1, 0, 7, 0, 3, 0, 2, 0, 2, 0, 1}, valid, uint8(0))
	var (
		cur  *Set
		a    *applied
		skip bool
	)
	f.Fuzz(func(t *testing.T, spec, frame []byte, ingress uint8) {
		if len(frame) < 14 || len(frame) > maxRunLen {
			return
		}
		// Swapping a set in waits for an RCU grace period (about 15 ms), so
		// reuse the live one when the bytes derive the same set.
		if s := fuzzSet(spec); a == nil || !reflect.DeepEqual(s, cur) {
			cur = s
			var err error
			a, err = h.apply(s)
			if skip = err != nil; skip {
				// Only too many shapes may reject a derived set.
				if Validate(s, h.resolve, 0) == nil {
					t.Fatalf("Validate accepts what apply rejects: %v", err)
				}
				return
			}
		}
		if skip {
			return
		}
		iface := harnessIfaces[int(ingress)%len(harnessIfaces)]
		err := h.inNS(func() error {
			_, d, err := a.run(frame, uint32(h.ifaces[iface]))
			if err != nil {
				return err
			}
			if d != "" {
				text, _ := Format(fuzzSet(spec))
				return fmt.Errorf("%s\nframe % x on %s\nrules:\n%s", d, frame, iface, text)
			}
			return a.checkStats()
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}
