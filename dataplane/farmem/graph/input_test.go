package graph

import (
	"errors"
	"slices"
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

// TestCheckIDs: an edge list's IDs are kept as vertex numbers only while
// the vertices they span are bounded by its edges (or are few). Before,
// nothing was checked and one ID near 2^32 made Build allocate about 32
// bytes for every vertex up to it, over 100 GiB.
func TestCheckIDs(t *testing.T) {
	for _, tc := range []struct {
		n     uint64
		edges int
		ok    bool
	}{
		{4, 3, true},
		{MinKeptVertices, 1, true},       // few vertices, whatever the edges
		{MinKeptVertices + 1, 1, false},  // more, from one edge
		{1 << 21, 1 << 20, true},         // as many as the edges can name
		{1<<21 + 1, 1 << 20, false},      // more than that
		{MaxVertices, 69_000_000, false}, // LiveJournal's edges, an ID near 2^32
	} {
		err := CheckIDs(tc.n, tc.edges)
		if tc.ok != (err == nil) || err != nil && !errors.Is(err, ErrSparseIDs) {
			t.Errorf("CheckIDs(%d vertices, %d edges): %v; want ok %t", tc.n, tc.edges, err, tc.ok)
		}
	}
}

// TestRenumber: IDs become 0 … k−1 in their order, the map gives each
// vertex's original ID back, and a list whose IDs are already dense is left
// as it was.
func TestRenumber(t *testing.T) {
	n, edges, err := ReadEdgeList(strings.NewReader("7 4294967294\n42 7\n4294967294 42\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckIDs(n, len(edges)); !errors.Is(err, ErrSparseIDs) {
		t.Fatalf("IDs up to 4294967294 from 3 edges: %v, want ErrSparseIDs", err)
	}
	orig := slices.Clone(edges)
	ids := Renumber(edges)
	if !slices.Equal(ids, []uint32{7, 42, 4294967294}) || !slices.Equal(edges, pairs(0, 2, 1, 0, 2, 1)) {
		t.Fatalf("renumbered to %v with map %v", edges, ids)
	}
	for i, e := range edges {
		if ids[e.Src] != orig[i].Src || ids[e.Dst] != orig[i].Dst {
			t.Errorf("edge %d: %v maps back to %d-%d, want %v", i, e, ids[e.Src], ids[e.Dst], orig[i])
		}
	}
	if _, err := Build(uint64(len(ids)), edges, true); err != nil {
		t.Errorf("Build of the renumbered list: %v", err)
	}

	dense := pairs(0, 1, 1, 2, 3, 0)
	if ids := Renumber(slices.Clone(dense)); !slices.Equal(ids, []uint32{0, 1, 2, 3}) {
		t.Errorf("dense IDs: map %v, want the identity", ids)
	}
}
