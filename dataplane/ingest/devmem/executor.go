package devmem

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/internal/fdpass"
)

// An executor is the shared-memory device's stand-in for a GPU's compute
// engine: a process of its own that maps the device's buffers and runs
// the models on them. A Shm with an executor (ShmOptions.Executor) hands
// each Run to it over a unix socket and waits for the answer, as a host
// launches a kernel and synchronises with its stream; the model's compute
// then runs on the executor's CPU, not on the host's, which is what the
// host-CPU comparisons of bench-ingest need. Without one, Run computes in
// the calling process.
//
// The exchange, on one stream connection per device (a device's runs go
// one at a time, as on one stream): a buffer is introduced once with an
// 'B' and an fdpass frame {op: buffer, id, size} carrying its memfd; each
// run is 'R' and a binary frame
//
//	u32 input buffer id, u32 output buffer id, u32 input length, u8 model name length, name
//
// answered with
//
//	u32 output length, u16 error length, error text (empty on success).

type executorFrame struct {
	Op   string `json:"op"`
	ID   uint32 `json:"id"`
	Size int    `json:"size"`
}

// ServeExecutor runs models for shared-memory devices that connect to
// ln, until ctx ends.
func ServeExecutor(ctx context.Context, ln *net.UnixListener, models []*model.Model) error {
	byName := map[string]*model.Model{}
	for _, m := range models {
		byName[m.Name] = m
	}
	go func() { <-ctx.Done(); ln.Close() }()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("executor: accept: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			stop := context.AfterFunc(ctx, func() { c.Close() })
			defer stop()
			serveExecutorConn(c, byName)
		}()
	}
}

func serveExecutorConn(c *net.UnixConn, models map[string]*model.Model) {
	bufs := map[uint32][]byte{}
	defer func() {
		for _, b := range bufs {
			unix.Munmap(b)
		}
	}()
	var hdr [13]byte
	for {
		// Each frame starts with a tag: 'B' introduces a buffer, 'R' a run.
		var tag [1]byte
		if _, err := io.ReadFull(c, tag[:]); err != nil {
			return
		}
		switch tag[0] {
		case 'B':
			var f executorFrame
			fds, err := fdpass.Read(c, &f)
			if err != nil || len(fds) != 1 || f.Size <= 0 {
				fdpass.CloseAll(fds)
				return
			}
			mem, err := unix.Mmap(fds[0], 0, f.Size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			unix.Close(fds[0])
			if err != nil {
				return
			}
			bufs[f.ID] = mem
		case 'R':
			if _, err := io.ReadFull(c, hdr[:]); err != nil {
				return
			}
			in, out, n := binary.BigEndian.Uint32(hdr[0:]), binary.BigEndian.Uint32(hdr[4:]), int(binary.BigEndian.Uint32(hdr[8:]))
			name := make([]byte, hdr[12])
			if _, err := io.ReadFull(c, name); err != nil {
				return
			}
			outLen, err := executorRun(models[string(name)], string(name), bufs[in], bufs[out], n)
			reply := binary.BigEndian.AppendUint32(nil, uint32(outLen))
			msg := ""
			if err != nil {
				msg = err.Error()
			}
			reply = binary.BigEndian.AppendUint16(reply, uint16(len(msg)))
			if _, err := c.Write(append(reply, msg...)); err != nil {
				return
			}
		default:
			return
		}
	}
}

func executorRun(m *model.Model, name string, in, out []byte, n int) (int, error) {
	switch {
	case m == nil || m.Reference == nil:
		return 0, fmt.Errorf("the executor runs no model %q", name)
	case in == nil || out == nil:
		return 0, errors.New("run on a buffer the executor was not given")
	case n < 0 || n > len(in):
		return 0, fmt.Errorf("input of %d bytes in a %d-byte buffer", n, len(in))
	}
	if err := m.Check(n); err != nil {
		return 0, err
	}
	if m.OutputSize(n) > len(out) {
		return 0, fmt.Errorf("output of %d bytes does not fit the %d-byte output buffer", m.OutputSize(n), len(out))
	}
	return m.Reference(in[:n], out), nil
}

// executorConn is a Shm's connection to its executor.
type executorConn struct {
	path string

	mu    sync.Mutex
	c     *net.UnixConn
	known map[*shmBuffer]bool
	buf   []byte
}

func (e *executorConn) run(m *model.Model, in, out *shmBuffer, n int) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.c == nil {
		c, err := net.Dial("unix", e.path)
		if err != nil {
			return 0, fmt.Errorf("shm executor %s: %w (is it running?)", e.path, err)
		}
		e.c, e.known = c.(*net.UnixConn), map[*shmBuffer]bool{}
	}
	for _, b := range []*shmBuffer{in, out} {
		if e.known[b] {
			continue
		}
		if _, err := e.c.Write([]byte{'B'}); err != nil {
			return 0, e.fail(err)
		}
		if err := fdpass.Write(e.c, executorFrame{Op: "buffer", ID: b.id, Size: len(b.mem)}, b.fd); err != nil {
			return 0, e.fail(err)
		}
		e.known[b] = true
	}
	e.buf = append(e.buf[:0], 'R')
	e.buf = binary.BigEndian.AppendUint32(e.buf, in.id)
	e.buf = binary.BigEndian.AppendUint32(e.buf, out.id)
	e.buf = binary.BigEndian.AppendUint32(e.buf, uint32(n))
	e.buf = append(e.buf, uint8(len(m.Name)))
	e.buf = append(e.buf, m.Name...)
	if _, err := e.c.Write(e.buf); err != nil {
		return 0, e.fail(err)
	}
	var rep [6]byte
	if _, err := io.ReadFull(e.c, rep[:]); err != nil {
		return 0, e.fail(err)
	}
	outLen := int(binary.BigEndian.Uint32(rep[0:]))
	if l := int(binary.BigEndian.Uint16(rep[4:])); l > 0 {
		msg := make([]byte, l)
		if _, err := io.ReadFull(e.c, msg); err != nil {
			return 0, e.fail(err)
		}
		return 0, fmt.Errorf("shm executor: %s: %w", msg, model.ErrBadInput)
	}
	return outLen, nil
}

// fail drops the connection; the next run dials again.
func (e *executorConn) fail(err error) error {
	e.c.Close()
	e.c = nil
	return fmt.Errorf("shm executor %s: %w", e.path, err)
}

func (e *executorConn) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.c != nil {
		e.c.Close()
		e.c = nil
	}
}
