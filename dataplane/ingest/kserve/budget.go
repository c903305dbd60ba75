package kserve

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	pb "github.com/lovelock-dpu/lovelock/dataplane/ingest/kserve/inferencepb"
)

// DecodeExpansion bounds the Go memory a ModelInfer request holds at once
// while it is decoded and converted, per byte of its protobuf wire size,
// not counting its input and output tensor entries (entryCost). Measured
// with google.golang.org/protobuf v1.36 and Go 1.26 on messages of 0.25 to
// 8 MiB (1 Mi elements), per wire byte:
//
//   - the received message and gRPC's contiguous copy of it: 2, until
//     protobuf decoding ends;
//   - raw_input_contents, FP32, FP64, BOOL: 1 decoded + 1 converted;
//   - INT8..INT32, UINT8..UINT32 from 1-byte varints: 4 decoded (int32) +
//     up to 4 converted; INT64, UINT64 from 1-byte varints: 8 + 8 = 16, the
//     most of the typed contents once converted;
//   - BYTES (bytes_contents, or many raw_input_contents entries) of empty
//     elements, 2 wire bytes each: a 24-byte slice header each, 12.3 after
//     decoding, but the slice grows by appending, so at its last growth the
//     old and new arrays are both live: 27 (28.3 from 4 Ki elements up,
//     36 below, which callOverhead covers); 61 allocated in all, the rest
//     garbage until the next GC;
//   - parameters maps of distinct short keys: 17.3 retained, 29.7
//     allocated in all;
//   - shape dimensions: 8.
//
// So 2 + 28.3 is the worst held at once. Empty input and output tensor
// entries expand far more (an empty inputs{} is 2 wire bytes and a 112-byte
// struct; inputs{contents{} parameters{{}}} 6 bytes and 670: 112x), so
// those are charged by count instead; the server takes one of each.
const DecodeExpansion = 32

// entryCost is charged for each input and output tensor entry of a
// request, besides DecodeExpansion per byte: the tensor struct, its
// contents struct, its first parameters map table and the slice of
// pointers to them, about 700 bytes at most measured.
const entryCost = 1 << 10

// callOverhead is charged to every call: its context, metadata and
// response, and the small slices whose growth DecodeExpansion does not
// cover.
const callOverhead = 64 << 10

// retainedExpansion bounds what a decoded request and its converted input
// hold per wire byte once conversion is over (parameters 17.3, INT64 16),
// raw_input_contents apart (2 at most: decoded, and concatenated for
// BYTES).
const retainedExpansion = 18

// DefaultBudgetMessages is how many of the largest messages' DecodeCost
// the decode budget holds when Options.MemoryBudget is zero: that many
// calls of the largest size decode at once, far more of smaller ones.
const DefaultBudgetMessages = 4

// DefaultBudgetWait is how long a call waits for the decode budget when
// Options.BudgetWait is zero (or its own deadline, if sooner).
const DefaultBudgetWait = time.Second

// DecodeCost is the decode budget a request of wire bytes with one input
// and one output tensor takes: the most it can hold at once while it is
// decoded and converted.
func DecodeCost(wire int) int64 {
	return decodeCost(wire, 2)
}

func decodeCost(wire, entries int) int64 {
	return DecodeExpansion*int64(wire) + entryCost*int64(entries) + callOverhead
}

// heldCost bounds what a call holds once its input is converted, until it
// ends: the decoded request and the converted input. A raw input, the
// usual case, holds about its own size, not DecodeExpansion times it.
func heldCost(wire, entries int, r *pb.ModelInferRequest) int64 {
	raw := 0
	for _, b := range r.GetRawInputContents() {
		raw += len(b)
	}
	return 2*int64(raw) + retainedExpansion*int64(max(wire-raw, 0)) + entryCost*int64(entries) + callOverhead
}

// countEntries returns the number of input and output tensor entries in
// a ModelInferRequest's wire form, without decoding it. A malformed tail
// is not counted: protobuf decoding stops there too.
func countEntries(b []byte) int {
	n, _ := scanRequest(b)
	return n
}

// maxContentRuns bounds how often one input's packed repeated field (its
// shape, or a typed contents field, bool to fp64) may appear in a message.
// protobuf-go grows a packed field by exactly each run's length, copying
// what it holds, so a field split into n one-element runs costs O(n²) to
// decode: 160 000 runs in 480 KB took 20 s of CPU, and a 9 MiB message
// would take hours. Encoders write each field as one run; a few are
// allowed for merged messages.
const maxContentRuns = 16

// scanRequest returns the input and output tensor entries of a
// ModelInferRequest's wire form without decoding it, and refuses (bad
// request) an input whose shape or typed contents are split into more
// than maxContentRuns packed runs. A malformed part is not looked into:
// decoding refuses it.
func scanRequest(b []byte) (entries int, err error) {
	input := 0
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeField(b)
		if l < 0 {
			break
		}
		if typ == protowire.BytesType && (num == 5 || num == 6) { // inputs, outputs
			entries++
		}
		if typ == protowire.BytesType && num == 5 {
			if field, runs := packedRuns(b[:l]); runs > maxContentRuns {
				if field == shapeField {
					return entries, ingest.Errorf(ingest.StatusBadRequest, "input %d: shape comes in %d packed runs, at most %d are accepted: "+
						"send the shape as one packed run (as protobuf encoders do)", input, runs, maxContentRuns)
				}
				return entries, ingest.Errorf(ingest.StatusBadRequest, "input %d: contents field %d comes in %d packed runs, at most %d are accepted: "+
					"send each contents field as one packed run (as protobuf encoders do), or the input raw (raw_input_contents)", input, field, runs, maxContentRuns)
			}
			input++
		}
		b = b[l:]
	}
	return entries, nil
}

// shapeField is the number of an input tensor's shape (repeated int64).
const shapeField protowire.Number = 3

// packedRuns returns the packed repeated field of one input tensor field
// (tag included) that comes in the most runs, and their count: the shape
// (shapeField) or a typed contents field (by its number in the contents,
// over every occurrence of the contents, which decoding merges).
func packedRuns(field []byte) (worst protowire.Number, most int) {
	_, _, n := protowire.ConsumeTag(field)
	if n < 0 {
		return 0, 0
	}
	tensor, m := protowire.ConsumeBytes(field[n:])
	if m < 0 {
		return 0, 0
	}
	var runs [8]int // by contents field number, 1 (bool) to 7 (fp64)
	shapeRuns := 0
	for len(tensor) > 0 {
		num, typ, l := protowire.ConsumeField(tensor)
		if l < 0 {
			break
		}
		if num == shapeField && typ == protowire.BytesType {
			shapeRuns++
		}
		if num == 5 && typ == protowire.BytesType { // contents
			_, _, tn := protowire.ConsumeTag(tensor)
			contents, _ := protowire.ConsumeBytes(tensor[tn:])
			for len(contents) > 0 {
				cnum, ctyp, cl := protowire.ConsumeField(contents)
				if cl < 0 {
					break
				}
				if ctyp == protowire.BytesType && cnum >= 1 && cnum <= 7 {
					runs[cnum]++
				}
				contents = contents[cl:]
			}
		}
		tensor = tensor[l:]
	}
	worst, most = shapeField, shapeRuns
	for f, r := range runs {
		if r > most {
			worst, most = protowire.Number(f), r
		}
	}
	return worst, most
}

// budget bounds the memory ModelInfer calls hold at once: each call
// acquires its DecodeCost before its message is decoded, shrinks it to
// heldCost once its input is converted, and releases it when it ends.
type budget struct {
	sem  *semaphore.Weighted
	size int64
	wait time.Duration
	// waiting, if set (tests), is called when a call starts to wait.
	waiting func()
}

func newBudget(size int64, wait time.Duration) *budget {
	return &budget{sem: semaphore.NewWeighted(size), size: size, wait: wait}
}

// hold is a call's share of the budget. A call's hold is used by its own
// goroutine only.
type hold struct {
	b *budget
	n int64
}

// acquire takes n bytes of the budget, waiting up to b.wait or ctx's
// deadline for calls in progress to return them.
func (b *budget) acquire(ctx context.Context, n int64, what string) (*hold, error) {
	if n > b.size {
		return nil, ingest.Errorf(ingest.StatusTooLarge, "%s may take up to %d bytes of memory to decode, more than the server's whole decode budget of %d bytes (grpc_memory_budget); send the input raw (raw_input_contents) or in smaller requests, or raise the budget",
			what, n, b.size)
	}
	if !b.sem.TryAcquire(n) {
		if b.waiting != nil {
			b.waiting()
		}
		wctx, cancel := context.WithTimeout(ctx, b.wait)
		err := b.sem.Acquire(wctx, n)
		cancel()
		if err != nil {
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil, ctx.Err()
			}
			return nil, ingest.Errorf(ingest.StatusOverloaded, "the server is busy: calls in progress hold its decode memory budget of %d bytes, and %s needs %d bytes of it; retry shortly",
				b.size, what, n)
		}
	}
	return &hold{b: b, n: n}, nil
}

// shrink returns what the call holds beyond n.
func (h *hold) shrink(n int64) {
	if h != nil && n < h.n {
		h.b.sem.Release(h.n - n)
		h.n = n
	}
}

func (h *hold) release() {
	if h != nil && h.n > 0 {
		h.b.sem.Release(h.n)
		h.n = 0
	}
}

// inferRequest is what the ModelInfer handler decodes into: a
// ModelInferRequest (it is one to any proto codec) that budgetCodec
// charges to the budget, by its wire size, before decoding it.
type inferRequest struct {
	*pb.ModelInferRequest
	ctx    context.Context
	budget *budget
	wire   int // the message's size, once charged
	ents   int // its input and output tensor entries
	hold   *hold
	err    error // the budget's refusal: the message was not decoded
}

func (r *inferRequest) charge(wire, entries int) error {
	h, err := r.budget.acquire(r.ctx, decodeCost(wire, entries),
		fmt.Sprintf("a request of %d bytes and %d input/output tensors", wire, entries))
	if err != nil {
		return err
	}
	r.hold, r.wire, r.ents = h, wire, entries
	return nil
}

// budgetCodec is gRPC's proto codec, but for inferRequest, which it
// charges to the budget before decoding: there the message's size is
// known and nothing is decoded yet. Options.ServerOptions installs it.
type budgetCodec struct{ encoding.CodecV2 }

func (c budgetCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*inferRequest)
	if !ok {
		return c.CodecV2.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	entries, err := scanRequest(b)
	if err == nil {
		err = r.charge(len(b), entries)
	}
	if err != nil {
		// Returned here, gRPC would make it INTERNAL: the handler
		// answers it instead.
		r.err = err
		return nil
	}
	return proto.Unmarshal(b, r.ModelInferRequest)
}

// holdKey is the context key of a call's *hold, for infer to shrink.
type holdKey struct{}

// modelInferHandler is the generated ModelInfer handler, decoding into an
// inferRequest charged to the server's budget, released when the call
// ends whatever its outcome.
func modelInferHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	s := srv.(*Server)
	in := &inferRequest{ModelInferRequest: new(pb.ModelInferRequest), ctx: ctx, budget: s.budget}
	defer func() { in.hold.release() }()
	if err := dec(in); err != nil {
		return nil, err
	}
	if in.err != nil {
		return nil, toGRPC(ctx, in.err)
	}
	if in.hold == nil {
		// Decoded by another codec (a grpc.Server made without
		// ServerOptions): charge it now, which bounds the conversion
		// and what the call holds, if not the decoding.
		if err := in.charge(proto.Size(in.ModelInferRequest), len(in.GetInputs())+len(in.GetOutputs())); err != nil {
			return nil, toGRPC(ctx, err)
		}
	}
	ctx = context.WithValue(ctx, holdKey{}, in)
	if interceptor == nil {
		return s.ModelInfer(ctx, in.ModelInferRequest)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: pb.GRPCInferenceService_ModelInfer_FullMethodName}
	return interceptor(ctx, in.ModelInferRequest, info, func(ctx context.Context, req any) (any, error) {
		return s.ModelInfer(ctx, req.(*pb.ModelInferRequest))
	})
}

// converted shrinks the call's hold to what it keeps once its input is
// converted.
func converted(ctx context.Context, r *pb.ModelInferRequest) {
	if in, ok := ctx.Value(holdKey{}).(*inferRequest); ok && in.ModelInferRequest == r {
		in.hold.shrink(heldCost(in.wire, in.ents, r))
	}
}

// serviceDesc is the generated service description with ModelInfer's
// handler replaced by modelInferHandler.
func serviceDesc() *grpc.ServiceDesc {
	desc := pb.GRPCInferenceService_ServiceDesc
	desc.Methods = slices.Clone(desc.Methods)
	for i := range desc.Methods {
		if desc.Methods[i].MethodName == "ModelInfer" {
			desc.Methods[i].Handler = modelInferHandler
		}
	}
	return &desc
}
