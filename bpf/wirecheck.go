package bpf

import (
	"encoding/binary"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// WireHeader is struct ll_hdr exactly as the C side lays it out (from the
// object's BTF). Multi-byte fields hold network-order bytes; the type exists so
// tests can compare its size and field offsets with dataplane/wire.
type WireHeader = wirecheckLlHdr

// WireStatus is the C parser's verdict on a frame (enum ll_status).
type WireStatus uint32

// The C parser's verdicts; dataplane/wire maps its errors onto the same set.
const (
	WireOK          WireStatus = 0 // a valid Lovelock header
	WireNotLovelock WireStatus = 1 // well-formed, but not UDP to the Lovelock port
	WireTruncated   WireStatus = 2 // a header ends past the frame
	WireBadVersion  WireStatus = 3 // unknown header version
	WireBadLength   WireStatus = 4 // length field disagrees with the UDP payload
	WireUnknownType WireStatus = 5 // unknown message type
	WireBadHeader   WireStatus = 6 // invalid L3/L4 header
)

// WireResult is what the C parser found in one frame.
type WireResult struct {
	Status WireStatus
	// Offset of the Lovelock header from the start of the frame (WireOK only).
	Offset uint32
	// Header is the raw 24-byte Lovelock header (WireOK only).
	Header [24]byte
	// Key is the flow key rules would match (zero fields the parser did
	// not reach; steer zeroes it entirely for malformed packets).
	Key FlowKey
}

// WireChecker runs frames through the data plane's C parser with
// BPF_PROG_TEST_RUN. It is for tests; it never touches live traffic.
type WireChecker struct {
	objs wirecheckObjects
	// skbCtx is a zero struct __sk_buff, as the test run takes it, and
	// gsoSize the offset of its gso_size field (from the object's BTF).
	skbCtx  int
	gsoSize int
}

// NewWireChecker loads the wirecheck program with the Lovelock UDP port set to
// port.
func NewWireChecker(port uint16) (*WireChecker, error) {
	spec, err := loadWirecheck()
	if err != nil {
		return nil, err
	}
	if err := spec.Variables[wirecheckVarLlPort].Set(port); err != nil {
		return nil, fmt.Errorf("wirecheck: set ll_port: %w", err)
	}
	w := &WireChecker{}
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
		return nil, fmt.Errorf("wirecheck: load: %+v", err)
	}
	return w, nil
}

// Check parses frame (starting at the Ethernet header) in the kernel, as
// the XDP hook does.
func (w *WireChecker) Check(frame []byte) (WireResult, error) {
	if _, err := w.objs.WireCheck.Run(&ebpf.RunOptions{Data: frame}); err != nil {
		return WireResult{}, fmt.Errorf("wirecheck: run: %w", err)
	}
	return w.result()
}

// CheckGSO parses frame as the TC hook sees a GSO super-packet of that many
// bytes (skb_is_gso: the test run's gso_size is set to gsoSize, which must
// not be 0).
func (w *WireChecker) CheckGSO(frame []byte, gsoSize uint16) (WireResult, error) {
	if gsoSize == 0 {
		return WireResult{}, fmt.Errorf("wirecheck: gso size 0 is no GSO packet")
	}
	ctx := make([]byte, w.skbCtx)
	binary.NativeEndian.PutUint32(ctx[w.gsoSize:], uint32(gsoSize))
	if _, err := w.objs.WireCheckSkb.Run(&ebpf.RunOptions{Data: frame, Context: ctx}); err != nil {
		return WireResult{}, fmt.Errorf("wirecheck: run skb: %w", err)
	}
	return w.result()
}

func (w *WireChecker) result() (WireResult, error) {
	raw := make([]byte, binary.Size(wirecheckWireResult{}))
	if err := w.objs.WireOut.Lookup(uint32(0), &raw); err != nil {
		return WireResult{}, fmt.Errorf("wirecheck: read result: %w", err)
	}
	res := WireResult{
		Status: WireStatus(binary.NativeEndian.Uint32(raw[0:4])),
		Offset: binary.NativeEndian.Uint32(raw[4:8]),
	}
	copy(res.Header[:], raw[8:32])
	if _, err := binary.Decode(raw[32:], binary.NativeEndian, &res.Key); err != nil {
		return WireResult{}, fmt.Errorf("wirecheck: decode flow key: %w", err)
	}
	return res, nil
}

// Close releases the program and its map.
func (w *WireChecker) Close() error {
	return w.objs.Close()
}
