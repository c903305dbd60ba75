package kserve

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	pb "github.com/lovelock-dpu/lovelock/dataplane/ingest/kserve/inferencepb"
)

// elemSize returns the size in bytes of one element of the protocol's
// datatype dt, or 0 for BYTES (variable) and unknown names.
func elemSize(dt string) int {
	switch dt {
	case "BOOL", "UINT8", "INT8":
		return 1
	case "UINT16", "INT16", "FP16", "BF16":
		return 2
	case "UINT32", "INT32", "FP32":
		return 4
	case "UINT64", "INT64", "FP64":
		return 8
	}
	return 0
}

// product returns the number of elements of a tensor of shape dims, and
// false if a dimension is negative or the product overflows what a
// message could hold.
func product(dims []int64) (int64, bool) {
	n := int64(1)
	for _, d := range dims {
		if d < 0 || (d > 0 && n > math.MaxInt32/d) {
			return 0, false
		}
		n *= d
	}
	return n, true
}

func badRequest(format string, args ...any) *ingest.Error {
	return ingest.Errorf(ingest.StatusBadRequest, format, args...)
}

// inputBytes returns the bytes of a request's single input tensor: the raw
// contents when the request has them (not copied), the typed contents
// converted to little-endian bytes otherwise. For BYTES tensors it also
// returns the element count, which their byte length does not give.
//
// With limit > 0 (the model's MaxInput), a tensor whose shape, typed
// element count or BYTES elements say more than limit bytes is refused as
// too-large before anything is converted or copied: typed contents take
// up to 8 times their wire size once converted, and empty BYTES elements
// are 2 bytes each on the wire.
func inputBytes(req *pb.ModelInferRequest, limit int) (data []byte, elems int64, err error) {
	if n := len(req.GetInputs()); n != 1 {
		return nil, 0, badRequest("model %s takes exactly one input tensor, the request has %d; send the input as one tensor", req.GetModelName(), n)
	}
	in := req.GetInputs()[0]
	if err := checkSize(req, limit); err != nil {
		return nil, 0, err
	}
	raw := req.GetRawInputContents()
	if len(raw) > 0 {
		if len(raw) != 1 {
			return nil, 0, badRequest("raw_input_contents has %d entries for 1 input tensor; send one", len(raw))
		}
		if hasContents(in.GetContents()) {
			return nil, 0, badRequest("input %q has both raw_input_contents and typed contents; send one of them", in.GetName())
		}
		if in.GetDatatype() == "BYTES" {
			return decodeRawBytes(raw[0])
		}
		return raw[0], 0, nil
	}
	if err := checkFields(in); err != nil {
		return nil, 0, err
	}
	return contentsBytes(in.GetDatatype(), in.GetContents())
}

// contentsField names the typed contents field of each datatype that has
// one.
var contentsField = map[string]string{
	"BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
	"INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
	"UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}

// checkFields refuses typed contents in a field other than the one the
// tensor's datatype takes: converting only that field would take the
// input for empty, or drop what the others carry.
func checkFields(in *pb.ModelInferRequest_InferInputTensor) error {
	want, ok := contentsField[in.GetDatatype()]
	if !ok {
		return nil // no typed field: contentsBytes says to send it raw
	}
	c := in.GetContents()
	var have []string
	stray := false
	for _, f := range []struct {
		name string
		n    int
	}{
		{"bool_contents", len(c.GetBoolContents())}, {"int_contents", len(c.GetIntContents())},
		{"int64_contents", len(c.GetInt64Contents())}, {"uint_contents", len(c.GetUintContents())},
		{"uint64_contents", len(c.GetUint64Contents())}, {"fp32_contents", len(c.GetFp32Contents())},
		{"fp64_contents", len(c.GetFp64Contents())}, {"bytes_contents", len(c.GetBytesContents())},
	} {
		if f.n > 0 {
			have = append(have, f.name)
			stray = stray || f.name != want
		}
	}
	if stray {
		return badRequest("input %q of %s takes its typed contents in %s; the request has %s: send them in %s alone",
			in.GetName(), in.GetDatatype(), want, strings.Join(have, ", "), want)
	}
	return nil
}

// checkSize refuses, as too-large, a single input tensor that says it is
// over limit bytes: by its shape (fixed-size datatypes), by the number of
// typed elements it carries, or for BYTES by its element count or the
// sum of its elements' lengths. It allocates nothing.
func checkSize(req *pb.ModelInferRequest, limit int) error {
	if limit <= 0 {
		return nil
	}
	in := req.GetInputs()[0]
	dt, c := in.GetDatatype(), in.GetContents()
	tooLarge := func(what string) error {
		return ingest.Errorf(ingest.StatusTooLarge, "input %q: %s exceeds model %s's largest, %d bytes; split it into smaller requests",
			in.GetName(), what, req.GetModelName(), limit)
	}
	if size := elemSize(dt); size > 0 {
		if elems, ok := product(in.GetShape()); ok && elems*int64(size) > int64(limit) {
			return tooLarge(fmt.Sprintf("shape %v of %s, %d bytes,", in.GetShape(), dt, elems*int64(size)))
		}
	}
	if dt == "BYTES" {
		if elems, ok := product(in.GetShape()); ok && elems > int64(limit) {
			return tooLarge(fmt.Sprintf("shape %v, %d BYTES elements,", in.GetShape(), elems))
		}
		if n := len(c.GetBytesContents()); n > limit {
			return tooLarge(fmt.Sprintf("a BYTES tensor of %d elements", n))
		}
		total := 0
		for _, e := range c.GetBytesContents() {
			if total += len(e); total > limit {
				return tooLarge("its BYTES elements together")
			}
		}
		return nil
	}
	typed := max(len(c.GetBoolContents()), len(c.GetIntContents()), len(c.GetInt64Contents()), len(c.GetUintContents()),
		len(c.GetUint64Contents()), len(c.GetFp32Contents()), len(c.GetFp64Contents()))
	if size := max(elemSize(dt), 1); int64(typed)*int64(size) > int64(limit) {
		return tooLarge(fmt.Sprintf("%d typed elements of %s, %d bytes,", typed, dt, int64(typed)*int64(size)))
	}
	return nil
}

func hasContents(c *pb.InferTensorContents) bool {
	return len(c.GetBoolContents())+len(c.GetIntContents())+len(c.GetInt64Contents())+
		len(c.GetUintContents())+len(c.GetUint64Contents())+len(c.GetFp32Contents())+
		len(c.GetFp64Contents())+len(c.GetBytesContents()) > 0
}

// decodeRawBytes undoes Triton's raw layout for BYTES tensors: each
// element is a 4-byte little-endian length and that many bytes. The
// elements are concatenated.
func decodeRawBytes(raw []byte) ([]byte, int64, error) {
	out := make([]byte, 0, len(raw))
	var n int64
	for len(raw) > 0 {
		if len(raw) < 4 {
			return nil, 0, badRequest("BYTES raw contents end inside an element's 4-byte length prefix")
		}
		l := binary.LittleEndian.Uint32(raw)
		raw = raw[4:]
		if uint64(l) > uint64(len(raw)) {
			return nil, 0, badRequest("BYTES raw contents: element %d says %d bytes, %d remain", n, l, len(raw))
		}
		out = append(out, raw[:l]...)
		raw = raw[l:]
		n++
	}
	return out, n, nil
}

// contentsBytes converts typed contents of datatype dt to the
// little-endian bytes raw contents would carry. FP16 and BF16 have no
// typed field in the protocol and must come raw.
func contentsBytes(dt string, c *pb.InferTensorContents) ([]byte, int64, error) {
	switch dt {
	case "BYTES":
		var out []byte
		for _, e := range c.GetBytesContents() {
			out = append(out, e...)
		}
		return out, int64(len(c.GetBytesContents())), nil
	case "BOOL":
		out := make([]byte, len(c.GetBoolContents()))
		for i, v := range c.GetBoolContents() {
			if v {
				out[i] = 1
			}
		}
		return out, 0, nil
	case "UINT8", "UINT16", "UINT32":
		size := elemSize(dt)
		limit := uint64(1)<<(8*size) - 1
		out := make([]byte, len(c.GetUintContents())*size)
		for i, v := range c.GetUintContents() {
			if uint64(v) > limit {
				return nil, 0, badRequest("uint_contents[%d] = %d does not fit %s", i, v, dt)
			}
			putUint(out[i*size:], size, uint64(v))
		}
		return out, 0, nil
	case "INT8", "INT16", "INT32":
		size := elemSize(dt)
		lo, hi := -int64(1)<<(8*size-1), int64(1)<<(8*size-1)-1
		out := make([]byte, len(c.GetIntContents())*size)
		for i, v := range c.GetIntContents() {
			if int64(v) < lo || int64(v) > hi {
				return nil, 0, badRequest("int_contents[%d] = %d does not fit %s", i, v, dt)
			}
			putUint(out[i*size:], size, uint64(v))
		}
		return out, 0, nil
	case "UINT64":
		out := make([]byte, 8*len(c.GetUint64Contents()))
		for i, v := range c.GetUint64Contents() {
			binary.LittleEndian.PutUint64(out[8*i:], v)
		}
		return out, 0, nil
	case "INT64":
		out := make([]byte, 8*len(c.GetInt64Contents()))
		for i, v := range c.GetInt64Contents() {
			binary.LittleEndian.PutUint64(out[8*i:], uint64(v))
		}
		return out, 0, nil
	case "FP32":
		out := make([]byte, 4*len(c.GetFp32Contents()))
		for i, v := range c.GetFp32Contents() {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
		}
		return out, 0, nil
	case "FP64":
		out := make([]byte, 8*len(c.GetFp64Contents()))
		for i, v := range c.GetFp64Contents() {
			binary.LittleEndian.PutUint64(out[8*i:], math.Float64bits(v))
		}
		return out, 0, nil
	}
	return nil, 0, badRequest("datatype %q cannot come as typed contents; send it in raw_input_contents", dt)
}

func putUint(b []byte, size int, v uint64) {
	switch size {
	case 1:
		b[0] = byte(v)
	case 2:
		binary.LittleEndian.PutUint16(b, uint16(v))
	case 4:
		binary.LittleEndian.PutUint32(b, uint32(v))
	}
}

// checkInput checks an input tensor's datatype and shape, and its data's
// length, against the model, and returns the number of rows. The shape is
// [rows, RowShape...], optionally after dimensions of 1 (a batch of one,
// as clients of batching servers send). A model whose row is one element
// takes any shape: every arrangement of its elements is whole rows. A
// UINT8 model also takes a BYTES tensor of any shape: its elements are
// concatenated and the total must be whole rows.
func checkInput(info *ingest.ModelInfo, in *pb.ModelInferRequest_InferInputTensor, n int, bytesElems int64) (int, error) {
	dt, shape := in.GetDatatype(), in.GetShape()
	rowBytes := max(info.RowBytes, 1)
	if n == 0 {
		return 0, badRequest("input %q is empty; model %s takes whole rows of %d bytes", in.GetName(), info.Name, rowBytes)
	}
	if n > info.MaxInput && info.MaxInput > 0 {
		return 0, ingest.Errorf(ingest.StatusTooLarge, "input of %d bytes exceeds model %s's largest, %d bytes; split it into smaller requests", n, info.Name, info.MaxInput)
	}
	elems, ok := product(shape)
	if !ok || len(shape) == 0 {
		return 0, badRequest("input %q has shape %v; give every dimension, none negative", in.GetName(), shape)
	}
	if dt == "BYTES" && (info.Datatype == "UINT8" || info.Datatype == "BYTES") {
		if elems != bytesElems {
			return 0, badRequest("input %q: shape %v says %d BYTES elements, the contents have %d", in.GetName(), shape, elems, bytesElems)
		}
		if n%rowBytes != 0 {
			return 0, badRequest("input %q: %d bytes is not a whole number of model %s's %d-byte rows", in.GetName(), n, info.Name, rowBytes)
		}
		return n / rowBytes, nil
	}
	if dt != info.Datatype {
		return 0, badRequest("input %q has datatype %q; model %s takes %q", in.GetName(), dt, info.Name, info.Datatype)
	}
	size := elemSize(dt)
	if size == 0 {
		return 0, ingest.Errorf(ingest.StatusInternal, "model %s declares datatype %q, which has no fixed element size", info.Name, dt)
	}
	if int64(n) != elems*int64(size) {
		return 0, badRequest("input %q: shape %v of %s is %d bytes, the contents are %d", in.GetName(), shape, dt, elems*int64(size), n)
	}
	if !rowShapeMatches(shape, info.RowShape) {
		return 0, badRequest("input %q has shape %v; model %s takes [rows%s]", in.GetName(), shape, info.Name, dimsString(info.RowShape))
	}
	if n%rowBytes != 0 {
		return 0, badRequest("input %q: %d bytes is not a whole number of model %s's %d-byte rows", in.GetName(), n, info.Name, rowBytes)
	}
	return n / rowBytes, nil
}

func rowShapeMatches(shape, row []int64) bool {
	if n, _ := product(row); n == 1 {
		return true
	}
	for len(shape) > len(row)+1 && shape[0] == 1 {
		shape = shape[1:]
	}
	if len(shape) != len(row)+1 {
		return false
	}
	for i, d := range row {
		if shape[i+1] != d {
			return false
		}
	}
	return true
}

func dimsString(dims []int64) string {
	s := ""
	for _, d := range dims {
		s += fmt.Sprintf(", %d", d)
	}
	return s
}

// outputShape is the output tensor's shape for an input of rows rows and
// an output of n bytes. A -1 in OutRowShape (the metadata's variable
// dimension, as KServe v2 writes it) is known only from the result: it is
// what makes the shape hold n bytes, or left -1 if none does, which the
// caller refuses.
func outputShape(info *ingest.ModelInfo, rows, n int) []int64 {
	first := int64(1)
	if info.OutPerRow {
		first = int64(rows)
	}
	shape := append([]int64{first}, info.OutRowShape...)
	at := slices.Index(shape, -1)
	if at < 0 {
		return shape
	}
	shape[at] = 1
	known, ok := product(shape)
	size := int64(elemSize(info.OutDatatype))
	if ok && known > 0 && size > 0 && int64(n)%(known*size) == 0 {
		shape[at] = int64(n) / (known * size)
	} else {
		shape[at] = -1
	}
	return shape
}
