package farmem

import (
	"context"
	"math/rand/v2"
	"testing"
)

// benchCacheSetup runs a memory node and a caching agent on loopback and
// returns a region of size bytes opened through the agent (the switch
// off: Window is too long to end, so each prefetcher is seen alone).
func benchCacheSetup(b *testing.B, size uint64, pf Prefetcher) (*Agent, *Region) {
	srv, _ := startServer(b, b.TempDir(), listen(b, loopback))
	a := startCachingAgent(b, srv, CacheConfig{Size: 4 << 20, EntrySize: 256 << 10, BNet: 1, BIntra: 1 << 40,
		Prefetcher: pf, Window: 1 << 30})
	c := newClient(b, a.Addr(), 4)
	r, err := c.Alloc(context.Background(), size)
	if err != nil {
		b.Fatal(err)
	}
	return a, r
}

// BenchmarkPrefetchers reads 64 KiB chunks of a 64 MiB region, one at a
// time, through a caching agent (4 MiB arena of 256 KiB entries) with each
// prefetcher, in four patterns: seq (a dense phase streaming an edge
// array), stride (every fifth chunk: a column walk), random, and hinted
// (random reads whose next eight the application names ahead with
// Region.Hint, as a sparse phase knows its frontier). It reports the
// prefetcher's accuracy (used/issued) and coverage (hits/reads):
//
//	go test -run='^$' -bench=Prefetchers -benchtime=512x ./dataplane/farmem/
func BenchmarkPrefetchers(b *testing.B) {
	const chunk, size = 64 << 10, 64 << 20
	for _, pattern := range []string{"seq", "stride", "random", "hinted"} {
		for _, pf := range []Prefetcher{PrefetchAdjacent, PrefetchStride, PrefetchHints, PrefetchOff} {
			b.Run(pattern+"/"+pf.String(), func(b *testing.B) {
				a, r := benchCacheSetup(b, size, pf)
				rng := rand.New(rand.NewPCG(1, 1))
				var next []int64
				pos := 0
				at := func() int64 {
					i := pos
					pos++
					switch pattern {
					case "seq":
						return int64(i%(size/chunk)) * chunk
					case "stride":
						return int64(i*5%(size/chunk)) * chunk
					}
					return int64(rng.IntN(size/chunk)) * chunk
				}
				buf := make([]byte, chunk)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if len(next) == 0 {
						for range 8 {
							next = append(next, at())
						}
						if pattern == "hinted" {
							var rs []Range
							for _, o := range next {
								rs = append(rs, Range{uint64(o), chunk})
							}
							if _, err := r.Hint(rs); err != nil {
								b.Fatal(err)
							}
						}
					}
					off := next[0]
					next = next[1:]
					if _, err := r.ReadAt(buf, off); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				st := a.Stats().Cache
				for _, rs := range st.Regions {
					if rs.Region == r.ID() {
						b.ReportMetric(rs.Accuracy, "accuracy")
						b.ReportMetric(rs.Coverage, "coverage")
						b.ReportMetric(float64(rs.PrefetchIssued)/float64(b.N), "fills/read")
					}
				}
			})
		}
	}
}

// BenchmarkCacheHitMiss reads one 64 KiB chunk through the agent: from a
// static range, from a dynamic-cache entry, and as a miss forwarded to
// the memory node (prefetcher off).
//
//	go test -run='^$' -bench=CacheHitMiss -benchtime=2000x ./dataplane/farmem/
func BenchmarkCacheHitMiss(b *testing.B) {
	const chunk = 64 << 10
	for _, kind := range []string{"static", "dynamic", "miss"} {
		b.Run(kind, func(b *testing.B) {
			pf := PrefetchHints
			if kind == "miss" {
				pf = PrefetchOff
			}
			a, r := benchCacheSetup(b, 1<<20, pf)
			switch kind {
			case "static":
				if ok, err := r.LoadStatic([]Range{{0, 1 << 20}}); err != nil || !ok {
					b.Fatal(ok, err)
				}
			case "dynamic":
				if _, err := r.Hint([]Range{{0, 1 << 20}}); err != nil {
					b.Fatal(err)
				}
				for a.Stats().Cache.Valid < 4 { // 4 entries of 256 KiB, filling
					buf := make([]byte, 1)
					_, _ = r.ReadAt(buf, 0)
				}
			}
			buf := make([]byte, chunk)
			b.SetBytes(chunk)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := r.ReadAt(buf, int64(i%16)*chunk); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			st := a.Stats().Cache.Regions
			for _, rs := range st {
				if rs.Region == r.ID() {
					b.ReportMetric(float64(rs.Hits+rs.StaticHits)/float64(b.N), "hits/read")
				}
			}
		})
	}
}
