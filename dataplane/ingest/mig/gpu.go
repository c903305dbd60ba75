package mig

import (
	"fmt"
	"math/bits"
)

// GPU is the placement state of one MIG card: which memory slices are taken
// and how many instances of each profile it holds. The zero value is not
// usable; call NewGPU.
type GPU struct {
	card  *Card
	used  uint8
	count []int
	n     int
}

// NewGPU returns an empty GPU of the card. The card must outlive the GPU and
// not change.
func NewGPU(c *Card) *GPU {
	return &GPU{card: c, count: make([]int, len(c.Profiles))}
}

// Card returns the GPU's card.
func (g *GPU) Card() *Card { return g.card }

// Used returns the occupied memory slices as a mask (bit i = slice i).
func (g *GPU) Used() uint8 { return g.used }

// Instances returns the number of instances on the GPU.
func (g *GPU) Instances() int { return g.n }

// FreeSlices returns the number of free memory slices.
func (g *GPU) FreeSlices() int { return MemorySlices - bits.OnesCount8(g.used) }

// Starts returns, as a mask, the start slots at which an instance of profile
// p fits now (bit s = slot s).
func (g *GPU) Starts(p int) uint8 {
	pr := &g.card.Profiles[p]
	if g.count[p] >= pr.Max {
		return 0
	}
	return FreeStarts(pr, g.used)
}

// FreeStarts returns the start slots of p whose memory ranges avoid used.
func FreeStarts(p *Profile, used uint8) uint8 {
	var m uint8
	for _, s := range p.Starts {
		if p.Mask(s)&used == 0 {
			m |= 1 << s
		}
	}
	return m
}

// Place adds an instance, or returns an error wrapping ErrBadStart,
// ErrOverlap, ErrTooMany or ErrNoProfile saying why it does not fit.
func (g *GPU) Place(pl Placement) error {
	if err := g.card.Check(pl, g.used, g.count); err != nil {
		return err
	}
	g.used |= g.card.Profiles[pl.Profile].Mask(pl.Start)
	g.count[pl.Profile]++
	g.n++
	return nil
}

// Remove deletes an instance placed earlier. It cannot tell two instances
// apart, so callers must remove only what they placed.
func (g *GPU) Remove(pl Placement) error {
	if pl.Profile < 0 || pl.Profile >= len(g.card.Profiles) {
		return fmt.Errorf("card %s: profile %d: %w", g.card.Name, pl.Profile, ErrNoProfile)
	}
	m := g.card.Profiles[pl.Profile].Mask(pl.Start)
	if g.used&m != m || g.count[pl.Profile] == 0 {
		return fmt.Errorf("card %s: %s at slot %d: %w", g.card.Name, g.card.Profiles[pl.Profile].Name, pl.Start, ErrNotPlaced)
	}
	g.used &^= m
	g.count[pl.Profile]--
	g.n--
	return nil
}
