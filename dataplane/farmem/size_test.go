package farmem

import "testing"

func TestSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Size
		out  string
	}{
		{"0", 0, "0"}, {"4096", 4096, "4KiB"}, {"64KiB", 64 << 10, "64KiB"}, {"256MiB", 256 << 20, "256MiB"},
		{"8GiB", 8 << 30, "8GiB"}, {"2TiB", 2 << 40, "2TiB"}, {"1000", 1000, "1000"}, {"1536MiB", 1536 << 20, "1536MiB"},
	} {
		got, err := ParseSize(c.in)
		if err != nil || got != c.want || got.String() != c.out {
			t.Errorf("%q: %d (%s), %v; want %d (%s)", c.in, got, got, err, c.want, c.out)
		}
	}
	for _, bad := range []string{"", "x", "1.5GiB", "-1", "GiB", "99999999999TiB"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
