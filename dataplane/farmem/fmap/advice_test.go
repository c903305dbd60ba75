package fmap

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// advisingBackend records the advice it gets.
type advisingBackend struct {
	*countingBackend
	mu  sync.Mutex
	got []Advice
	err error
}

func (b *advisingBackend) Advise(a Advice) (AdviceResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.got = append(b.got, a)
	return AdviceResult{Static: len(a.Static) > 0, Hinted: len(a.Hints)}, b.err
}

// TestAdvise passes advice through the host agent to a backend that takes
// it, and to one that does not. The program never touches the mapping's
// bytes, so it may run in the agent's process here.
func TestAdvise(t *testing.T) {
	a := startAgent(t)
	plain := a.add(1, NewMemBackend(1<<20))
	adv := &advisingBackend{countingBackend: &countingBackend{MemBackend: NewMemBackend(1 << 20)}}
	a.setAdvisors(map[uint64]Backend{2: adv})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	m1, err := Map(ctx, a.sock, RegionRef{ID: 1, ReadOnly: true}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m1.Close()
	res, err := m1.Advise(ctx, Advice{Prefetcher: "hints", Hints: []Extent{{0, 4096}}})
	if err != nil || res != (AdviceResult{}) {
		t.Errorf("advice to a backend without caches: %+v, %v; want unsupported, no error", res, err)
	}
	if plain.reads.Load() != 0 {
		t.Errorf("advice read the backend %d times", plain.reads.Load())
	}

	m2, err := Map(ctx, a.sock, RegionRef{ID: 2, ReadOnly: true}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	want := []Advice{
		{Prefetcher: "stride"},
		{Static: []Extent{{0, 65536}}},
		{Hints: []Extent{{65536, 100}, {1 << 19, 4096}}},
	}
	wantRes := []AdviceResult{{Supported: true}, {Supported: true, Static: true}, {Supported: true, Hinted: 2}}
	for i, w := range want {
		res, err := m2.Advise(ctx, w)
		if err != nil {
			t.Fatal(err)
		}
		if res != wantRes[i] {
			t.Errorf("advice %+v: result %+v, want %+v", w, res, wantRes[i])
		}
	}
	adv.mu.Lock()
	if !reflect.DeepEqual(adv.got, want) {
		t.Errorf("backend got %+v, want %+v", adv.got, want)
	}
	adv.err = errors.New("cache refused")
	adv.mu.Unlock()
	if _, err := m2.Advise(ctx, Advice{Prefetcher: "x"}); err == nil || !strings.Contains(err.Error(), "cache refused") {
		t.Errorf("backend error: got %v", err)
	}
	if _, err := m2.Advise(ctx, Advice{Hints: make([]Extent, maxExtents+1)}); !errors.Is(err, ErrTooMuchAdvice) {
		t.Errorf("too many ranges: got %v, want ErrTooMuchAdvice", err)
	}
	// The connection still works after an error reply.
	if _, err := m2.Stats(ctx); err != nil {
		t.Errorf("stats after advice errors: %v", err)
	}
}
