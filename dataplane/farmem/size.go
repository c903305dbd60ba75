package farmem

import (
	"fmt"
	"strconv"
	"strings"
)

// Size is a byte count that reads "8GiB", "512MiB", "64KiB" or a plain
// number of bytes.
type Size uint64

// UnmarshalJSON implements json.Unmarshaler (YAML goes through JSON).
func (s *Size) UnmarshalJSON(b []byte) error {
	v, err := ParseSize(strings.Trim(string(b), `"`))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// MarshalJSON implements json.Marshaler.
func (s Size) MarshalJSON() ([]byte, error) { return []byte(strconv.Quote(s.String())), nil }

// String formats s with the largest binary unit that divides it.
func (s Size) String() string {
	for _, u := range sizeUnits {
		if s >= u.n && s%u.n == 0 {
			return strconv.FormatUint(uint64(s/u.n), 10) + u.name
		}
	}
	return strconv.FormatUint(uint64(s), 10)
}

var sizeUnits = []struct {
	name string
	n    Size
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}

// ParseSize reads a Size.
func ParseSize(v string) (Size, error) {
	num, mult := v, Size(1)
	for _, u := range sizeUnits {
		if n, ok := strings.CutSuffix(v, u.name); ok {
			num, mult = n, u.n
			break
		}
	}
	n, err := strconv.ParseUint(strings.TrimSpace(num), 10, 64)
	if err != nil || Size(n) > ^Size(0)/mult {
		return 0, fmt.Errorf("size %q: want a number of bytes, or one with KiB, MiB, GiB or TiB", v)
	}
	return Size(n) * mult, nil
}
