package ingest

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// The client protocol, in the payload after the Lovelock header.
//
// An input (type 0x20, header Tenant = the client's tenant) is cut into
// fragments that each fit one datagram; every fragment repeats the whole
// request header, so the DPU can start reassembly from any of them:
//
//	0  u64 request ID, unique per client address
//	8  u32 input length (all fragments)
//	12 u32 this fragment's offset in the input
//	16 u32 deadline budget in µs from when the DPU first hears of the request; 0: none
//	20 u8  model name length M (1..MaxModelName)
//	21 u8  reserved (0)
//	22 u16 reserved (0)
//	24 M bytes model name, then the fragment's bytes
//
// A result (type 0x21) comes back to the address the input came from, also
// in fragments:
//
//	0  u64 request ID
//	8  u32 output length (all fragments); 0 on failure
//	12 u32 this fragment's offset in the output
//	16 u8  status (Status)
//	17 u8  GPU index
//	18 u16 text length T
//	20 u32 µs queued on the DPU
//	24 u32 µs on the device (doorbell to completion)
//	28 T bytes text: the slice name on success, the error message on failure
//	then the fragment's bytes
//
// Every input fragment but the one that ends the input carries at least
// MinFragment bytes, and an input may not arrive in more than a bounded
// number of separate pieces at once (the DPU agent's limit, 1024): the
// DPU refuses the request as bad-request otherwise. Clients cut inputs at
// their datagram size (MaxFragment), which on any IP path (576 bytes at
// least) leaves more than MinFragment.
//
// Loss is the client's to repair: it sends the request again after a
// timeout, and the DPU ignores fragments it already has, fills holes with
// the rest, and answers a request it already completed from its memory of
// recent results, so a retransmission never runs a model twice.
const (
	InputHeaderLen  = 24
	ResultHeaderLen = 28
	MaxModelName    = 64
	// MinFragment is the least input a fragment carries, unless it is
	// the input's last (ends at its length): an IPv4 path's least MTU,
	// 576 bytes, leaves 436 with a model name of MaxModelName.
	MinFragment = 256
	maxText     = 1024
)

// Input is one input fragment.
type Input struct {
	ID       uint64
	Total    uint32
	Offset   uint32
	BudgetUs uint32
	Model    string
	Data     []byte // aliases the datagram on decode
}

// AppendInput appends a datagram carrying in (tenant in the Lovelock
// header) to b.
func AppendInput(b []byte, tenant uint32, in *Input) []byte {
	h := wire.Header{Version: wire.Version, Type: wire.TypeIngestInput, Tenant: tenant,
		Length: uint32(InputHeaderLen + len(in.Model) + len(in.Data))}
	start := len(b)
	b = append(b, make([]byte, wire.HeaderLen+InputHeaderLen)...)
	h.Put(b[start:])
	p := b[start+wire.HeaderLen:]
	binary.BigEndian.PutUint64(p[0:], in.ID)
	binary.BigEndian.PutUint32(p[8:], in.Total)
	binary.BigEndian.PutUint32(p[12:], in.Offset)
	binary.BigEndian.PutUint32(p[16:], in.BudgetUs)
	p[20] = uint8(len(in.Model))
	b = append(b, in.Model...)
	return append(b, in.Data...)
}

// Errors from decoding.
var ErrMalformed = errors.New("malformed ingest datagram")

// DecodeInput decodes an input datagram's payload (after the Lovelock
// header), checking that the fragment lies within the input.
func DecodeInput(p []byte) (Input, error) {
	var in Input
	if len(p) < InputHeaderLen {
		return in, fmt.Errorf("%w: input of %d bytes, header alone is %d", ErrMalformed, len(p), InputHeaderLen)
	}
	in.ID = binary.BigEndian.Uint64(p[0:])
	in.Total = binary.BigEndian.Uint32(p[8:])
	in.Offset = binary.BigEndian.Uint32(p[12:])
	in.BudgetUs = binary.BigEndian.Uint32(p[16:])
	m := int(p[20])
	if m == 0 || m > MaxModelName {
		return in, fmt.Errorf("%w: model name of %d bytes (want 1..%d)", ErrMalformed, m, MaxModelName)
	}
	if len(p) < InputHeaderLen+m {
		return in, fmt.Errorf("%w: model name runs past the datagram", ErrMalformed)
	}
	in.Model = string(p[InputHeaderLen : InputHeaderLen+m])
	in.Data = p[InputHeaderLen+m:]
	if in.Total == 0 {
		return in, fmt.Errorf("%w: empty input", ErrMalformed)
	}
	if uint64(in.Offset)+uint64(len(in.Data)) > uint64(in.Total) {
		return in, fmt.Errorf("%w: fragment [%d, %d) past the input's %d bytes", ErrMalformed, in.Offset, uint64(in.Offset)+uint64(len(in.Data)), in.Total)
	}
	if len(in.Data) == 0 {
		return in, fmt.Errorf("%w: fragment without data", ErrMalformed)
	}
	return in, nil
}

// ResultFragment is one result fragment.
type ResultFragment struct {
	ID       uint64
	Total    uint32
	Offset   uint32
	Status   Status
	GPU      uint8
	QueuedUs uint32
	DeviceUs uint32
	Text     string // slice name, or the error message
	Data     []byte // aliases the datagram on decode
}

// AppendResult appends a result datagram to b. Text longer than 1 KiB is
// cut.
func AppendResult(b []byte, tenant uint32, r *ResultFragment) []byte {
	text := r.Text
	if len(text) > maxText {
		text = text[:maxText]
	}
	h := wire.Header{Version: wire.Version, Type: wire.TypeIngestResult, Tenant: tenant,
		Length: uint32(ResultHeaderLen + len(text) + len(r.Data))}
	start := len(b)
	b = append(b, make([]byte, wire.HeaderLen+ResultHeaderLen)...)
	h.Put(b[start:])
	p := b[start+wire.HeaderLen:]
	binary.BigEndian.PutUint64(p[0:], r.ID)
	binary.BigEndian.PutUint32(p[8:], r.Total)
	binary.BigEndian.PutUint32(p[12:], r.Offset)
	p[16] = uint8(r.Status)
	p[17] = r.GPU
	binary.BigEndian.PutUint16(p[18:], uint16(len(text)))
	binary.BigEndian.PutUint32(p[20:], r.QueuedUs)
	binary.BigEndian.PutUint32(p[24:], r.DeviceUs)
	b = append(b, text...)
	return append(b, r.Data...)
}

// DecodeResult decodes a result datagram's payload.
func DecodeResult(p []byte) (ResultFragment, error) {
	var r ResultFragment
	if len(p) < ResultHeaderLen {
		return r, fmt.Errorf("%w: result of %d bytes, header alone is %d", ErrMalformed, len(p), ResultHeaderLen)
	}
	r.ID = binary.BigEndian.Uint64(p[0:])
	r.Total = binary.BigEndian.Uint32(p[8:])
	r.Offset = binary.BigEndian.Uint32(p[12:])
	r.Status = Status(p[16])
	r.GPU = p[17]
	t := int(binary.BigEndian.Uint16(p[18:]))
	r.QueuedUs = binary.BigEndian.Uint32(p[20:])
	r.DeviceUs = binary.BigEndian.Uint32(p[24:])
	if len(p) < ResultHeaderLen+t {
		return r, fmt.Errorf("%w: result text runs past the datagram", ErrMalformed)
	}
	r.Text = string(p[ResultHeaderLen : ResultHeaderLen+t])
	r.Data = p[ResultHeaderLen+t:]
	if uint64(r.Offset)+uint64(len(r.Data)) > uint64(r.Total) {
		return r, fmt.Errorf("%w: result fragment [%d, %d) past the output's %d bytes", ErrMalformed, r.Offset, uint64(r.Offset)+uint64(len(r.Data)), r.Total)
	}
	return r, nil
}

// MaxFragment returns the most input bytes one datagram of maxPayload
// bytes (a transport's MaxPayload) carries for a model named model.
func MaxFragment(maxPayload int, model string) int {
	return maxPayload - wire.HeaderLen - InputHeaderLen - len(model)
}

// MaxResultFragment returns the most output bytes one result datagram of
// maxPayload bytes carries with text.
func MaxResultFragment(maxPayload int, text string) int {
	return maxPayload - wire.HeaderLen - ResultHeaderLen - min(len(text), maxText)
}
