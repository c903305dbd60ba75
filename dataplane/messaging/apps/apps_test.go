package apps

import (
	"context"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
)

var modes = []messaging.Mode{messaging.ModeNone, messaging.ModeHost, messaging.ModeDPU}

func layout(mode messaging.Mode) Layout {
	return Layout{Mode: mode, Nodes: 3, ClientsPerNode: 2, RanksPerClient: 2, Workers: 2}
}

func TestHistogram(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			l := layout(mode)
			h := NewHistogram(l.Ranks(), HistogramParams{InsertsPerRank: 20000, KeysPerRank: 512, Seed: 42})
			cl, err := StartCluster(l, h.Handle)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := cl.Close(); err != nil {
					t.Error(err)
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := h.Run(ctx, cl)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d inserts over %d ranks in %v (%.0f msg/s)", mode, res.Messages, l.Ranks(), res.Elapsed, res.Rate())
		})
	}
}

// TestHistogramSmallBundles runs bundles capped at 1472 bytes, as on a
// 1500-byte MTU, with padded messages that sometimes straddle bundles.
func TestHistogramSmallBundles(t *testing.T) {
	l := layout(messaging.ModeDPU)
	l.MaxPayload = 1472
	h := NewHistogram(l.Ranks(), HistogramParams{InsertsPerRank: 5000, KeysPerRank: 64, Seed: 7, Pad: 200})
	cl, err := StartCluster(l, h.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := h.Run(ctx, cl); err != nil {
		t.Fatal(err)
	}
}

func TestSSSP(t *testing.T) {
	g := RMAT(12, 8, 100, 3)
	source := g.Dst[0] // an edge's target: a vertex of some degree
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			l := layout(mode)
			s := NewSSSP(g, source, l.Ranks())
			cl, err := StartCluster(l, s.Handle)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := cl.Close(); err != nil {
					t.Error(err)
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			res, err := s.Run(ctx, cl)
			if err != nil {
				t.Fatal(err)
			}
			reach := 0
			for _, d := range s.Distances() {
				if d != Unreachable {
					reach++
				}
			}
			if reach < int(g.N)/4 {
				t.Errorf("only %d of %d vertices reachable: a weak test", reach, g.N)
			}
			t.Logf("%s: %d vertices (%d reachable), %d edges, %d rounds, %d relaxations in %v",
				mode, g.N, reach, len(g.Dst), res.Rounds, res.Messages, res.Elapsed)
		})
	}
}
