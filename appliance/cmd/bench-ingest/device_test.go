package main

import (
	"errors"
	"strings"
	"testing"
)

// TestCheckDevice: -device takes shm, and cuda only in a binary built with
// -tags cuda; anything else is refused before a testbed is brought up.
func TestCheckDevice(t *testing.T) {
	// cuda is refused, saying how to build it in, where it is not built in.
	var cudaErr error
	cudaMsg := ""
	if !cudaBuilt {
		cudaErr, cudaMsg = errNoCUDA, "build it with -tags cuda (CGO_ENABLED=0 go build -tags cuda ./appliance/cmd/bench-ingest)"
	}
	for _, tc := range []struct {
		kind    string
		wantErr error  // errors.Is, where set
		wantMsg string // in the error; "" wants none
	}{
		{kind: "shm"},
		{kind: "cuda", wantErr: cudaErr, wantMsg: cudaMsg},
		{kind: "", wantMsg: `-device "": want shm or cuda`},
		{kind: "CUDA", wantMsg: `-device "CUDA": want shm or cuda`},
		{kind: "gpu", wantMsg: `-device "gpu": want shm or cuda`},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			err := checkDevice(tc.kind)
			if tc.wantMsg == "" {
				if err != nil {
					t.Fatalf("checkDevice(%q) = %v, want nil", tc.kind, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("checkDevice(%q) = %v, want an error with %q", tc.kind, err, tc.wantMsg)
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("checkDevice(%q) = %v, want it to wrap %v", tc.kind, err, tc.wantErr)
			}
		})
	}
}

// TestDeviceWithoutCUDA: in the default build every CUDA entry point says
// how to build the backend in, rather than failing somewhere later.
func TestDeviceWithoutCUDA(t *testing.T) {
	if cudaBuilt {
		t.Log("built with -tags cuda: the CUDA backend is in; nothing to refuse")
		return
	}
	defer func(k string) { *deviceKind = k }(*deviceKind)
	*deviceKind = deviceCUDA
	_, errDev := openDevice()
	_, errImp := openImporter()
	_, errDesc := describeGPU()
	for name, err := range map[string]error{"openDevice": errDev, "openImporter": errImp, "describeGPU": errDesc} {
		if !errors.Is(err, errNoCUDA) {
			t.Errorf("%s with -device cuda = %v, want errNoCUDA", name, err)
		}
	}
}
