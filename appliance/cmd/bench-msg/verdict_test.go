package main

import (
	"strings"
	"testing"
)

func TestTenX(t *testing.T) {
	base := map[int]float64{8: 100e3, 16: 100e3, 64: 100e3, 256: 90e3}
	for _, tc := range []struct {
		name       string
		rate, base map[int]float64
		want       string
	}{
		{"met", map[int]float64{16: 2e6, 64: 1.1e6}, base, "met (16 B 20.0x, 64 B 11.0x)"},
		{"not met at 64 B", map[int]float64{16: 2e6, 64: 0.9e6}, base, "not met (16 B 20.0x, 64 B 9.0x)"},
		// Sizes outside 16 and 64 B do not count, for or against.
		{"other sizes ignored", map[int]float64{8: 1, 16: 2e6, 64: 2e6, 256: 1}, base, "met (16 B 20.0x, 64 B 20.0x)"},
		// The target names both sizes: -sizes without 64 has no verdict.
		{"64 B not run", map[int]float64{16: 2e6, 32: 2e6}, map[int]float64{16: 1e5, 32: 1e5}, "not measured (no 64 B row)"},
		// A baseline that delivered nothing (interrupted, or its sockets
		// failed) makes every ratio infinite: no pass.
		{"zero baseline", map[int]float64{16: 0, 64: 0}, map[int]float64{16: 0, 64: 0}, "not measured (16 B: the baseline delivered nothing)"},
		{"zero rate", map[int]float64{16: 2e6, 64: 0}, base, "not measured (64 B: the path delivered nothing)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tenX(tc.rate, tc.base); got != tc.want {
				t.Errorf("tenX = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestTransportVerdicts(t *testing.T) {
	rows := map[int]float64{16: 2e6, 64: 2e6}
	base := map[int]float64{16: 1e5, 64: 1e5}
	// The AF_XDP rows' datagrams went through the kernel sockets: their
	// rates are not AF_XDP's, and the AF_XDP verdict says so.
	got := transportVerdicts(rows, rows, base, false)
	if !strings.Contains(got, "DPU agents on kernel UDP met (") || !strings.Contains(got, "on AF_XDP not measured (the AF_XDP rows left the AF_XDP sockets") {
		t.Errorf("path check failed: %q", got)
	}
	got = transportVerdicts(rows, rows, base, true)
	if !strings.Contains(got, "on AF_XDP met (") {
		t.Errorf("path check passed: %q", got)
	}
}
