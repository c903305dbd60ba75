// Package fdpass moves small JSON messages, with file descriptors riding
// along, over a stream unix socket: a 4-byte big-endian length, the JSON
// body, and SCM_RIGHTS on the frame's first byte. Far memory's host agent
// (farmem/fmap) and accelerator ingest's handle server use it; both
// exchange a few frames per mapping or registration, never per packet, so
// JSON's cost does not matter and its readability does.
package fdpass

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"

	"golang.org/x/sys/unix"
)

// ErrTorn marks a Read or Write that failed after part of its frame had
// crossed the connection (mostly a deadline in the middle of a frame): the
// stream is no longer at a frame boundary, so nothing more read from it
// can be trusted. A failure with ErrTorn absent moved no byte of the frame.
var ErrTorn = errors.New("connection torn mid-frame")

// MaxFrame is the largest JSON body accepted; a longer one means the peer
// speaks another protocol.
const MaxFrame = 1 << 20

// MaxFDs is the most descriptors one frame may carry (the kernel's
// SCM_MAX_FD is 253).
const MaxFDs = 253

// Write sends v as one frame with fds attached. The caller keeps its copies
// of fds: the kernel duplicates them into the peer.
func Write(c *net.UnixConn, v any, fds ...int) error {
	if len(fds) > MaxFDs {
		return fmt.Errorf("frame with %d descriptors: at most %d fit in one message", len(fds), MaxFDs)
	}
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode frame: %w", err)
	}
	if len(body) > MaxFrame {
		return fmt.Errorf("frame of %d bytes: larger than %d", len(body), MaxFrame)
	}
	msg := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(body)), uint32(len(body)))
	msg = append(msg, body...)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, oobn, err := c.WriteMsgUnix(msg, oob, nil)
	if err != nil {
		if n > 0 {
			return fmt.Errorf("%w: %w", ErrTorn, err)
		}
		return err
	}
	if oobn != len(oob) {
		return fmt.Errorf("%w: sent %d of %d bytes of descriptors", ErrTorn, oobn, len(oob))
	}
	if n < len(msg) {
		if _, err := c.Write(msg[n:]); err != nil {
			return fmt.Errorf("%w: %w", ErrTorn, err)
		}
	}
	return nil
}

// Read reads one frame into v and returns the descriptors sent with it,
// which the caller owns (and must close). On any error it closes them
// itself. io.EOF means the peer closed the connection between frames.
func Read(c *net.UnixConn, v any) ([]int, error) {
	var hdr [4]byte
	oob := make([]byte, unix.CmsgSpace(4*MaxFDs))
	n, oobn, _, _, err := c.ReadMsgUnix(hdr[:], oob)
	var fds []int
	if oobn > 0 {
		var perr error
		fds, perr = parseRights(oob[:oobn])
		if perr != nil {
			return nil, fmt.Errorf("%w: %w", ErrTorn, perr)
		}
	}
	if err == nil && n == 0 {
		err = io.EOF
	}
	if err == nil && n < len(hdr) {
		_, err = io.ReadFull(c, hdr[n:])
	}
	if err != nil {
		CloseAll(fds)
		if n > 0 { // part of the header was read
			err = fmt.Errorf("%w: %w", ErrTorn, err)
		}
		return nil, err
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if size > MaxFrame {
		CloseAll(fds)
		return nil, fmt.Errorf("frame of %d bytes: larger than %d, not a Lovelock peer (%w)", size, MaxFrame, ErrTorn)
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(c, body); err != nil {
		CloseAll(fds)
		return nil, fmt.Errorf("%w: %w", ErrTorn, err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		CloseAll(fds)
		return nil, fmt.Errorf("decode frame: %w", err)
	}
	return fds, nil
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("parse control message: %w", err)
	}
	var fds []int
	for _, m := range msgs {
		r, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		fds = append(fds, r...)
	}
	return fds, nil
}

// CloseAll closes every descriptor in fds.
func CloseAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
