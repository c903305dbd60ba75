package kserve

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	pb "github.com/lovelock-dpu/lovelock/dataplane/ingest/kserve/inferencepb"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
)

// The fake catalog: the two built-in models as the agent would describe
// them with a GPU host serving them (ready), and test models that share checksum's tensors: "wait" blocks until
// the call ends, "fail" fails with the status numbered like its tenant,
// "plain" fails with an error that is no *ingest.Error, "badout" returns
// an output its metadata does not allow.
var (
	checksumInfo = ingest.ModelInfo{
		Name: "checksum", RowBytes: 1, MaxInput: 16 << 20,
		Datatype: "UINT8", RowShape: []int64{1},
		OutDatatype: "UINT32", OutRowShape: []int64{2}, Ready: true,
	}
	mlpInfo = ingest.ModelInfo{
		Name: "mlp", RowBytes: model.MLPIn * 4, MaxInput: 1 << 20,
		Datatype: "FP32", RowShape: []int64{model.MLPIn},
		OutDatatype: "FP32", OutRowShape: []int64{model.MLPOut}, OutPerRow: true, Ready: true,
	}
)

func like(info ingest.ModelInfo, name string) ingest.ModelInfo {
	info.Name = name
	return info
}

type catalog []ingest.ModelInfo

func (c catalog) Models() []ingest.ModelInfo { return c }

var testCatalog = catalog{checksumInfo, mlpInfo,
	like(checksumInfo, "wait"), like(checksumInfo, "fail"), like(checksumInfo, "plain"), like(checksumInfo, "badout")}

// fake is the Submitter: it runs the models' CPU references and records
// what it was handed.
type fake struct {
	mu      sync.Mutex
	reqs    []ingest.Request
	ctxDead []time.Time // each call's context deadline, zero if none
	entered chan struct{}
}

func (f *fake) Infer(ctx context.Context, r *ingest.Request) (*ingest.Result, error) {
	d, _ := ctx.Deadline()
	f.mu.Lock()
	f.reqs = append(f.reqs, *r)
	f.ctxDead = append(f.ctxDead, d)
	f.mu.Unlock()
	switch r.Model {
	case "checksum":
		sum := model.Checksum(r.Input)
		return &ingest.Result{Output: sum[:], GPU: 1, Slice: "1g.10gb@3", Queued: time.Microsecond, Device: time.Millisecond}, nil
	case "mlp":
		m, err := model.Builtin("mlp")
		if err != nil {
			return nil, err
		}
		out := make([]byte, m.OutputSize(len(r.Input)))
		return &ingest.Result{Output: out[:m.Reference(r.Input, out)]}, nil
	case "wait":
		if f.entered != nil {
			close(f.entered)
		}
		<-ctx.Done()
		return nil, ctx.Err()
	case "fail":
		return nil, ingest.Errorf(ingest.Status(r.Tenant), "failed as asked, tenant %d", r.Tenant)
	case "plain":
		return nil, errors.New("something broke")
	case "badout":
		return &ingest.Result{Output: []byte{1, 2, 3}}, nil
	}
	return nil, ingest.Errorf(ingest.StatusUnknownModel, "fake has no model %s", r.Model)
}

func (f *fake) calls() []ingest.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]ingest.Request(nil), f.reqs...)
}

// serve starts the front end on a loopback TCP port and returns a client
// connection to it.
func serve(t *testing.T, sub ingest.Submitter, cat ingest.Catalog, opts Options) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewGRPCServer(sub, cat, opts)
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
	return conn
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}

// mlpInput returns rows rows of float32s as bytes and as floats.
func mlpInput(rows int) ([]byte, []float32) {
	fs := make([]float32, rows*model.MLPIn)
	b := make([]byte, 4*len(fs))
	for i := range fs {
		fs[i] = float32(i%13)/8 - 0.7
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(fs[i]))
	}
	return b, fs
}

func mlpRef(t *testing.T, in []byte) []byte {
	m, err := model.Builtin("mlp")
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, m.OutputSize(len(in)))
	return out[:m.Reference(in, out)]
}

func TestInferRoundTrip(t *testing.T) {
	conn := serve(t, &fake{}, testCatalog, Options{})
	mlpIn, _ := mlpInput(3)
	for _, tc := range []struct {
		name  string
		model string
		info  ingest.ModelInfo
		input []byte
		want  []byte
	}{
		{"checksum 1 B", "checksum", checksumInfo, []byte{42}, nil},
		{"checksum 1000 B", "checksum", checksumInfo, pattern(1000), nil},
		{"checksum 9 MiB, over gRPC's 4 MiB default", "checksum", checksumInfo, pattern(9 << 20), nil},
		{"checksum with a zero ModelInfo", "checksum", ingest.ModelInfo{}, pattern(77), nil},
		{"mlp 3 rows", "mlp", mlpInfo, mlpIn, mlpRef(t, mlpIn)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			if want == nil {
				sum := model.Checksum(tc.input)
				want = sum[:]
			}
			got, err := Infer(context.Background(), conn, tc.model, 0, tc.input, tc.info)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("output %x, want %x", got, want)
			}
		})
	}
}

func TestModelInferResponse(t *testing.T) {
	conn := serve(t, &fake{}, testCatalog, Options{})
	c := pb.NewGRPCInferenceServiceClient(conn)
	in, _ := mlpInput(2)
	for _, tc := range []struct {
		name  string
		req   *pb.ModelInferRequest
		shape []int64
		dt    string
		slice string
	}{
		{"mlp: one output row per input row", &pb.ModelInferRequest{
			ModelName: "mlp", Id: "req-17",
			Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "FP32", Shape: []int64{2, 64}}},
			Outputs:          []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "output"}},
			RawInputContents: [][]byte{in},
		}, []int64{2, 16}, "FP32", ""},
		{"checksum: one output row", &pb.ModelInferRequest{
			ModelName: "checksum", ModelVersion: "1", Id: "x",
			Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "in", Datatype: "UINT8", Shape: []int64{5, 1}}},
			RawInputContents: [][]byte{[]byte("hello")},
		}, []int64{1, 2}, "UINT32", "1g.10gb@3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := c.ModelInfer(context.Background(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetId() != tc.req.GetId() || resp.GetModelName() != tc.req.GetModelName() || resp.GetModelVersion() != ModelVersion {
				t.Errorf("id %q model %q version %q, want %q %q %q", resp.GetId(), resp.GetModelName(), resp.GetModelVersion(), tc.req.GetId(), tc.req.GetModelName(), ModelVersion)
			}
			if len(resp.GetOutputs()) != 1 || len(resp.GetRawOutputContents()) != 1 {
				t.Fatalf("%d outputs, %d raw contents; want 1 and 1", len(resp.GetOutputs()), len(resp.GetRawOutputContents()))
			}
			o := resp.GetOutputs()[0]
			if o.GetName() != OutputName || o.GetDatatype() != tc.dt || fmt.Sprint(o.GetShape()) != fmt.Sprint(tc.shape) {
				t.Errorf("output %q %s %v, want %q %s %v", o.GetName(), o.GetDatatype(), o.GetShape(), OutputName, tc.dt, tc.shape)
			}
			n, _ := product(o.GetShape())
			if int(n)*elemSize(o.GetDatatype()) != len(resp.GetRawOutputContents()[0]) {
				t.Errorf("raw output of %d bytes for shape %v", len(resp.GetRawOutputContents()[0]), o.GetShape())
			}
			if got := resp.GetParameters()["lovelock_slice"].GetStringParam(); got != tc.slice {
				t.Errorf("lovelock_slice %q, want %q", got, tc.slice)
			}
		})
	}
}

func TestShapesAccepted(t *testing.T) {
	conn := serve(t, &fake{}, testCatalog, Options{})
	c := pb.NewGRPCInferenceServiceClient(conn)
	mlpIn, _ := mlpInput(2)
	for _, tc := range []struct {
		model string
		shape []int64
		input []byte
		out   []int64
	}{
		{"checksum", []int64{5}, []byte("hello"), []int64{1, 2}},
		{"checksum", []int64{5, 1}, []byte("hello"), []int64{1, 2}},
		{"checksum", []int64{1, 5}, []byte("hello"), []int64{1, 2}},
		{"checksum", []int64{1, 1, 5}, []byte("hello"), []int64{1, 2}},
		{"mlp", []int64{2, 64}, mlpIn, []int64{2, 16}},
		{"mlp", []int64{1, 2, 64}, mlpIn, []int64{2, 16}},
	} {
		t.Run(fmt.Sprintf("%s %v", tc.model, tc.shape), func(t *testing.T) {
			dt := map[string]string{"checksum": "UINT8", "mlp": "FP32"}[tc.model]
			resp, err := c.ModelInfer(context.Background(), &pb.ModelInferRequest{
				ModelName:        tc.model,
				Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: dt, Shape: tc.shape}},
				RawInputContents: [][]byte{tc.input},
			})
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.GetOutputs()[0].GetShape(); fmt.Sprint(got) != fmt.Sprint(tc.out) {
				t.Errorf("output shape %v, want %v", got, tc.out)
			}
		})
	}
}

// rawBytes lays out BYTES elements as Triton's clients send them raw.
func rawBytes(elems ...[]byte) []byte {
	var out []byte
	for _, e := range elems {
		out = binary.LittleEndian.AppendUint32(out, uint32(len(e)))
		out = append(out, e...)
	}
	return out
}

func TestTypedContents(t *testing.T) {
	conn := serve(t, &fake{}, testCatalog, Options{})
	c := pb.NewGRPCInferenceServiceClient(conn)
	mlpIn, mlpFloats := mlpInput(2)
	data := pattern(300)
	u32 := make([]uint32, len(data))
	for i, b := range data {
		u32[i] = uint32(b)
	}
	sum := model.Checksum(data)
	for _, tc := range []struct {
		name   string
		model  string
		tensor *pb.ModelInferRequest_InferInputTensor
		raw    [][]byte
		want   []byte
	}{
		{"FP32 fp32_contents", "mlp", &pb.ModelInferRequest_InferInputTensor{
			Name: "x", Datatype: "FP32", Shape: []int64{2, 64}, Contents: &pb.InferTensorContents{Fp32Contents: mlpFloats},
		}, nil, mlpRef(t, mlpIn)},
		{"UINT8 uint_contents", "checksum", &pb.ModelInferRequest_InferInputTensor{
			Name: "x", Datatype: "UINT8", Shape: []int64{300}, Contents: &pb.InferTensorContents{UintContents: u32},
		}, nil, sum[:]},
		{"BYTES bytes_contents, two elements", "checksum", &pb.ModelInferRequest_InferInputTensor{
			Name: "x", Datatype: "BYTES", Shape: []int64{2}, Contents: &pb.InferTensorContents{BytesContents: [][]byte{data[:100], data[100:]}},
		}, nil, sum[:]},
		{"BYTES raw, length-prefixed", "checksum", &pb.ModelInferRequest_InferInputTensor{
			Name: "x", Datatype: "BYTES", Shape: []int64{1, 3},
		}, [][]byte{rawBytes(data[:1], data[1:250], data[250:])}, sum[:]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := c.ModelInfer(context.Background(), &pb.ModelInferRequest{
				ModelName: tc.model, Inputs: []*pb.ModelInferRequest_InferInputTensor{tc.tensor}, RawInputContents: tc.raw,
			})
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.GetRawOutputContents()[0]; !bytes.Equal(got, tc.want) {
				t.Fatalf("output %x, want %x", got, tc.want)
			}
		})
	}
}

func TestBadInput(t *testing.T) {
	f := &fake{}
	conn := serve(t, f, testCatalog, Options{})
	c := pb.NewGRPCInferenceServiceClient(conn)
	mlpIn, _ := mlpInput(1)
	tensor := func(dt string, shape ...int64) []*pb.ModelInferRequest_InferInputTensor {
		return []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: dt, Shape: shape}}
	}
	raw := func(b ...[]byte) [][]byte { return b }
	for _, tc := range []struct {
		name   string
		req    *pb.ModelInferRequest
		md     []string
		status ingest.Status
		msg    string
	}{
		{"unknown model", &pb.ModelInferRequest{ModelName: "resnet", Inputs: tensor("UINT8", 1), RawInputContents: raw([]byte{1})},
			nil, ingest.StatusUnknownModel, "no model \"resnet\" here; the models are badout, checksum"},
		{"unknown version", &pb.ModelInferRequest{ModelName: "checksum", ModelVersion: "2", Inputs: tensor("UINT8", 1), RawInputContents: raw([]byte{1})},
			nil, ingest.StatusUnknownModel, "only version"},
		{"no input", &pb.ModelInferRequest{ModelName: "checksum"},
			nil, ingest.StatusBadRequest, "exactly one input tensor, the request has 0"},
		{"two inputs", &pb.ModelInferRequest{ModelName: "checksum", Inputs: append(tensor("UINT8", 1), tensor("UINT8", 1)...), RawInputContents: raw([]byte{1}, []byte{2})},
			nil, ingest.StatusBadRequest, "the request has 2"},
		{"two raw contents for one input", &pb.ModelInferRequest{ModelName: "checksum", Inputs: tensor("UINT8", 1), RawInputContents: raw([]byte{1}, []byte{2})},
			nil, ingest.StatusBadRequest, "raw_input_contents has 2 entries"},
		{"raw and typed contents", &pb.ModelInferRequest{ModelName: "checksum", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "UINT8", Shape: []int64{1}, Contents: &pb.InferTensorContents{UintContents: []uint32{1}}}}, RawInputContents: raw([]byte{1})},
			nil, ingest.StatusBadRequest, "both raw_input_contents and typed contents"},
		{"empty input", &pb.ModelInferRequest{ModelName: "checksum", Inputs: tensor("UINT8", 0)},
			nil, ingest.StatusBadRequest, "is empty"},
		{"wrong datatype", &pb.ModelInferRequest{ModelName: "mlp", Inputs: tensor("FP64", 1, 32), RawInputContents: raw(mlpIn)},
			nil, ingest.StatusBadRequest, "datatype \"FP64\"; model mlp takes \"FP32\""},
		{"shape product and bytes disagree", &pb.ModelInferRequest{ModelName: "mlp", Inputs: tensor("FP32", 2, 64), RawInputContents: raw(mlpIn)},
			nil, ingest.StatusBadRequest, "shape [2 64] of FP32 is 512 bytes, the contents are 256"},
		{"row shape differs", &pb.ModelInferRequest{ModelName: "mlp", Inputs: tensor("FP32", 2, 32), RawInputContents: raw(mlpIn)},
			nil, ingest.StatusBadRequest, "model mlp takes [rows, 64]"},
		{"batch dimension other than 1", &pb.ModelInferRequest{ModelName: "mlp", Inputs: tensor("FP32", 2, 1, 64), RawInputContents: raw(append(mlpIn, mlpIn...))},
			nil, ingest.StatusBadRequest, "takes [rows, 64]"},
		{"flat shape for a model with wide rows", &pb.ModelInferRequest{ModelName: "mlp", Inputs: tensor("FP32", 64), RawInputContents: raw(mlpIn)},
			nil, ingest.StatusBadRequest, "takes [rows, 64]"},
		{"negative dimension", &pb.ModelInferRequest{ModelName: "checksum", Inputs: tensor("UINT8", -1), RawInputContents: raw([]byte{1})},
			nil, ingest.StatusBadRequest, "none negative"},
		{"no shape", &pb.ModelInferRequest{ModelName: "checksum", Inputs: tensor("UINT8"), RawInputContents: raw([]byte{1})},
			nil, ingest.StatusBadRequest, "give every dimension"},
		{"UINT8 element out of range", &pb.ModelInferRequest{ModelName: "checksum", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "UINT8", Shape: []int64{2}, Contents: &pb.InferTensorContents{UintContents: []uint32{1, 256}}}}},
			nil, ingest.StatusBadRequest, "uint_contents[1] = 256 does not fit UINT8"},
		// Typed contents in a field the datatype does not use: before,
		// the first was refused as empty, the second's extra field ignored.
		{"UINT8 in int_contents", &pb.ModelInferRequest{ModelName: "checksum", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "UINT8", Shape: []int64{2}, Contents: &pb.InferTensorContents{IntContents: []int32{1, 2}}}}},
			nil, ingest.StatusBadRequest, "UINT8 takes its typed contents in uint_contents; the request has int_contents"},
		{"FP32 besides fp64_contents", &pb.ModelInferRequest{ModelName: "mlp", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{1, 64},
			Contents: &pb.InferTensorContents{Fp32Contents: make([]float32, 64), Fp64Contents: []float64{1}}}}},
			nil, ingest.StatusBadRequest, "FP32 takes its typed contents in fp32_contents; the request has fp32_contents, fp64_contents"},
		{"BYTES in uint_contents", &pb.ModelInferRequest{ModelName: "checksum", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "BYTES", Shape: []int64{1}, Contents: &pb.InferTensorContents{UintContents: []uint32{1}}}}},
			nil, ingest.StatusBadRequest, "BYTES takes its typed contents in bytes_contents; the request has uint_contents"},
		{"FP16 as typed contents", &pb.ModelInferRequest{ModelName: "checksum", Inputs: tensor("FP16", 1)},
			nil, ingest.StatusBadRequest, "send it in raw_input_contents"},
		{"BYTES raw cut inside a length", &pb.ModelInferRequest{ModelName: "checksum", Inputs: tensor("BYTES", 1), RawInputContents: raw([]byte{1, 0})},
			nil, ingest.StatusBadRequest, "4-byte length prefix"},
		{"BYTES raw element longer than the rest", &pb.ModelInferRequest{ModelName: "checksum", Inputs: tensor("BYTES", 1), RawInputContents: raw([]byte{9, 0, 0, 0, 1})},
			nil, ingest.StatusBadRequest, "says 9 bytes, 1 remain"},
		{"BYTES count differs from shape", &pb.ModelInferRequest{ModelName: "checksum", Inputs: tensor("BYTES", 3), RawInputContents: raw(rawBytes([]byte{1}, []byte{2}))},
			nil, ingest.StatusBadRequest, "says 3 BYTES elements, the contents have 2"},
		{"BYTES to a float model", &pb.ModelInferRequest{ModelName: "mlp", Inputs: tensor("BYTES", 1), RawInputContents: raw(rawBytes(mlpIn))},
			nil, ingest.StatusBadRequest, "datatype \"BYTES\""},
		{"unknown output asked for", &pb.ModelInferRequest{ModelName: "checksum", Inputs: tensor("UINT8", 1), Outputs: []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "OUTPUT0"}}, RawInputContents: raw([]byte{1})},
			nil, ingest.StatusBadRequest, "has one output, \"output\""},
		{"over the model's largest input", &pb.ModelInferRequest{ModelName: "mlp", Inputs: tensor("FP32", 4097, 64), RawInputContents: raw(make([]byte, 4097*256))},
			nil, ingest.StatusTooLarge, "exceeds model mlp's largest, 1048576 bytes"},
		{"tenant not a number", &pb.ModelInferRequest{ModelName: "checksum", Inputs: tensor("UINT8", 1), RawInputContents: raw([]byte{1})},
			[]string{TenantHeader, "acme"}, ingest.StatusBadRequest, "not a tenant number"},
		{"tenant over 32 bits", &pb.ModelInferRequest{ModelName: "checksum", Inputs: tensor("UINT8", 1), RawInputContents: raw([]byte{1})},
			[]string{TenantHeader, "4294967296"}, ingest.StatusBadRequest, "not a tenant number"},
		{"tenant twice", &pb.ModelInferRequest{ModelName: "checksum", Inputs: tensor("UINT8", 1), RawInputContents: raw([]byte{1})},
			[]string{TenantHeader, "1", TenantHeader, "2"}, ingest.StatusBadRequest, "given 2 times"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.md != nil {
				ctx = metadata.AppendToOutgoingContext(ctx, tc.md...)
			}
			before := len(f.calls())
			_, err := c.ModelInfer(ctx, tc.req)
			if want := Code(tc.status); status.Code(err) != want {
				t.Fatalf("code %v (%v), want %v", status.Code(err), err, want)
			}
			var e *ingest.Error
			if !errors.As(fromGRPC(err), &e) || e.Status != tc.status || !strings.Contains(e.Msg, tc.msg) {
				t.Fatalf("error %v, want status %v with %q", fromGRPC(err), tc.status, tc.msg)
			}
			if n := len(f.calls()); n != before {
				t.Errorf("the submitter got the bad request")
			}
		})
	}
}

func TestErrorMapping(t *testing.T) {
	conn := serve(t, &fake{}, testCatalog, Options{})
	for _, tc := range []struct {
		model  string
		status ingest.Status // the "fail" model fails with its tenant's number
		code   codes.Code
	}{
		{"fail", ingest.StatusBadRequest, codes.InvalidArgument},
		{"fail", ingest.StatusUnknownModel, codes.NotFound},
		{"fail", ingest.StatusNotGranted, codes.PermissionDenied},
		{"fail", ingest.StatusTooLarge, codes.InvalidArgument},
		{"fail", ingest.StatusDeadline, codes.DeadlineExceeded},
		{"fail", ingest.StatusOverloaded, codes.ResourceExhausted},
		{"fail", ingest.StatusHostUnavailable, codes.Unavailable},
		{"fail", ingest.StatusModelFailed, codes.Internal},
		{"fail", ingest.StatusInternal, codes.Internal},
		{"plain", ingest.StatusInternal, codes.Internal},
		{"badout", ingest.StatusInternal, codes.Internal},
	} {
		t.Run(tc.model+" "+tc.status.String(), func(t *testing.T) {
			in := []byte{1, 2, 3}
			_, err := pb.NewGRPCInferenceServiceClient(conn).ModelInfer(
				metadata.AppendToOutgoingContext(context.Background(), TenantHeader, fmt.Sprint(uint8(tc.status))),
				&pb.ModelInferRequest{ModelName: tc.model, Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "UINT8", Shape: []int64{3}}}, RawInputContents: [][]byte{in}})
			if status.Code(err) != tc.code {
				t.Errorf("gRPC code %v, want %v", status.Code(err), tc.code)
			}
			if tc.status.Retryable() != strings.Contains(status.Convert(err).Message(), "may succeed if sent again") {
				t.Errorf("message %q: retry hint wrong for %v", status.Convert(err).Message(), tc.status)
			}
			_, err = Infer(context.Background(), conn, tc.model, uint32(tc.status), in, checksumInfo)
			var e *ingest.Error
			if !errors.As(err, &e) || e.Status != tc.status {
				t.Fatalf("Infer: %v, want an *ingest.Error of status %v", err, tc.status)
			}
			if tc.model == "fail" && !strings.HasPrefix(e.Msg, fmt.Sprintf("failed as asked, tenant %d", tc.status)) {
				t.Errorf("message %q lost the submitter's", e.Msg)
			}
		})
	}
}

// Codes from servers that attach no ErrorInfo map by the code alone.
func TestFromGRPCWithoutDetail(t *testing.T) {
	for _, tc := range []struct {
		code   codes.Code
		status ingest.Status
	}{
		{codes.InvalidArgument, ingest.StatusBadRequest},
		{codes.NotFound, ingest.StatusUnknownModel},
		{codes.PermissionDenied, ingest.StatusNotGranted},
		{codes.DeadlineExceeded, ingest.StatusDeadline},
		{codes.ResourceExhausted, ingest.StatusTooLarge}, // gRPC's own size limit
		{codes.Unavailable, ingest.StatusHostUnavailable},
		{codes.Internal, ingest.StatusInternal},
		{codes.Unimplemented, ingest.StatusInternal},
	} {
		if got := ingest.StatusOf(fromGRPC(status.Error(tc.code, "x"))); got != tc.status {
			t.Errorf("%v: status %v, want %v", tc.code, got, tc.status)
		}
	}
}

func TestTenant(t *testing.T) {
	f := &fake{}
	conn := serve(t, f, testCatalog, Options{})
	c := pb.NewGRPCInferenceServiceClient(conn)
	req := &pb.ModelInferRequest{ModelName: "checksum", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "UINT8", Shape: []int64{1}}}, RawInputContents: [][]byte{{1}}}
	for _, tc := range []struct {
		name string
		call func() error
		want uint32
	}{
		{"no header is tenant 0", func() error { _, err := c.ModelInfer(context.Background(), req); return err }, DefaultTenant},
		{"header", func() error {
			_, err := c.ModelInfer(metadata.AppendToOutgoingContext(context.Background(), TenantHeader, "12"), req)
			return err
		}, 12},
		{"largest tenant", func() error {
			_, err := c.ModelInfer(metadata.AppendToOutgoingContext(context.Background(), TenantHeader, "4294967295"), req)
			return err
		}, math.MaxUint32},
		{"Infer sends it", func() error {
			_, err := Infer(context.Background(), conn, "checksum", 7, []byte{1}, checksumInfo)
			return err
		}, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); err != nil {
				t.Fatal(err)
			}
			calls := f.calls()
			if got := calls[len(calls)-1].Tenant; got != tc.want {
				t.Fatalf("tenant %d, want %d", got, tc.want)
			}
		})
	}
}

func TestDeadline(t *testing.T) {
	f := &fake{}
	conn := serve(t, f, testCatalog, Options{})

	// A call without a deadline hands the submitter none.
	if _, err := Infer(context.Background(), conn, "checksum", 0, []byte{1}, checksumInfo); err != nil {
		t.Fatal(err)
	}
	if calls := f.calls(); !calls[0].Deadline.IsZero() || !f.ctxDead[0].IsZero() {
		t.Fatalf("deadline %v (context %v), want none", calls[0].Deadline, f.ctxDead[0])
	}

	// A call's deadline becomes the request's. grpc-timeout carries the
	// time left, so the server's deadline is the client's moved by the
	// transit time and the timeout's rounding: far less than a minute.
	want := time.Now().Add(time.Hour)
	ctx, cancel := context.WithDeadline(context.Background(), want)
	defer cancel()
	if _, err := Infer(ctx, conn, "checksum", 0, []byte{1}, checksumInfo); err != nil {
		t.Fatal(err)
	}
	got := f.calls()[1].Deadline
	if got.Before(want.Add(-time.Minute)) || got.After(want.Add(time.Minute)) {
		t.Fatalf("request deadline %v, want about %v", got, want)
	}
	if !f.ctxDead[1].Equal(got) {
		t.Errorf("submitter's context deadline %v, request's %v", f.ctxDead[1], got)
	}

	// A submitter still working at the deadline: the client gets
	// StatusDeadline.
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := Infer(ctx, conn, "wait", 0, []byte{1}, checksumInfo)
	if s := ingest.StatusOf(err); s != ingest.StatusDeadline {
		t.Fatalf("Infer past its deadline: %v (status %v), want %v", err, s, ingest.StatusDeadline)
	}
}

func TestCancel(t *testing.T) {
	f := &fake{entered: make(chan struct{})}
	conn := serve(t, f, testCatalog, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-f.entered
		cancel()
	}()
	_, err := Infer(ctx, conn, "wait", 0, []byte{1}, checksumInfo)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Infer cancelled: %v, want context.Canceled", err)
	}
}

func TestMessageSizeLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  Options
		size  int
		want  ingest.Status
		calls int
	}{
		{"default limit takes 12 MiB", Options{}, 12 << 20, ingest.StatusOK, 1},
		{"1 MiB limit refuses 2 MiB", Options{MaxRecvMsgSize: 1 << 20}, 2 << 20, ingest.StatusTooLarge, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fake{}
			conn := serve(t, f, testCatalog, tc.opts)
			_, err := Infer(context.Background(), conn, "checksum", 0, pattern(tc.size), checksumInfo)
			if s := ingest.StatusOf(err); s != tc.want {
				t.Fatalf("Infer of %d bytes: %v (status %v), want %v", tc.size, err, s, tc.want)
			}
			if n := len(f.calls()); n != tc.calls {
				t.Errorf("submitter called %d times, want %d", n, tc.calls)
			}
		})
	}
}

func TestMetadata(t *testing.T) {
	ctx := context.Background()
	c := pb.NewGRPCInferenceServiceClient(serve(t, &fake{}, testCatalog, Options{Version: "v1.2.3"}))
	empty := pb.NewGRPCInferenceServiceClient(serve(t, &fake{}, catalog{}, Options{}))
	// Models configured, none served by a GPU host (none registered, or
	// it runs other models): listed, described, not ready.
	cold := func(info ingest.ModelInfo) ingest.ModelInfo { info.Ready = false; return info }
	unserved := pb.NewGRPCInferenceServiceClient(serve(t, &fake{}, catalog{cold(checksumInfo), cold(mlpInfo)}, Options{}))
	partly := pb.NewGRPCInferenceServiceClient(serve(t, &fake{}, catalog{checksumInfo, cold(mlpInfo)}, Options{}))

	if r, err := c.ServerLive(ctx, &pb.ServerLiveRequest{}); err != nil || !r.GetLive() {
		t.Errorf("ServerLive: %v, %v", r, err)
	}
	for _, tc := range []struct {
		c    pb.GRPCInferenceServiceClient
		want bool
	}{{c, true}, {empty, false}, {unserved, false}, {partly, true}} {
		if r, err := tc.c.ServerReady(ctx, &pb.ServerReadyRequest{}); err != nil || r.GetReady() != tc.want {
			t.Errorf("ServerReady: %v, %v; want %v", r, err, tc.want)
		}
		if r, err := tc.c.ServerLive(ctx, &pb.ServerLiveRequest{}); err != nil || !r.GetLive() {
			t.Errorf("ServerLive: %v, %v; want live whether ready or not", r, err)
		}
	}
	for _, tc := range []struct {
		c             pb.GRPCInferenceServiceClient
		name, version string
		want          bool
	}{{c, "mlp", "", true}, {c, "mlp", "1", true}, {c, "mlp", "2", false}, {c, "resnet", "", false},
		{unserved, "mlp", "", false}, {partly, "checksum", "", true}, {partly, "mlp", "", false}} {
		if r, err := tc.c.ModelReady(ctx, &pb.ModelReadyRequest{Name: tc.name, Version: tc.version}); err != nil || r.GetReady() != tc.want {
			t.Errorf("ModelReady %s@%q: %v, %v; want %v", tc.name, tc.version, r, err, tc.want)
		}
	}
	// A model not ready is still described: clients shape requests
	// before a host comes.
	if r, err := unserved.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: "mlp"}); err != nil || r.GetName() != "mlp" {
		t.Errorf("ModelMetadata of a model no host serves: %v, %v", r, err)
	}
	for _, tc := range []struct {
		c             pb.GRPCInferenceServiceClient
		name, version string
	}{{c, ServerName, "v1.2.3"}, {empty, ServerName, "unknown"}} {
		if r, err := tc.c.ServerMetadata(ctx, &pb.ServerMetadataRequest{}); err != nil || r.GetName() != tc.name || r.GetVersion() != tc.version {
			t.Errorf("ServerMetadata: %v, %v; want %s %s", r, err, tc.name, tc.version)
		}
	}

	for _, tc := range []struct {
		model         string
		in, out       string // datatype and shape
		err           codes.Code
		errSubstrings string
	}{
		{"mlp", "FP32 [-1 64]", "FP32 [-1 16]", codes.OK, ""},
		{"checksum", "UINT8 [-1 1]", "UINT32 [1 2]", codes.OK, ""},
		{"resnet", "", "", codes.NotFound, "no model \"resnet\""},
	} {
		r, err := c.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: tc.model})
		if status.Code(err) != tc.err || !strings.Contains(status.Convert(err).Message(), tc.errSubstrings) {
			t.Errorf("ModelMetadata %s: %v, want code %v with %q", tc.model, err, tc.err, tc.errSubstrings)
			continue
		}
		if err != nil {
			continue
		}
		if r.GetName() != tc.model || fmt.Sprint(r.GetVersions()) != "[1]" || r.GetPlatform() != Platform {
			t.Errorf("ModelMetadata %s: name %q versions %v platform %q", tc.model, r.GetName(), r.GetVersions(), r.GetPlatform())
		}
		tensor := func(ts []*pb.ModelMetadataResponse_TensorMetadata, name string) string {
			if len(ts) != 1 || ts[0].GetName() != name {
				return fmt.Sprintf("tensors %v, want one named %q", ts, name)
			}
			return fmt.Sprintf("%s %v", ts[0].GetDatatype(), ts[0].GetShape())
		}
		if got := tensor(r.GetInputs(), InputName); got != tc.in {
			t.Errorf("ModelMetadata %s input: %s, want %s", tc.model, got, tc.in)
		}
		if got := tensor(r.GetOutputs(), OutputName); got != tc.out {
			t.Errorf("ModelMetadata %s output: %s, want %s", tc.model, got, tc.out)
		}
	}
}

// TestOutputShape: the response's output shape from the model's
// ModelInfo, the input's rows and the result's length: a -1 dimension (an
// output whose length only the result gives) is what holds the result's
// bytes, and stays -1 (refused as internal) if no whole number does.
func TestOutputShape(t *testing.T) {
	bytesOut := ingest.ModelInfo{OutDatatype: "UINT8", OutRowShape: []int64{-1}}
	floatsOut := ingest.ModelInfo{OutDatatype: "FP32", OutRowShape: []int64{-1, 2}}
	for _, tc := range []struct {
		name    string
		info    ingest.ModelInfo
		rows, n int
		want    []int64
	}{
		{"per row", mlpInfo, 3, 3 * model.MLPOut * 4, []int64{3, model.MLPOut}},
		{"one row", checksumInfo, 5, 8, []int64{1, 2}},
		{"bytes, length from the result", bytesOut, 10, 5, []int64{1, 5}},
		{"bytes, empty result", bytesOut, 10, 0, []int64{1, 0}},
		{"float pairs", floatsOut, 1, 24, []int64{1, 3, 2}},
		{"float pairs, a partial one", floatsOut, 1, 20, []int64{1, -1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := outputShape(&tc.info, tc.rows, tc.n); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("shape %v, want %v", got, tc.want)
			}
		})
	}
}
