package messaging

// rankTable maps a rank to a next-hop index, or -1. It is built once at
// start from the cluster config and only read afterwards, so workers share
// it without locks. A dense slice serves compact rank spaces (the usual
// 0..N-1), a map the rest.
type rankTable struct {
	dense  []int32
	sparse map[uint32]int32
}

// maxDense bounds the dense table: 4 Mi entries, 16 MiB.
const maxDense = 1 << 22

// newRankTable builds the table from cfg, giving each client's ranks the hop
// hop(node, client) returns.
func newRankTable(cfg Config, hop func(node, client int) int32) *rankTable {
	var maxRank uint32
	var total uint64
	for _, n := range cfg.Nodes {
		for _, c := range n.Clients {
			for _, r := range c.Ranks {
				maxRank = max(maxRank, r.Hi)
				total += uint64(r.Hi-r.Lo) + 1
			}
		}
	}
	t := &rankTable{}
	dense := total > 0 && uint64(maxRank) < maxDense && uint64(maxRank) < 4*total+4096
	if dense {
		t.dense = make([]int32, maxRank+1)
		for i := range t.dense {
			t.dense[i] = -1
		}
	} else {
		t.sparse = make(map[uint32]int32, total)
	}
	for ni, n := range cfg.Nodes {
		for ci, c := range n.Clients {
			h := hop(ni, ci)
			for _, r := range c.Ranks {
				for v := uint64(r.Lo); v <= uint64(r.Hi); v++ {
					if dense {
						t.dense[v] = h
					} else {
						t.sparse[uint32(v)] = h
					}
				}
			}
		}
	}
	return t
}

// lookup returns rank's next hop, or -1 for a rank the cluster lacks.
func (t *rankTable) lookup(rank uint32) int32 {
	if t.dense != nil {
		if uint64(rank) < uint64(len(t.dense)) {
			return t.dense[rank]
		}
		return -1
	}
	if h, ok := t.sparse[rank]; ok {
		return h
	}
	return -1
}
