package sched

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
)

func TestFragTable(t *testing.T) {
	c, err := mig.CardByName("H100-80GB")
	if err != nil {
		t.Fatal(err)
	}
	only := func(name string) []float64 {
		mix := make([]float64, len(c.Profiles))
		p, err := c.Profile(name)
		if err != nil {
			t.Fatal(err)
		}
		mix[p] = 1
		return mix
	}
	for _, tc := range []struct {
		name  string
		mix   []float64
		state int
		want  float64
	}{
		// An empty GPU: a 1g can never use slice 7, a 2g never 6 and 7.
		{"empty, 1g", only("1g.10gb"), 0, 1},
		{"empty, 2g", only("2g.20gb"), 0, 2},
		{"empty, 7g", only("7g.80gb"), 0, 0},
		// 1g@0 taken: a 7g can use none of the seven free slices.
		{"1g@0, 7g", only("7g.80gb"), 0b00000001, 7},
		// 3g@0 and 1g@6 taken: slices 4, 5, 7 free; a 3g fits nowhere.
		{"3g@0 1g@6, 3g", only("3g.40gb"), 0b01001111, 3},
		{"3g@0 1g@6, 2g", only("2g.20gb"), 0b01001111, 1},
		// Full GPU: no free slice, no fragment.
		{"full, uniform", uniformMix(&c), 0xff, 0},
		// Slices 0 and 7 free: with the +me instance held, a +me request
		// can use neither; without it, slice 0.
		{"+me held, +me", only("1g.10gb+me"), meBit | 0b1111110, 2},
		{"+me free, +me", only("1g.10gb+me"), 0b1111110, 1},
	} {
		got := fragTable(&c, tc.mix)[tc.state]
		if math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: fragmentation %.3f, want %.3f", tc.name, got, tc.want)
		}
	}
}

func TestStrandedTable(t *testing.T) {
	c, err := mig.CardByName("H100-80GB")
	if err != nil {
		t.Fatal(err)
	}
	mix := func(w map[string]float64) []float64 {
		m := make([]float64, len(c.Profiles))
		for name, x := range w {
			p, err := c.Profile(name)
			if err != nil {
				t.Fatal(err)
			}
			m[p] = x
		}
		return normalise(m)
	}
	small := mix(map[string]float64{"1g.10gb": 4, "2g.20gb": 3, "3g.40gb": 3})
	for _, tc := range []struct {
		name  string
		mix   []float64
		state int
		want  int // stranded slices: the table's integer part
	}{
		{"empty", small, 0, 0},
		// Only 3g@4 reaches slice 7: a 1g at 4 strands it, a 1g at 0 not.
		{"1g@0", small, 0b00000001, 0},
		{"1g@4", small, 0b00010000, 1},
		{"2g@4", small, 0b00110000, 1},
		// Slice 6 free beside a taken 7: a 1g still uses it.
		{"3g@0 2g@4 7 taken", small, 0b10111111, 0},
		// Only whole GPUs expected: one instance strands the other seven.
		{"7g only, 1g@0", mix(map[string]float64{"7g.80gb": 1}), 0b00000001, 7},
		// A profile below a quarter of the even share does not count:
		// with 3g at 3 %, slice 7 of an empty GPU is stranded.
		{"rare 3g", mix(map[string]float64{"1g.10gb": 97, "3g.40gb": 3}), 0, 1},
		{"full", small, 0xff, 0},
	} {
		next := fragTable(&c, tc.mix)
		got := strandedTable(&c, tc.mix, &next)[tc.state]
		if int(got) != tc.want || got-float64(tc.want) >= 1 {
			t.Errorf("%s: stranded %.3f, want %d (+ a tie-break below 1)", tc.name, got, tc.want)
		}
		if math.Abs(got-float64(tc.want)-next[tc.state]/16) > 1e-9 {
			t.Errorf("%s: tie-break %.4f, want fragTable/16 = %.4f", tc.name, got-float64(tc.want), next[tc.state]/16)
		}
	}
	// The case the measure is for: FGD's table rates a 1g at 0 and at 4
	// alike on this mix; the stranded table prefers 0.
	if f := fragTable(&c, small); math.Abs(f[0b1]-f[0b10000]) > 1e-9 {
		t.Errorf("fragTable: 1g@0 %.3f, 1g@4 %.3f: want equal", f[0b1], f[0b10000])
	}
}

func TestParseFrag(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want FragMeasure
		err  bool
	}{
		{"", FragDefault, false},
		{"next", FragNext, false},
		{"Stranded", FragStranded, false},
		{"", FragStranded, false}, // the default
		{"fgd", 0, true},
	} {
		got, err := ParseFrag(tc.in)
		if (err != nil) != tc.err || (!tc.err && got.resolve() != tc.want.resolve()) {
			t.Errorf("ParseFrag(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.err)
		}
		if !tc.err && tc.in != "" && !strings.EqualFold(got.String(), tc.in) {
			t.Errorf("ParseFrag(%q).String() = %q", tc.in, got)
		}
	}
}

// TestStrandedKeepsSlotsForTheMix: on one H100 serving 1g, 2g and 3g
// requests, FGD's measure puts the first 1g at slot 6 and ends with slice 7
// free and useless; the stranded measure keeps slices 4-7 for the 3g and has
// room for one more 1g.
func TestStrandedKeepsSlotsForTheMix(t *testing.T) {
	c, err := mig.CardByName("H100-80GB")
	if err != nil {
		t.Fatal(err)
	}
	mix := make([]float64, len(c.Profiles))
	for name, w := range map[string]float64{"1g.10gb": 4, "2g.20gb": 3, "3g.40gb": 3} {
		p, _ := c.Profile(name)
		mix[p] = w
	}
	var reqs []Request
	for i, p := range []string{"1g.10gb", "2g.20gb", "3g.40gb", "1g.10gb"} {
		reqs = append(reqs, Request{ID: uint64(i + 1), Profile: p, Arrival: time.Duration(i) * time.Second, Duration: time.Minute})
	}
	for _, tc := range []struct {
		frag   FragMeasure
		placed int
	}{
		{FragNext, 3},
		{FragStranded, 4},
	} {
		res, err := Fill(Config{Policy: Lovelock, Fleet: []Fleet{{"H100-80GB", 1}}, Mix: mix, Frag: tc.frag}, reqs, 10)
		if err != nil {
			t.Fatal(err)
		}
		if res.Placed != tc.placed {
			t.Errorf("%s: %d of 4 placed, want %d", tc.frag, res.Placed, tc.placed)
		}
	}
}

// TestStrandedWaitsForTheMix: with a learned mix, the stranded measure
// starts once 64 requests have arrived (before, the even prior dominates the
// mix and FGD's measure decides); with a given mix at once. The default
// measure is the stranded one.
func TestStrandedWaitsForTheMix(t *testing.T) {
	c, err := mig.CardByName("H100-80GB")
	if err != nil {
		t.Fatal(err)
	}
	given := uniformMix(&c)
	for _, tc := range []struct {
		name     string
		frag     FragMeasure
		mix      []float64
		arrivals int
		stranded bool
	}{
		{"default, learning, 0 arrivals", FragDefault, nil, 0, false},
		{"default, learning, 63 arrivals", FragDefault, nil, 63, false},
		{"default, learning, 64 arrivals", FragDefault, nil, 64, true},
		{"stranded, given mix", FragStranded, given, 0, true},
		{"next, learning, 64 arrivals", FragNext, nil, 64, false},
	} {
		s, err := New(Config{Policy: Lovelock, Fleet: []Fleet{{"H100-80GB", 1}}, Mix: tc.mix, Frag: tc.frag})
		if err != nil {
			t.Fatal(err)
		}
		for i := range tc.arrivals {
			r := &Request{ID: uint64(i + 1), Profile: "1g.10gb", Duration: time.Second}
			if _, err := s.Place(r, 0); err != nil {
				t.Fatal(err)
			}
			if err := s.Release(r.ID); err != nil {
				t.Fatal(err)
			}
		}
		cs := &s.cards[0]
		want := cs.frag
		if tc.stranded {
			mix := tc.mix
			if mix == nil {
				mix = s.mixCount // relearned at the 64th arrival
			}
			want = strandedTable(&cs.card, normalise(mix), &cs.frag)
		}
		if cs.tie != want {
			t.Errorf("%s: tie-break table is not the %s one", tc.name, map[bool]string{true: "stranded", false: "FGD"}[tc.stranded])
		}
	}
}
