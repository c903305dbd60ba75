// Package memservice is far memory (SODA) in lovelockd, on the service
// frame (appliance/service): the memory server a memory node runs
// (ServerService, section memory_server) and the agent a DPU runs between
// its host's processes and the memory nodes (AgentService, section
// far_memory). The protocol and both parties live in dataplane/farmem.
package memservice

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/lovelock-dpu/lovelock/appliance/service"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
)

// ServerName is the memory server's service name.
const ServerName = "memserver"

// ServerService runs a memory node's far-memory server.
type ServerService struct {
	cfg    ServerConfig
	log    *slog.Logger
	server atomic.Pointer[farmem.Server]
	mux    *http.ServeMux
}

// NewServer returns the memory server of cfg (validated by the caller).
func NewServer(cfg ServerConfig, log *slog.Logger) *ServerService {
	s := &ServerService{cfg: cfg, log: log.With("service", ServerName)}
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("GET /regions", s.listRegions)
	s.mux.HandleFunc("POST /regions", s.createRegion)
	s.mux.HandleFunc("DELETE /regions/{id}", s.freeRegion)
	return s
}

// Name implements service.Service.
func (s *ServerService) Name() string { return ServerName }

// Interfaces implements service.Service: the server runs on a kernel UDP
// socket.
func (s *ServerService) Interfaces() []string { return nil }

// Plan implements service.Service.
func (s *ServerService) Plan() (service.Needs, error) { return service.Needs{}, s.cfg.Validate() }

// Run implements service.Service: it opens the state directory, reopening
// every region it holds, and serves until ctx ends.
func (s *ServerService) Run(ctx context.Context, b *service.Binding) error {
	opts := s.cfg.options()
	opts.Logger = s.log
	srv, err := farmem.NewServer(opts)
	if err != nil {
		return err
	}
	s.server.Store(srv)
	defer s.server.Store(nil)
	st := srv.Stats()
	s.log.Info("memory server", "addr", srv.Addr(), "state_dir", s.cfg.StateDir, "regions", st.Regions,
		"used", farmemSize(st.Used), "capacity", s.cfg.Capacity)
	b.Ready()
	return srv.Run(ctx)
}

func farmemSize(n uint64) string { return farmem.Size(n).String() }

// Stats implements service.Service: farmem.ServerStats.
func (s *ServerService) Stats() any {
	if srv := s.server.Load(); srv != nil {
		return srv.Stats()
	}
	return nil
}

// ServeHTTP serves the server's own calls under /v1/services/memserver:
//
//	GET    /regions             []farmem.RegionInfo (?tenant=N: that tenant's)
//	POST   /regions             api.MemCreate -> farmem.RegionInfo
//	DELETE /regions/{id}        free (?tenant=N: only if it is that tenant's)
func (s *ServerService) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

func (s *ServerService) running() (*farmem.Server, error) {
	if srv := s.server.Load(); srv != nil {
		return srv, nil
	}
	return nil, errors.New("the memory server is not running (see 'lovelock services')")
}

func tenantParam(r *http.Request) (uint32, error) {
	v := r.URL.Query().Get("tenant")
	if v == "" {
		return 0, nil
	}
	t, err := strconv.ParseUint(v, 10, 32)
	if err != nil {
		return 0, &api.BadRequestError{Err: fmt.Errorf("tenant %q: want a number", v)}
	}
	return uint32(t), nil
}

func (s *ServerService) listRegions(w http.ResponseWriter, r *http.Request) {
	srv, err := s.running()
	if err != nil {
		api.Reply(w, nil, err)
		return
	}
	tenant, err := tenantParam(r)
	if err != nil {
		api.Reply(w, nil, err)
		return
	}
	regions := srv.List(tenant)
	if regions == nil {
		regions = []farmem.RegionInfo{}
	}
	api.Reply(w, regions, nil)
}

func (s *ServerService) createRegion(w http.ResponseWriter, r *http.Request) {
	var req api.MemCreate
	if !api.ReadRequest(w, r, &req) {
		return
	}
	srv, err := s.running()
	if err != nil {
		api.Reply(w, nil, err)
		return
	}
	if req.Size == 0 && req.Preload == "" {
		api.Reply(w, nil, &api.BadRequestError{Err: errors.New("region: give a size, or a file to preload")})
		return
	}
	info, err := srv.Create(req.Tenant, req.Size, req.Writable, req.Preload)
	api.Reply(w, info, classify(err))
}

func (s *ServerService) freeRegion(w http.ResponseWriter, r *http.Request) {
	srv, err := s.running()
	if err != nil {
		api.Reply(w, nil, err)
		return
	}
	id, err := strconv.ParseUint(r.PathValue("id"), 10, 32)
	if err != nil {
		api.Reply(w, nil, &api.BadRequestError{Err: fmt.Errorf("region %q: want a number (see 'lovelock mem regions')", r.PathValue("id"))})
		return
	}
	tenant, err := tenantParam(r)
	if err != nil {
		api.Reply(w, nil, err)
		return
	}
	api.Reply(w, struct{}{}, classify(srv.Free(tenant, uint32(id))))
}

// classify gives far-memory errors the API's kinds.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, farmem.ErrUnknownRegion):
		return &api.NotFoundError{Err: fmt.Errorf("%w (see 'lovelock mem regions')", err)}
	case errors.Is(err, farmem.ErrBadRequest), errors.Is(err, farmem.ErrNoSpace), errors.Is(err, farmem.ErrWrongTenant),
		errors.Is(err, farmem.ErrWriterBusy):
		return &api.BadRequestError{Err: err}
	}
	return err
}

var _ service.Service = (*ServerService)(nil)
