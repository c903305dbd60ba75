package inferencepb

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// wire lists what stock clients depend on: the method paths and each
// field's full name, number, kind and cardinality, as the Open Inference
// Protocol defines them. Editing the .proto must not change any of it.
var wire = `
/inference.GRPCInferenceService/ServerLive
/inference.GRPCInferenceService/ServerReady
/inference.GRPCInferenceService/ModelReady
/inference.GRPCInferenceService/ServerMetadata
/inference.GRPCInferenceService/ModelMetadata
/inference.GRPCInferenceService/ModelInfer
inference.ServerLiveResponse.live 1 optional bool
inference.ServerReadyResponse.ready 1 optional bool
inference.ModelReadyRequest.name 1 optional string
inference.ModelReadyRequest.version 2 optional string
inference.ModelReadyResponse.ready 1 optional bool
inference.ServerMetadataResponse.name 1 optional string
inference.ServerMetadataResponse.version 2 optional string
inference.ServerMetadataResponse.extensions 3 repeated string
inference.ModelMetadataRequest.name 1 optional string
inference.ModelMetadataRequest.version 2 optional string
inference.ModelMetadataResponse.name 1 optional string
inference.ModelMetadataResponse.versions 2 repeated string
inference.ModelMetadataResponse.platform 3 optional string
inference.ModelMetadataResponse.inputs 4 repeated message inference.ModelMetadataResponse.TensorMetadata
inference.ModelMetadataResponse.outputs 5 repeated message inference.ModelMetadataResponse.TensorMetadata
inference.ModelMetadataResponse.TensorMetadata.name 1 optional string
inference.ModelMetadataResponse.TensorMetadata.datatype 2 optional string
inference.ModelMetadataResponse.TensorMetadata.shape 3 repeated int64
inference.ModelInferRequest.model_name 1 optional string
inference.ModelInferRequest.model_version 2 optional string
inference.ModelInferRequest.id 3 optional string
inference.ModelInferRequest.parameters 4 map inference.InferParameter
inference.ModelInferRequest.inputs 5 repeated message inference.ModelInferRequest.InferInputTensor
inference.ModelInferRequest.outputs 6 repeated message inference.ModelInferRequest.InferRequestedOutputTensor
inference.ModelInferRequest.raw_input_contents 7 repeated bytes
inference.ModelInferRequest.InferInputTensor.name 1 optional string
inference.ModelInferRequest.InferInputTensor.datatype 2 optional string
inference.ModelInferRequest.InferInputTensor.shape 3 repeated int64
inference.ModelInferRequest.InferInputTensor.parameters 4 map inference.InferParameter
inference.ModelInferRequest.InferInputTensor.contents 5 optional message inference.InferTensorContents
inference.ModelInferRequest.InferRequestedOutputTensor.name 1 optional string
inference.ModelInferRequest.InferRequestedOutputTensor.parameters 2 map inference.InferParameter
inference.ModelInferResponse.model_name 1 optional string
inference.ModelInferResponse.model_version 2 optional string
inference.ModelInferResponse.id 3 optional string
inference.ModelInferResponse.parameters 4 map inference.InferParameter
inference.ModelInferResponse.outputs 5 repeated message inference.ModelInferResponse.InferOutputTensor
inference.ModelInferResponse.raw_output_contents 6 repeated bytes
inference.ModelInferResponse.InferOutputTensor.name 1 optional string
inference.ModelInferResponse.InferOutputTensor.datatype 2 optional string
inference.ModelInferResponse.InferOutputTensor.shape 3 repeated int64
inference.ModelInferResponse.InferOutputTensor.parameters 4 map inference.InferParameter
inference.ModelInferResponse.InferOutputTensor.contents 5 optional message inference.InferTensorContents
inference.InferParameter.bool_param 1 optional bool oneof parameter_choice
inference.InferParameter.int64_param 2 optional int64 oneof parameter_choice
inference.InferParameter.string_param 3 optional string oneof parameter_choice
inference.InferTensorContents.bool_contents 1 repeated bool
inference.InferTensorContents.int_contents 2 repeated int32
inference.InferTensorContents.int64_contents 3 repeated int64
inference.InferTensorContents.uint_contents 4 repeated uint32
inference.InferTensorContents.uint64_contents 5 repeated uint64
inference.InferTensorContents.fp32_contents 6 repeated float
inference.InferTensorContents.fp64_contents 7 repeated double
inference.InferTensorContents.bytes_contents 8 repeated bytes
`

func TestWireNames(t *testing.T) {
	var got []string
	svcs := File_grpc_predict_v2_proto.Services()
	for i := range svcs.Len() {
		ms := svcs.Get(i).Methods()
		for j := range ms.Len() {
			got = append(got, fmt.Sprintf("/%s/%s", svcs.Get(i).FullName(), ms.Get(j).Name()))
		}
	}
	var walk func(protoreflect.MessageDescriptors)
	walk = func(msgs protoreflect.MessageDescriptors) {
		for i := range msgs.Len() {
			m := msgs.Get(i)
			if m.IsMapEntry() {
				continue
			}
			fs := m.Fields()
			for j := range fs.Len() {
				got = append(got, field(fs.Get(j)))
			}
			walk(m.Messages())
		}
	}
	walk(File_grpc_predict_v2_proto.Messages())

	want := strings.Split(strings.TrimSpace(wire), "\n")
	slices.Sort(got)
	slices.Sort(want)
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("missing or changed: %s", w)
		}
	}
	for _, g := range got {
		if !slices.Contains(want, g) {
			t.Errorf("not in the protocol: %s", g)
		}
	}
}

func field(f protoreflect.FieldDescriptor) string {
	s := fmt.Sprintf("%s %d ", f.FullName(), f.Number())
	switch {
	case f.IsMap():
		s += "map " + string(f.MapValue().Message().FullName())
	case f.Kind() == protoreflect.MessageKind:
		s += fmt.Sprintf("%s message %s", f.Cardinality(), f.Message().FullName())
	default:
		s += fmt.Sprintf("%s %s", f.Cardinality(), f.Kind())
	}
	if o := f.ContainingOneof(); o != nil {
		s += " oneof " + string(o.Name())
	}
	return s
}
