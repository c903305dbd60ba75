package cli

import (
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/agent"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/hostagent"
)

// The ingest services' names in lovelockd (appliance/service/ingestservice).
const (
	ingestAgent = "ingest"
	ingestHost  = "ingest_host"
)

func ingestCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "ingest",
		Usage: "accelerator ingest (Conspirator): the DPU's ingest agent and the GPU host's agent",
		Description: "On a DPU running the ingest service, stats shows what its agent received, where it placed\n" +
			"it and how long it took, and models what it serves; on a GPU host running ingest_host, stats\n" +
			"shows the doorbells it took and gpus the GPUs it registered. Send requests with 'lovelock infer'.",
		Subcommands: []*ucli.Command{
			{Name: "stats", Usage: "counters of the node's ingest agents", Flags: []ucli.Flag{outputFlag()}, Action: ingestStats},
			{Name: "gpus", Usage: "the GPUs a GPU host's agent registered with its DPU", Flags: []ucli.Flag{outputFlag()}, Action: ingestGPUs},
			{Name: "models", Usage: "the models a DPU's ingest agent serves, as tensors", Flags: []ucli.Flag{outputFlag()}, Action: ingestModels},
		},
	}
}

type ingestStatsReport struct {
	Agent *agent.Stats     `json:"ingest,omitempty"`
	Host  *hostagent.Stats `json:"ingest_host,omitempty"`
}

func ingestStats(c *ucli.Context) error {
	asJSON, err := wantJSON(c)
	if err != nil {
		return err
	}
	rep := ingestStatsReport{Agent: &agent.Stats{}, Host: &hostagent.Stats{}}
	found, err := fetchStats(c, map[string]any{ingestAgent: rep.Agent, ingestHost: rep.Host})
	if err != nil {
		return err
	}
	if len(found) == 0 {
		return errors.New("the node's lovelockd runs no ingest service (ingest or ingest_host in its config)")
	}
	// What the node does not run stays out of the report.
	if !found[ingestAgent] {
		rep.Agent = nil
	}
	if !found[ingestHost] {
		rep.Host = nil
	}
	if asJSON {
		return writeJSON(c.App.Writer, rep)
	}
	w := c.App.Writer
	if a := rep.Agent; a != nil {
		if h := a.Host; h != nil {
			fmt.Fprintf(w, "ingest agent: GPU host %s, epoch %s, %d GPUs, models %s; last heartbeat %v ago\n", h.Addr, h.Epoch, len(h.GPUs),
				strings.Join(h.Models, ","), h.Seen.Round(time.Millisecond))
		} else {
			fmt.Fprintf(w, "ingest agent: no GPU host registered (start ingest_host on the GPU host; registrations are heard from host_peer %s naming a socket host_socket %s allows)\n",
				a.HostPeer, a.HostSocket)
		}
		fmt.Fprintf(w, "  requests: %d received, %d completed, %d late, %d canceled by the caller; refused %s\n", a.Received, a.Completed, a.LateResults,
			a.Canceled, refusals(a.Refused))
		fmt.Fprintf(w, "  now: %d in flight, %d waiting for a slice, %d bytes held; %d slots held for requests given up on; GPUs in use %v\n", a.InFlight, a.Queued, a.BufferBytes,
			a.SlotsHeld, a.GPUsInUse)
		fmt.Fprintf(w, "  bytes: %d from clients, %d written to slots, %d read from slots; %d input datagrams (%d duplicate, %d malformed; %d requests refused for fragments too small or too scattered), %d gRPC requests\n",
			a.BytesIn, a.BytesToDevice, a.BytesFromDevice, a.Fragments, a.Duplicates, a.Malformed, a.FragmentRefusals, a.InferCalls)
		// The percentiles are over completed requests: none, no latency.
		lat := "latency: none measured (no request completed)"
		if a.Completed > 0 {
			lat = fmt.Sprintf("latency p50 %v, p99 %v", a.P50.Round(time.Microsecond), a.P99.Round(time.Microsecond))
		}
		// A mean over no decision is no time.
		decision := "scheduler: no decision yet"
		if a.Decision > 0 {
			decision = fmt.Sprintf("scheduler %v per decision", a.Decision)
		}
		fmt.Fprintf(w, "  %s; %s; doorbells %d (%d rung again), results resent %d; held slots released unrun %d\n",
			lat, decision, a.Doorbells, a.Rerings, a.Resent, a.HeldReleased)
		fmt.Fprintf(w, "  host registrations %d (%d failed), host lost %d, host protocol errors %d, reassembly timeouts %d\n", a.Registrations, a.RegisterFailed, a.HostLost,
			a.ProtocolErrors, a.ReassemblyTimeouts)
		fmt.Fprintf(w, "  host control refused %d (from outside host_peer %s, or registrations naming a socket outside host_socket %s; the log says which)\n",
			a.HostRefused, a.HostPeer, a.HostSocket)
	}
	if h := rep.Host; h != nil {
		fmt.Fprintf(w, "GPU host agent: epoch %s, %d GPUs of %d slots; %s\n", h.Epoch, h.GPUs, h.Slots, hostRegistration(h))
		fmt.Fprintf(w, "  doorbells %d (%d repeated, %d stale, %d given up released unrun); ran %d, failed %d; %d bytes in, %d out; device time %v\n",
			h.Doorbells, h.Repeats, h.Stale, h.ReleasedUnrun, h.Completed, h.Failed, h.BytesIn, h.BytesOut, h.DeviceTime.Round(time.Microsecond))
		fmt.Fprintf(w, "  handles served %d, refused %d\n", h.HandlesServed, h.HandleRefused)
		if len(h.Workers) > 0 {
			names := make([]string, 0, len(h.Workers))
			for n := range h.Workers {
				names = append(names, n)
			}
			sort.Strings(names)
			var ws []string
			for _, n := range names {
				ws = append(ws, fmt.Sprintf("%s %d", n, h.Workers[n]))
			}
			fmt.Fprintf(w, "  external models: workers attached: %s; ran %d, failed %d; attaches %d, refused %d, lost mid-run %d, leftovers killed %d\n",
				strings.Join(ws, ", "), h.ExternalRuns, h.ExternalFailed, h.WorkerAttaches, h.WorkerRefused, h.WorkerLost, h.LeftoversKilled)
		}
	}
	return nil
}

// hostRegistration says whether the DPU acknowledges the host agent, and
// when not, what that looks like and where to look.
func hostRegistration(h *hostagent.Stats) string {
	switch {
	case h.Registered:
		return "registered with its DPU"
	case h.LastAck > 0:
		ago := h.LastAck.Round(time.Second)
		if ago == 0 {
			ago = h.LastAck.Round(time.Millisecond)
		}
		return fmt.Sprintf("not registered: last ack from its DPU %v ago; is the DPU's lovelockd running?", ago)
	default:
		return "not registered: no ack from its DPU yet; is the DPU's lovelockd running ingest, and does its host_listen match this host's dpu? (its log says why if it refused)"
	}
}

func refusals(m map[string]uint64) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, s := range []ingest.Status{ingest.StatusBadRequest, ingest.StatusUnknownModel, ingest.StatusNotGranted, ingest.StatusTooLarge,
		ingest.StatusDeadline, ingest.StatusOverloaded, ingest.StatusHostUnavailable, ingest.StatusModelFailed, ingest.StatusInternal} {
		if v := m[s.String()]; v > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", s, v))
		}
	}
	return strings.Join(parts, ", ")
}

func ingestGPUs(c *ucli.Context) error {
	asJSON, err := wantJSON(c)
	if err != nil {
		return err
	}
	var gpus []hostagent.GPUInfo
	if err := client(c).ServiceCall(c.Context, http.MethodGet, ingestHost, "gpus", nil, &gpus); err != nil {
		return noIngest(err, ingestHost)
	}
	if asJSON {
		return writeJSON(c.App.Writer, gpus)
	}
	tw := newTable(c.App.Writer)
	fmt.Fprintln(tw, "GPU\tKIND\tNAME\tCARD\tMIG\tMEMORY\tSLOTS\tSLOT IN\tSLOT OUT")
	for _, g := range gpus {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%v\t%d\t%d\t%d\t%d\n", g.Index, g.Kind, g.Name, g.Card, g.MIG, g.MemBytes, g.Slots, g.SlotIn, g.SlotOut)
	}
	return tw.Flush()
}

func ingestModels(c *ucli.Context) error {
	asJSON, err := wantJSON(c)
	if err != nil {
		return err
	}
	var models []ingest.ModelInfo
	if err := client(c).ServiceCall(c.Context, http.MethodGet, ingestAgent, "models", nil, &models); err != nil {
		return noIngest(err, ingestAgent)
	}
	if asJSON {
		return writeJSON(c.App.Writer, models)
	}
	tw := newTable(c.App.Writer)
	fmt.Fprintln(tw, "MODEL\tREADY\tINPUT ROW\tOUTPUT ROW\tMAX INPUT\tTENANTS")
	for _, m := range models {
		tenants := "all"
		if len(m.Tenants) > 0 {
			tenants = fmt.Sprint(m.Tenants)
		}
		// Ready: a registered GPU host runs it now (KServe's ModelReady).
		ready := "no"
		if m.Ready {
			ready = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s%v\t%s%v\t%d\t%s\n", m.Name, ready, m.Datatype, m.RowShape, m.OutDatatype, m.OutRowShape, m.MaxInput, tenants)
	}
	return tw.Flush()
}

func noIngest(err error, svc string) error {
	if serviceMissing(err) {
		return fmt.Errorf("%w (the node's lovelockd runs no %s service: see its config)", err, svc)
	}
	return err
}
