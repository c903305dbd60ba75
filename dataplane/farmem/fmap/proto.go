package fmap

import (
	"errors"
	"fmt"
	"net"

	"github.com/lovelock-dpu/lovelock/dataplane/internal/fdpass"
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
// JSON because the exchange happens a few times per mapping, never per fault;
// the framing is package fdpass's.
const (
	opOpen   = "open"
	opAttach = "attach"
	opSync   = "sync"
	opClose  = "close"
	opStats  = "stats"
	opAdvise = "advise"
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

func writeFrame(c *net.UnixConn, f frame, fds ...int) error { return fdpass.Write(c, f, fds...) }

// readFrame reads one frame and the descriptors sent with it.
func readFrame(c *net.UnixConn) (frame, []int, error) {
	var f frame
	fds, err := fdpass.Read(c, &f)
	return f, fds, err
}

func closeAll(fds []int) { fdpass.CloseAll(fds) }

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
