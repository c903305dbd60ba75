package kserve

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	pb "github.com/lovelock-dpu/lovelock/dataplane/ingest/kserve/inferencepb"
)

// serveBudget serves the front end like NewGRPCServer (or, with plain, on
// a grpc.Server made without ServerOptions) and returns a client and the
// service, whose budget's waiting hook is waiting.
func serveBudget(t *testing.T, sub ingest.Submitter, opts Options, plain bool, waiting func()) pb.GRPCInferenceServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var s *grpc.Server
	if plain {
		s = grpc.NewServer(grpc.MaxRecvMsgSize(opts.maxRecv()))
	} else {
		s = grpc.NewServer(opts.ServerOptions()...)
	}
	srv := Register(s, sub, testCatalog, opts)
	srv.budget.waiting = waiting
	done := make(chan error, 1)
	go func() { done <- s.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		s.Stop()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return pb.NewGRPCInferenceServiceClient(conn)
}

// rawRequest is a raw UINT8 input of n bytes for mdl.
func rawRequest(mdl string, n int) *pb.ModelInferRequest {
	return &pb.ModelInferRequest{ModelName: mdl, RawInputContents: [][]byte{pattern(n)},
		Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "UINT8", Shape: []int64{int64(n)}}}}
}

// TestMemoryBudget: a ModelInfer call takes its DecodeCost of
// Options.MemoryBudget before its message is decoded and keeps about its
// input's size while the submitter has it (a raw input: twice it). A second call that finds too
// little waits up to BudgetWait and is refused RESOURCE_EXHAUSTED, saying
// the server is busy, or goes through once the first call ends; a call
// that needs more than the whole budget is refused at once as too-large.
// Before, nothing bounded the calls' memory: every call went through.
func TestMemoryBudget(t *testing.T) {
	req := rawRequest("checksum", 64<<10)
	cost := decodeCost(proto.Size(req), 1)
	held := heldCost(proto.Size(req), 1, req) // about 2 x 64 KiB, not cost
	for _, tc := range []struct {
		name   string
		budget int64
		wait   time.Duration
		plain  bool // a grpc.Server without ServerOptions: charged after decoding
		first  bool // a first call holds part of the budget in the submitter
		code   codes.Code
		msg    string
		waits  bool
	}{
		{"one call, budget its cost", cost, time.Minute, false, false, codes.OK, "", false},
		{"second call refused", cost, time.Nanosecond, false, true, codes.ResourceExhausted, "the server is busy", true},
		{"second call waits for the first", cost, time.Minute, false, true, codes.OK, "", true},
		{"second call fits beside the first's input", cost + held, time.Nanosecond, false, true, codes.OK, "", false},
		{"over the whole budget", cost - 1, time.Minute, false, false, codes.InvalidArgument, "more than the server's whole decode budget", false},
		{"plain server: second call refused", cost, time.Nanosecond, true, true, codes.ResourceExhausted, "retry", true},
		{"plain server: over the whole budget", cost - 1, time.Minute, true, false, codes.InvalidArgument, "too-large", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &gate{open: make(chan struct{}), inChanged: make(chan struct{}, 10)}
			waiting := make(chan struct{}, 10)
			c := serveBudget(t, g, Options{MemoryBudget: tc.budget, BudgetWait: tc.wait}, tc.plain, func() { waiting <- struct{}{} })
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			firstErr := make(chan error, 1)
			if tc.first {
				go func() { _, err := c.ModelInfer(ctx, req); firstErr <- err }()
				<-g.inChanged // the first call is in the submitter, its budget shrunk
			}
			secondErr := make(chan error, 1)
			go func() { _, err := c.ModelInfer(ctx, req); secondErr <- err }()
			opened := false
			open := func() {
				if !opened {
					close(g.open)
					opened = true
				}
			}
			var err error
			waited := false
			for got := false; !got; {
				select {
				case <-waiting:
					waited = true
					if tc.code == codes.OK {
						open() // the first call ends; the second follows
					}
				case <-g.inChanged:
					if tc.code != codes.OK {
						t.Errorf("the call reached the submitter; want it refused before")
					}
					open()
				case err = <-secondErr:
					got = true
				}
			}
			open()
			st, _ := status.FromError(err)
			if st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg) {
				t.Errorf("call: %v; want %v saying %q", err, tc.code, tc.msg)
			}
			if tc.first {
				if err := <-firstErr; err != nil {
					t.Errorf("first call: %v", err)
				}
			}
			// The hook runs before the call ends: if select took the
			// call's end first, it is in the channel.
			if waited = waited || len(waiting) > 0; waited != tc.waits {
				t.Errorf("the call waited for the budget: %v, want %v", waited, tc.waits)
			}
		})
	}
}

// TestMemoryBudgetReturned: every call returns its budget when it ends,
// whatever the outcome, so after many failed calls (and calls refused for
// want of budget) a call that needs the whole budget still goes through at
// once. A call that kept its budget would leave too little for it.
func TestMemoryBudgetReturned(t *testing.T) {
	big := rawRequest("checksum", 64<<10)
	cost := decodeCost(proto.Size(big), 1)
	wrongType := rawRequest("checksum", 8)
	wrongType.Inputs[0].Datatype = "INT8"
	twoInputs := rawRequest("checksum", 8)
	twoInputs.Inputs = append(twoInputs.Inputs, twoInputs.Inputs[0])
	typedBadValue := &pb.ModelInferRequest{ModelName: "checksum", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "UINT8",
		Shape: []int64{2}, Contents: &pb.InferTensorContents{UintContents: []uint32{1, 300}}}}}
	overBudget := rawRequest("checksum", 128<<10)
	// The fake's model "fail" fails with the status numbered like the
	// tenant.
	failing := metadata.AppendToOutgoingContext(context.Background(), TenantHeader, fmt.Sprint(uint8(ingest.StatusModelFailed)))
	for _, tc := range []struct {
		name string
		ctx  context.Context
		req  *pb.ModelInferRequest
		code codes.Code
	}{
		{"unknown model", context.Background(), rawRequest("nonesuch", 64<<10), codes.NotFound},
		{"wrong datatype", context.Background(), wrongType, codes.InvalidArgument},
		{"two inputs", context.Background(), twoInputs, codes.InvalidArgument},
		{"typed value out of range", context.Background(), typedBadValue, codes.InvalidArgument},
		{"submitter fails", failing, rawRequest("fail", 64<<10), codes.Internal},
		{"submitter's plain error", context.Background(), rawRequest("plain", 64<<10), codes.Internal},
		{"over the whole budget", context.Background(), overBudget, codes.InvalidArgument},
		{"succeeds", context.Background(), rawRequest("checksum", 1<<10), codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := serveBudget(t, &fake{}, Options{MemoryBudget: cost, BudgetWait: time.Nanosecond}, false, nil)
			for i := range 10 {
				_, err := c.ModelInfer(tc.ctx, tc.req)
				if got := status.Code(err); got != tc.code {
					t.Fatalf("call %d: %v, want %v", i, err, tc.code)
				}
			}
			if _, err := c.ModelInfer(context.Background(), big); err != nil {
				t.Errorf("a call needing the whole budget after 10 %s calls: %v; an earlier call kept its budget", tc.name, err)
			}
		})
	}
}

// TestDecodeCostBoundsMemory: what a request holds once decoded and
// converted, with the received message and gRPC's copy of it, stays within
// the DecodeCost charged for it, for the messages that expand most
// (measured in DecodeExpansion's comment), and within heldCost for those
// that convert.
func TestDecodeCostBoundsMemory(t *testing.T) {
	const n = 1 << 17
	fld := func(num protowire.Number, body []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), body)
	}
	times := func(k int, b []byte) []byte { return []byte(strings.Repeat(string(b), k)) }
	message := func(dt string, contents []byte) []byte {
		return append(fld(1, []byte("checksum")), fld(5, append(append(fld(1, []byte("input")), fld(2, []byte(dt))...), fld(5, contents)...))...)
	}
	var keys []byte
	for i := range n {
		keys = append(keys, fld(4, fld(1, []byte{byte(i & 0x7f), byte(i >> 7 & 0x7f), byte(i >> 14)}))...)
	}
	for _, tc := range []struct {
		name string
		wire []byte
	}{
		{"raw UINT8", func() []byte { b, _ := proto.Marshal(rawRequest("checksum", 1<<20)); return b }()},
		{"INT64 of 1-byte varints", message("INT64", fld(3, make([]byte, n)))},
		{"INT32 of 1-byte varints", message("INT32", fld(2, make([]byte, n)))},
		{"BYTES of empty elements", message("BYTES", times(n, fld(8, nil)))},
		{"empty raw contents", append(message("UINT8", nil), times(n, fld(7, nil))...)},
		{"empty inputs", times(n, fld(5, nil))},
		{"inputs with contents and parameters", times(n, fld(5, append(fld(5, nil), fld(4, nil)...)))},
		{"outputs with parameters", times(n, fld(6, fld(2, nil)))},
		{"parameters of distinct keys", keys},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := len(tc.wire)
			var m1, m2 runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&m1)
			r := &pb.ModelInferRequest{}
			if err := proto.Unmarshal(tc.wire, r); err != nil {
				t.Fatal(err)
			}
			data, _, convErr := inputBytes(r, 0)
			runtime.GC()
			runtime.ReadMemStats(&m2)
			held := int64(m2.HeapAlloc) - int64(m1.HeapAlloc)
			runtime.KeepAlive(r)
			runtime.KeepAlive(data)
			entries := countEntries(tc.wire)
			if cost := decodeCost(w, entries); held+2*int64(w) > cost {
				t.Errorf("%d wire bytes, %d entries: %d bytes held + 2 copies of the message > DecodeCost %d", w, entries, held, cost)
			}
			if convErr == nil {
				if after := heldCost(w, entries, r); held > after {
					t.Errorf("%d wire bytes: %d bytes held once converted > heldCost %d", w, held, after)
				}
			}
			t.Logf("%d wire bytes, %d entries: %.1fx held", w, entries, float64(held)/float64(w))
		})
	}
}

// TestOptionsValidate: negative settings and a budget too small for the
// largest message accepted are refused, saying what to set.
func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		opts Options
		want string // "" for valid
	}{
		{Options{}, ""},
		{Options{MaxInput: 8 << 20, MemoryBudget: DecodeCost(9 << 20)}, ""},
		{Options{MaxInput: 8 << 20, MemoryBudget: DecodeCost(9<<20) - 1}, "less than the " + fmt.Sprint(DecodeCost(9<<20)) + " bytes"},
		{Options{MemoryBudget: -1}, "memory budget -1"},
		{Options{BudgetWait: -time.Second}, "budget wait -1s"},
		{Options{MaxConnections: -1}, "negative"},
	} {
		err := tc.opts.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want %q", tc.opts, err, tc.want)
		}
	}
	if got, want := (Options{MaxInput: 8 << 20}).budget(), DefaultBudgetMessages*DecodeCost(9<<20); got != want {
		t.Errorf("default budget for 8 MiB inputs: %d, want %d", got, want)
	}
}

// TestSplitContentsRefused: an input whose typed contents come in more
// than maxContentRuns packed runs, counted over every occurrence of its
// contents (decoding merges them), is refused as a bad request before it
// is decoded. protobuf-go decodes n one-element runs in O(n²): before,
// 100 000 of them in 300 KB held a core for 12.7 s.
func TestSplitContentsRefused(t *testing.T) {
	fld := func(num protowire.Number, body []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), body)
	}
	times := func(k int, b []byte) []byte { return []byte(strings.Repeat(string(b), k)) }
	tensor := func(fields ...[]byte) []byte {
		b := append(fld(1, []byte("input")), fld(2, []byte("INT64"))...)
		for _, f := range fields {
			b = append(b, f...)
		}
		return fld(5, b)
	}
	input := func(contents ...[]byte) []byte {
		var fields [][]byte
		for _, c := range contents {
			fields = append(fields, fld(5, c))
		}
		return tensor(fields...)
	}
	run := fld(3, []byte{1}) // one int64_contents element, packed
	codec := budgetCodec{encoding.GetCodecV2(grpcproto.Name)}
	for _, tc := range []struct {
		name    string
		wire    []byte
		refused bool
		elems   int // int64 elements decoded, when not refused
	}{
		{"one run", append(fld(1, []byte("m")), input(fld(3, make([]byte, 1000)))...), false, 1000},
		{"the most runs", append(fld(1, []byte("m")), input(times(maxContentRuns, run))...), false, maxContentRuns},
		{"one run too many", append(fld(1, []byte("m")), input(times(maxContentRuns+1, run))...), true, 0},
		{"split over two contents", append(fld(1, []byte("m")), input(times(9, run), times(9, run))...), true, 0},
		{"runs of two inputs", append(append(fld(1, []byte("m")), input(times(9, run))...), input(times(9, run))...), false, 9},
		{"100 000 runs", append(fld(1, []byte("m")), input(times(100000, run))...), true, 0},
		{"shape in one run", append(fld(1, []byte("m")), tensor(fld(3, []byte{2, 3}), fld(5, fld(3, make([]byte, 6))))...), false, 6},
		{"shape in the most runs", append(fld(1, []byte("m")), tensor(times(maxContentRuns, fld(3, []byte{1})), fld(5, run))...), false, 1},
		{"shape in 100 000 runs", append(fld(1, []byte("m")), tensor(times(100000, fld(3, []byte{1})), fld(5, run))...), true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &inferRequest{ModelInferRequest: new(pb.ModelInferRequest), ctx: context.Background(), budget: newBudget(1<<40, time.Second)}
			defer func() { r.hold.release() }()
			if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(tc.wire)}, r); err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.refused && (ingest.StatusOf(r.err) != ingest.StatusBadRequest || !strings.Contains(r.err.Error(), "packed runs")):
				t.Errorf("%v, want a bad request naming the packed runs", r.err)
			case !tc.refused && r.err != nil:
				t.Errorf("refused: %v", r.err)
			case !tc.refused && len(r.GetInputs()[0].GetContents().GetInt64Contents()) != tc.elems:
				t.Errorf("%d elements decoded, want %d", len(r.GetInputs()[0].GetContents().GetInt64Contents()), tc.elems)
			}
		})
	}
}
