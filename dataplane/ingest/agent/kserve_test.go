package agent

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/kserve"
	pb "github.com/lovelock-dpu/lovelock/dataplane/ingest/kserve/inferencepb"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
)

// TestKServeFrontEnd: the KServe v2 front end over the real agent: a
// stock-shaped ModelInfer lands in the GPU host's slot like a Lovelock
// request, refusals come back as their statuses, and the gRPC deadline
// is the request's.
func TestKServeFrontEnd(t *testing.T) {
	r := newRig(t, rigOptions{tenants: []TenantConfig{{ID: 1, Models: []string{"checksum", "mlp"}}, {ID: 2, Models: []string{"checksum"}}}})
	conn := r.kserve()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	in := randomBytes(5, 3<<20)
	out, err := kserve.Infer(ctx, conn, "checksum", 1, in, ModelInfo("checksum"))
	if want := model.Checksum(in); err != nil || !bytes.Equal(out, want[:]) {
		t.Errorf("checksum over gRPC: %x %v, want %x", out, err, want)
	}
	x := mlpInput(6, 32)
	out, err = kserve.Infer(ctx, conn, "mlp", 1, x, ModelInfo("mlp"))
	if err != nil || !bytes.Equal(out, reference(t, "mlp", x)) {
		t.Errorf("mlp over gRPC: %v, output differs from the reference", err)
	}
	for _, tc := range []struct {
		name   string
		tenant uint32
		model  string
		ctx    func() (context.Context, context.CancelFunc)
		want   ingest.Status
	}{
		{"not granted", 2, "mlp", func() (context.Context, context.CancelFunc) { return ctx, func() {} }, ingest.StatusNotGranted},
		{"deadline", 1, "checksum", func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, time.Nanosecond) }, ingest.StatusDeadline},
	} {
		c, cancel := tc.ctx()
		_, err := kserve.Infer(c, conn, tc.model, tc.tenant, mlpInput(1, 1), ModelInfo(tc.model))
		cancel()
		if ingest.StatusOf(err) != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if s := r.agent.Stats(); s.InFlight != 0 || s.BufferBytes != 0 {
		t.Errorf("left behind: %d in flight, %d bytes", s.InFlight, s.BufferBytes)
	}
}

// kserve serves the KServe front end over the rig's agent and returns a
// client connection to it.
func (r *rig) kserve() *grpc.ClientConn {
	r.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		r.t.Fatal(err)
	}
	srv := kserve.NewGRPCServer(r.agent, r.agent, kserve.Options{})
	go srv.Serve(ln)
	r.t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(kserve.DefaultMaxRecvMsgSize), grpc.MaxCallRecvMsgSize(kserve.DefaultMaxRecvMsgSize)))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { conn.Close() })
	return conn
}

// TestKServeReadiness: ServerReady and ModelReady over the real agent say
// whether a request could be served now: a model is ready while a GPU host
// is registered and runs it, the server while any model is; a configured
// model the host does not run is never ready, and every configured model
// keeps its metadata throughout.
func TestKServeReadiness(t *testing.T) {
	r := newRig(t, rigOptions{models: []ModelConfig{{Name: "checksum"}, {Name: "mlp"}, {Name: "mine"}},
		// Long enough that a loaded machine does not lose the host between checks.
		tweak: func(c *Config) { c.HostTimeout = 1500 * time.Millisecond }})
	c := pb.NewGRPCInferenceServiceClient(r.kserve())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	check := func(when string, server bool, models map[string]bool) {
		t.Helper()
		if res, err := c.ServerReady(ctx, &pb.ServerReadyRequest{}); err != nil || res.GetReady() != server {
			t.Errorf("%s: ServerReady %v, %v; want %v", when, res.GetReady(), err, server)
		}
		if res, err := c.ServerLive(ctx, &pb.ServerLiveRequest{}); err != nil || !res.GetLive() {
			t.Errorf("%s: ServerLive %v, %v; want live", when, res.GetLive(), err)
		}
		for name, want := range models {
			if res, err := c.ModelReady(ctx, &pb.ModelReadyRequest{Name: name}); err != nil || res.GetReady() != want {
				t.Errorf("%s: ModelReady %s %v, %v; want %v", when, name, res.GetReady(), err, want)
			}
			if _, err := c.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: name}); err != nil {
				t.Errorf("%s: ModelMetadata %s: %v", when, name, err)
			}
		}
	}
	check("host registered", true, map[string]bool{"checksum": true, "mlp": true, "mine": false})
	r.stopHost()
	for end := time.Now().Add(10 * time.Second); r.agent.Stats().Host != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("DPU never noticed the host stopped")
		}
	}
	check("no host", false, map[string]bool{"checksum": false, "mlp": false, "mine": false})
	r.startHost(0)
	r.waitRegistered()
	check("host registered again", true, map[string]bool{"checksum": true, "mlp": true, "mine": false})
}
