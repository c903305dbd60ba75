package main

import (
	"strings"
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
)

func TestHistoStats(t *testing.T) {
	for _, tc := range []struct {
		rates       []float64
		lo, med, hi float64
	}{
		{[]float64{3, 1, 2}, 1, 2, 3},
		// An even count's median is the mean of the middle two.
		{[]float64{4, 1, 3, 2}, 1, 2.5, 4},
		{[]float64{5, 7}, 5, 6, 7},
		{[]float64{9}, 9, 9, 9},
	} {
		lo, med, hi := histoRow{rates: tc.rates}.stats()
		if lo != tc.lo || med != tc.med || hi != tc.hi {
			t.Errorf("%v: %v %v %v, want %v %v %v", tc.rates, lo, med, hi, tc.lo, tc.med, tc.hi)
		}
	}
}

func TestHistoTable(t *testing.T) {
	none := &histoRow{name: "none", mode: messaging.ModeNone, rates: []float64{10e6, 8e6, 12e6}}
	host := &histoRow{name: "host", mode: messaging.ModeHost, rates: []float64{5e6, 6e6, 7e6}}
	dpu := &histoRow{name: "dpu", mode: messaging.ModeDPU, rates: []float64{4e6, 3e6, 5e6}}
	line := func(table, name string) string {
		for _, l := range strings.Split(table, "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), name+" ") {
				return strings.Join(strings.Fields(l), " ")
			}
		}
		t.Fatalf("no row %q in\n%s", name, table)
		return ""
	}
	got := histoTable([]*histoRow{none, host, dpu})
	if l := line(got, "host"); !strings.Contains(l, "5.00 6.00 7.00 0.60") {
		t.Errorf("host row %q: want min 5, median 6, max 7, 0.60 × none's median 10", l)
	}
	// Without none's row (-histo-modes host,dpu) there is no ratio to it,
	// rather than one to whichever row came first.
	got = histoTable([]*histoRow{host, dpu})
	if l := line(got, "dpu"); !strings.Contains(l, "3.00 4.00 5.00 -") {
		t.Errorf("dpu row without none %q: want its ratio '-', not 4/6", l)
	}
	if !strings.Contains(got, "× none: not measured") {
		t.Errorf("table without none says nothing of the missing ratio:\n%s", got)
	}
}

// TestHistoVerdicts: the Histogram table ends with issue 15's two targets
// judged on this run's medians, and says "not measured" for a row the run
// lacks; before, it printed no verdict for either.
func TestHistoVerdicts(t *testing.T) {
	none := &histoRow{name: "none", mode: messaging.ModeNone, tsize: 8972, rates: []float64{10e6}}
	dpu := &histoRow{name: "dpu", mode: messaging.ModeDPU, tsize: 8972, rates: []float64{8.5e6}}
	xdp := &histoRow{name: "dpu AF_XDP", mode: messaging.ModeDPU, xdp: true, tsize: 8972, rates: []float64{8e6}}
	xdpSmall := &histoRow{name: "dpu AF_XDP", mode: messaging.ModeDPU, xdp: true, tsize: 3478, rates: []float64{4e6}}
	udpSmall := &histoRow{name: "dpu ≤3478", mode: messaging.ModeDPU, tsize: 3478, rates: []float64{3.5e6}}
	for _, tc := range []struct {
		name string
		rows []*histoRow
		want []string
	}{
		{"all rows", []*histoRow{none, dpu, xdp}, []string{
			"target dpu ≥ 0.8x none (medians): met (0.85)",
			"target AF_XDP agents ≥ kernel-UDP agents at equal MTU (medians): not met (0.94)"}},
		{"AF_XDP at its own size", []*histoRow{none, dpu, xdpSmall, udpSmall}, []string{
			"AF_XDP agents ≥ kernel-UDP agents at equal MTU (medians): met (1.14)"}},
		{"no none", []*histoRow{dpu}, []string{
			"target dpu ≥ 0.8x none (medians): not measured (no none row",
			"AF_XDP agents ≥ kernel-UDP agents at equal MTU (medians): not measured (no dpu AF_XDP row"}},
		{"no kernel-UDP row at AF_XDP's size", []*histoRow{none, dpu, xdpSmall}, []string{
			"at equal MTU (medians): not measured (no kernel-UDP dpu at 3478 B row"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := histoTable(tc.rows)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("table lacks %q:\n%s", w, got)
				}
			}
		})
	}
}
