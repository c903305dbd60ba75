package mig

import (
	"bufio"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// smiProfiles parses what `nvidia-smi mig -lgip` and `nvidia-smi mig
// -lgipp` print into profiles (no MemGB: nvidia-smi prints GiB).
func smiProfiles(t *testing.T, lgip, lgipp string) []Profile {
	t.Helper()
	// "|   0  MIG 1g.10gb         19     7/7        9.75       No     16     1     0   |"
	row := regexp.MustCompile(`^\|\s+\d+\s+MIG (\S+)\s+(\d+)\s+\d+/(\d+)\s+[\d.]+\s+\w+\s+(\d+)\s`)
	// "GPU  0 Profile ID 15 Placements: {0,2,4,6}:2"
	place := regexp.MustCompile(`^GPU\s+\d+ Profile ID\s+(\d+) Placements?\s*: \{([\d,]+)\}:(\d+)$`)
	atoi := func(s string) int {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	var ps []Profile
	read := func(name string, re *regexp.Regexp, f func([]string)) {
		file, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		defer file.Close()
		s := bufio.NewScanner(file)
		for s.Scan() {
			if m := re.FindStringSubmatch(strings.TrimSpace(s.Text())); m != nil {
				f(m)
			}
		}
	}
	read(lgip, row, func(m []string) {
		compute := atoi(strings.SplitN(m[1], "g.", 2)[0])
		ps = append(ps, Profile{Name: m[1], ID: atoi(m[2]), Compute: compute, Max: atoi(m[3]), SMs: atoi(m[4])})
	})
	read(lgipp, place, func(m []string) {
		i := slices.IndexFunc(ps, func(p Profile) bool { return p.ID == atoi(m[1]) })
		if i < 0 {
			t.Fatalf("%s: placements of profile %s, which -lgip does not list", lgipp, m[1])
		}
		for _, s := range strings.Split(m[2], ",") {
			ps[i].Starts = append(ps[i].Starts, atoi(s))
		}
		ps[i].MemSlices = atoi(m[3])
	})
	if len(ps) == 0 {
		t.Fatalf("no profiles parsed from %s", lgip)
	}
	return ps
}

// TestCardMatchesH100 checks the H100-80GB table against what nvidia-smi
// printed on the H100 that the device tool lent on 2026-11-25 (driver
// 580.159.04, MIG mode off): every profile's ID, name, compute and memory
// slices, SMs, most instances and start slots. The GPU tests check the
// same through NVML (cuda's TestGPUMIGProfiles) where a GPU is.
func TestCardMatchesH100(t *testing.T) {
	live := smiProfiles(t, "testdata/h100-80gb-lgip.txt", "testdata/h100-80gb-lgipp.txt")
	c, err := CardByName("H100-80GB")
	if err != nil {
		t.Fatal(err)
	}
	if d := c.Compare(live); d != nil {
		t.Errorf("the table differs from the H100's nvidia-smi:\n%s", strings.Join(d, "\n"))
	}
	for _, p := range live {
		if i, err := c.Profile(p.Name); err != nil || c.Profiles[i].ID != p.ID {
			t.Errorf("nvidia-smi's %s is profile %d; the table: %v, %v", p.Name, p.ID, i, err)
		}
	}
}

func TestCompare(t *testing.T) {
	card := func() Card { c, _ := CardByName("A100-40GB"); return c }
	tests := []struct {
		name  string
		tweak func(live []Profile) []Profile
		want  []string
	}{
		{"same", func(l []Profile) []Profile { return l }, nil},
		{"starts", func(l []Profile) []Profile { l[4].Starts = []int{0, 2, 4}; return l },
			[]string{"3g.20gb (profile 9): start slots [0 4] in the table, [0 2 4] on the GPU"}},
		{"missing", func(l []Profile) []Profile { return l[1:] },
			[]string{"1g.5gb (profile 19): in the table, not on the GPU"}},
		{"extra", func(l []Profile) []Profile {
			return append(l, Profile{ID: 21, Compute: 1, MemSlices: 1})
		}, []string{"profile 21 (1 compute, 1 memory slices): on the GPU, not in the table"}},
		{"sms and max", func(l []Profile) []Profile { l[0].SMs, l[0].Max = 16, 6; return l }, []string{
			"1g.5gb (profile 19): SMs 14 in the table, 16 on the GPU",
			"1g.5gb (profile 19): most instances 7 in the table, 6 on the GPU",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := card()
			live := card().Profiles
			for i := range live {
				live[i].Name, live[i].MemGB = "", 0 // as NVML gives them: not compared
			}
			if got := c.Compare(tt.tweak(live)); !slices.Equal(got, tt.want) {
				t.Errorf("Compare:\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}
