package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/hostagent"
)

// TestHostRegistration: a host agent whose DPU stopped acknowledging it
// says so, and since when, instead of "registered".
func TestHostRegistration(t *testing.T) {
	for _, tc := range []struct {
		h    hostagent.Stats
		want string
	}{
		{hostagent.Stats{Registered: true, LastAck: 100 * time.Millisecond}, "registered with its DPU"},
		{hostagent.Stats{LastAck: 12*time.Second + 300*time.Millisecond}, "not registered: last ack from its DPU 12s ago; is the DPU's lovelockd running?"},
		{hostagent.Stats{LastAck: 40 * time.Millisecond}, "last ack from its DPU 40ms ago"},
		{hostagent.Stats{}, "not registered: no ack from its DPU yet"},
	} {
		if got := hostRegistration(&tc.h); !strings.Contains(got, tc.want) {
			t.Errorf("%+v: %q, want %q", tc.h, got, tc.want)
		}
	}
}
