package hostagent

import (
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
)

// TestRememberedAnswers: a doorbell rung again (its completion lost) is
// answered from memory, never run again, however many other doorbells
// finish before it comes back within the DPU's re-ring window: refusals
// that ran nothing take no remembered answer, and answers are kept by age,
// not only by count.
func TestRememberedAnswers(t *testing.T) {
	const fill = 4096 // what the agent once kept, whatever their age
	first := func(t *testing.T, r *extRig) ingest.Ctrl {
		t.Helper()
		c := r.run(0, "checksum", []byte("the request whose completion is lost"))
		if c.Status != ingest.StatusOK {
			t.Fatalf("request %d: %s %q", c.Request, c.Status, c.Text)
		}
		return c
	}
	again := func(t *testing.T, r *extRig, c ingest.Ctrl, n int) {
		t.Helper()
		r.send(ingest.Ctrl{Op: ingest.OpDoorbell, Epoch: r.agent.Epoch(), Request: c.Request, Slot: 0,
			Length: uint32(len("the request whose completion is lost")), Text: "checksum"})
		if got := r.complete(c.Request); got.Status != c.Status || got.Length != c.Length {
			t.Fatalf("rung again: %+v, want %+v", got, c)
		}
		if s := r.agent.Stats(); s.Completed != uint64(n) || s.Repeats != 1 {
			t.Fatalf("completed %d, repeats %d: want %d and 1 (the model ran again)", s.Completed, s.Repeats, n)
		}
	}
	t.Run("refusals", func(t *testing.T) {
		r := newExtRig(t, nil)
		c := first(t, r)
		for range fill {
			r.mu.Lock()
			r.ids++
			id := r.ids
			r.mu.Unlock()
			r.send(ingest.Ctrl{Op: ingest.OpDoorbell, Epoch: r.agent.Epoch(), Request: id, GPU: 7, Length: 1, Text: "checksum"})
			wantFailure(t, r.complete(id), ingest.StatusBadRequest, "GPU 7")
		}
		again(t, r, c, 1)
	})
	t.Run("completions", func(t *testing.T) {
		r := newExtRig(t, nil)
		c := first(t, r)
		for i := range fill + 1 {
			if d := r.run(i%2, "checksum", []byte{byte(i), byte(i >> 8)}); d.Status != ingest.StatusOK {
				t.Fatalf("request %d: %s %q", d.Request, d.Status, d.Text)
			}
		}
		again(t, r, c, fill+2)
	})
}
