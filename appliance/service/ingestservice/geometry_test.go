package ingestservice

import (
	"errors"
	"strings"
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
)

// TestCheckGeometry: a GPU whose NVML geometry matches its card's table is
// taken, one that differs is refused saying how, and one that cannot say
// is taken with a note for the log.
func TestCheckGeometry(t *testing.T) {
	h100, _ := mig.CardByName("H100-80GB")
	same := h100.Profiles
	moved := mig.Cards()[2].Profiles // H100-80GB, a fresh copy
	moved[4].Starts = []int{0, 2}
	for _, tc := range []struct {
		name     string
		card     string
		live     []mig.Profile
		readErr  error
		wantErr  string // "" wants none
		wantNote string
	}{
		{"matches", "H100-80GB", same, nil, "", "GPU 1: MIG geometry matches the H100-80GB table (7 profiles, from NVML)"},
		{"no NVML", "H100-80GB", nil, errors.New("libnvidia-ml.so.1 not loaded"), "",
			"GPU 1: MIG geometry not checked against the H100-80GB table: libnvidia-ml.so.1 not loaded"},
		{"differs", "H100-80GB", moved, nil,
			"ingest_host: GPU 1: its MIG geometry differs from the scheduler's H100-80GB table, so placements would be wrong: 3g.40gb (profile 9): start slots [0 4] in the table, [0 2] on the GPU; set gpus[1].card", ""},
		{"card named wrong", "A100-40GB", same, nil, "differs from the scheduler's A100-40GB table", ""},
		{"unknown card", "B200", same, nil, `unknown card "B200"`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			note, err := checkGeometry(1, tc.card, tc.live, tc.readErr)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || note != tc.wantNote {
				t.Fatalf("note %q, err %v; want note %q", note, err, tc.wantNote)
			}
		})
	}
}
