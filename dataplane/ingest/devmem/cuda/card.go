package cuda

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
)

// CardName returns the mig package's card name (e.g. "H100-80GB") of a
// GPU called name with memBytes of memory, or "" when it is none of
// mig.Cards(). The family is a word of the name (A100, H100, H200: a
// GH200 is not an H200); the size is the name's "<n>GB" word when it has
// one ("NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3"), else memBytes
// rounded to the nearest card size within 5 % ("NVIDIA H100 PCIe" has 80
// GB; an H100 NVL's 94 GB has other MIG profiles and maps to none). A MIG
// device's name ("... MIG 1g.10gb") is judged by its parent's words.
func CardName(name string, memBytes uint64) string {
	words := strings.FieldsFunc(strings.ToUpper(name), func(r rune) bool { return r == ' ' || r == '-' || r == '_' })
	family, gb := "", 0
	for i, w := range words {
		if w == "MIG" {
			words = words[:i]
			break
		}
	}
	for _, w := range words {
		switch w {
		case "A100", "H100", "H200":
			family = w
		}
		if n, ok := strings.CutSuffix(w, "GB"); ok {
			if v, err := strconv.Atoi(n); err == nil {
				gb = v
			}
		}
	}
	if family == "" {
		return ""
	}
	cards := mig.Cards()
	if gb == 0 {
		gib := float64(memBytes) / (1 << 30)
		for _, c := range cards {
			if strings.HasPrefix(c.Name, family+"-") && gib > 0.95*float64(c.MemGB) && gib < 1.05*float64(c.MemGB) {
				return c.Name
			}
		}
		return ""
	}
	want := fmt.Sprintf("%s-%dGB", family, gb)
	if _, err := mig.CardByName(want); err != nil {
		return ""
	}
	return want
}

// profileNames maps the NVML profile IDs of card's profiles to their names
// (empty for a card that is not one of mig.Cards()).
func profileNames(card string) map[int]string {
	names := map[int]string{}
	if c, err := mig.CardByName(card); err == nil {
		for _, p := range c.Profiles {
			names[p.ID] = p.Name
		}
	}
	return names
}
