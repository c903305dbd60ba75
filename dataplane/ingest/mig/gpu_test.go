package mig

import (
	"errors"
	"testing"
)

func TestGPUPlaceRemove(t *testing.T) {
	c, err := CardByName("A100-40GB")
	if err != nil {
		t.Fatal(err)
	}
	g := NewGPU(&c)
	g3, _ := c.Profile("3g.20gb")
	g1, _ := c.Profile("MIG 1g.5gb")
	if got := g.Starts(g3); got != 0b10001 {
		t.Fatalf("3g starts on an empty GPU: %08b", got)
	}
	for _, pl := range []Placement{{g3, 0}, {g3, 4}} {
		if err := g.Place(pl); err != nil {
			t.Fatal(err)
		}
	}
	if g.Starts(g1) != 0 || g.FreeSlices() != 0 {
		t.Fatalf("3g+3g leaves room: starts %08b, free %d", g.Starts(g1), g.FreeSlices())
	}
	if err := g.Place(Placement{g1, 6}); !errors.Is(err, ErrOverlap) {
		t.Fatalf("1g beside 3g+3g: %v, want ErrOverlap", err)
	}
	if err := g.Remove(Placement{g3, 4}); err != nil {
		t.Fatal(err)
	}
	if err := g.Remove(Placement{g3, 4}); !errors.Is(err, ErrNotPlaced) {
		t.Fatalf("second remove: %v, want ErrNotPlaced", err)
	}
	if got := g.Starts(g1); got != 0b1110000 {
		t.Fatalf("1g starts beside 3g@0: %08b, want slots 4-6", got)
	}
	if g.Instances() != 1 || g.Used() != 0x0f {
		t.Fatalf("state: %d instances, used %08b", g.Instances(), g.Used())
	}
}

func TestCardByName(t *testing.T) {
	if _, err := CardByName("h200-141gb"); err != nil {
		t.Fatal(err)
	}
	if _, err := CardByName("V100"); err == nil {
		t.Fatal("V100 accepted")
	}
}
