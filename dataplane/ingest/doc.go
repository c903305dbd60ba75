// Package ingest is accelerator ingest (Conspirator, seed 002): clients send
// inference inputs to the GPU host's DPU, which validates them, picks a GPU
// slice for each, writes the bytes straight into a device buffer the host
// registered, and rings the host, which only launches the model and hands
// the result back.
//
// This package owns what the pieces share: the wire protocol on the
// Lovelock header's ingest types (input 0x20, result 0x21, host/DPU control
// 0x22), the request and status types, and the Submitter interface that
// the client-facing front ends (the Lovelock protocol, KServe v2 over gRPC)
// hand whole requests to. The pieces live in subpackages: devmem (device
// memory: shared memory and CUDA), model (the models and their CPU
// references), hostagent (the GPU host's agent), agent (the DPU's ingest
// agent), client (the client library), kserve (the gRPC front end).
package ingest
