package sched

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
)

// BenchmarkPlace measures one arrival and one completion on a fleet of 1000
// H100s kept about 70 % full, per policy (lovelock with each fragmentation
// measure).
func BenchmarkPlace(b *testing.B) {
	profiles := []string{"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}
	type run struct {
		name string
		cfg  Config
	}
	var runs []run
	for _, p := range Policies() {
		if p != Lovelock {
			runs = append(runs, run{p.String(), Config{Policy: p}})
			continue
		}
		for _, f := range FragMeasures() {
			runs = append(runs, run{p.String() + "-" + f.String(), Config{Policy: p, Frag: f}})
		}
	}
	for _, r := range runs {
		b.Run(r.name, func(b *testing.B) {
			cfg := r.cfg
			cfg.Fleet = []Fleet{{"H100-80GB", 1000}}
			s, err := New(cfg)
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

// BenchmarkPlanWindow measures the windowed planner on a batch of six
// requests arriving together at three empty H100s (the gap table's window
// class): one op is one batch, planned or, over budget, placed one by one.
func BenchmarkPlanWindow(b *testing.B) {
	rng := rand.New(rand.NewPCG(2, 2026))
	var batches [][]Request
	for range 64 {
		in, err := Generate(rng, GenOptions{Card: "H100-80GB", Jobs: 6, GPUs: 3, Releases: 0, MaxDur: 4, MaxSlack: 4})
		if err != nil {
			b.Fatal(err)
		}
		batches = append(batches, in.Requests())
	}
	card, err := mig.CardByName("H100-80GB")
	if err != nil {
		b.Fatal(err)
	}
	// A fixed mix: the learned one is recomputed at the first arrivals.
	cfg := Config{Policy: Lovelock, Fleet: []Fleet{{"H100-80GB", 3}}, Mix: uniformMix(&card)}
	nodes := 0
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		d, err := NewDispatcher(cfg)
		if err != nil {
			b.Fatal(err)
		}
		reqs := batches[i%len(batches)]
		batch := make([]*Request, len(reqs))
		for k := range reqs {
			batch[k] = &reqs[k]
		}
		b.StartTimer()
		if _, err := d.Arrive(0, batch, nil); err != nil {
			b.Fatal(err)
		}
		nodes += d.Scheduler().Plans().Nodes
	}
	b.ReportMetric(float64(nodes)/float64(b.N), "nodes/op")
}
