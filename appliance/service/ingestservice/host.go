package ingestservice

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/lovelock-dpu/lovelock/appliance/service"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/hostagent"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
)

// HostName is the GPU host agent's service name.
const HostName = "ingest_host"

// HostService runs a GPU host's ingest agent.
type HostService struct {
	cfg   HostConfig
	log   *slog.Logger
	agent atomic.Pointer[hostagent.Agent]
	mux   *http.ServeMux
}

// NewHost returns the GPU host agent of cfg (validated by the caller).
func NewHost(cfg HostConfig, log *slog.Logger) *HostService {
	s := &HostService{cfg: cfg, log: log.With("service", HostName)}
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("GET /gpus", s.gpus)
	return s
}

// Name implements service.Service.
func (s *HostService) Name() string { return HostName }

// Interfaces implements service.Service: the host agent talks to its DPU
// through a kernel socket.
func (s *HostService) Interfaces() []string { return nil }

// Plan implements service.Service.
func (s *HostService) Plan() (service.Needs, error) { return service.Needs{}, s.cfg.Validate() }

// Run implements service.Service: it allocates the slot buffers on the
// devices, registers them with the DPU and serves doorbells until ctx
// ends. A restart registers a new epoch: the DPU drops the old buffers.
func (s *HostService) Run(ctx context.Context, b *service.Binding) error {
	devs, cards, err := s.devices()
	if err != nil {
		return err
	}
	defer func() {
		for _, d := range devs {
			d.Close()
		}
	}()
	tr, err := udp.Listen(s.cfg.Listen, udp.Options{ReadBuffer: 1 << 20, WriteBuffer: 1 << 20})
	if err != nil {
		return fmt.Errorf("ingest_host: listen on %v: %w", s.cfg.Listen, err)
	}
	defer tr.Close()
	a, err := hostagent.New(hostagent.Config{Transport: tr, DPU: s.cfg.DPU, Devices: devs, Cards: cards, HandleSocket: s.cfg.Socket,
		Models: s.cfg.models(), SlotInput: int(s.cfg.SlotInput), SlotOutput: int(s.cfg.SlotOutput), Heartbeat: s.cfg.Heartbeat.D(), Logger: s.log,
		WorkerSocket: s.cfg.WorkerSocket, RunTimeout: s.cfg.RunTimeout.D(), WorkerWait: s.cfg.WorkerWait.D(),
		// The agent opens its handle and worker sockets in Run.
		Ready: b.Ready})
	if err != nil {
		return err
	}
	s.agent.Store(a)
	defer s.agent.Store(nil)
	s.log.Info("GPU host agent", "listen", s.cfg.Listen, "dpu", s.cfg.DPU, "device", s.cfg.device(), "gpus", len(devs), "socket", s.cfg.Socket,
		"worker_socket", s.cfg.WorkerSocket)
	return a.Run(ctx)
}

// devices opens the configured devices and says each one's MIG card.
func (s *HostService) devices() ([]devmem.Device, []string, error) {
	var devs []devmem.Device
	var cards []string
	switch s.cfg.device() {
	case "shm":
		for i, g := range s.cfg.GPUs {
			devs = append(devs, devmem.NewShm(devmem.Info{Index: i, Name: "shm (" + g.Card + ")", Card: g.Card}))
			cards = append(cards, g.Card)
		}
		return devs, cards, nil
	}
	// The Python workers of external models map legacy CUDA IPC handles
	// (cupy opens them; it cannot map cuMemCreate descriptors), so with
	// external models every buffer is a cuMemAlloc one with such a handle.
	return cudaDevices(s.cfg.GPUs, len(s.cfg.ExternalModels) > 0, s.log)
}

// Stats implements service.Service: hostagent.Stats.
func (s *HostService) Stats() any {
	if a := s.agent.Load(); a != nil {
		return a.Stats()
	}
	return nil
}

// ServeHTTP serves the service's calls under /v1/services/ingest_host/.
func (s *HostService) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

func (s *HostService) gpus(w http.ResponseWriter, r *http.Request) {
	a := s.agent.Load()
	if a == nil {
		api.Reply(w, nil, fmt.Errorf("the GPU host agent is not running (see lovelock services)"))
		return
	}
	api.Reply(w, a.GPUs(), nil)
}

var _ service.Service = (*HostService)(nil)

// checkGeometry compares the MIG geometry GPU i reports (live, read from
// NVML; readErr where it could not be read) with the scheduler's table of
// card, the card the host agent registers it as. A GPU whose geometry
// differs is refused: the scheduler would place instances it cannot hold.
// One that cannot say (no NVML, or a driver without the calls) is taken
// on the table's word, and the returned note says so for the log.
func checkGeometry(i int, card string, live []mig.Profile, readErr error) (note string, err error) {
	if readErr != nil {
		return fmt.Sprintf("GPU %d: MIG geometry not checked against the %s table: %v", i, card, readErr), nil
	}
	c, err := mig.CardByName(card)
	if err != nil {
		return "", fmt.Errorf("ingest_host: GPU %d: %w", i, err)
	}
	if diffs := c.Compare(live); diffs != nil {
		return "", fmt.Errorf("ingest_host: GPU %d: its MIG geometry differs from the scheduler's %s table, so placements would be wrong: %s; "+
			"set gpus[%d].card to the card this GPU is, or report the driver's geometry to the developers",
			i, card, strings.Join(diffs, "; "), i)
	}
	return fmt.Sprintf("GPU %d: MIG geometry matches the %s table (%d profiles, from NVML)", i, card, len(live)), nil
}
