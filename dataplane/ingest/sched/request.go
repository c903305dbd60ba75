package sched

import (
	"errors"
	"fmt"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
)

// Request is one inference request or job to place.
//
// What it needs is given, in order of precedence, by Profile (an exact MIG
// profile name, e.g. "3g.40gb"), by Throughput (a fraction of one whole GPU's
// throughput, mapped to the smallest profile whose speed reaches it; see
// Speeds), or by Compute and MemGB (the smallest profile with at least that
// many compute slices and that much memory). MemGB also constrains the
// first two.
type Request struct {
	ID         uint64
	Profile    string
	Throughput float64
	Compute    int
	MemGB      int
	Media      bool // needs the media engines (a +me profile)

	Arrival  time.Duration // since the start of the trace
	Duration time.Duration // run time on the profile it asks for
	Deadline time.Duration // latest completion, since the start; 0: none
	Share    int           // GPU share requested, in thousandths (for the allocation rate); 0: from the profile
}

// Reasons a request cannot be served.
var (
	ErrUnfit      = errors.New("no profile of the card fits the request")
	ErrNoCapacity = errors.New("no GPU has room now")
	ErrWait       = errors.New("waiting is cheaper than opening a GPU")
	ErrUnknownID  = errors.New("no running request with this id")
	ErrDuplicate  = errors.New("request id already running")
)

// Speeds gives the throughput of each profile as a fraction of a whole GPU,
// keyed by profile name. Profiles missing from it run at SMs / SMs of the
// whole GPU, not at compute slices / 7: on H100 a 1g.10gb has 16 of 132 SMs
// (0.121, not 0.143) and a 3g.40gb 60 (0.455, not 0.429). Measured numbers
// (e.g. from a model's MLPerf run per profile) belong here.
type Speeds map[string]float64

// Speed returns the relative speed of profile p of card c.
func (s Speeds) Speed(c *mig.Card, p int) float64 {
	if v, ok := s[c.Profiles[p].Name]; ok {
		return v
	}
	full := c.Profiles[len(c.Profiles)-1].SMs
	return float64(c.Profiles[p].SMs) / float64(full)
}

// Resolve returns the index of the profile of card c that serves r, or an
// error wrapping ErrUnfit that says why none does.
func Resolve(c *mig.Card, r *Request, speeds Speeds) (int, error) {
	if r.Profile != "" {
		p, err := c.Profile(r.Profile)
		if err != nil {
			return -1, fmt.Errorf("request %d: %w: %w", r.ID, ErrUnfit, err)
		}
		if c.Profiles[p].MemGB < r.MemGB {
			return -1, fmt.Errorf("request %d: %w: %s has %d GB, request needs %d", r.ID, ErrUnfit, r.Profile, c.Profiles[p].MemGB, r.MemGB)
		}
		return p, nil
	}
	best := -1
	for i, p := range c.Profiles {
		isME := p.Max == 1 && p.MemSlices == 1
		if isME != r.Media || p.MemGB < r.MemGB || p.Compute < r.Compute {
			continue
		}
		if r.Throughput > 0 && speeds.Speed(c, i) < r.Throughput {
			continue
		}
		// Smallest memory first, then fewest compute slices: leave the most room.
		if best < 0 || p.MemSlices < c.Profiles[best].MemSlices ||
			(p.MemSlices == c.Profiles[best].MemSlices && p.Compute < c.Profiles[best].Compute) {
			best = i
		}
	}
	if best < 0 {
		return -1, fmt.Errorf("request %d (compute %d, %d GB, throughput %.3f, media %v) on %s: %w",
			r.ID, r.Compute, r.MemGB, r.Throughput, r.Media, c.Name, ErrUnfit)
	}
	return best, nil
}
