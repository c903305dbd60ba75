package mig

import (
	"fmt"
	"strings"
)

// Slices of every MIG card.
const (
	ComputeSlices = 7
	MemorySlices  = 8
)

// Profile is one GPU instance profile of a card.
type Profile struct {
	Name      string // as nvidia-smi prints it, e.g. "1g.10gb"
	ID        int    // NVML GPU instance profile ID
	Compute   int    // compute slices (the "g" of the name)
	MemSlices int    // memory slices the instance covers
	MemGB     int    // memory in GB, as in the name
	SMs       int    // streaming multiprocessors
	Starts    []int  // memory slices an instance may begin at
	Max       int    // most instances of this profile on one GPU
}

// Mask returns the memory slices an instance of p starting at slot covers.
func (p Profile) Mask(start int) uint8 {
	return uint8(((1 << p.MemSlices) - 1) << start)
}

// StartMask returns the profile's start slots as a bit mask.
func (p Profile) StartMask() uint8 {
	var m uint8
	for _, s := range p.Starts {
		m |= 1 << s
	}
	return m
}

// Card is one MIG-capable GPU model.
type Card struct {
	Name     string
	MemGB    int
	Profiles []Profile
}

// Profile returns the index of the profile named name ("3g.40gb" or "MIG 3g.40gb").
func (c *Card) Profile(name string) (int, error) {
	name = strings.TrimPrefix(strings.TrimSpace(name), "MIG ")
	for i, p := range c.Profiles {
		if p.Name == name {
			return i, nil
		}
	}
	names := make([]string, len(c.Profiles))
	for i, p := range c.Profiles {
		names[i] = p.Name
	}
	return -1, fmt.Errorf("card %s: no profile %q: want one of %s", c.Name, name, strings.Join(names, ", "))
}

// slotsAll, slotsEven … are the start slots of NVIDIA's placement tables.
var (
	startsEvery = []int{0, 1, 2, 3, 4, 5, 6}
	startsEven  = []int{0, 2, 4, 6}
	starts2g    = []int{0, 2, 4}
	starts3g    = []int{0, 4}
	startsZero  = []int{0}
)

// profiles builds a card's seven profiles from its names, memory sizes and SM
// counts; the slot structure is the same on A100, H100 and H200.
func profiles(names [7]string, mem [7]int, sms [7]int) []Profile {
	// 1g, 1g+me, 1g (two memory slices), 2g, 3g, 4g, 7g.
	ids := [7]int{19, 20, 15, 14, 9, 5, 0}
	compute := [7]int{1, 1, 1, 2, 3, 4, 7}
	memSlices := [7]int{1, 1, 2, 2, 4, 4, 8}
	starts := [7][]int{startsEvery, startsEvery, startsEven, starts2g, starts3g, startsZero, startsZero}
	max := [7]int{7, 1, 4, 3, 2, 1, 1}
	ps := make([]Profile, 7)
	for i := range ps {
		ps[i] = Profile{Name: names[i], ID: ids[i], Compute: compute[i], MemSlices: memSlices[i],
			MemGB: mem[i], SMs: sms[i], Starts: append([]int(nil), starts[i]...), Max: max[i]}
	}
	return ps
}

// Cards returns the supported cards, freshly built (callers may modify them).
func Cards() []Card {
	a100SMs := [7]int{14, 14, 14, 28, 42, 56, 98}
	hopperSMs := [7]int{16, 16, 26, 32, 60, 64, 132}
	return []Card{
		{Name: "A100-40GB", MemGB: 40, Profiles: profiles(
			[7]string{"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"},
			[7]int{5, 5, 10, 10, 20, 20, 40}, a100SMs)},
		{Name: "A100-80GB", MemGB: 80, Profiles: profiles(
			[7]string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
			[7]int{10, 10, 20, 20, 40, 40, 80}, a100SMs)},
		{Name: "H100-80GB", MemGB: 80, Profiles: profiles(
			[7]string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
			[7]int{10, 10, 20, 20, 40, 40, 80}, hopperSMs)},
		{Name: "H200-141GB", MemGB: 141, Profiles: profiles(
			[7]string{"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"},
			[7]int{18, 18, 35, 35, 71, 71, 141}, hopperSMs)},
	}
}

// CardByName returns the card called name (case-insensitive).
func CardByName(name string) (Card, error) {
	cards := Cards()
	names := make([]string, len(cards))
	for i, c := range cards {
		if strings.EqualFold(c.Name, name) {
			return c, nil
		}
		names[i] = c.Name
	}
	return Card{}, fmt.Errorf("unknown card %q: want one of %s", name, strings.Join(names, ", "))
}

// Compare checks the card's table against live, the profiles a GPU of this
// card reports (cuda.Device.MIGProfiles reads them from NVML), matched by
// NVML profile ID, and returns one line per difference: a profile missing
// on either side, or one whose compute slices, memory slices, SMs, most
// instances or start slots differ. Names and memory sizes are not
// compared (NVML's profile info has neither as the table writes them).
// Nil means the scheduler's placements are the GPU's.
func (c *Card) Compare(live []Profile) []string {
	var diffs []string
	byID := map[int]Profile{}
	for _, p := range live {
		byID[p.ID] = p
	}
	for _, want := range c.Profiles {
		got, ok := byID[want.ID]
		if !ok {
			diffs = append(diffs, fmt.Sprintf("%s (profile %d): in the table, not on the GPU", want.Name, want.ID))
			continue
		}
		delete(byID, want.ID)
		for _, f := range []struct {
			what      string
			want, got any
		}{
			{"compute slices", want.Compute, got.Compute},
			{"memory slices", want.MemSlices, got.MemSlices},
			{"SMs", want.SMs, got.SMs},
			{"most instances", want.Max, got.Max},
			{"start slots", fmt.Sprint(want.Starts), fmt.Sprint(got.Starts)},
		} {
			if f.want != f.got {
				diffs = append(diffs, fmt.Sprintf("%s (profile %d): %s %v in the table, %v on the GPU", want.Name, want.ID, f.what, f.want, f.got))
			}
		}
	}
	for _, p := range live {
		if _, ok := byID[p.ID]; ok {
			diffs = append(diffs, fmt.Sprintf("profile %d (%d compute, %d memory slices): on the GPU, not in the table", p.ID, p.Compute, p.MemSlices))
		}
	}
	return diffs
}
