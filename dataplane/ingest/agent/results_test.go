package agent

import (
	"bytes"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
)

// TestResultBudget: kept results stay within their byte budget, oldest
// forgotten first; a retransmission of a forgotten request runs it again
// and still gets the right answer.
func TestResultBudget(t *testing.T) {
	r := newRig(t, rigOptions{tweak: func(c *Config) { c.ResultBytes = 4096 }})
	cl := r.client(0)
	mlp := mlpInput(1, 64) // 64 rows: a 4 KiB output, alone above half the budget
	first := cl.ids.Load() + 1
	for i := 0; i < 3; i++ {
		if a := cl.infer("mlp", mlp, 0); a.status != ingest.StatusOK {
			t.Fatalf("request %d: %v %q", i, a.status, a.text)
		}
	}
	s := r.agent.Stats()
	if s.ResultsForgotten < 2 {
		t.Errorf("%d results forgotten, want at least 2 with a 4 KiB budget", s.ResultsForgotten)
	}
	r.agent.mu.Lock()
	kept := r.agent.resultBytes
	r.agent.mu.Unlock()
	if kept > 4096+ingest.ResultHeaderLen*8+1024 {
		t.Errorf("%d bytes of results kept, budget 4096", kept)
	}
	// The first request again, under its old ID: forgotten, so it runs
	// again, with the same answer.
	ran := r.host.Stats().Completed
	pkts := cl.fragments(first, "mlp", mlp, 0)
	cl.send(pkts)
	a, err := cl.await(first, pkts, 200*time.Millisecond, 10*time.Second)
	if err != nil || a.status != ingest.StatusOK || !bytes.Equal(a.out, reference(t, "mlp", mlp)) {
		t.Fatalf("forgotten request sent again: %+v %v", a.status, err)
	}
	if got := r.host.Stats().Completed; got != ran+1 {
		t.Errorf("host ran %d more, want 1 (the forgotten result is computed again)", got-ran)
	}
}
