package main

import "testing"

// TestCPUDeltaBackwards: a window whose total went backwards (iowait may)
// has no shares, and a field that went backwards counts 0; before, the
// unsigned differences wrapped, so the shares came out ~0 (or ~1e17) and
// the warning about other load on the CPUs never fired.
func TestCPUDeltaBackwards(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b cpuTimes
		want cpuUse
	}{
		{"normal", cpuTimes{user: 10, system: 10, total: 100}, cpuTimes{user: 60, system: 30, total: 200}, cpuUse{user: 0.5, system: 0.2}},
		{"total went back", cpuTimes{user: 10, total: 200}, cpuTimes{user: 60, total: 190}, cpuUse{}},
		{"a field went back", cpuTimes{user: 10, steal: 5, total: 100}, cpuTimes{user: 60, steal: 4, total: 200}, cpuUse{user: 0.5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := cpuDelta([]cpuTimes{tc.a}, []cpuTimes{tc.b})
			if len(got) != 1 || got[0] != tc.want {
				t.Errorf("cpuDelta = %+v, want %+v", got, tc.want)
			}
		})
	}
}
