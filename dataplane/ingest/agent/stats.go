package agent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
)

type counters struct {
	fragments, bytesIn, malformed, duplicates, resent           atomic.Uint64
	received, completed, lateResults                            atomic.Uint64
	decisions, decisionNs                                       atomic.Uint64
	doorbells, rerings, staleCompletions                        atomic.Uint64
	bytesToDevice, bytesFromDevice, resultDatagrams, sendErrors atomic.Uint64
	registrations, registerFailed, hostLost, reassemblyTimeouts atomic.Uint64
	resultsForgotten, protocolErrors, canceled                  atomic.Uint64
	fragmentRefusals, hostRefused, inferCalls, heldReleased     atomic.Uint64
	refused                                                     [16]atomic.Uint64 // by ingest.Status
}

// countRefusal counts a request answered with err: by its status, or as
// canceled when its caller cancelled it.
func (a *Agent) countRefusal(err error) {
	if errors.Is(err, context.Canceled) {
		a.stats.canceled.Add(1)
		return
	}
	s := ingest.StatusOf(err)
	if int(s) < len(a.stats.refused) {
		a.stats.refused[s].Add(1)
	}
}

// latencies keeps the most recent request latencies for percentiles
// (nearest rank, as the load generator's).
type latencies struct {
	mu   sync.Mutex
	ring []time.Duration
	n    int
}

func (l *latencies) init(size int) { l.ring = make([]time.Duration, size) }

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.ring[l.n%len(l.ring)] = d
	l.n++
	l.mu.Unlock()
}

func (l *latencies) percentiles(ps ...float64) []time.Duration {
	l.mu.Lock()
	s := slices.Clone(l.ring[:min(l.n, len(l.ring))])
	l.mu.Unlock()
	out := make([]time.Duration, len(ps))
	if len(s) == 0 {
		return out
	}
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	for i, p := range ps {
		// Nearest rank: the ceil(p*n)-th smallest. The tolerance keeps
		// p*n that floating point puts just above a whole number (0.99
		// of 100) on that number.
		rank := int(math.Ceil(p*float64(len(s)) - 1e-9))
		out[i] = s[min(len(s)-1, max(0, rank-1))]
	}
	return out
}

// Stats are a DPU ingest agent's counters.
type Stats struct {
	// Host is the registered GPU host, empty when none is.
	Host *HostStatus `json:"host,omitempty"`
	// Fragments counts input datagrams (the Lovelock protocol's);
	// InferCalls the requests handed to Infer (the gRPC front end's),
	// refused ones too; BytesIn the input bytes of both. Received counts
	// requests whose input was complete; Completed those answered with a
	// result; Refused those answered with an error, by status; Canceled
	// those whose caller (of Infer: the gRPC front end) cancelled them.
	// Each request counts once.
	Fragments  uint64            `json:"fragments"`
	InferCalls uint64            `json:"infer_calls"`
	BytesIn    uint64            `json:"bytes_in"`
	Received   uint64            `json:"received"`
	Completed  uint64            `json:"completed"`
	Refused    map[string]uint64 `json:"refused"`
	Canceled   uint64            `json:"canceled"`
	Malformed  uint64            `json:"malformed"`
	Duplicates uint64            `json:"duplicate_fragments"`
	// Resent counts results sent again for a retransmitted request.
	Resent uint64 `json:"results_resent"`
	// ResultsForgotten are results dropped before their time to keep the
	// kept results within their byte budget.
	ResultsForgotten uint64 `json:"results_forgotten"`
	// LateResults are results delivered after their deadline (the
	// deadline passed while the model ran).
	LateResults        uint64 `json:"late_results"`
	ReassemblyTimeouts uint64 `json:"reassembly_timeouts"`
	// FragmentRefusals are requests refused (bad-request, also counted
	// in Refused) for a fragment under ingest.MinFragment that was not
	// the input's last, or for arriving in more than 1024 separate
	// pieces at once.
	FragmentRefusals uint64 `json:"fragment_refusals"`
	BytesToDevice    uint64 `json:"bytes_to_device"`
	BytesFromDevice  uint64 `json:"bytes_from_device"`
	Doorbells        uint64 `json:"doorbells"`
	Rerings          uint64 `json:"doorbells_rerung"`
	// HeldReleased are held slots freed because the host, rung for their
	// given-up request, had no record of it and ran nothing (released
	// unrun); a host older than control version 3 runs the model instead.
	HeldReleased     uint64 `json:"held_released_unrun"`
	StaleCompletions uint64 `json:"stale_completions"`
	Registrations    uint64 `json:"registrations"`
	RegisterFailed   uint64 `json:"registrations_failed"`
	// HostRefused are control datagrams refused unanswered because they
	// came from outside HostPeer, and registrations refused because they
	// named a handle socket HostSocket does not allow: a peer that is
	// not the GPU host, or the host with a setting that disagrees (the
	// agent's log says which, once per source).
	HostRefused uint64 `json:"host_refused"`
	// HostPeer and HostSocket are where registrations are heard from and
	// which handle sockets they may name (Config).
	HostPeer   string `json:"host_peer"`
	HostSocket string `json:"host_socket"`
	HostLost   uint64 `json:"host_lost"`
	SendErrors uint64 `json:"send_errors"`
	// ProtocolErrors are host replies that contradict the request they
	// name: a completion for another GPU or slot, which is ignored, or a
	// release of a request not given up, which fails it.
	ProtocolErrors uint64 `json:"host_protocol_errors"`
	// InFlight are requests open now; Queued those waiting for a slice;
	// BufferBytes the DPU memory their inputs hold. SlotsHeld are the
	// slots of requests already answered (their doorbells went
	// unanswered, or their Infer caller gave up) that the host may still
	// be writing or running on: neither free nor in flight, they go back
	// when the host answers for their request, re-registers or is lost.
	InFlight    int `json:"in_flight"`
	SlotsHeld   int `json:"slots_held"`
	Queued      int `json:"queued"`
	BufferBytes int `json:"buffer_bytes"`
	// Latency percentiles (nearest rank) from the input's first fragment
	// to the result, over the last 4096 results.
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	// Decision is the scheduler's mean decision time per arrival.
	Decision time.Duration `json:"decision_ns"`
	// GPUsInUse is the GPUs the scheduler has work on, per pool.
	GPUsInUse map[string]int `json:"gpus_in_use,omitempty"`
}

// HostStatus is the registered GPU host.
type HostStatus struct {
	Addr   string             `json:"addr"`
	Epoch  string             `json:"epoch"`
	Socket string             `json:"socket"`
	GPUs   []ingest.GPULayout `json:"gpus"`
	Models []string           `json:"models"`
	// Seen is how long ago its last heartbeat arrived.
	Seen time.Duration `json:"seen_ns"`
}

// Stats returns the agent's counters.
func (a *Agent) Stats() Stats {
	s := Stats{
		Fragments: a.stats.fragments.Load(), InferCalls: a.stats.inferCalls.Load(), BytesIn: a.stats.bytesIn.Load(), Received: a.stats.received.Load(),
		Completed: a.stats.completed.Load(), Canceled: a.stats.canceled.Load(), Malformed: a.stats.malformed.Load(), Duplicates: a.stats.duplicates.Load(),
		Resent: a.stats.resent.Load(), ResultsForgotten: a.stats.resultsForgotten.Load(), LateResults: a.stats.lateResults.Load(), ReassemblyTimeouts: a.stats.reassemblyTimeouts.Load(),
		FragmentRefusals: a.stats.fragmentRefusals.Load(),
		BytesToDevice:    a.stats.bytesToDevice.Load(), BytesFromDevice: a.stats.bytesFromDevice.Load(),
		Doorbells: a.stats.doorbells.Load(), Rerings: a.stats.rerings.Load(), HeldReleased: a.stats.heldReleased.Load(), StaleCompletions: a.stats.staleCompletions.Load(),
		Registrations: a.stats.registrations.Load(), RegisterFailed: a.stats.registerFailed.Load(), HostLost: a.stats.hostLost.Load(),
		HostRefused: a.stats.hostRefused.Load(), HostPeer: a.cfg.HostPeer.String(), HostSocket: a.cfg.HostSocket,
		SendErrors: a.stats.sendErrors.Load(), ProtocolErrors: a.stats.protocolErrors.Load(), Refused: map[string]uint64{},
	}
	for i := range a.stats.refused {
		if v := a.stats.refused[i].Load(); v > 0 {
			s.Refused[ingest.Status(i).String()] = v
		}
	}
	if n := a.stats.decisions.Load(); n > 0 {
		s.Decision = time.Duration(a.stats.decisionNs.Load() / n)
	}
	p := a.lat.percentiles(0.5, 0.99)
	s.P50, s.P99 = p[0], p[1]
	a.mu.Lock()
	defer a.mu.Unlock()
	s.InFlight, s.SlotsHeld, s.BufferBytes = len(a.reqs)-a.held, a.held, a.bufUsed
	if h := a.host; h != nil {
		s.Host = &HostStatus{Addr: h.addr.String(), Epoch: fmt.Sprintf("%016x", h.epoch), Socket: h.socket, GPUs: h.layout.GPUs, Models: h.layout.Models, Seen: time.Since(h.lastSeen)}
		s.GPUsInUse = map[string]int{}
		for name, pl := range h.pools {
			s.Queued += pl.queued
			s.GPUsInUse[name] = pl.disp.Scheduler().InUse()
		}
	}
	return s
}

// Models implements ingest.Catalog: every configured model, ready when
// the registered host runs it (what admission checks too).
func (a *Agent) Models() []ingest.ModelInfo {
	var out []ingest.ModelInfo
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, mc := range a.cfg.Models {
		info := a.models[mc.Name].info
		if a.host != nil {
			info.MaxInput = a.maxInput(a.models[mc.Name], a.host)
			info.Ready = a.host.models[mc.Name]
		}
		for _, t := range a.cfg.Tenants {
			if slices.Contains(t.Models, mc.Name) {
				info.Tenants = append(info.Tenants, t.ID)
			}
		}
		out = append(out, info)
	}
	return out
}

// ModelInfo describes a model as tensors, as the agent publishes it: the
// built-in ones as they are, others (the host's external models, whose
// shapes only the host knows) as rows of bytes in and one row of bytes
// out, its length -1: known only from the result, which the gRPC front
// end's response shapes by it. Clients of the gRPC front end use it to
// shape their requests.
func ModelInfo(name string) ingest.ModelInfo {
	return modelInfo(ModelConfig{Name: name})
}

func modelInfo(mc ModelConfig) ingest.ModelInfo {
	info := ingest.ModelInfo{Name: mc.Name, RowBytes: 1, Datatype: "UINT8", RowShape: []int64{1}, OutDatatype: "UINT8", OutRowShape: []int64{-1}, Profile: mc.Profile}
	m, err := model.Builtin(mc.Name)
	if err != nil {
		return info
	}
	info.Doc = m.Doc
	switch m.Name {
	case "checksum":
		info.OutDatatype, info.OutRowShape = "UINT32", []int64{2}
	case "mlp":
		info.RowBytes, info.Datatype, info.RowShape = m.Multiple, "FP32", []int64{model.MLPIn}
		info.OutDatatype, info.OutRowShape, info.OutPerRow = "FP32", []int64{model.MLPOut}, true
	}
	return info
}

var _ ingest.Catalog = (*Agent)(nil)
