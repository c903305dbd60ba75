package kserve

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo detail that the
// server attaches to every failed ModelInfer; its Reason is the ingest
// status's name ("too-large", "overloaded", ...). The gRPC code alone
// cannot say which of two statuses that share it (BadRequest and TooLarge,
// ModelFailed and Internal) a request met; the detail can.
const ErrorDomain = "ingest.lovelock"

// Code returns the gRPC code a request that ended in status s answers
// with.
func Code(s ingest.Status) codes.Code {
	switch s {
	case ingest.StatusOK:
		return codes.OK
	case ingest.StatusBadRequest, ingest.StatusTooLarge:
		return codes.InvalidArgument
	case ingest.StatusUnknownModel:
		return codes.NotFound
	case ingest.StatusNotGranted:
		return codes.PermissionDenied
	case ingest.StatusDeadline:
		return codes.DeadlineExceeded
	case ingest.StatusOverloaded:
		return codes.ResourceExhausted
	case ingest.StatusHostUnavailable:
		return codes.Unavailable
	}
	return codes.Internal
}

// statusFromCode is Code's inverse where the code alone decides.
func statusFromCode(c codes.Code) ingest.Status {
	switch c {
	case codes.OK:
		return ingest.StatusOK
	case codes.InvalidArgument, codes.OutOfRange, codes.FailedPrecondition:
		return ingest.StatusBadRequest
	case codes.NotFound:
		return ingest.StatusUnknownModel
	case codes.PermissionDenied, codes.Unauthenticated:
		return ingest.StatusNotGranted
	case codes.DeadlineExceeded:
		return ingest.StatusDeadline
	case codes.ResourceExhausted:
		return ingest.StatusOverloaded
	case codes.Unavailable:
		return ingest.StatusHostUnavailable
	}
	return ingest.StatusInternal
}

// statusByName maps Status.String back to the status.
var statusByName = func() map[string]ingest.Status {
	m := map[string]ingest.Status{}
	for s := ingest.StatusOK; s <= ingest.StatusInternal; s++ {
		m[s.String()] = s
	}
	return m
}()

// toGRPC turns a Submitter's or the front end's error into the gRPC status
// the client gets: the code from Code, the *ingest.Error's message (which
// says what to do), a hint for retryable statuses, and an ErrorInfo detail
// naming the status. A caller that went away gets Canceled.
func toGRPC(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || ctx.Err() == context.Canceled {
		return status.Error(codes.Canceled, "the client cancelled the request")
	}
	s := ingest.StatusOf(err)
	msg := err.Error()
	var e *ingest.Error
	if errors.As(err, &e) {
		msg = e.Msg
	}
	msg = s.String() + ": " + msg
	if s.Retryable() {
		msg += " (the same request may succeed if sent again)"
	}
	st := status.New(Code(s), msg)
	if d, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: s.String(), Domain: ErrorDomain}); derr == nil {
		st = d
	}
	return st.Err()
}

// fromGRPC turns a gRPC error back into an *ingest.Error: the status named
// in our ErrorInfo detail when the server attached one, else the status
// the code maps to. ResourceExhausted without our detail comes from gRPC
// itself, which answers it for a message over a size limit: TooLarge, not
// Overloaded, since sending it again cannot help.
func fromGRPC(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return ingest.Errorf(ingest.StatusInternal, "%v", err)
	}
	if st.Code() == codes.Canceled {
		return err
	}
	msg := st.Message()
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			if s, ok := statusByName[info.GetReason()]; ok {
				return &ingest.Error{Status: s, Msg: strings.TrimPrefix(msg, s.String()+": ")}
			}
		}
	}
	if st.Code() == codes.ResourceExhausted {
		return ingest.Errorf(ingest.StatusTooLarge, "%s; the message exceeds a gRPC size limit: send smaller inputs or raise the limits (kserve.Options.MaxRecvMsgSize on the server)", msg)
	}
	return &ingest.Error{Status: statusFromCode(st.Code()), Msg: msg}
}
