package apps

import (
	"container/heap"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// Graph is a directed, weighted graph in compressed sparse rows.
type Graph struct {
	N      uint32
	Off    []uint32 // out-edges of v: Dst[Off[v]:Off[v+1]]
	Dst    []uint32
	Weight []uint32
}

// RMAT generates a directed R-MAT graph of 2^scale vertices and
// edgeFactor × 2^scale edges (probabilities a, b, c = 0.57, 0.19, 0.19, as
// in Graph500), weights 1..maxWeight, from seed.
func RMAT(scale, edgeFactor int, maxWeight uint32, seed uint64) *Graph {
	n := uint32(1) << scale
	m := int(n) * edgeFactor
	rng := rand.New(rand.NewPCG(seed, 0x5353_5350))
	src := make([]uint32, m)
	dst := make([]uint32, m)
	w := make([]uint32, m)
	for e := range m {
		var u, v uint32
		for bit := range scale {
			x := rng.Float64()
			switch {
			case x < 0.57:
			case x < 0.76:
				v |= 1 << bit
			case x < 0.95:
				u |= 1 << bit
			default:
				u |= 1 << bit
				v |= 1 << bit
			}
		}
		src[e], dst[e], w[e] = u, v, 1+rng.Uint32N(maxWeight)
	}
	g := &Graph{N: n, Off: make([]uint32, n+1), Dst: make([]uint32, m), Weight: make([]uint32, m)}
	for _, u := range src {
		g.Off[u+1]++
	}
	for v := range n {
		g.Off[v+1] += g.Off[v]
	}
	pos := append([]uint32(nil), g.Off[:n]...)
	for e, u := range src {
		g.Dst[pos[u]], g.Weight[pos[u]] = dst[e], w[e]
		pos[u]++
	}
	return g
}

// Unreachable is the distance of a vertex the source does not reach.
const Unreachable = math.MaxUint64

// Dijkstra returns the distances from source, computed locally.
func (g *Graph) Dijkstra(source uint32) []uint64 {
	d := make([]uint64, g.N)
	for i := range d {
		d[i] = Unreachable
	}
	d[source] = 0
	q := &pq{{source, 0}}
	for q.Len() > 0 {
		it := heap.Pop(q).(pqItem)
		if it.d > d[it.v] {
			continue
		}
		for e := g.Off[it.v]; e < g.Off[it.v+1]; e++ {
			u, nd := g.Dst[e], it.d+uint64(g.Weight[e])
			if nd < d[u] {
				d[u] = nd
				heap.Push(q, pqItem{u, nd})
			}
		}
	}
	return d
}

type pqItem struct {
	v uint32
	d uint64
}
type pq []pqItem

func (q pq) Len() int           { return len(q) }
func (q pq) Less(i, j int) bool { return q[i].d < q[j].d }
func (q pq) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *pq) Push(x any)        { *q = append(*q, x.(pqItem)) }
func (q *pq) Pop() any {
	old := *q
	it := old[len(old)-1]
	*q = old[:len(old)-1]
	return it
}

// SSSP computes single-source shortest paths over the ranks, vertex v
// belonging to rank v % ranks, by synchronous Bellman-Ford rounds of
// relaxation messages.
//
// In round i every rank sends, for each of its vertices whose distance
// dropped in round i-1 (round 0: the source), one relaxation per out-edge
// (the smallest per target vertex), tagged with i. Then it sends every rank
// an end-of-round message carrying how many relaxations of round i it sent
// to that rank and how many it sent in all. A rank has all of round i once
// it holds an end-of-round message of round i from every rank and as many
// round-i relaxations as they announce; it then applies them (minimum per
// vertex) and starts round i+1. A rank can be at most one round ahead of
// another, and messages of a later round are kept apart by their tag.
//
// Termination: every rank sees the same end-of-round messages, so every
// rank computes the same global count of relaxations of round i. If it is
// zero, no distance dropped in round i-1 anywhere, so none can drop again:
// the distances are the fixpoint of Bellman-Ford, and every rank stops after
// the same round. A graph of n vertices needs at most n rounds.
type SSSP struct {
	g      *Graph
	source uint32
	ranks  uint32
	state  []ssspRank
}

type ssspRound struct {
	relax  map[uint32]uint64 // best distance received per vertex
	recv   uint64
	expect uint64
	ends   uint32
	total  uint64 // relaxations sent in the round, by every rank
}

type ssspRank struct {
	mu     sync.Mutex
	rounds map[uint32]*ssspRound
	bad    int
	wake   chan struct{}
	dist   map[uint32]uint64 // owned vertices' distances (rank goroutine only, then Distances)
}

// NewSSSP prepares an SSSP run of g from source over ranks ranks.
func NewSSSP(g *Graph, source uint32, ranks uint32) *SSSP {
	s := &SSSP{g: g, source: source, ranks: ranks, state: make([]ssspRank, ranks)}
	for i := range s.state {
		s.state[i].rounds = map[uint32]*ssspRound{}
		s.state[i].wake = make(chan struct{}, 1)
	}
	return s
}

func (st *ssspRank) round(i uint32) *ssspRound {
	r := st.rounds[i]
	if r == nil {
		r = &ssspRound{relax: map[uint32]uint64{}}
		st.rounds[i] = r
	}
	return r
}

// Handle is the message handler of every client of the cluster.
func (s *SSSP) Handle(rank uint32, p []byte) {
	if rank >= s.ranks {
		return
	}
	st := &s.state[rank]
	st.mu.Lock()
	defer st.mu.Unlock()
	switch {
	case len(p) == 17 && p[0] == tagRelax:
		v, d := binary.LittleEndian.Uint32(p[5:]), binary.LittleEndian.Uint64(p[9:])
		if v >= s.g.N || v%s.ranks != rank {
			st.bad++
			return
		}
		r := st.round(binary.LittleEndian.Uint32(p[1:]))
		if old, ok := r.relax[v]; !ok || d < old {
			r.relax[v] = d
		}
		r.recv++
	case len(p) == 25 && p[0] == tagRound:
		r := st.round(binary.LittleEndian.Uint32(p[1:]))
		r.ends++
		r.expect += binary.LittleEndian.Uint64(p[9:])
		r.total += binary.LittleEndian.Uint64(p[17:])
	default:
		st.bad++
		return
	}
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// wait returns round i of rank once it is complete.
func (s *SSSP) wait(ctx context.Context, rank, i uint32) (*ssspRound, error) {
	st := &s.state[rank]
	for {
		st.mu.Lock()
		r := st.round(i)
		if r.ends == s.ranks && r.recv == r.expect {
			delete(st.rounds, i)
			st.mu.Unlock()
			return r, nil
		}
		ends, recv, expect := r.ends, r.recv, r.expect
		st.mu.Unlock()
		select {
		case <-st.wake:
		case <-ctx.Done():
			return nil, fmt.Errorf("rank %d round %d: %d of %d end messages, %d of %d relaxations: %w",
				rank, i, ends, s.ranks, recv, expect, ctx.Err())
		}
	}
}

// rank is the work of one rank.
func (s *SSSP) rank(ctx context.Context, cl *Cluster, me uint32, sent *uint64) (int, error) {
	c := cl.ClientOf(me)
	dist := map[uint32]uint64{}
	var changed []uint32
	if s.source%s.ranks == me {
		dist[s.source] = 0
		changed = append(changed, s.source)
	}
	counts := make([]uint64, s.ranks)
	var msg [25]byte
	for i := uint32(0); ; i++ {
		// Send round i's relaxations: the best per target vertex.
		best := map[uint32]uint64{}
		for _, v := range changed {
			dv := dist[v]
			for e := s.g.Off[v]; e < s.g.Off[v+1]; e++ {
				u, d := s.g.Dst[e], dv+uint64(s.g.Weight[e])
				if old, ok := best[u]; !ok || d < old {
					best[u] = d
				}
			}
		}
		clear(counts)
		msg[0] = tagRelax
		binary.LittleEndian.PutUint32(msg[1:], i)
		for u, d := range best {
			binary.LittleEndian.PutUint32(msg[5:], u)
			binary.LittleEndian.PutUint64(msg[9:], d)
			dst := u % s.ranks
			if err := c.SendContext(ctx, dst, msg[:17]); err != nil {
				return 0, err
			}
			counts[dst]++
		}
		*sent += uint64(len(best))
		msg[0] = tagRound
		binary.LittleEndian.PutUint32(msg[5:], me)
		binary.LittleEndian.PutUint64(msg[17:], uint64(len(best)))
		for dst := range s.ranks {
			binary.LittleEndian.PutUint64(msg[9:], counts[dst])
			if err := c.SendContext(ctx, dst, msg[:25]); err != nil {
				return 0, err
			}
		}
		// Complete round i.
		r, err := s.wait(ctx, me, i)
		if err != nil {
			return 0, err
		}
		if r.total == 0 {
			s.state[me].mu.Lock()
			s.state[me].dist = dist
			s.state[me].mu.Unlock()
			return int(i) + 1, nil
		}
		if i > s.g.N+1 {
			return 0, fmt.Errorf("rank %d: no fixpoint after %d rounds", me, i)
		}
		changed = changed[:0]
		for v, d := range r.relax {
			if old, ok := dist[v]; !ok || d < old {
				dist[v] = d
				changed = append(changed, v)
			}
		}
	}
}

// Run runs every rank on a goroutine of its own, through its own client,
// and checks the distances against Dijkstra (Verify).
func (s *SSSP) Run(ctx context.Context, cl *Cluster) (Result, error) {
	if cl.Ranks() != s.ranks {
		return Result{}, fmt.Errorf("sssp: cluster has %d ranks, want %d", cl.Ranks(), s.ranks)
	}
	start := time.Now()
	type out struct {
		rounds int
		sent   uint64
		err    error
	}
	outs := make(chan out, s.ranks)
	for me := range s.ranks {
		go func() {
			var o out
			o.rounds, o.err = s.rank(ctx, cl, me, &o.sent)
			outs <- o
		}()
	}
	var res Result
	var firstErr error
	for range s.ranks {
		o := <-outs
		if o.err != nil && firstErr == nil {
			firstErr = o.err
		}
		res.Messages += o.sent
		if res.Rounds != 0 && o.rounds != res.Rounds && o.err == nil {
			firstErr = fmt.Errorf("ranks stopped after %d and %d rounds", res.Rounds, o.rounds)
		}
		if o.err == nil {
			res.Rounds = o.rounds
		}
	}
	res.Elapsed = time.Since(start)
	res.Bytes = res.Messages * 17
	if firstErr != nil {
		return res, fmt.Errorf("sssp: %w", firstErr)
	}
	return res, s.Verify()
}

// Distances returns the distances the ranks computed.
func (s *SSSP) Distances() []uint64 {
	d := make([]uint64, s.g.N)
	for i := range d {
		d[i] = Unreachable
	}
	for r := range s.state {
		st := &s.state[r]
		st.mu.Lock()
		for v, dv := range st.dist {
			d[v] = dv
		}
		st.mu.Unlock()
	}
	return d
}

// Verify compares the distances with a local Dijkstra.
func (s *SSSP) Verify() error {
	want := s.g.Dijkstra(s.source)
	got := s.Distances()
	wrong, reach := 0, 0
	first := ""
	for v := range want {
		if want[v] != Unreachable {
			reach++
		}
		if got[v] != want[v] {
			wrong++
			if first == "" {
				first = fmt.Sprintf("vertex %d: %d, want %d", v, got[v], want[v])
			}
		}
	}
	for r := range s.state {
		s.state[r].mu.Lock()
		bad := s.state[r].bad
		s.state[r].mu.Unlock()
		if bad > 0 {
			return fmt.Errorf("sssp: rank %d received %d bad messages", r, bad)
		}
	}
	if wrong > 0 {
		return fmt.Errorf("sssp: %d of %d distances wrong (%d reachable); %s", wrong, len(want), reach, first)
	}
	return nil
}
