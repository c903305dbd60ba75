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
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
)

// TestKServeFrontEnd: the KServe v2 front end over the real agent: a
// stock-shaped ModelInfer lands in the GPU host's slot like a Lovelock
// request, refusals come back as their statuses, and the gRPC deadline
// is the request's.
func TestKServeFrontEnd(t *testing.T) {
	r := newRig(t, rigOptions{tenants: []TenantConfig{{ID: 1, Models: []string{"checksum", "mlp"}}, {ID: 2, Models: []string{"checksum"}}}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := kserve.NewGRPCServer(r.agent, r.agent, kserve.Options{})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(kserve.DefaultMaxRecvMsgSize), grpc.MaxCallRecvMsgSize(kserve.DefaultMaxRecvMsgSize)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
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
