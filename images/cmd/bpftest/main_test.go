package main

import (
	"errors"
	"strings"
	"testing"
)

func TestWatch(t *testing.T) {
	console := strings.Join([]string{
		"[    0.6] mtrr: your CPUs had inconsistent fixed MTRR settings",
		"BPFTEST kernel 6.12.117+deb12-cloud-amd64 x86_64",
		"BPFTEST start verifier",
		"BPFTEST end verifier ok every program loaded 1.31s",
		"BPFTEST start bpf",
		"=== RUN   TestApplyClassify",
		"--- FAIL: TestApplyClassify (0.25s)",
		"--- SKIP: TestSteerPinAttach (0.00s)",
		"BPFTEST end bpf FAIL exit status 1 0.69s\r",
		"BPFTEST DONE FAIL 1 passed, 1 failed",
		"[    2.9] reboot: Power down",
	}, "\n")
	var out strings.Builder
	res := &result{}
	watch(strings.NewReader(console), &out, res)
	if res.kernel != "6.12.117+deb12-cloud-amd64 x86_64" {
		t.Errorf("kernel %q", res.kernel)
	}
	if len(res.ends) != 2 || res.ends[1] != "BPFTEST end bpf FAIL exit status 1 0.69s" {
		t.Errorf("ends %q", res.ends)
	}
	if len(res.fails) != 1 || len(res.skips) != 1 || res.done != "BPFTEST DONE FAIL 1 passed, 1 failed" || res.panic != "" {
		t.Errorf("fails %q done %q panic %q", res.fails, res.done, res.panic)
	}
	if !strings.Contains(out.String(), "reboot: Power down") {
		t.Error("console not copied")
	}

	res = &result{}
	watch(strings.NewReader("[ 0.9] Kernel panic - not syncing: Attempted to kill init!\n"), &out, res)
	if res.panic == "" || res.done != "" {
		t.Errorf("panic %q done %q", res.panic, res.done)
	}
}

func TestTestName(t *testing.T) {
	for in, want := range map[string]string{"./bpf/": "bpf", "./control/attach/": "control_attach", "./dataplane/wire": "dataplane_wire"} {
		if got := testName(in); got != want {
			t.Errorf("testName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestBootAgain(t *testing.T) {
	panicked := func(n int) (*result, error) {
		return &result{panic: "Kernel panic - not syncing: double fault", logFile: "log"}, errors.New("guest: panic")
	}
	passed := func(int) (*result, error) { return &result{done: "BPFTEST DONE PASS"}, nil }
	failed := func(int) (*result, error) { return &result{}, errors.New("tests failed") }
	for _, tc := range []struct {
		name      string
		boots     []func(int) (*result, error)
		wantBoots int
		wantErr   string // "" for a pass
		wantPanic bool   // a panicked boot is reported
	}{
		{"pass", []func(int) (*result, error){passed}, 1, "", false},
		{"fail, no second boot", []func(int) (*result, error){failed}, 1, "tests failed", false},
		{"panic, then pass", []func(int) (*result, error){panicked, passed}, 2, "", true},
		{"panic, then fail", []func(int) (*result, error){panicked, failed}, 2, "tests failed (earlier: boot 1:", true},
		{"panic twice", []func(int) (*result, error){panicked, panicked, passed}, 2, "panicked on all 2 boots", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			boots := 0
			_, panics, err := bootAgain(t.Logf, func(n int) (*result, error) {
				if n != boots+1 {
					t.Fatalf("boot %d after %d boots", n, boots)
				}
				boots++
				return tc.boots[n-1](n)
			})
			if boots != tc.wantBoots {
				t.Errorf("%d boots, want %d", boots, tc.wantBoots)
			}
			if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %v, want %q", err, tc.wantErr)
			}
			if (panics != "") != tc.wantPanic {
				t.Errorf("panics %q, want reported: %v", panics, tc.wantPanic)
			}
		})
	}
}
