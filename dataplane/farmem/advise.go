package farmem

import (
	"errors"

	"github.com/lovelock-dpu/lovelock/dataplane/farmem/fmap"
)

// Advise implements fmap.Advisor, so a transparent mapping of the region
// (served by a host agent holding this Region) can reach the DPU agent's
// caches: the prefetcher is set first (SetPrefetcher), then the dynamic
// cache's ranges (SetDynamicRanges), then the static ranges are loaded
// (LoadStatic, waiting until they are there), then the hints are sent
// (Hint). A memory node has no cache: Static is then false
// and Hinted 0, with no error.
func (r *Region) Advise(a fmap.Advice) (fmap.AdviceResult, error) {
	res := fmap.AdviceResult{Supported: true}
	if a.Prefetcher != "" {
		p, err := ParsePrefetcher(a.Prefetcher)
		if err != nil {
			return res, err
		}
		if err := r.SetPrefetcher(p); err != nil {
			return res, err
		}
	}
	if len(a.Dynamic) > 0 {
		rs, err := toRanges(a.Dynamic)
		if err != nil {
			return res, err
		}
		if err := r.SetDynamicRanges(rs); err != nil {
			return res, err
		}
	}
	if len(a.Static) > 0 {
		rs, err := toRanges(a.Static)
		if err != nil {
			return res, err
		}
		if res.Static, err = r.LoadStatic(rs); err != nil {
			return res, err
		}
	}
	if len(a.Hints) > 0 {
		rs, err := toRanges(a.Hints)
		if err != nil {
			return res, err
		}
		if res.Hinted, err = r.Hint(rs); err != nil {
			return res, err
		}
	}
	return res, nil
}

func toRanges(es []fmap.Extent) ([]Range, error) {
	rs := make([]Range, 0, len(es))
	for _, e := range es {
		if e.Offset < 0 || e.Size < 0 {
			return nil, errors.New("farmem: advice with a negative offset or size")
		}
		rs = append(rs, Range{Offset: uint64(e.Offset), Size: uint64(e.Size)})
	}
	return rs, nil
}
