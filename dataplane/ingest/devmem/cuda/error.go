package cuda

import (
	"errors"
	"fmt"
)

// Error is a driver API call that did not return CUDA_SUCCESS.
type Error struct {
	Call string // the entry point, e.g. "cuMemCreate"
	Code int    // the CUresult
	Name string // cuGetErrorName's, e.g. "CUDA_ERROR_NOT_SUPPORTED"
	Text string // cuGetErrorString's
	// Log is the JIT compiler's error log, for cuModuleLoadDataEx.
	Log string
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%s: %s (%d): %s", e.Call, e.Name, e.Code, e.Text)
	if e.Log != "" {
		s += "\nJIT log:\n" + e.Log
	}
	return s
}

// Is makes errors.Is(err, ErrNotSupported) true for the codes by which a
// driver refuses an operation it does not offer.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrNotSupported:
		return e.Code == errNotSupportedCode || e.Code == errNotPermittedCode
	case ErrNoDevice:
		return e.Code == errNoDeviceCode
	}
	return false
}

// Sentinels that errors of this package may wrap.
var (
	// ErrNotSupported: the driver or device refuses the operation
	// (CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_PERMITTED).
	ErrNotSupported = errors.New("not supported by the driver or device")
	// ErrNoDevice: the driver sees no such GPU.
	ErrNoDevice = errors.New("no such CUDA device")
	// ErrClosed: the device or importer was closed.
	ErrClosed = errors.New("closed")
)

// check turns r into nil or an *Error naming call.
func (d *driver) check(call string, r cuResult) error {
	if r == cuSuccess {
		return nil
	}
	e := &Error{Call: call, Code: int(r), Name: "CUDA_ERROR_UNKNOWN_CODE", Text: "unrecognized error code"}
	var s *byte
	if d.cuGetErrorName(r, &s) == cuSuccess {
		e.Name = goString(s)
	}
	s = nil
	if d.cuGetErrorString(r, &s) == cuSuccess {
		e.Text = goString(s)
	}
	return e
}
