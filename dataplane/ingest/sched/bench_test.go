package sched

import (
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkPlace measures one arrival and one completion on a fleet of 1000
// H100s kept about 70 % full, per policy.
func BenchmarkPlace(b *testing.B) {
	profiles := []string{"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}
	for _, p := range Policies() {
		b.Run(p.String(), func(b *testing.B) {
			s, err := New(Config{Policy: p, Fleet: []Fleet{{"H100-80GB", 1000}}})
			if err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 1))
			var live []uint64
			id := uint64(0)
			for s.InUse() < 700 {
				id++
				if _, err := s.Place(&Request{ID: id, Profile: profiles[rng.IntN(len(profiles))], Duration: time.Minute}, 0); err == nil {
					live = append(live, id)
				}
			}
			b.ResetTimer()
			for range b.N {
				k := rng.IntN(len(live))
				if err := s.Release(live[k]); err != nil {
					b.Fatal(err)
				}
				live[k] = live[len(live)-1]
				live = live[:len(live)-1]
				id++
				if _, err := s.Place(&Request{ID: id, Profile: profiles[rng.IntN(len(profiles))], Duration: time.Minute}, 0); err == nil {
					live = append(live, id)
				}
			}
		})
	}
}
