package main

import (
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
