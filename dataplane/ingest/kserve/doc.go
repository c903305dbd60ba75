// Package kserve is accelerator ingest's gRPC front end: the KServe v2 /
// Open Inference Protocol (GRPCInferenceService: ServerLive, ServerReady,
// ModelReady, ServerMetadata, ModelMetadata, ModelInfer), so that stock
// Triton and KServe clients send inputs to the DPU unchanged.
//
// It owns the translation between the protocol and package ingest and
// nothing else: ModelInfer checks the one input tensor's datatype and
// shape against the model's ingest.ModelInfo, hands an ingest.Request to
// an ingest.Submitter (the DPU agent), and returns the result as one raw
// output tensor; ingest statuses travel as gRPC codes (Code) with an
// ErrorInfo detail naming the status (ErrorDomain). Besides the protocol's
// own checks it refuses inputs over the model's MaxInput before they reach
// the agent, and bounds the memory calls hold at once while their messages
// are decoded (Options.MemoryBudget); grants, slices and deadlines are the
// agent's to enforce.
// The tenant comes from the call's TenantHeader metadata (tenant 0 when
// absent) and the deadline from the call's own (grpc-timeout).
//
// Infer is the client half, for `lovelock infer --grpc` and benchmarks.
// The generated protocol code is in the subpackage inferencepb;
// docs/ingest-kserve.md shows stock clients calling the server.
package kserve
