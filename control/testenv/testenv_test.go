package testenv

import "testing"

func TestParseRelease(t *testing.T) {
	for _, tc := range []struct {
		release      string
		major, minor int
		ok           bool
	}{
		{"6.1.0-56-cloud-amd64", 6, 1, true},
		{"6.12.117+deb12-arm64", 6, 12, true},
		{"6.18.0", 6, 18, true},
		{"5.15", 5, 15, true},
		{"6", 0, 0, false},
		{"linux", 0, 0, false},
	} {
		major, minor, ok := parseRelease(tc.release)
		if ok != tc.ok || ok && (major != tc.major || minor != tc.minor) {
			t.Errorf("%q: %d.%d %v, want %d.%d %v", tc.release, major, minor, ok, tc.major, tc.minor, tc.ok)
		}
	}
	// The running kernel is at least itself and older than 1000.0.
	if !KernelAtLeast(t, 0, 0) || KernelAtLeast(t, 1000, 0) {
		t.Error("KernelAtLeast disagrees with the running kernel")
	}
}
