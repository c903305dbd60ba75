package fmap

import (
	"context"
	"errors"
)

// Extent is a byte range of a region.
type Extent struct {
	Offset int64 `json:"off"`
	Size   int64 `json:"size"`
}

// Advice is what a program tells the far end of its mapping about how it
// will read the region: the host agent passes it to the region's Backend
// when that implements Advisor (the far-memory client's region does: it
// forwards the advice to the DPU agent's caches), and ignores it
// otherwise. Advice never changes what the mapping reads, only what the
// far end keeps ready.
type Advice struct {
	// Prefetcher, when not empty, chooses the far cache's prefetcher for
	// the region ("adjacent", "stride", "hints", "off" for the DPU agent).
	Prefetcher string `json:"prefetcher,omitempty"`
	// Dynamic, when not empty, limits the far end's dynamic cache to these
	// ranges (the rest of the region is read through uncached).
	Dynamic []Extent `json:"dynamic,omitempty"`
	// Static asks the far end to load these ranges into its static cache
	// and to return once they are there.
	Static []Extent `json:"static,omitempty"`
	// Hints name ranges the program will read soon; the far end loads them
	// off the critical path.
	Hints []Extent `json:"hints,omitempty"`
}

// AdviceResult is the far end's answer to an Advice.
type AdviceResult struct {
	// Supported is false when the backend takes no advice (a file, a
	// MemBackend, a region served straight by a memory node).
	Supported bool `json:"supported,omitempty"`
	// Static reports that the static ranges are loaded.
	Static bool `json:"static,omitempty"`
	// Hinted is the number of cache entry loads the hints started.
	Hinted int `json:"hinted,omitempty"`
}

// Advisor is implemented by Backends whose far end has caches.
type Advisor interface {
	Advise(Advice) (AdviceResult, error)
}

// maxExtents bounds an Advice's ranges so that its frame stays well below
// fdpass.MaxFrame (an extent is at most about 50 bytes of JSON).
const maxExtents = 1000

// ErrTooMuchAdvice is returned by Advise for more than 1000 ranges in one
// call; split them.
var ErrTooMuchAdvice = errors.New("fmap: more than 1000 ranges in one advice")

// Advise passes a to the region's far end through the host agent and
// waits for its answer. It does not touch the mapping's bytes, so any
// goroutine may call it while others fault; calls are serialised with
// Sync and Stats on the agent connection.
func (m *Mapping) Advise(ctx context.Context, a Advice) (AdviceResult, error) {
	if len(a.Dynamic)+len(a.Static)+len(a.Hints) > maxExtents {
		return AdviceResult{}, ErrTooMuchAdvice
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	resp, err := m.roundTrip(ctx, frame{Op: opAdvise, Advice: &a})
	if err != nil {
		return AdviceResult{}, err
	}
	if resp.Result == nil {
		return AdviceResult{}, nil
	}
	return *resp.Result, nil
}

// advise is the agent's side of Advise.
func advise(be Backend, a *Advice) (AdviceResult, error) {
	if a == nil {
		return AdviceResult{}, errors.New("fmap agent: advise without advice")
	}
	if len(a.Dynamic)+len(a.Static)+len(a.Hints) > maxExtents {
		return AdviceResult{}, ErrTooMuchAdvice
	}
	adv, ok := be.(Advisor)
	if !ok {
		return AdviceResult{}, nil
	}
	r, err := adv.Advise(*a)
	r.Supported = r.Supported || err == nil
	return r, err
}
