package graph

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestOpenRefusesTrailingBytes: a CSR file must be exactly as long as its
// header says. Before, Open checked only that it was not shorter, so a file
// with bytes after its arrays (two files run together, a copy that grew)
// opened as if nothing were wrong.
func TestOpenRefusesTrailingBytes(t *testing.T) {
	n, edges, _ := RMAT(5, 4, 7)
	for _, sym := range []bool{true, false} {
		_, b := build(t, n, edges, sym)
		for _, tc := range []struct {
			name string
			img  []byte
			want string
		}{
			{"one byte more", append(slices.Clone(b), 0), "1 more than"},
			{"eight zero bytes more", append(slices.Clone(b), make([]byte, 8)...), "8 more than"},
			{"the file twice", append(slices.Clone(b), b...), "trailing bytes"},
			{"one byte less", b[:len(b)-1], "truncated"},
		} {
			_, err := Open(tc.img)
			if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "graph gen or convert") {
				t.Errorf("symmetric %t, %s: Open: %v; want ErrFormat saying %q and what to run", sym, tc.name, err, tc.want)
			}
		}
		if _, err := Open(b); err != nil {
			t.Errorf("symmetric %t, the file as written: %v", sym, err)
		}
	}
}
