package ingest

import (
	"encoding/binary"
	"fmt"

	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// The host/DPU control protocol (type 0x22) between the GPU host's agent
// and its DPU's ingest agent. One layout serves every operation:
//
//	0  u8  op (CtrlOp)
//	1  u8  status (Status; completions and acks); flags (CtrlFlags;
//	   doorbell, version 3: a version 2 host reads them as a status,
//	   which it ignores in a doorbell)
//	2  u8  GPU index
//	3  u8  slot (memory slice) index
//	4  u32 length: input bytes (doorbell) or output bytes (completion)
//	8  u64 epoch: the host agent's registration it refers to
//	16 u64 request: the DPU's number for the request (doorbell, completion)
//	24 u32 µs on the device (completion)
//	28 u16 text length T
//	30 u16 tenant (doorbell); the sender's protocol version (register,
//	   register-ack; 0 from a version 1 peer, which wrote nothing there)
//	32 T bytes text: the handle socket (register), the model (doorbell),
//	   an error message (completion, ack)
//
// Version 2 adds Batch: several doorbells, completions or running answers
// in one datagram. Its header is the layout above with op Batch, the
// number of messages N as length, and every other field zero; N messages
// follow, each the 32-byte layout and its text, back to back, to the end
// of the datagram. Only doorbell, complete and running travel in a batch.
// Each side says its version in register and register-ack and sends
// batches only to a peer that said 2 or more: a version 1 peer gets one
// message per datagram, as before, and works unchanged.
//
// Version 3 adds a doorbell's flags, in the byte that is the status of
// other messages: FlagGivenUp marks a doorbell rung again for a request
// the DPU has already answered (given up on) and rings only to learn when
// its slot is free. A host of version 3 answers it as any doorbell rung
// again when it is running or remembers the request, and otherwise runs
// nothing and answers Complete with StatusReleased at once. An older host
// ignores the byte and treats it as an ordinary doorbell (it runs the
// model if it has no record of the request, as before), so the DPU marks
// whatever the host's version.
//
// The host announces itself with Register every heartbeat interval; a new
// epoch means new buffers: the DPU fetches their handles from the host's
// handle socket (unix, descriptors passed with SCM_RIGHTS; on a BlueField
// a DOCA mmap export descriptor), drops every mapping of the old epoch, and
// answers RegisterAck. The DPU rings with Doorbell once the input is in the
// slot's buffer; the host answers Complete once the output is in the
// slot's output buffer. A lost doorbell or completion is repaired by the
// DPU ringing again: the host remembers what it completed and answers
// again without running the model twice, and answers Running for what it
// is still running.
const CtrlHeaderLen = 32

// CtrlOp is a control operation.
type CtrlOp uint8

// The control operations.
const (
	OpRegister    CtrlOp = 1
	OpRegisterAck CtrlOp = 2
	OpDoorbell    CtrlOp = 3
	OpComplete    CtrlOp = 4
	// OpRunning answers a doorbell rung again for a request the host is
	// still running: the host is alive, the model slow.
	OpRunning CtrlOp = 5
	// OpBatch carries several doorbells, completions or running answers
	// (version 2).
	OpBatch CtrlOp = 6
)

// CtrlVersion is the control protocol's version this package speaks.
const CtrlVersion = 3

// CtrlFlags are a doorbell's flags (version 3).
type CtrlFlags uint8

// FlagGivenUp marks a doorbell for a request whose caller the DPU has
// already answered: the host must not start a run for it, only say
// whether its slot is free (see the protocol above).
const FlagGivenUp CtrlFlags = 1

func (o CtrlOp) String() string {
	switch o {
	case OpRegister:
		return "register"
	case OpRegisterAck:
		return "register-ack"
	case OpDoorbell:
		return "doorbell"
	case OpComplete:
		return "complete"
	case OpRunning:
		return "running"
	case OpBatch:
		return "batch"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Ctrl is one control message.
type Ctrl struct {
	Op       CtrlOp
	Status   Status
	GPU      uint8
	Slot     uint8
	Length   uint32
	Epoch    uint64
	Request  uint64
	DeviceUs uint32
	Tenant   uint16
	// Flags are a doorbell's (version 3), sent in place of its status.
	Flags CtrlFlags
	// Version is the sender's protocol version, in register and
	// register-ack (0: a version 1 peer).
	Version uint16
	Text    string
}

// AppendCtrl appends a control datagram to b.
func AppendCtrl(b []byte, c *Ctrl) []byte {
	h := wire.Header{Version: wire.Version, Type: wire.TypeIngestCtrl, Length: uint32(ctrlSize(c))}
	start := len(b)
	b = append(b, make([]byte, wire.HeaderLen)...)
	h.Put(b[start:])
	return appendCtrlBody(b, c)
}

// appendCtrlBody appends one message's 32-byte layout and its text.
func appendCtrlBody(b []byte, c *Ctrl) []byte {
	text := c.Text
	if len(text) > maxText {
		text = text[:maxText]
	}
	start := len(b)
	b = append(b, make([]byte, CtrlHeaderLen)...)
	p := b[start:]
	p[0], p[1], p[2], p[3] = uint8(c.Op), uint8(c.Status), c.GPU, c.Slot
	if c.Op == OpDoorbell {
		p[1] = uint8(c.Flags)
	}
	binary.BigEndian.PutUint32(p[4:], c.Length)
	binary.BigEndian.PutUint64(p[8:], c.Epoch)
	binary.BigEndian.PutUint64(p[16:], c.Request)
	binary.BigEndian.PutUint32(p[24:], c.DeviceUs)
	binary.BigEndian.PutUint16(p[28:], uint16(len(text)))
	if c.Op == OpRegister || c.Op == OpRegisterAck {
		binary.BigEndian.PutUint16(p[30:], c.Version)
	} else {
		binary.BigEndian.PutUint16(p[30:], c.Tenant)
	}
	return append(b, text...)
}

// ctrlSize is the bytes c takes in a datagram or batch, header included.
func ctrlSize(c *Ctrl) int { return CtrlHeaderLen + min(len(c.Text), maxText) }

// Batchable reports whether op may travel in a batch.
func (o CtrlOp) Batchable() bool { return o == OpDoorbell || o == OpComplete || o == OpRunning }

// AppendCtrls appends to b one datagram that carries cs[0] and as many of
// the messages after it as fit in maxPayload bytes (the transport's
// MaxPayload) and returns it with how many it carries. With batch false
// (a version 1 peer), or when only one message fits or is given, the
// datagram is a plain message; otherwise a Batch. Messages that may not
// travel in a batch end it: one such is sent alone.
func AppendCtrls(b []byte, cs []Ctrl, maxPayload int, batch bool) ([]byte, int) {
	if len(cs) == 0 {
		return b, 0
	}
	n, size := 0, wire.HeaderLen+CtrlHeaderLen
	if batch {
		for n < len(cs) && cs[n].Op.Batchable() && size+ctrlSize(&cs[n]) <= maxPayload {
			size += ctrlSize(&cs[n])
			n++
		}
	}
	if n < 2 {
		return AppendCtrl(b, &cs[0]), 1
	}
	h := wire.Header{Version: wire.Version, Type: wire.TypeIngestCtrl, Length: uint32(size - wire.HeaderLen)}
	start := len(b)
	b = append(b, make([]byte, wire.HeaderLen)...)
	h.Put(b[start:])
	b = appendCtrlBody(b, &Ctrl{Op: OpBatch, Length: uint32(n)})
	for i := range n {
		b = appendCtrlBody(b, &cs[i])
	}
	return b, n
}

// DecodeCtrl decodes a control datagram's payload that holds one message
// (not a Batch: DecodeCtrls decodes either).
func DecodeCtrl(p []byte) (Ctrl, error) {
	c, _, err := decodeCtrl(p)
	if err == nil && c.Op == OpBatch {
		return c, fmt.Errorf("%w: a batch of %d control messages where one was expected", ErrMalformed, c.Length)
	}
	return c, err
}

// DecodeCtrls appends the messages of a control datagram's payload, one
// or a Batch's, to dst. A malformed batch yields none of its messages.
func DecodeCtrls(p []byte, dst []Ctrl) ([]Ctrl, error) {
	c, n, err := decodeCtrl(p)
	if err != nil {
		return dst, err
	}
	if c.Op != OpBatch {
		return append(dst, c), nil
	}
	if c.Length == 0 || c.Status != 0 || c.Epoch != 0 || c.Request != 0 || c.Text != "" {
		return dst, fmt.Errorf("%w: batch header with count %d and fields set", ErrMalformed, c.Length)
	}
	start := len(dst)
	for i := uint32(0); i < c.Length; i++ {
		m, k, err := decodeCtrl(p[n:])
		if err != nil {
			return dst[:start], fmt.Errorf("batch message %d of %d: %w", i+1, c.Length, err)
		}
		if !m.Op.Batchable() {
			return dst[:start], fmt.Errorf("%w: batch message %d of %d is a %s", ErrMalformed, i+1, c.Length, m.Op)
		}
		dst = append(dst, m)
		n += k
	}
	if n != len(p) {
		return dst[:start], fmt.Errorf("%w: %d bytes after a batch of %d", ErrMalformed, len(p)-n, c.Length)
	}
	return dst, nil
}

// decodeCtrl decodes the message at the start of p and returns how many
// bytes it took.
func decodeCtrl(p []byte) (Ctrl, int, error) {
	var c Ctrl
	if len(p) < CtrlHeaderLen {
		return c, 0, fmt.Errorf("%w: control message of %d bytes, header alone is %d", ErrMalformed, len(p), CtrlHeaderLen)
	}
	c.Op, c.Status, c.GPU, c.Slot = CtrlOp(p[0]), Status(p[1]), p[2], p[3]
	if c.Op == OpDoorbell {
		c.Status, c.Flags = 0, CtrlFlags(p[1])
	}
	if c.Op < OpRegister || c.Op > OpBatch {
		return c, 0, fmt.Errorf("%w: unknown control op %d", ErrMalformed, p[0])
	}
	c.Length = binary.BigEndian.Uint32(p[4:])
	c.Epoch = binary.BigEndian.Uint64(p[8:])
	c.Request = binary.BigEndian.Uint64(p[16:])
	c.DeviceUs = binary.BigEndian.Uint32(p[24:])
	t := int(binary.BigEndian.Uint16(p[28:]))
	if c.Op == OpRegister || c.Op == OpRegisterAck {
		c.Version = binary.BigEndian.Uint16(p[30:])
	} else {
		c.Tenant = binary.BigEndian.Uint16(p[30:])
	}
	if len(p) < CtrlHeaderLen+t {
		return c, 0, fmt.Errorf("%w: control text runs past the datagram", ErrMalformed)
	}
	c.Text = string(p[CtrlHeaderLen : CtrlHeaderLen+t])
	return c, CtrlHeaderLen + t, nil
}

// The handle socket's exchange (package fdpass frames): the DPU asks for
// the layout of an epoch, the host answers with the layout and, in the same
// frame, one descriptor per buffer in Layout order (each slot's input, then
// its output), or with Err.
type LayoutRequest struct {
	Epoch uint64 `json:"epoch"`
}

// Layout is a host's registered GPUs and their slot buffers.
type Layout struct {
	Epoch uint64      `json:"epoch"`
	GPUs  []GPULayout `json:"gpus"`
	// Models are the models the host runs (built-in or attached).
	Models []string `json:"models"`
	Err    string   `json:"err,omitempty"`
}

// GPULayout is one GPU's slots.
type GPULayout struct {
	Index int    `json:"index"`
	Kind  string `json:"kind"` // devmem.Kind
	Name  string `json:"name"`
	// UUID is the device's (devmem.Info.UUID; empty for shm): the handles
	// of its buffers carry it, so that an importer finds the GPU whatever
	// its own CUDA ordinals are.
	UUID string `json:"uuid,omitempty"`
	Card string `json:"card"` // MIG card model, e.g. "H100-80GB"
	// HandleKind is how its buffers import (devmem.HandleKind).
	HandleKind string `json:"handle_kind"`
	// Slots are indexed by MIG memory slice: work placed on an instance
	// starting at memory slice s uses slot s's buffers.
	Slots []SlotLayout `json:"slots"`
}

// SlotLayout is one slot's buffers.
type SlotLayout struct {
	Slot     int    `json:"slot"`
	InBytes  int    `json:"in_bytes"`
	OutBytes int    `json:"out_bytes"`
	InIPC    []byte `json:"in_ipc,omitempty"`  // legacy CUDA IPC handles, when the
	OutIPC   []byte `json:"out_ipc,omitempty"` // buffers have no descriptor
}
