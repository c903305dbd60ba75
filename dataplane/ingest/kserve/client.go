package kserve

import (
	"context"
	"fmt"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	pb "github.com/lovelock-dpu/lovelock/dataplane/ingest/kserve/inferencepb"
)

// Infer sends input to model over conn as tenant, the way a stock KServe
// client would: one input tensor in raw_input_contents, shaped [rows,
// info.RowShape...] of info.Datatype, with the tenant in TenantHeader and
// ctx's deadline as the call's. It returns the output tensor's bytes.
//
// info is the model's ModelInfo (from the catalog, or ModelMetadata);
// with a zero info the input goes as a flat UINT8 tensor. A failure is an
// *ingest.Error with the status the server named (or the gRPC code
// implies, for a server that names none), except that a cancelled ctx
// gives an error wrapping context.Canceled. Infer accepts responses up to
// DefaultMaxRecvMsgSize; inputs are bounded by the server's
// Options.MaxRecvMsgSize, beyond which the error is StatusTooLarge.
func Infer(ctx context.Context, conn grpc.ClientConnInterface, model string, tenant uint32, input []byte, info ingest.ModelInfo) ([]byte, error) {
	req, err := newRequest(model, input, info)
	if err != nil {
		return nil, err
	}
	ctx = metadata.AppendToOutgoingContext(ctx, TenantHeader, strconv.FormatUint(uint64(tenant), 10))
	resp, err := pb.NewGRPCInferenceServiceClient(conn).ModelInfer(ctx, req, grpc.MaxCallRecvMsgSize(DefaultMaxRecvMsgSize))
	if err != nil {
		if status.Code(err) == codes.Canceled && ctx.Err() != nil {
			return nil, fmt.Errorf("model %s: %w", model, ctx.Err())
		}
		return nil, fromGRPC(err)
	}
	if raw := resp.GetRawOutputContents(); len(raw) > 0 {
		return raw[0], nil
	}
	if outs := resp.GetOutputs(); len(outs) > 0 {
		out, _, err := contentsBytes(outs[0].GetDatatype(), outs[0].GetContents())
		if err != nil {
			return nil, ingest.Errorf(ingest.StatusInternal, "model %s: the response's output: %v", model, err)
		}
		return out, nil
	}
	return nil, ingest.Errorf(ingest.StatusInternal, "model %s: the response has no output tensor", model)
}

// newRequest builds Infer's request.
func newRequest(model string, input []byte, info ingest.ModelInfo) (*pb.ModelInferRequest, error) {
	dt := info.Datatype
	if dt == "" {
		dt = "UINT8"
	}
	size := elemSize(dt)
	if size == 0 {
		return nil, ingest.Errorf(ingest.StatusBadRequest, "model %s: datatype %q has no fixed element size; Infer sends raw tensors of fixed-size elements", model, dt)
	}
	rowBytes := max(info.RowBytes, 1)
	if len(input) == 0 || len(input)%rowBytes != 0 || len(input)%size != 0 {
		return nil, ingest.Errorf(ingest.StatusBadRequest, "model %s: an input of %d bytes is not a whole number of %d-byte rows of %s", model, len(input), rowBytes, dt)
	}
	shape := []int64{int64(len(input) / size)}
	if len(info.RowShape) > 0 {
		shape = append([]int64{int64(len(input) / rowBytes)}, info.RowShape...)
	}
	return &pb.ModelInferRequest{
		ModelName: model,
		Inputs: []*pb.ModelInferRequest_InferInputTensor{{
			Name: InputName, Datatype: dt, Shape: shape,
		}},
		RawInputContents: [][]byte{input},
	}, nil
}
