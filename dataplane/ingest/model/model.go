// Package model holds the models that accelerator ingest runs: what input
// each accepts, how large its output is, and its CPU reference
// implementation. The reference is what the shared-memory device runs and
// what the CUDA device's PTX kernels are checked against; it is plain Go on
// byte slices so that it runs in place on a mapped buffer.
package model

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"
)

// ErrBadInput is wrapped by errors about an input a model does not accept.
var ErrBadInput = errors.New("input not accepted by the model")

// Model is one model.
type Model struct {
	Name string
	// Doc is one line for `lovelock ingest models` and the docs.
	Doc string
	// Multiple is the input size granularity in bytes (the size of one
	// row); inputs are a positive number of rows. 1 accepts any length.
	Multiple int
	// OutputSize returns the output length for an input of n bytes.
	OutputSize func(n int) int
	// Reference computes the output of in into out (len(out) ≥
	// OutputSize(len(in))) on the CPU and returns its length.
	Reference func(in, out []byte) int
	// External models are served by a user's process attached to the
	// host agent (the Python hand-off); Reference is nil for them.
	External bool
}

// Check returns an error wrapping ErrBadInput unless n bytes is an input
// the model accepts.
func (m *Model) Check(n int) error {
	if n <= 0 {
		return fmt.Errorf("model %s: empty input: %w", m.Name, ErrBadInput)
	}
	if m.Multiple > 1 && n%m.Multiple != 0 {
		return fmt.Errorf("model %s: input of %d bytes is not a whole number of %d-byte rows: %w", m.Name, n, m.Multiple, ErrBadInput)
	}
	return nil
}

// Builtin returns the built-in model named name.
func Builtin(name string) (*Model, error) {
	for _, m := range builtins {
		if m.Name == name {
			return m, nil
		}
	}
	return nil, fmt.Errorf("no built-in model %q (built in: %v)", name, BuiltinNames())
}

// BuiltinNames lists the built-in models, sorted.
func BuiltinNames() []string {
	var out []string
	for _, m := range builtins {
		out = append(out, m.Name)
	}
	sort.Strings(out)
	return out
}

// NewExternal returns an external model: one a user's own process serves.
func NewExternal(name string, multiple int, outputSize func(int) int) *Model {
	return &Model{Name: name, Doc: "served by a process attached to the host agent", Multiple: multiple, OutputSize: outputSize, External: true}
}

var builtins = []*Model{
	{
		Name:       "checksum",
		Doc:        "two 32-bit sums of the input bytes, computed where the bytes landed: proves they arrived intact",
		Multiple:   1,
		OutputSize: func(int) int { return ChecksumLen },
		Reference:  checksumInto,
	},
	{
		Name:       "mlp",
		Doc:        fmt.Sprintf("a %d-%d-%d perceptron (ReLU) over float32 rows, fixed weights", MLPIn, MLPHidden, MLPOut),
		Multiple:   MLPIn * 4,
		OutputSize: func(n int) int { return n / (MLPIn * 4) * MLPOut * 4 },
		Reference:  mlpInto,
	},
}

// ChecksumLen is the checksum model's output length.
const ChecksumLen = 8

// Checksum returns the checksum model's output for in: little-endian
// A = Σ b_i and B = Σ (i+1)·b_i, both mod 2³². Unlike a CRC it is a sum of
// independent terms, so a GPU computes it with one atomic add per thread
// and the CPU reference gives exactly the same bits; B makes it sensitive
// to bytes landing at the wrong offset.
func Checksum(in []byte) [ChecksumLen]byte {
	var a, b uint32
	for i, v := range in {
		a += uint32(v)
		b += uint32(i+1) * uint32(v)
	}
	var out [ChecksumLen]byte
	binary.LittleEndian.PutUint32(out[0:], a)
	binary.LittleEndian.PutUint32(out[4:], b)
	return out
}

func checksumInto(in, out []byte) int {
	s := Checksum(in)
	return copy(out, s[:])
}

// The MLP's shape.
const (
	MLPIn     = 64
	MLPHidden = 64
	MLPOut    = 16
)

// MLPWeights are the MLP's fixed parameters: W1 is MLPHidden×MLPIn (row
// major), then B1, W2 (MLPOut×MLPHidden), B2. The CUDA kernel receives the
// same numbers.
type MLPWeights struct {
	W1 [MLPHidden * MLPIn]float32
	B1 [MLPHidden]float32
	W2 [MLPOut * MLPHidden]float32
	B2 [MLPOut]float32
}

// Weights returns the MLP's parameters: small values from a fixed
// xorshift sequence, so every build and device uses the same ones.
func Weights() *MLPWeights {
	w := &MLPWeights{}
	x := uint32(2463534242)
	next := func() float32 {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		return (float32(x%2001) - 1000) / 8000 // [-0.125, 0.125]
	}
	for i := range w.W1 {
		w.W1[i] = next()
	}
	for i := range w.B1 {
		w.B1[i] = next()
	}
	for i := range w.W2 {
		w.W2[i] = next()
	}
	for i := range w.B2 {
		w.B2[i] = next()
	}
	return w
}

var mlpWeights = Weights()

// MLPRow computes one row: out = W2·relu(W1·in + B1) + B2.
func MLPRow(w *MLPWeights, in *[MLPIn]float32, out *[MLPOut]float32) {
	var h [MLPHidden]float32
	for j := range h {
		s := w.B1[j]
		for k := 0; k < MLPIn; k++ {
			s += w.W1[j*MLPIn+k] * in[k]
		}
		h[j] = max(s, 0)
	}
	for j := range out {
		s := w.B2[j]
		for k := 0; k < MLPHidden; k++ {
			s += w.W2[j*MLPHidden+k] * h[k]
		}
		out[j] = s
	}
}

func mlpInto(in, out []byte) int {
	rows := len(in) / (MLPIn * 4)
	var x [MLPIn]float32
	var y [MLPOut]float32
	for r := 0; r < rows; r++ {
		row := in[r*MLPIn*4:]
		for k := range x {
			x[k] = math.Float32frombits(binary.LittleEndian.Uint32(row[k*4:]))
		}
		MLPRow(mlpWeights, &x, &y)
		o := out[r*MLPOut*4:]
		for k, v := range y {
			binary.LittleEndian.PutUint32(o[k*4:], math.Float32bits(v))
		}
	}
	return rows * MLPOut * 4
}

// Close reports whether two MLP outputs agree within tolerance: a GPU sums
// in another order (and may fuse multiply-adds), so bits differ slightly.
func Close(a, b []byte) bool {
	if len(a) != len(b) || len(a)%4 != 0 {
		return false
	}
	for i := 0; i < len(a); i += 4 {
		x := math.Float32frombits(binary.LittleEndian.Uint32(a[i:]))
		y := math.Float32frombits(binary.LittleEndian.Uint32(b[i:]))
		if d := math.Abs(float64(x - y)); d > 1e-4+1e-4*math.Abs(float64(y)) {
			return false
		}
	}
	return true
}
