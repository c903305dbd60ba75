// Package graph owns Lovelock's graph workloads over far memory, SODA's test
// and benchmark: a Ligra-like engine (EdgeMap with sparse push and dense pull
// steps chosen by frontier weight, VertexMap) over a CSR graph, the five apps
// of SODA's evaluation (BFS, PageRank, Connected Components, Radii,
// Betweenness Centrality), the binary CSR file format and its builders
// (R-MAT/Graph500 generator, SNAP edge lists), and the check that compares a
// run with the same app on another copy of the graph.
//
// The engine reads offsets and neighbours as little-endian integers from a
// []byte: the file image in memory, or the bytes of a far-memory mapping
// (dataplane/farmem/fmap), where each first touch of a chunk faults it in
// from the memory node. The file holds no pointers, so a region maps at any
// address. Vertex state (depths, labels, scores) lives in local memory.
// docs/graph.md describes the format, the apps and the measurements.
package graph
