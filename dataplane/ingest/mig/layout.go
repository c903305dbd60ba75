package mig

import (
	"errors"
	"fmt"
	"slices"
)

// Reasons a placement or layout is refused; errors wrap one of these.
var (
	ErrNoProfile = errors.New("no such profile")
	ErrBadStart  = errors.New("start slot not allowed for the profile")
	ErrOverlap   = errors.New("memory slices already taken")
	ErrTooMany   = errors.New("too many instances of the profile")
	ErrNotPlaced = errors.New("no such instance")
)

// Placement is one GPU instance: a profile (index into Card.Profiles) and the
// memory slice it starts at.
type Placement struct {
	Profile int
	Start   int
}

// Layout is a set of placements on one GPU.
type Layout []Placement

// Check returns nil if the placement may go on a GPU whose occupied memory
// slices are used and which holds count[p] instances of each profile p, and
// otherwise an error saying why not.
func (c *Card) Check(pl Placement, used uint8, count []int) error {
	if pl.Profile < 0 || pl.Profile >= len(c.Profiles) {
		return fmt.Errorf("card %s: profile %d: %w", c.Name, pl.Profile, ErrNoProfile)
	}
	p := c.Profiles[pl.Profile]
	if !slices.Contains(p.Starts, pl.Start) {
		return fmt.Errorf("card %s: %s at slot %d (allowed %v): %w", c.Name, p.Name, pl.Start, p.Starts, ErrBadStart)
	}
	if m := p.Mask(pl.Start); m&used != 0 {
		return fmt.Errorf("card %s: %s at slot %d needs memory slices %s, taken: %s: %w",
			c.Name, p.Name, pl.Start, SliceString(m), SliceString(m&used), ErrOverlap)
	}
	if count != nil && count[pl.Profile] >= p.Max {
		return fmt.Errorf("card %s: %s: at most %d per GPU: %w", c.Name, p.Name, p.Max, ErrTooMany)
	}
	return nil
}

// Validate returns nil if every placement of l fits beside the others.
func (c *Card) Validate(l Layout) error {
	var used uint8
	count := make([]int, len(c.Profiles))
	for _, pl := range l {
		if err := c.Check(pl, used, count); err != nil {
			return err
		}
		used |= c.Profiles[pl.Profile].Mask(pl.Start)
		count[pl.Profile]++
	}
	return nil
}

// Layouts returns every non-empty feasible layout of the card, each sorted by
// start slot. It walks the memory slices left to right: each slice is either
// left free or begins one instance, so every layout is produced exactly once.
func (c *Card) Layouts() []Layout {
	var out []Layout
	count := make([]int, len(c.Profiles))
	var cur Layout
	var walk func(slot int)
	walk = func(slot int) {
		if slot >= MemorySlices {
			if len(cur) > 0 {
				out = append(out, slices.Clone(cur))
			}
			return
		}
		walk(slot + 1)
		for i, p := range c.Profiles {
			if slot+p.MemSlices > MemorySlices || count[i] >= p.Max || !slices.Contains(p.Starts, slot) {
				continue
			}
			cur = append(cur, Placement{Profile: i, Start: slot})
			count[i]++
			walk(slot + p.MemSlices)
			count[i]--
			cur = cur[:len(cur)-1]
		}
	}
	walk(0)
	return out
}

// Maximal reports whether no further instance of any profile fits beside l.
func (c *Card) Maximal(l Layout) bool {
	var used uint8
	count := make([]int, len(c.Profiles))
	for _, pl := range l {
		used |= c.Profiles[pl.Profile].Mask(pl.Start)
		count[pl.Profile]++
	}
	for i, p := range c.Profiles {
		for _, s := range p.Starts {
			if c.Check(Placement{Profile: i, Start: s}, used, count) == nil {
				return false
			}
		}
	}
	return true
}

// Format writes a layout as its slots, e.g. "3g.40gb@0 2g.20gb@4 1g.10gb@6".
func (c *Card) Format(l Layout) string {
	s := ""
	for i, pl := range l {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%s@%d", c.Profiles[pl.Profile].Name, pl.Start)
	}
	return s
}

// SliceString writes a memory-slice mask as a slot list, e.g. "{0,1,4}".
func SliceString(m uint8) string {
	s := "{"
	first := true
	for i := 0; i < MemorySlices; i++ {
		if m&(1<<i) != 0 {
			if !first {
				s += ","
			}
			s += fmt.Sprint(i)
			first = false
		}
	}
	return s + "}"
}
