package sched

import (
	"math"
	"testing"

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
