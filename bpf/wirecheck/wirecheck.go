// Package wirecheck runs frames through the data plane's C parser
// (bpf/include/parse.h) in the kernel with BPF_PROG_TEST_RUN, so tests can
// hold it against the Go parser in dataplane/wire. It is for tests only: no
// shipped binary imports it, so none carries its program, and it never
// touches live traffic.
//
// Regenerate the object after editing C with `make generate`.
package wirecheck

//go:generate go tool bpf2go -tags linux -cc clang -cflags "-O2 -g -Wall -Werror" -target bpfel -type ll_hdr -type ll_status -type wire_result -type flow_key wirecheck wirecheck.c -- -I.. -I../include

import (
	"encoding/binary"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/lovelock-dpu/lovelock/bpf"
)

// Header is struct ll_hdr exactly as the C side lays it out (from the
// object's BTF). Multi-byte fields hold network-order bytes; the type exists
// so tests can compare its size and field offsets with dataplane/wire.
type Header = wirecheckLlHdr

// Status is the C parser's verdict on a frame (enum ll_status, generated
// from the object's BTF).
type Status = wirecheckLlStatus

// The C parser's verdicts; dataplane/wire maps its errors onto the same set.
const (
	OK          = wirecheckLlStatusLL_OK           // a valid Lovelock header
	NotLovelock = wirecheckLlStatusLL_NOT_LOVELOCK // well-formed, but not UDP to the Lovelock port
	Truncated   = wirecheckLlStatusLL_TRUNCATED    // a header ends past the frame
	BadVersion  = wirecheckLlStatusLL_BAD_VERSION  // unknown header version
	BadLength   = wirecheckLlStatusLL_BAD_LENGTH   // length field disagrees with the UDP payload
	UnknownType = wirecheckLlStatusLL_UNKNOWN_TYPE // unknown message type
	BadHeader   = wirecheckLlStatusLL_BAD_HEADER   // invalid L3/L4 header
)

// Result is what the C parser found in one frame.
type Result struct {
	Status Status
	// Offset of the Lovelock header from the start of the frame (OK only).
	Offset uint32
	// Header is the raw 24-byte Lovelock header (OK only).
	Header [24]byte
	// Key is the flow key rules would match (zero fields the parser did
	// not reach; steer zeroes it entirely for malformed packets, but for
	// BadLovelock ones).
	Key bpf.FlowKey
	// BadLovelock: the L3/L4 headers are valid and only the Lovelock
	// header failed its checks (pkt_meta.bad_ll), so steer classifies the
	// frame on Key's L3/L4 fields.
	BadLovelock bool
}

// Checker holds the loaded wirecheck program.
type Checker struct {
	objs wirecheckObjects
	// skbCtx is a zero struct __sk_buff, as the test run takes it, and
	// gsoSize the offset of its gso_size field (from the object's BTF).
	skbCtx  int
	gsoSize int
}

// New loads the wirecheck program with the Lovelock UDP port set to port.
// A load the kernel refuses returns a *bpf.LoadError, which unwraps to the
// cause (*ebpf.VerifierError, ebpf.ErrNotSupported, …).
func New(port uint16) (*Checker, error) {
	spec, err := loadWirecheck()
	if err != nil {
		return nil, fmt.Errorf("wirecheck: read object: %w", err)
	}
	if err := spec.Variables[wirecheckVarLlPort].Set(port); err != nil {
		return nil, fmt.Errorf("wirecheck: set ll_port: %w", err)
	}
	// The result is read as raw bytes laid out as the generated struct.
	if n, want := spec.Maps[wirecheckMapWireOut].ValueSize, binary.Size(wirecheckWireResult{}); int(n) != want {
		return nil, fmt.Errorf("wirecheck: wire_out values are %d bytes, the generated wire_result %d: run make generate", n, want)
	}
	w := &Checker{}
	var skb *btf.Struct
	if err := spec.Types.TypeByName("__sk_buff", &skb); err != nil {
		return nil, fmt.Errorf("wirecheck: struct __sk_buff: %w", err)
	}
	w.skbCtx = int(skb.Size)
	for _, m := range skb.Members {
		if m.Name == "gso_size" {
			w.gsoSize = int(m.Offset.Bytes())
		}
	}
	if w.gsoSize == 0 {
		return nil, fmt.Errorf("wirecheck: struct __sk_buff has no gso_size")
	}
	if err := spec.LoadAndAssign(&w.objs, nil); err != nil {
		return nil, &bpf.LoadError{Object: "wirecheck", Err: err}
	}
	return w, nil
}

// Check parses frame (starting at the Ethernet header) in the kernel, as
// the XDP hook does.
func (w *Checker) Check(frame []byte) (Result, error) {
	if _, err := w.objs.WireCheck.Run(&ebpf.RunOptions{Data: frame}); err != nil {
		return Result{}, fmt.Errorf("wirecheck: run: %w", err)
	}
	return w.result()
}

// CheckGSO parses frame as the TC hook sees a GSO super-packet of that many
// bytes (skb_is_gso: the test run's gso_size is set to gsoSize, which must
// not be 0).
func (w *Checker) CheckGSO(frame []byte, gsoSize uint16) (Result, error) {
	if gsoSize == 0 {
		return Result{}, fmt.Errorf("wirecheck: gso size 0 is no GSO packet")
	}
	ctx := make([]byte, w.skbCtx)
	binary.NativeEndian.PutUint32(ctx[w.gsoSize:], uint32(gsoSize))
	if _, err := w.objs.WireCheckSkb.Run(&ebpf.RunOptions{Data: frame, Context: ctx}); err != nil {
		return Result{}, fmt.Errorf("wirecheck: run skb: %w", err)
	}
	return w.result()
}

func (w *Checker) result() (Result, error) {
	var r wirecheckWireResult
	if err := w.objs.WireOut.Lookup(uint32(0), &r); err != nil {
		return Result{}, fmt.Errorf("wirecheck: read result: %w", err)
	}
	res := Result{Status: r.Status, Offset: r.Offset, BadLovelock: r.BadLl != 0}
	if _, err := binary.Encode(res.Header[:], binary.NativeEndian, r.Hdr); err != nil {
		return Result{}, fmt.Errorf("wirecheck: encode header: %w", err)
	}
	// The same C struct flow_key, generated twice (here and in package bpf;
	// Go does not convert between them, their blank HostLayout fields being
	// different packages' names): copy it through its bytes.
	key, err := binary.Append(nil, binary.NativeEndian, r.Key)
	if err != nil {
		return Result{}, fmt.Errorf("wirecheck: encode flow key: %w", err)
	}
	if _, err := binary.Decode(key, binary.NativeEndian, &res.Key); err != nil {
		return Result{}, fmt.Errorf("wirecheck: decode flow key: %w", err)
	}
	return res, nil
}

// Close releases the program and its map.
func (w *Checker) Close() error {
	return w.objs.Close()
}
