package ingest

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Request is one inference request, whole: what a front end hands the
// DPU agent once it has received and reassembled the input.
type Request struct {
	Tenant uint32
	Model  string
	Input  []byte
	// Deadline is when the result is due; zero means none. A request
	// whose deadline has passed when it is placed is refused
	// (StatusDeadline), not run.
	Deadline time.Time
}

// Result is a completed request's output and where and how long it ran.
type Result struct {
	Output []byte
	// GPU and Slice say where it ran: the GPU's index on its host and the
	// slice (MIG instance) name, e.g. "1g.10gb@3".
	GPU   int
	Slice string
	// Queued is the time from arrival at the DPU to placement, Device the
	// time from the doorbell to the host's completion.
	Queued time.Duration
	Device time.Duration
}

// Submitter takes whole requests and returns their results. The DPU agent
// implements it; the gRPC front end (package kserve) calls it.
type Submitter interface {
	Infer(ctx context.Context, r *Request) (*Result, error)
}

// Status is a request's outcome on the wire.
type Status uint8

// The statuses. A client may retry Overloaded and HostUnavailable as is;
// the others need a changed request.
const (
	StatusOK              Status = 0
	StatusBadRequest      Status = 1 // malformed, truncated or inconsistent input
	StatusUnknownModel    Status = 2
	StatusNotGranted      Status = 3 // the tenant may not use this model
	StatusTooLarge        Status = 4 // input larger than the model's slices take
	StatusDeadline        Status = 5 // deadline passed before the work could start
	StatusOverloaded      Status = 6 // no slice free and the queue is full
	StatusHostUnavailable Status = 7 // no GPU host registered, or it restarted mid-request
	StatusModelFailed     Status = 8 // the model ran and failed
	StatusInternal        Status = 9
	// StatusReleased is the control protocol's only (never a client's):
	// the host's answer to a doorbell marked FlagGivenUp for a request it
	// has no record of. It ran nothing, and the slot is free.
	StatusReleased Status = 10
)

func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusBadRequest:
		return "bad-request"
	case StatusUnknownModel:
		return "unknown-model"
	case StatusNotGranted:
		return "not-granted"
	case StatusTooLarge:
		return "too-large"
	case StatusDeadline:
		return "deadline"
	case StatusOverloaded:
		return "overloaded"
	case StatusHostUnavailable:
		return "host-unavailable"
	case StatusModelFailed:
		return "model-failed"
	case StatusInternal:
		return "internal"
	case StatusReleased:
		return "released"
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Retryable reports whether the same request may succeed if sent again.
func (s Status) Retryable() bool {
	return s == StatusOverloaded || s == StatusHostUnavailable
}

// Error is a request's failure: its status and a message that says what
// to do.
type Error struct {
	Status Status
	Msg    string
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Status, e.Msg) }

// Errorf returns an *Error with status s.
func Errorf(s Status, format string, args ...any) *Error {
	return &Error{Status: s, Msg: fmt.Sprintf(format, args...)}
}

// StatusOf returns err's status: StatusOK for nil, the status of an *Error
// in its chain, StatusDeadline for a context deadline, and StatusInternal
// otherwise.
func StatusOf(err error) Status {
	if err == nil {
		return StatusOK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return StatusDeadline
	}
	return StatusInternal
}

// ModelInfo describes a model a DPU agent serves, for front ends that
// publish metadata (KServe's ModelMetadata) and for `lovelock ingest`.
type ModelInfo struct {
	Name string `json:"name"`
	Doc  string `json:"doc,omitempty"`
	// RowBytes is the input's granularity: inputs are whole rows.
	RowBytes int `json:"row_bytes"`
	// MaxInput is the largest input the model's slices take.
	MaxInput int `json:"max_input"`
	// Datatype and RowShape describe a row as a tensor (KServe: "FP32"
	// and [64] for the MLP; "UINT8" and [1] for byte models).
	Datatype string  `json:"datatype"`
	RowShape []int64 `json:"row_shape"`
	// OutDatatype and OutRowShape describe one output row; OutRows says
	// how many output rows an input of n rows gives (n, or 1).
	OutDatatype string   `json:"out_datatype"`
	OutRowShape []int64  `json:"out_row_shape"`
	OutPerRow   bool     `json:"out_per_row"`
	Profile     string   `json:"profile"` // the MIG profile its requests ask for
	Tenants     []uint32 `json:"tenants,omitempty"`
	// Ready is whether a GPU host is registered now and runs the model:
	// whether a request for it can be served, as KServe's ModelReady
	// means. A configured model is listed either way.
	Ready bool `json:"ready"`
}

// Catalog lists the models a front end may offer, whether ready or not;
// the DPU agent implements it.
type Catalog interface {
	Models() []ModelInfo
}
