package agent

import (
	"context"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
)

// tick is how often the agent looks at its timers: stalled inputs,
// unanswered doorbells, queued deadlines, the host's heartbeat, the
// scheduler's wake-ups and expired results.
const tick = 5 * time.Millisecond

func (a *Agent) timers(ctx context.Context) {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			a.mu.Lock()
			a.expireLocked(now)
			a.mu.Unlock()
		}
	}
}

func (a *Agent) expireLocked(now time.Time) {
	h := a.host
	if h != nil && now.Sub(h.lastSeen) > a.cfg.HostTimeout {
		a.cfg.Logger.Warn("GPU host stopped registering; its slots are closed until it comes back", "epoch", h.epoch, "silent", now.Sub(h.lastSeen).Round(time.Millisecond))
		a.stats.hostLost.Add(1)
		a.host = nil
		for _, r := range a.reqs {
			if r.host == h && r.state != receiving {
				a.failLocked(r, ingest.Errorf(ingest.StatusHostUnavailable, "the GPU host stopped answering (no heartbeat for %v): retry once it is back", a.cfg.HostTimeout))
			}
		}
		go h.unmap()
	}
	for _, r := range a.reqs {
		switch r.state {
		case receiving:
			if now.Sub(r.last) > a.cfg.ReassemblyTimeout {
				// The client's retransmission starts it again; answering
				// would only race with that.
				a.stats.reassemblyTimeouts.Add(1)
				a.dropLocked(r)
			}
		case queued:
			if !r.deadline.IsZero() && now.After(r.deadline) {
				a.failLocked(r, ingest.Errorf(ingest.StatusDeadline, "deadline passed after %v waiting for a slice", now.Sub(r.arrived).Round(time.Microsecond)))
			}
		case running:
			if now.Sub(r.rungAt) < max(a.cfg.DoorbellTimeout, 2*r.model.duration) {
				continue
			}
			if r.rings > a.cfg.DoorbellRetries && !r.answered {
				a.holdLocked(r, ingest.Errorf(ingest.StatusHostUnavailable, "the GPU host did not complete the request after %d doorbells: retry", r.rings))
			}
			// A held request is rung on: the host's answer for it (its
			// completion, from memory if that was lost) frees its slot.
			a.stats.rerings.Add(1)
			a.ringLocked(r)
		}
	}
	if h := a.host; h != nil {
		at := now.Sub(a.start)
		for _, pl := range h.pools {
			if next, ok := pl.disp.NextTimer(); ok && next <= at {
				if err := pl.disp.Tick(at, a.placer(pl)); err != nil {
					a.cfg.Logger.Debug("scheduler tick", "pool", pl.name, "err", err)
				}
			}
		}
	}
	for len(a.resultQ) > 0 && now.After(a.resultQ[0].expires) {
		a.forgetLocked(a.resultQ[0])
		a.resultQ = a.resultQ[1:]
	}
}

// dropLocked forgets a request without answering it.
func (a *Agent) dropLocked(r *request) {
	delete(a.bySeq, r.seq)
	delete(a.reqs, r.key)
	a.bufUsed -= len(r.buf)
}
