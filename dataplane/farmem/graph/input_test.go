package graph

import (
	"strings"
	"testing"
)

// TestRMATRefusesTooManyEdges: an R-MAT graph has edgeFactor × 2^scale
// edges, and a file holds at most MaxEdges. Before, the product was
// taken in uint64 unchecked: edge factor 2^62 at scale 1 asked for a
// slice of 2^63 edges and panicked, and 2^62+1 at scale 2 wrapped to 4
// edges and returned a graph of 4 edges without an error.
func TestRMATRefusesTooManyEdges(t *testing.T) {
	for _, tc := range []struct{ scale, factor int }{
		{1, 1 << 62},
		{2, 1<<62 + 1},
		{31, 1 << 10},
		{20, 1<<20 + 1},
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("RMAT(%d, %d): panicked: %v", tc.scale, tc.factor, r)
				}
			}()
			n, edges, err := RMAT(tc.scale, tc.factor, 1)
			if err == nil || !strings.Contains(err.Error(), "edges") {
				t.Errorf("RMAT(%d, %d): %d vertices, %d edges, %v; want an error about the edge count", tc.scale, tc.factor, n, len(edges), err)
			}
		}()
	}
}

// TestReadEdgeListNamesTheLine: every refusal of an edge list names the
// line. Before, a line longer than the reader's 1 MiB buffer failed with
// bufio's "token too long" alone, with no line to look at.
func TestReadEdgeListNamesTheLine(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"0 1\n1\n", "line 2"},
		{"# c\n0 1\n1 -2\n", "line 3"},
		{"0 1\n1 99999999999\n", "line 2"},
		{"0 1\n1 2\n" + strings.Repeat("7", 2<<20) + " 2\n", "line 3"},
		{"0 1\n1 2 " + strings.Repeat("x", 2<<20) + "\n", "line 2"},
	} {
		_, _, err := ReadEdgeList(strings.NewReader(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%.40q…: %v, want an error naming %q", tc.in, err, tc.want)
		}
	}
}
