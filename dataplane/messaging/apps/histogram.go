package apps

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// Message tags, the first payload byte of every application message.
const (
	tagInsert = 'I' // histogram: key u64
	tagDone   = 'D' // histogram: sender rank u32, inserts sent to the receiver u64
	tagRelax  = 'R' // sssp: round u32, vertex u32, distance u64
	tagRound  = 'E' // sssp: round u32, sender u32, relaxations sent to the receiver u64, sent in all u64
)

// HistogramParams configure a Histogram run.
type HistogramParams struct {
	// InsertsPerRank is how many increments every rank sends.
	InsertsPerRank int
	// KeysPerRank is the size of each rank's share of the table; the table
	// has KeysPerRank × ranks keys, key k belonging to rank k % ranks.
	KeysPerRank int
	// Seed makes the keys reproducible: rank r draws its keys from
	// PCG(Seed, r).
	Seed uint64
	// Pad adds bytes to every insert message (9 bytes: tag and key), to
	// measure other message sizes.
	Pad int
}

// Histogram is the Buddy paper's Histogram: every rank sends random
// increments (fire and forget, one message each) to the owners of random
// keys of a table distributed over all ranks.
//
// Termination: once a rank has sent its inserts it sends every rank
// (itself included) a done message carrying how many inserts it sent to
// that rank. A rank has its final table once it holds a done message from
// every rank and has received as many inserts as those messages add up to.
// Messages may be reordered between links, so the counts, not the order of
// arrival, decide.
type Histogram struct {
	p     HistogramParams
	ranks uint32
	state []histRank
}

// histRank is one rank's share of the table. Its fields other than seen
// belong to the delivery goroutine of the client that serves the rank (a
// client calls its handler one message at a time, and a rank has one
// client), so Handle takes no lock: a mutex per insert cost more than the
// increment itself (docs/messaging.md, Where the time goes). Readers of the
// other fields wait for final, whose close publishes them; seen publishes
// progress for the report of a run that did not finish.
type histRank struct {
	counts []uint64
	recv   uint64 // inserts received
	expect uint64 // inserts announced by done messages
	dones  uint32
	bad    int // malformed or misdirected messages
	final  chan struct{}
	closed bool
	seen   histSeen
}

// histSeen is a rank's progress as other goroutines may read it before the
// rank is final: published at every done message and every
// histPublishEvery inserts, not per insert.
type histSeen struct {
	recv, expect atomic.Uint64
	dones        atomic.Uint32
}

const histPublishEvery = 4096

func (s *histRank) publish() {
	s.seen.recv.Store(s.recv)
	s.seen.expect.Store(s.expect)
	s.seen.dones.Store(s.dones)
}

// NewHistogram prepares a Histogram over ranks ranks. Its Handle is the
// clients' message handler.
func NewHistogram(ranks uint32, p HistogramParams) *Histogram {
	h := &Histogram{p: p, ranks: ranks, state: make([]histRank, ranks)}
	for i := range h.state {
		h.state[i].counts = make([]uint64, p.KeysPerRank)
		h.state[i].final = make(chan struct{})
	}
	return h
}

// keys returns the generator of rank r's keys.
func (h *Histogram) keys(r uint32) func() uint64 {
	rng := rand.New(rand.NewPCG(h.p.Seed, uint64(r)))
	n := uint64(h.p.KeysPerRank) * uint64(h.ranks)
	return func() uint64 { return rng.Uint64N(n) }
}

// Handle is the message handler of every client of the cluster.
func (h *Histogram) Handle(rank uint32, p []byte) {
	if rank >= h.ranks {
		return
	}
	s := &h.state[rank]
	switch {
	case len(p) >= 9 && p[0] == tagInsert:
		k := binary.LittleEndian.Uint64(p[1:])
		if k%uint64(h.ranks) != uint64(rank) || k/uint64(h.ranks) >= uint64(len(s.counts)) {
			s.bad++
			return
		}
		s.counts[k/uint64(h.ranks)]++
		s.recv++
		if s.recv%histPublishEvery == 0 {
			s.publish()
		}
	case len(p) == 13 && p[0] == tagDone:
		s.dones++
		s.expect += binary.LittleEndian.Uint64(p[5:])
		s.publish()
	default:
		s.bad++
		return
	}
	if !s.closed && s.dones == h.ranks && s.recv == s.expect {
		s.closed = true
		s.publish()
		close(s.final)
	}
}

// Result is the outcome of an application run.
type Result struct {
	// Messages is the number of application messages sent (without the
	// termination protocol's), Bytes their payload bytes.
	Messages, Bytes uint64
	// Elapsed is from the first send until every rank knew its result.
	Elapsed time.Duration
	// Rounds is SSSP's number of rounds.
	Rounds int
}

// Rate is messages per second.
func (r Result) Rate() float64 { return float64(r.Messages) / r.Elapsed.Seconds() }

// Run sends every rank's inserts from one goroutine per rank, through the
// rank's own client, waits for the termination protocol and checks the
// table (Verify). It returns an error if ctx ends first or the table is
// wrong.
func (h *Histogram) Run(ctx context.Context, cl *Cluster) (Result, error) {
	if cl.Ranks() != h.ranks {
		return Result{}, fmt.Errorf("histogram: cluster has %d ranks, want %d", cl.Ranks(), h.ranks)
	}
	start := time.Now()
	errs := make(chan error, h.ranks)
	msg := 9 + h.p.Pad
	for r := range h.ranks {
		go func() {
			c := cl.ClientOf(r)
			next := h.keys(r)
			sent := make([]uint64, h.ranks)
			buf := make([]byte, msg)
			buf[0] = tagInsert
			for range h.p.InsertsPerRank {
				k := next()
				dst := uint32(k % uint64(h.ranks))
				binary.LittleEndian.PutUint64(buf[1:], k)
				if err := c.SendContext(ctx, dst, buf); err != nil {
					errs <- fmt.Errorf("rank %d: %w", r, err)
					return
				}
				sent[dst]++
			}
			var done [13]byte
			done[0] = tagDone
			binary.LittleEndian.PutUint32(done[1:], r)
			for dst := range h.ranks {
				binary.LittleEndian.PutUint64(done[5:], sent[dst])
				if err := c.SendContext(ctx, dst, done[:]); err != nil {
					errs <- fmt.Errorf("rank %d: %w", r, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range h.ranks {
		if err := <-errs; err != nil {
			return Result{}, fmt.Errorf("histogram: %w", err)
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return Result{}, fmt.Errorf("histogram: flush: %w", err)
	}
	for r := range h.state {
		select {
		case <-h.state[r].final:
		case <-ctx.Done():
			s := &h.state[r].seen
			return Result{}, fmt.Errorf("histogram: rank %d not final (%d of %d done messages, at least %d of %d inserts): %w",
				r, s.dones.Load(), h.ranks, s.recv.Load(), s.expect.Load(), ctx.Err())
		}
	}
	n := uint64(h.p.InsertsPerRank) * uint64(h.ranks)
	res := Result{Messages: n, Bytes: n * uint64(msg), Elapsed: time.Since(start)}
	return res, h.Verify()
}

// Verify checks the distributed table: the totals must add up to every
// insert sent, and every key's count must equal a local recomputation from
// the same seeds. It reads the table without locks, so call it once every
// rank is final (Run does).
func (h *Histogram) Verify() error {
	want := make([]uint64, uint64(h.p.KeysPerRank)*uint64(h.ranks))
	for r := range h.ranks {
		next := h.keys(r)
		for range h.p.InsertsPerRank {
			want[next()]++
		}
	}
	var total uint64
	var wrong int
	var first string
	for r := range h.state {
		s := &h.state[r]
		if s.bad > 0 && first == "" {
			first = fmt.Sprintf("rank %d received %d bad messages", r, s.bad)
		}
		for i, c := range s.counts {
			total += c
			k := uint64(i)*uint64(h.ranks) + uint64(r)
			if c != want[k] {
				wrong++
				if first == "" {
					first = fmt.Sprintf("key %d: count %d, want %d", k, c, want[k])
				}
			}
		}
	}
	if n := uint64(h.p.InsertsPerRank) * uint64(h.ranks); total != n || wrong > 0 || first != "" {
		return fmt.Errorf("histogram: total %d of %d inserts, %d keys wrong (%s)", total, n, wrong, first)
	}
	return nil
}
