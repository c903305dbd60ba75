package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestWatch(t *testing.T) {
	tests := []struct {
		name    string
		console string
		pass    bool
		ready   bool
		failure string
	}{
		{"pass", "[ 1.0] Run /init\n2026/01/01 INFO data plane ready version=dev\nLOVELOCK-CHECK ok x\nLOVELOCK-CHECK todo api: not yet: lovelockd has no API\nLOVELOCK-CHECK PASS\n",
			true, true, ""},
		{"check fails", "data plane ready\nLOVELOCK-CHECK FAIL interface eth0: no XDP\n", false, true, "LOVELOCK-CHECK FAIL interface eth0: no XDP"},
		{"panic", "[ 0.9] Kernel panic - not syncing: No working init found\n", false, false, "[ 0.9] Kernel panic - not syncing: No working init found"},
		{"silence", "", false, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out strings.Builder
			ev := watch(strings.NewReader(tt.console), &out, time.Now().Add(-time.Second))
			if ev.pass != tt.pass || (ev.ready > 0) != tt.ready || ev.failure != tt.failure {
				t.Fatalf("got pass %v ready %v failure %q", ev.pass, ev.ready, ev.failure)
			}
			if out.String() != tt.console {
				t.Fatal("console not copied through")
			}
			if tt.pass && ev.note != "todo api: not yet: lovelockd has no API" {
				t.Fatalf("note = %q", ev.note)
			}
		})
	}
}

func TestArgsNeverKVM(t *testing.T) {
	for _, c := range cases {
		args := c.args("bin/image", "1024")
		joined := strings.Join(args, " ")
		if strings.Contains(joined, "kvm") || !slices.Contains(args, "tcg") {
			t.Errorf("%s: %s", c.name, joined)
		}
		if !strings.Contains(joined, "lovelock.check") || !strings.Contains(joined, "console="+c.console) {
			t.Errorf("%s: kernel command line lacks check mode or console: %s", c.name, joined)
		}
	}
}
