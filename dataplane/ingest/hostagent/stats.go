package hostagent

import (
	"fmt"
	"sync/atomic"
	"time"
)

type counters struct {
	registers, doorbells, repeats, stale, completed, failed atomic.Uint64
	bytesIn, bytesOut, deviceNs                             atomic.Uint64
	malformed, sendErrors, handlesServed, handleRefused     atomic.Uint64
	externalRuns, externalFailed, workerAttaches            atomic.Uint64
	workerRefused, workerLost, leftoversKilled              atomic.Uint64
	receives, completionSends, releasedUnrun                atomic.Uint64
}

// Stats are a host agent's counters.
type Stats struct {
	Epoch string `json:"epoch"`
	// Registered is true while the DPU acknowledges the heartbeats;
	// LastAck is how long ago it last did, 0 if it never acknowledged
	// this epoch (or refused it).
	Registered bool          `json:"registered"`
	LastAck    time.Duration `json:"last_ack_ns,omitempty"`
	GPUs       int           `json:"gpus"`
	Slots      int           `json:"slots_per_gpu"`
	// Doorbells counts doorbells rung; Repeats those rung again for a
	// request already running or done (answered without running it
	// twice); Stale those for an older epoch's buffers.
	Doorbells uint64 `json:"doorbells"`
	Repeats   uint64 `json:"repeats"`
	Stale     uint64 `json:"stale"`
	Completed uint64 `json:"completed"`
	Failed    uint64 `json:"failed"`
	BytesIn   uint64 `json:"bytes_in"`
	BytesOut  uint64 `json:"bytes_out"`
	// ReleasedUnrun counts the doorbells the DPU rang for a request it
	// had given up on (ingest.FlagGivenUp) that the agent had no record
	// of: answered released, nothing run.
	ReleasedUnrun uint64 `json:"released_unrun"`
	// DeviceTime is the total time models ran.
	DeviceTime    time.Duration `json:"device_time_ns"`
	Registers     uint64        `json:"registers_sent"`
	HandlesServed uint64        `json:"handles_served"`
	HandleRefused uint64        `json:"handles_refused"`
	Malformed     uint64        `json:"malformed"`
	SendErrors    uint64        `json:"send_errors"`
	// ExternalRuns counts external models' runs a worker completed,
	// ExternalFailed those that failed (no worker, a worker's error, a
	// wrong output size, a worker lost or timed out). Workers is the
	// number attached now, per model; WorkerAttaches counts attaches,
	// WorkerRefused refused ones (user, model, protocol), WorkerLost
	// workers that disconnected or timed out mid-request.
	// LeftoversKilled counts the kills of processes that still held the
	// slot buffers after a worker was killed for overrunning its run
	// (its children, daemons, subprocesses; one two timeouts' scans both
	// found counts twice).
	ExternalRuns    uint64         `json:"external_runs"`
	ExternalFailed  uint64         `json:"external_failed"`
	Workers         map[string]int `json:"workers,omitempty"`
	WorkerAttaches  uint64         `json:"worker_attaches"`
	WorkerRefused   uint64         `json:"worker_refused"`
	WorkerLost      uint64         `json:"worker_lost"`
	LeftoversKilled uint64         `json:"leftovers_killed"`
	// Receives counts the receives from the DPU that returned datagrams
	// (each drains what is waiting), CompletionSends the sends of
	// launched runs' completions (each carries all that finished
	// together): against Doorbells and Completed, how much the host's
	// wake-ups are shared.
	Receives        uint64 `json:"receives"`
	CompletionSends uint64 `json:"completion_sends"`
}

// Stats returns the agent's counters.
func (a *Agent) Stats() Stats {
	var workers map[string]int
	for name, e := range a.ext {
		if workers == nil {
			workers = map[string]int{}
		}
		workers[name] = e.count()
	}
	lastAck, _ := a.lastAckAgo()
	return Stats{
		Epoch: fmt.Sprintf("%016x", a.epoch), Registered: a.Registered(), LastAck: lastAck, GPUs: len(a.gpus), Slots: a.cfg.Slots,
		Doorbells: a.stats.doorbells.Load(), Repeats: a.stats.repeats.Load(), Stale: a.stats.stale.Load(), ReleasedUnrun: a.stats.releasedUnrun.Load(),
		Completed: a.stats.completed.Load(), Failed: a.stats.failed.Load(),
		BytesIn: a.stats.bytesIn.Load(), BytesOut: a.stats.bytesOut.Load(), DeviceTime: time.Duration(a.stats.deviceNs.Load()),
		Registers: a.stats.registers.Load(), HandlesServed: a.stats.handlesServed.Load(), HandleRefused: a.stats.handleRefused.Load(),
		Malformed: a.stats.malformed.Load(), SendErrors: a.stats.sendErrors.Load(),
		ExternalRuns: a.stats.externalRuns.Load(), ExternalFailed: a.stats.externalFailed.Load(), Workers: workers,
		WorkerAttaches: a.stats.workerAttaches.Load(), WorkerRefused: a.stats.workerRefused.Load(), WorkerLost: a.stats.workerLost.Load(),
		LeftoversKilled: a.stats.leftoversKilled.Load(),
		Receives:        a.stats.receives.Load(), CompletionSends: a.stats.completionSends.Load(),
	}
}

// GPUInfo describes one registered GPU for `lovelock ingest gpus`.
type GPUInfo struct {
	Index    int    `json:"index"`
	Kind     string `json:"kind"`
	Name     string `json:"name"`
	UUID     string `json:"uuid,omitempty"`
	Card     string `json:"card"`
	MemBytes uint64 `json:"mem_bytes"`
	MIG      bool   `json:"mig"`
	Slots    int    `json:"slots"`
	SlotIn   int    `json:"slot_input_bytes"`
	SlotOut  int    `json:"slot_output_bytes"`
}

// GPUs describes the registered GPUs.
func (a *Agent) GPUs() []GPUInfo {
	var out []GPUInfo
	for _, g := range a.gpus {
		i := g.dev.Info()
		out = append(out, GPUInfo{Index: g.index, Kind: string(i.Kind), Name: i.Name, UUID: i.UUID, Card: g.card, MemBytes: i.MemBytes, MIG: i.MIG,
			Slots: len(g.slots), SlotIn: a.cfg.SlotInput, SlotOut: a.cfg.SlotOutput})
	}
	return out
}
