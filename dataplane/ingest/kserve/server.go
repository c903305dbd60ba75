package kserve

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	pb "github.com/lovelock-dpu/lovelock/dataplane/ingest/kserve/inferencepb"
)

// TenantHeader is the gRPC metadata key that carries the caller's tenant,
// in decimal. A call without it is tenant 0 (DefaultTenant): stock clients
// that know nothing of tenants are tenant 0, and whether tenant 0 may use
// a model is the DPU agent's grant to decide like any other.
const TenantHeader = "lovelock-tenant"

// DefaultTenant is the tenant of a call without TenantHeader.
const DefaultTenant uint32 = 0

// DefaultMaxRecvMsgSize is the largest request message the server takes
// when Options gives neither MaxRecvMsgSize nor MaxInput: 64 MiB, above
// gRPC's own default of 4 MiB, which is too small for the inputs
// accelerator ingest carries. Infer allows messages this large each way.
const DefaultMaxRecvMsgSize = 64 << 20

// MsgOverhead is what a request message may hold besides its input when
// the limit comes from Options.MaxInput: names, shape, parameters, and
// raw BYTES elements' length prefixes.
const MsgOverhead = 1 << 20

// DefaultMaxConcurrentStreams and DefaultMaxConnections bound the calls
// in progress on one connection and the connections served at once when
// Options leaves them zero. A call's message is read whole before it is
// checked, so together with the message limit they bound the received
// messages callers can make the server hold: 16 connections of 16 calls of
// a 9 MiB message (8 MiB slots) is 2.3 GiB at most. Decoding them takes up
// to DecodeExpansion times more, which Options.MemoryBudget bounds.
const (
	DefaultMaxConcurrentStreams = 16
	DefaultMaxConnections       = 16
)

// DefaultMaxConnectionIdle is how long a connection with no call in
// progress keeps its place among MaxConnections when Options leaves it
// zero; handshakeTimeout how long a new one may take to start HTTP/2
// (gRPC's default is 120 s). Without them, MaxConnections clients that
// keep idle channels open, or connections that send nothing, hold every
// place for good and lock every other client out.
const (
	DefaultMaxConnectionIdle = time.Minute
	handshakeTimeout         = 10 * time.Second
)

// The names the server gives things: the one input and output tensor in
// ModelMetadata (a request's input may have any name), the single model
// version, and the platform.
const (
	InputName    = "input"
	OutputName   = "output"
	ModelVersion = "1"
	Platform     = "lovelock"
	ServerName   = "lovelock"
)

// Options configure the front end.
type Options struct {
	// Version is the server version ServerMetadata reports: the
	// caller's build version (dataplane cannot import control/buildinfo).
	// Empty reports "unknown".
	Version string
	// MaxRecvMsgSize bounds a request message, input included, in bytes;
	// zero means MaxInput plus MsgOverhead, or DefaultMaxRecvMsgSize
	// without MaxInput. gRPC fixes it when the server is made, so it
	// applies only through NewGRPCServer or ServerOptions, not Register.
	// Clients must allow as much on their side (Triton's Python client
	// does; Infer does up to DefaultMaxRecvMsgSize).
	MaxRecvMsgSize int
	// MaxInput is the largest input any model takes (the GPU host's
	// slot input, or the largest max_input), from which the message
	// limit follows when MaxRecvMsgSize is zero. Each call is checked
	// against its own model's MaxInput from the catalog besides.
	MaxInput int
	// MaxConcurrentStreams bounds the calls in progress on one
	// connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: a client's
	// further calls wait for one to end); zero means
	// DefaultMaxConcurrentStreams.
	MaxConcurrentStreams uint32
	// MaxConnections bounds the connections served at once by a
	// listener from Listener: further ones wait in the kernel's accept
	// queue until one closes. Zero means DefaultMaxConnections.
	MaxConnections int
	// MaxConnectionIdle is how long a connection with no call in
	// progress stays open: then the server closes it (HTTP/2 GOAWAY;
	// gRPC clients reconnect on their next call), giving its place to
	// the connections waiting. Zero means DefaultMaxConnectionIdle.
	MaxConnectionIdle time.Duration
	// MemoryBudget bounds, in bytes, the memory ModelInfer calls hold at
	// once, server-wide: each call takes its DecodeCost (from its
	// message's size) before its message is decoded, keeps about its
	// decoded size once its input is converted, and returns it when it
	// ends. A call that finds too little waits up to BudgetWait, then
	// fails with RESOURCE_EXHAUSTED (overloaded, retryable); one that
	// needs more than the whole budget fails at once as too-large. Zero
	// means DefaultBudgetMessages times the largest message's DecodeCost.
	MemoryBudget int64
	// BudgetWait is how long a call waits for MemoryBudget, or until its
	// own deadline if sooner; zero means DefaultBudgetWait.
	BudgetWait time.Duration
}

// Validate checks the options that can be wrong.
func (o Options) Validate() error {
	switch need := DecodeCost(o.maxRecv()); {
	case o.MaxRecvMsgSize < 0 || o.MaxInput < 0 || o.MaxConnections < 0:
		return fmt.Errorf("kserve: negative message, input or connection limit (%d, %d, %d): want 0 (the default) or more",
			o.MaxRecvMsgSize, o.MaxInput, o.MaxConnections)
	case o.MaxConnectionIdle < 0:
		return fmt.Errorf("kserve: max connection idle %v: want 0 (the default) or more", o.MaxConnectionIdle)
	case o.MemoryBudget < 0 || o.BudgetWait < 0:
		return fmt.Errorf("kserve: memory budget %d, budget wait %v: want 0 (the default) or more", o.MemoryBudget, o.BudgetWait)
	case o.MemoryBudget > 0 && o.MemoryBudget < need:
		return fmt.Errorf("kserve: memory budget %d bytes is less than the %d bytes decoding the largest message accepted (%d bytes) may take: raise the budget to at least that, or lower the message limit",
			o.MemoryBudget, need, o.maxRecv())
	}
	return nil
}

func (o Options) budget() int64 {
	if o.MemoryBudget > 0 {
		return o.MemoryBudget
	}
	return DefaultBudgetMessages * DecodeCost(o.maxRecv())
}

func (o Options) budgetWait() time.Duration {
	if o.BudgetWait > 0 {
		return o.BudgetWait
	}
	return DefaultBudgetWait
}

func (o Options) maxRecv() int {
	switch {
	case o.MaxRecvMsgSize > 0:
		return o.MaxRecvMsgSize
	case o.MaxInput > 0:
		return o.MaxInput + MsgOverhead
	}
	return DefaultMaxRecvMsgSize
}

func (o Options) maxStreams() uint32 {
	if o.MaxConcurrentStreams > 0 {
		return o.MaxConcurrentStreams
	}
	return DefaultMaxConcurrentStreams
}

func (o Options) maxConns() int {
	if o.MaxConnections > 0 {
		return o.MaxConnections
	}
	return DefaultMaxConnections
}

func (o Options) maxIdle() time.Duration {
	if o.MaxConnectionIdle > 0 {
		return o.MaxConnectionIdle
	}
	return DefaultMaxConnectionIdle
}

// ServerOptions returns the grpc.ServerOptions the front end needs, for a
// caller that makes its own grpc.Server and then calls Register: the
// message limit, the calls per connection, how long an idle or silent
// connection is kept, and the codec that charges ModelInfer messages to
// MemoryBudget before decoding them (gRPC's proto codec otherwise; without
// it the budget bounds conversion, not decoding).
func (o Options) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(o.maxRecv()), grpc.MaxConcurrentStreams(o.maxStreams()),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: o.maxIdle()}),
		grpc.ConnectionTimeout(handshakeTimeout),
		grpc.ForceServerCodecV2(budgetCodec{encoding.GetCodecV2(grpcproto.Name)})}
}

// Listener returns ln limited to MaxConnections connections at once; serve
// the grpc.Server on it.
func (o Options) Listener(ln net.Listener) net.Listener {
	return netutil.LimitListener(ln, o.maxConns())
}

// Server is the KServe v2 GRPCInferenceService over a Submitter and a
// Catalog. It keeps no state of its own but its memory budget: the catalog
// is read on each call.
type Server struct {
	pb.UnimplementedGRPCInferenceServiceServer
	sub    ingest.Submitter
	cat    ingest.Catalog
	opts   Options
	budget *budget
}

var _ pb.GRPCInferenceServiceServer = (*Server)(nil)

// NewServer returns the service. Register makes one and registers it with
// ModelInfer's memory bounded by Options.MemoryBudget; registered with
// inferencepb.RegisterGRPCInferenceServiceServer instead, it has no bound.
func NewServer(sub ingest.Submitter, cat ingest.Catalog, opts Options) *Server {
	return &Server{sub: sub, cat: cat, opts: opts, budget: newBudget(opts.budget(), opts.budgetWait())}
}

// Register registers the service on s and returns it. s should have been
// made with opts.ServerOptions(), or inputs over gRPC's 4 MiB default are
// refused.
func Register(s *grpc.Server, sub ingest.Submitter, cat ingest.Catalog, opts Options) *Server {
	srv := NewServer(sub, cat, opts)
	s.RegisterService(serviceDesc(), srv)
	return srv
}

// NewGRPCServer returns a grpc.Server with the front end's options,
// extra's after them, and the service registered.
func NewGRPCServer(sub ingest.Submitter, cat ingest.Catalog, opts Options, extra ...grpc.ServerOption) *grpc.Server {
	s := grpc.NewServer(append(opts.ServerOptions(), extra...)...)
	Register(s, sub, cat, opts)
	return s
}

// ServerLive answers true while the process serves gRPC at all.
func (s *Server) ServerLive(context.Context, *pb.ServerLiveRequest) (*pb.ServerLiveResponse, error) {
	return &pb.ServerLiveResponse{Live: true}, nil
}

// ServerReady answers true when at least one model is ready: KServe's
// ready is ready for inferencing, which a DPU with no GPU host serving
// any model is not.
func (s *Server) ServerReady(context.Context, *pb.ServerReadyRequest) (*pb.ServerReadyResponse, error) {
	for _, m := range s.cat.Models() {
		if m.Ready {
			return &pb.ServerReadyResponse{Ready: true}, nil
		}
	}
	return &pb.ServerReadyResponse{Ready: false}, nil
}

// ModelReady answers whether the catalog offers the model (in the version
// asked for, if any) and says it is ready, i.e. a GPU host serves it now;
// an unknown model is not ready, not an error.
func (s *Server) ModelReady(_ context.Context, r *pb.ModelReadyRequest) (*pb.ModelReadyResponse, error) {
	info, err := s.lookup(r.GetName(), r.GetVersion())
	return &pb.ModelReadyResponse{Ready: err == nil && info.Ready}, nil
}

// ServerMetadata reports ServerName and Options.Version. It lists no
// extensions: the protocol's optional extensions (repository, statistics,
// shared memory) are not served.
func (s *Server) ServerMetadata(context.Context, *pb.ServerMetadataRequest) (*pb.ServerMetadataResponse, error) {
	v := s.opts.Version
	if v == "" {
		v = "unknown"
	}
	return &pb.ServerMetadataResponse{Name: ServerName, Version: v, Extensions: []string{}}, nil
}

// ModelMetadata describes a model from its ModelInfo: one input and one
// output tensor, their first dimension the row count (-1: any; an output
// of one row whatever the input has 1). A -1 in OutRowShape stays -1: the
// response gives its size, from the result's length.
func (s *Server) ModelMetadata(ctx context.Context, r *pb.ModelMetadataRequest) (*pb.ModelMetadataResponse, error) {
	info, err := s.lookup(r.GetName(), r.GetVersion())
	if err != nil {
		return nil, toGRPC(ctx, err)
	}
	outFirst := int64(1)
	if info.OutPerRow {
		outFirst = -1
	}
	return &pb.ModelMetadataResponse{
		Name:     info.Name,
		Versions: []string{ModelVersion},
		Platform: Platform,
		Inputs: []*pb.ModelMetadataResponse_TensorMetadata{{
			Name: InputName, Datatype: info.Datatype, Shape: append([]int64{-1}, info.RowShape...),
		}},
		Outputs: []*pb.ModelMetadataResponse_TensorMetadata{{
			Name: OutputName, Datatype: info.OutDatatype, Shape: append([]int64{outFirst}, info.OutRowShape...),
		}},
	}, nil
}

// ModelInfer checks the request against the model's ModelInfo, hands it to
// the Submitter with the tenant from TenantHeader and the call's deadline,
// and returns the output as one raw tensor named OutputName. Failures are
// gRPC statuses whose code is Code(status), with an ErrorInfo detail
// naming the ingest status (see ErrorDomain).
func (s *Server) ModelInfer(ctx context.Context, r *pb.ModelInferRequest) (*pb.ModelInferResponse, error) {
	resp, err := s.infer(ctx, r)
	return resp, toGRPC(ctx, err)
}

func (s *Server) infer(ctx context.Context, r *pb.ModelInferRequest) (*pb.ModelInferResponse, error) {
	info, err := s.lookup(r.GetModelName(), r.GetModelVersion())
	if err != nil {
		return nil, err
	}
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	for _, o := range r.GetOutputs() {
		if o.GetName() != OutputName {
			return nil, badRequest("model %s has one output, %q; the request asks for %q", info.Name, OutputName, o.GetName())
		}
	}
	data, bytesElems, err := inputBytes(r, info.MaxInput)
	if err != nil {
		return nil, err
	}
	converted(ctx, r)
	rows, err := checkInput(info, r.GetInputs()[0], len(data), bytesElems)
	if err != nil {
		return nil, err
	}
	req := &ingest.Request{Tenant: tenant, Model: info.Name, Input: data}
	if d, ok := ctx.Deadline(); ok {
		req.Deadline = d
	}
	res, err := s.sub.Infer(ctx, req)
	if err != nil {
		return nil, err
	}
	shape := outputShape(info, rows, len(res.Output))
	if n, ok := product(shape); !ok || elemSize(info.OutDatatype) == 0 || n*int64(elemSize(info.OutDatatype)) != int64(len(res.Output)) {
		return nil, ingest.Errorf(ingest.StatusInternal, "model %s returned %d bytes, but its metadata says an output of shape %v of %s; the model's catalog entry is wrong", info.Name, len(res.Output), shape, info.OutDatatype)
	}
	return &pb.ModelInferResponse{
		ModelName:    info.Name,
		ModelVersion: ModelVersion,
		Id:           r.GetId(),
		Parameters: map[string]*pb.InferParameter{
			"lovelock_gpu":       {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: int64(res.GPU)}},
			"lovelock_slice":     {ParameterChoice: &pb.InferParameter_StringParam{StringParam: res.Slice}},
			"lovelock_queued_ns": {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: res.Queued.Nanoseconds()}},
			"lovelock_device_ns": {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: res.Device.Nanoseconds()}},
		},
		Outputs: []*pb.ModelInferResponse_InferOutputTensor{{
			Name: OutputName, Datatype: info.OutDatatype, Shape: shape,
		}},
		RawOutputContents: [][]byte{res.Output},
	}, nil
}

// lookup finds a model in the catalog. Models have the one version
// ModelVersion; an empty version means it.
func (s *Server) lookup(name, version string) (*ingest.ModelInfo, error) {
	models := s.cat.Models()
	for i := range models {
		if models[i].Name != name {
			continue
		}
		if version != "" && version != ModelVersion {
			return nil, ingest.Errorf(ingest.StatusUnknownModel, "model %s has only version %q, not %q; leave the version empty", name, ModelVersion, version)
		}
		return &models[i], nil
	}
	names := make([]string, len(models))
	for i, m := range models {
		names[i] = m.Name
	}
	sort.Strings(names)
	return nil, ingest.Errorf(ingest.StatusUnknownModel, "no model %q here; the models are %s", name, strings.Join(names, ", "))
}

// tenantOf reads TenantHeader from the call's metadata.
func tenantOf(ctx context.Context) (uint32, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(TenantHeader)
	switch len(vals) {
	case 0:
		return DefaultTenant, nil
	case 1:
		t, err := strconv.ParseUint(strings.TrimSpace(vals[0]), 10, 32)
		if err != nil {
			return 0, badRequest("metadata %s: %q is not a tenant number; send it in decimal", TenantHeader, vals[0])
		}
		return uint32(t), nil
	}
	return 0, badRequest("metadata %s given %d times; send it once", TenantHeader, len(vals))
}
