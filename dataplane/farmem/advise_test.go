package farmem

import (
	"errors"
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/farmem/fmap"
)

// TestAdviseChecksFirst: advice with a dynamic or static range outside the
// region (or a negative one) is refused with ErrOutOfRange before any of
// it is applied: the prefetcher it also names is not set, nothing is
// loaded. Hints past the end are cut at it, as the DPU agent cuts them,
// and the rest of the advice is applied. (Before, the prefetcher was set
// first and the range refused after, by the agent.)
func TestAdviseChecksFirst(t *testing.T) {
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	const chunk, esz, size = 64 << 10, 256 << 10, 1 << 20
	// The switch kept on: the hints load entries.
	a := startCachingAgent(t, srv, CacheConfig{Size: 4 * esz, EntrySize: esz, BNet: 1, BIntra: 1 << 40, Window: 1 << 30})
	r, _ := writtenRegion(t, newClient(t, a.Addr(), 3), size, chunk)
	stats := func() RegionCacheStats {
		for _, rs := range a.Stats().Cache.Regions {
			if rs.Region == r.ID() {
				return rs
			}
		}
		return RegionCacheStats{}
	}
	before := stats().Prefetcher
	if before == "off" {
		t.Fatal("the region's prefetcher is off already: the test sets it off to see whether it was applied")
	}
	for _, tc := range []struct {
		name string
		a    fmap.Advice
	}{
		{"static past the end", fmap.Advice{Prefetcher: "off", Static: []fmap.Extent{{Offset: 0, Size: esz}, {Offset: size - 4096, Size: 8192}}}},
		{"static at the end", fmap.Advice{Prefetcher: "off", Static: []fmap.Extent{{Offset: size, Size: 1}}}},
		{"dynamic past the end", fmap.Advice{Prefetcher: "off", Dynamic: []fmap.Extent{{Offset: esz, Size: size}}}},
		{"dynamic empty", fmap.Advice{Prefetcher: "off", Dynamic: []fmap.Extent{{Offset: esz, Size: 0}}}},
		{"negative hint", fmap.Advice{Prefetcher: "off", Static: []fmap.Extent{{Offset: 0, Size: esz}}, Hints: []fmap.Extent{{Offset: -1, Size: 10}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := r.Advise(tc.a); !errors.Is(err, ErrOutOfRange) {
				t.Fatalf("Advise(%+v): %v, want ErrOutOfRange", tc.a, err)
			}
			if st := stats(); st.Prefetcher != before || st.StaticBytes != 0 || st.DynamicRanges != 0 {
				t.Fatalf("after the refused advice: prefetcher %q (want %q), %d static bytes, %d dynamic ranges; want none of it applied",
					st.Prefetcher, before, st.StaticBytes, st.DynamicRanges)
			}
		})
	}
	// Hints are cut at the end (the last one rounded up past it by a
	// chunk; one wholly past it names nothing): the advice goes through.
	res, err := r.Advise(fmap.Advice{Prefetcher: "hints", Hints: []fmap.Extent{{Offset: size - esz, Size: esz + chunk}, {Offset: size + chunk, Size: chunk}}})
	if err != nil {
		t.Fatalf("Advise with hints past the end: %v", err)
	}
	if res.Hinted != 1 {
		t.Fatalf("Advise with hints past the end: %d entry loads started, want 1 (the last entry)", res.Hinted)
	}
	if st := stats(); st.Prefetcher != "hints" {
		t.Fatalf("prefetcher %q after the advice, want hints", st.Prefetcher)
	}
}
