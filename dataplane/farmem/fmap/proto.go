package fmap

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"

	"golang.org/x/sys/unix"
)

// The program talks to its host agent over a stream unix socket in frames:
// a 4-byte big-endian length, then a JSON message. The exchange is
//
//	program → agent  {op: open, region, options}
//	agent → program  {size} or {err}
//	program → agent  {op: attach, addr, len}   + SCM_RIGHTS [userfaultfd, memfd]
//	agent → program  {} or {err}
//	then any number of {op: sync} → {} or {err}, {op: stats} → {stats} and
//	{op: advise, advice} → {result} or {err}, and one {op: close} → {} or {err}.
//
// JSON because the exchange happens a few times per mapping, never per fault.
const (
	opOpen   = "open"
	opAttach = "attach"
	opSync   = "sync"
	opClose  = "close"
	opStats  = "stats"
	opAdvise = "advise"

	maxFrame = 64 << 10
)

type frame struct {
	Op      string        `json:"op,omitempty"`
	Region  *RegionRef    `json:"region,omitempty"`
	Options *Options      `json:"options,omitempty"`
	Size    int64         `json:"size,omitempty"`
	Addr    uint64        `json:"addr,omitempty"`
	Len     uint64        `json:"len,omitempty"`
	Stats   *Stats        `json:"stats,omitempty"`
	Advice  *Advice       `json:"advice,omitempty"`
	Result  *AdviceResult `json:"result,omitempty"`
	Err     string        `json:"err,omitempty"`
}

func writeFrame(c *net.UnixConn, f frame, fds ...int) error {
	body, err := json.Marshal(f)
	if err != nil {
		return err
	}
	msg := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(body)), uint32(len(body)))
	msg = append(msg, body...)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, oobn, err := c.WriteMsgUnix(msg, oob, nil)
	if err != nil {
		return err
	}
	if oobn != len(oob) {
		return fmt.Errorf("sent %d of %d bytes of descriptors", oobn, len(oob))
	}
	if n < len(msg) {
		_, err = c.Write(msg[n:])
	}
	return err
}

// readFrame reads one frame and the descriptors sent with it. On a stream
// socket the descriptors come with the first byte they were sent with, so
// they arrive on the first read of the frame.
func readFrame(c *net.UnixConn) (frame, []int, error) {
	var f frame
	var hdr [4]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ReadMsgUnix(hdr[:], oob)
	var fds []int
	if oobn > 0 {
		fds, err = parseRights(oob[:oobn])
		if err != nil {
			return f, nil, err
		}
	}
	if err == nil && n < len(hdr) {
		_, err = io.ReadFull(c, hdr[n:])
	}
	if err == nil && n == 0 {
		err = io.EOF
	}
	if err != nil {
		closeAll(fds)
		return f, nil, err
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if size > maxFrame {
		closeAll(fds)
		return f, nil, fmt.Errorf("frame of %d bytes: larger than %d, not an fmap peer", size, maxFrame)
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(c, body); err != nil {
		closeAll(fds)
		return f, nil, err
	}
	if err := json.Unmarshal(body, &f); err != nil {
		closeAll(fds)
		return f, nil, fmt.Errorf("decode frame: %w", err)
	}
	return f, fds, nil
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

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// call sends a request and waits for its reply, turning a reply's err into
// an error.
func call(c *net.UnixConn, req frame, fds ...int) (frame, error) {
	if err := writeFrame(c, req, fds...); err != nil {
		return frame{}, fmt.Errorf("send %s: %w", req.Op, err)
	}
	resp, extra, err := readFrame(c)
	closeAll(extra)
	if err != nil {
		return frame{}, fmt.Errorf("%s: read reply: %w", req.Op, err)
	}
	if resp.Err != "" {
		return resp, errors.New(resp.Err)
	}
	return resp, nil
}
