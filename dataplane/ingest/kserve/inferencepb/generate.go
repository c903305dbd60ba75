// Package inferencepb holds the generated Go code for the KServe v2 / Open
// Inference Protocol over gRPC (proto package "inference", service
// GRPCInferenceService): the messages and the client and server stubs.
// Package kserve serves it; nothing else should need to import this
// package except clients that build requests by hand.
//
// grpc_predict_v2.proto says where the protocol comes from (KServe,
// Apache-2.0) and which of its methods are declared. The generated files
// are committed so that building needs no protoc; the plugins are pinned
// as tools in go.mod, protoc itself comes from Debian (protobuf-compiler).
//
// Because the proto package is "inference", a binary that links another
// copy of these messages (Triton's or KServe's own Go stubs) has two
// registrations of the same names; protobuf-go refuses that at start-up
// unless GOLANG_PROTOBUF_REGISTRATION_CONFLICT=warn is set.
package inferencepb

//go:generate sh -c "protoc --plugin=protoc-gen-go=$(go tool -n protoc-gen-go) --plugin=protoc-gen-go-grpc=$(go tool -n protoc-gen-go-grpc) --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative grpc_predict_v2.proto"
