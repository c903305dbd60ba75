package kserve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	pb "github.com/lovelock-dpu/lovelock/dataplane/ingest/kserve/inferencepb"
)

// allocated returns the bytes f allocates.
func allocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// TestTypedContentsCheckedBeforeConversion: typed contents over the
// model's largest input are refused as too-large (INVALID_ARGUMENT, the
// limit in the message) before they are converted to bytes. Before, a
// 4 Mi-element INT64 tensor was converted to 32 MiB first, and a BYTES
// tensor of millions of empty elements (2 bytes each on the wire) was
// taken apart before it was found empty.
func TestTypedContentsCheckedBeforeConversion(t *testing.T) {
	i64 := ingest.ModelInfo{Name: "i64", RowBytes: 8, MaxInput: 8 << 20, Datatype: "INT64", RowShape: []int64{1},
		OutDatatype: "UINT32", OutRowShape: []int64{2}, Ready: true}
	bytes1m := like(checksumInfo, "bytes1m")
	bytes1m.MaxInput = 1 << 20
	srv := NewServer(&fake{}, catalog{i64, bytes1m}, Options{})
	const n = 4 << 20
	ints := make([]int64, n)
	empties := make([][]byte, n)
	for i := range empties {
		empties[i] = []byte{}
	}
	tensor := func(mdl, dt string, shape int64, c *pb.InferTensorContents) *pb.ModelInferRequest {
		return &pb.ModelInferRequest{ModelName: mdl, Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: dt, Shape: []int64{shape}, Contents: c}}}
	}
	for _, tc := range []struct {
		name  string
		req   *pb.ModelInferRequest
		limit string
	}{
		{"INT64, shape says 32 MiB", tensor("i64", "INT64", n, &pb.InferTensorContents{Int64Contents: ints}), "8388608"},
		{"INT64, shape says 8 bytes, 32 MiB of elements", tensor("i64", "INT64", 1, &pb.InferTensorContents{Int64Contents: ints}), "8388608"},
		{"BYTES, 4 Mi empty elements", tensor("bytes1m", "BYTES", n, &pb.InferTensorContents{BytesContents: empties}), "1048576"},
		{"BYTES, shape says 1 element, 4 Mi empty ones", tensor("bytes1m", "BYTES", 1, &pb.InferTensorContents{BytesContents: empties}), "1048576"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			alloc := allocated(func() { _, err = srv.ModelInfer(context.Background(), tc.req) })
			st, _ := status.FromError(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "too-large") || !strings.Contains(st.Message(), tc.limit) {
				t.Errorf("ModelInfer: %v; want INVALID_ARGUMENT, too-large, saying the limit %s", err, tc.limit)
			}
			if alloc > 1<<20 {
				t.Errorf("ModelInfer allocated %d KiB refusing it: the contents were converted before the size check", alloc>>10)
			}
		})
	}
	// Typed contents within the limit still convert.
	r := tensor("i64", "INT64", 3, &pb.InferTensorContents{Int64Contents: []int64{1, -2, 3}})
	data, _, err := inputBytes(r, i64.MaxInput)
	if err != nil || len(data) != 24 || data[8] != 0xfe {
		t.Errorf("3 INT64 elements: %x, %v", data, err)
	}
}

// serveLimited is serve with the connection limit of opts.Listener.
func serveLimited(t *testing.T, sub ingest.Submitter, cat ingest.Catalog, opts Options) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewGRPCServer(sub, cat, opts)
	done := make(chan error, 1)
	go func() { done <- s.Serve(opts.Listener(lis)) }()
	t.Cleanup(func() {
		s.Stop()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return lis.Addr().String()
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(DefaultMaxRecvMsgSize)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestMessageLimitFromMaxInput: with Options.MaxInput the message limit is
// that input plus MsgOverhead, not 64 MiB: gRPC refuses a larger message
// (RESOURCE_EXHAUSTED, saying the limit) before the service sees it.
func TestMessageLimitFromMaxInput(t *testing.T) {
	f := &fake{}
	conn := dial(t, serveLimited(t, f, testCatalog, Options{MaxInput: 1 << 20}))
	if _, err := Infer(context.Background(), conn, "checksum", 0, pattern(1<<20), checksumInfo); err != nil {
		t.Fatalf("Infer of MaxInput: %v", err)
	}
	c := pb.NewGRPCInferenceServiceClient(conn)
	_, err := c.ModelInfer(context.Background(), &pb.ModelInferRequest{ModelName: "checksum", RawInputContents: [][]byte{pattern(1<<20 + MsgOverhead)},
		Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "UINT8", Shape: []int64{1<<20 + MsgOverhead}}}})
	limit := fmt.Sprint(1<<20 + MsgOverhead)
	if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), limit) {
		t.Errorf("message over MaxInput+MsgOverhead: %v; want RESOURCE_EXHAUSTED naming %s", err, limit)
	}
	if n := len(f.calls()); n != 1 {
		t.Errorf("submitter called %d times, want 1", n)
	}
	if got := (Options{}).maxRecv(); got != DefaultMaxRecvMsgSize {
		t.Errorf("Options{} message limit %d, want %d", got, DefaultMaxRecvMsgSize)
	}
}

// gate is a Submitter whose calls wait until it opens, counting how many
// wait at once.
type gate struct {
	mu        sync.Mutex
	in, most  int
	open      chan struct{}
	inChanged chan struct{}
}

func (g *gate) Infer(ctx context.Context, r *ingest.Request) (*ingest.Result, error) {
	g.mu.Lock()
	g.in++
	g.most = max(g.most, g.in)
	g.mu.Unlock()
	g.inChanged <- struct{}{}
	<-g.open
	g.mu.Lock()
	g.in--
	g.mu.Unlock()
	return &ingest.Result{Output: make([]byte, 8)}, nil
}

// TestConcurrencyLimits: a connection carries at most MaxConcurrentStreams
// calls at once (the others wait, and complete later), and the server
// serves at most MaxConnections connections at once (another is accepted
// when one closes).
func TestConcurrencyLimits(t *testing.T) {
	g := &gate{open: make(chan struct{}), inChanged: make(chan struct{}, 100)}
	addr := serveLimited(t, g, testCatalog, Options{MaxConcurrentStreams: 2, MaxConnections: 1})
	conn := dial(t, addr)
	ctx := context.Background()
	if _, err := pb.NewGRPCInferenceServiceClient(conn).ServerLive(ctx, &pb.ServerLiveRequest{}); err != nil {
		t.Fatal(err)
	}
	const calls = 5
	errs := make(chan error, calls)
	for range calls {
		go func() {
			_, err := Infer(ctx, conn, "checksum", 0, []byte{1}, checksumInfo)
			errs <- err
		}()
	}
	<-g.inChanged
	<-g.inChanged
	select {
	case <-g.inChanged:
		t.Errorf("a third call reached the service on a connection of MaxConcurrentStreams 2")
	case <-time.After(200 * time.Millisecond):
	}

	// A second connection is not served while the first is open.
	other := dial(t, addr)
	sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := pb.NewGRPCInferenceServiceClient(other).ServerLive(sctx, &pb.ServerLiveRequest{})
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("ServerLive on a second connection with MaxConnections 1: %v, want it to wait (DEADLINE_EXCEEDED)", err)
	}

	close(g.open)
	for range calls {
		if err := <-errs; err != nil {
			t.Errorf("call: %v", err)
		}
	}
	if g.most != 2 {
		t.Errorf("%d calls in the service at once, want 2", g.most)
	}
	conn.Close()
	sctx, cancel = context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := pb.NewGRPCInferenceServiceClient(other).ServerLive(sctx, &pb.ServerLiveRequest{}, grpc.WaitForReady(true)); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("ServerLive on the second connection once the first closed: %v", err)
	}
}

// TestIdleConnectionsLetGo: connections that hold every place among
// MaxConnections and make no call (here two that sent HTTP/2's preface and
// then nothing, as a client's idle channel) are closed after
// MaxConnectionIdle, and a waiting client is served. (Before, they held
// their places for good and every other client waited until its deadline.)
func TestIdleConnectionsLetGo(t *testing.T) {
	addr := serveLimited(t, &gate{open: make(chan struct{}), inChanged: make(chan struct{}, 100)}, testCatalog, Options{MaxConnections: 2, MaxConnectionIdle: 200 * time.Millisecond})
	var idle []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// The client preface and an empty SETTINGS frame.
		if _, err := c.Write(append([]byte(http2.ClientPreface), 0, 0, 0, byte(http2.FrameSettings), 0, 0, 0, 0, 0)); err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := pb.NewGRPCInferenceServiceClient(dial(t, addr)).ServerLive(ctx, &pb.ServerLiveRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("ServerLive while two idle connections held both places: %v", err)
	}
	for i, c := range idle {
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Errorf("idle connection %d: %v, want the server to close it", i, err)
		}
	}
}
