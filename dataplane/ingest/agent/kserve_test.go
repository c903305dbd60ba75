package agent

import (
	"bytes"
	"context"
	"fmt"
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

// TestKServeExternalOutput: a model the DPU does not know (one the host
// attaches) is published as bytes in and one row of bytes out whose
// length only the result gives ([1, -1]); a result of another length than
// its input is served with its actual shape and counted once, completed.
// Before, the output was described as one byte per input byte: such a
// result failed as INTERNAL at the gRPC client after the agent had
// counted it completed.
func TestKServeExternalOutput(t *testing.T) {
	half := &model.Model{Name: "half", Doc: "the input's first half", Multiple: 1, OutputSize: func(n int) int { return n / 2 },
		Reference: func(in, out []byte) int { return copy(out, in[:len(in)/2]) }}
	r := newRig(t, rigOptions{models: []ModelConfig{{Name: "checksum"}, {Name: "half"}}, hostModels: []*model.Model{half}})
	c := pb.NewGRPCInferenceServiceClient(r.kserve())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	md, err := c.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: "half"})
	if err != nil {
		t.Fatal(err)
	}
	if o := md.GetOutputs(); len(o) != 1 || o[0].GetDatatype() != "UINT8" || fmt.Sprint(o[0].GetShape()) != "[1 -1]" {
		t.Errorf("metadata output %v, want one UINT8 [1 -1]", o)
	}
	for i, n := range []int{2, 1000, 4097} {
		in := randomBytes(uint64(i), n)
		resp, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "half",
			Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "UINT8", Shape: []int64{int64(n), 1}}},
			RawInputContents: [][]byte{in}})
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		o := resp.GetOutputs()
		if len(o) != 1 || o[0].GetDatatype() != "UINT8" || fmt.Sprint(o[0].GetShape()) != fmt.Sprint([]int64{1, int64(n / 2)}) ||
			len(resp.GetRawOutputContents()) != 1 || !bytes.Equal(resp.GetRawOutputContents()[0], in[:n/2]) {
			t.Errorf("%d bytes: outputs %v, want one UINT8 [1 %d] holding the input's first half", n, o, n/2)
		}
	}
	if s := r.agent.Stats(); s.Completed != 3 || len(s.Refused) != 0 {
		t.Errorf("completed %d, refused %v; want 3, none", s.Completed, s.Refused)
	}
}
