package farmem

import (
	"fmt"

	"github.com/lovelock-dpu/lovelock/dataplane/farmem/fmap"
)

// Advise implements fmap.Advisor, so a transparent mapping of the region
// (served by a host agent holding this Region) can reach the DPU agent's
// caches. All of the advice is checked first, and nothing is applied when
// a part is bad: an unknown prefetcher, a negative extent, or a dynamic or
// static range outside the region is refused (ErrOutOfRange for the
// ranges), as the DPU agent would refuse it; hints, which are advice, are
// cut at the region's end instead, as the agent cuts them (one rounded up
// past the end by a whole chunk is fine). Then the prefetcher is set
// (SetPrefetcher), then the dynamic cache's ranges (SetDynamicRanges),
// then the static ranges are loaded (LoadStatic, waiting until they are
// there), then the hints are sent (Hint). A memory node has no cache:
// Static is then false and Hinted 0, with no error.
func (r *Region) Advise(a fmap.Advice) (fmap.AdviceResult, error) {
	res := fmap.AdviceResult{Supported: true}
	var pf Prefetcher
	if a.Prefetcher != "" {
		var err error
		if pf, err = ParsePrefetcher(a.Prefetcher); err != nil {
			return res, err
		}
	}
	dynamic, err := r.adviceRanges("dynamic cache", a.Dynamic, false)
	if err != nil {
		return res, err
	}
	static, err := r.adviceRanges("static", a.Static, true)
	if err != nil {
		return res, err
	}
	hints, err := r.adviceHints(a.Hints)
	if err != nil {
		return res, err
	}
	if a.Prefetcher != "" {
		if err := r.SetPrefetcher(pf); err != nil {
			return res, err
		}
	}
	if len(dynamic) > 0 {
		if err := r.SetDynamicRanges(dynamic); err != nil {
			return res, err
		}
	}
	if len(static) > 0 {
		if res.Static, err = r.LoadStatic(static); err != nil {
			return res, err
		}
	}
	if len(hints) > 0 {
		if res.Hinted, err = r.Hint(hints); err != nil {
			return res, err
		}
	}
	return res, nil
}

// adviceRanges converts the extents of one kind of advice, refusing any
// that does not lie wholly inside the region. whole allows Size 0 at
// Offset 0, the whole region (a static load's).
func (r *Region) adviceRanges(kind string, es []fmap.Extent, whole bool) ([]Range, error) {
	rs := make([]Range, 0, len(es))
	for _, e := range es {
		if err := r.checkExtent(kind, e); err != nil {
			return nil, err
		}
		off, n := uint64(e.Offset), uint64(e.Size)
		if !(whole && off == 0 && n == 0) && (n == 0 || off >= r.size || n > r.size-off) {
			return nil, fmt.Errorf("farmem: advice for region %d: %s range %d+%d is not inside its %d bytes, and none of the advice was applied: %w",
				r.id, kind, e.Offset, e.Size, r.size, ErrOutOfRange)
		}
		rs = append(rs, Range{Offset: off, Size: n})
	}
	return rs, nil
}

// adviceHints converts hint extents, cut at the region's end; those that
// start at or past it, or are empty, name nothing and are left out.
func (r *Region) adviceHints(es []fmap.Extent) ([]Range, error) {
	rs := make([]Range, 0, len(es))
	for _, e := range es {
		if err := r.checkExtent("hint", e); err != nil {
			return nil, err
		}
		off, n := uint64(e.Offset), uint64(e.Size)
		if n == 0 || off >= r.size {
			continue
		}
		rs = append(rs, Range{Offset: off, Size: min(n, r.size-off)})
	}
	return rs, nil
}

func (r *Region) checkExtent(kind string, e fmap.Extent) error {
	if e.Offset < 0 || e.Size < 0 {
		return fmt.Errorf("farmem: advice for region %d: %s range %d+%d has a negative offset or size, and none of the advice was applied: %w",
			r.id, kind, e.Offset, e.Size, ErrOutOfRange)
	}
	return nil
}
