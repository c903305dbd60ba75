package devmem

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"
	"unsafe"

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
//
// A Launcher's runs (launcher.go) go on a connection of their own, without
// waiting: each is 'L' and
//
//	u64 run id, u32 input buffer id, u32 output buffer id, u32 input length, u8 model name length, name
//
// and its answer is
//
//	u64 run id, u32 output length, u16 error length, error text.
//
// The executor runs them in order and holds an answer back while more runs
// are waiting on the connection, for at most holdRuns of run time, so that
// runs that finish together are answered in one write (the host wakes once
// for them, as it would for a batch of a stream's completion events).

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

// holdRuns is how much run time an executor's answer to a launch may be
// held back for, to go out with the answers of the runs after it.
const holdRuns = 200 * time.Microsecond

func serveExecutorConn(c *net.UnixConn, models map[string]*model.Model) {
	bufs := map[uint32][]byte{}
	defer func() {
		for _, b := range bufs {
			unix.Munmap(b)
		}
	}()
	var hdr [13]byte
	var lhdr [21]byte
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	// held are launches' answers not written yet, since heldAt.
	var held []byte
	var heldAt time.Time
	flush := func() bool {
		if len(held) == 0 {
			return true
		}
		_, err := c.Write(held)
		held = held[:0]
		return err == nil
	}
	waiting := func() bool {
		n := 0
		rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
		return n > 0
	}
	for {
		// Each frame starts with a tag: 'B' introduces a buffer, 'R' a run.
		var tag [1]byte
		if _, err := io.ReadFull(c, tag[:]); err != nil {
			return
		}
		switch tag[0] {
		case 'B':
			if !flush() {
				return
			}
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
		case 'L':
			if _, err := io.ReadFull(c, lhdr[:]); err != nil {
				return
			}
			id := binary.BigEndian.Uint64(lhdr[0:])
			in, out, n := binary.BigEndian.Uint32(lhdr[8:]), binary.BigEndian.Uint32(lhdr[12:]), int(binary.BigEndian.Uint32(lhdr[16:]))
			name := make([]byte, lhdr[20])
			if _, err := io.ReadFull(c, name); err != nil {
				return
			}
			if len(held) == 0 {
				heldAt = time.Now()
			}
			outLen, err := executorRun(models[string(name)], string(name), bufs[in], bufs[out], n)
			msg := ""
			if err != nil {
				msg = err.Error()
			}
			held = binary.BigEndian.AppendUint64(held, id)
			held = binary.BigEndian.AppendUint32(held, uint32(outLen))
			held = binary.BigEndian.AppendUint16(held, uint16(len(msg)))
			held = append(held, msg...)
			if time.Since(heldAt) < holdRuns && waiting() {
				continue
			}
			if !flush() {
				return
			}
		case 'R':
			if !flush() {
				return
			}
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

// execQueue is a Launcher's queue on a shared-memory device's executor:
// launches are written to it without waiting, one write for all of a
// Launch call's runs, and a reader goroutine reports its answers, all that
// came in one read at once.
type execQueue struct {
	path string
	done func([]Completion)

	mu      sync.Mutex
	link    *execLink // nil: dial on the next launch
	nextID  uint64
	buf     []byte
	closed  bool
	readers sync.WaitGroup
}

// execLink is one connection to the executor and the runs in flight on
// it: their run ids to the callers' tags.
type execLink struct {
	c       *net.UnixConn
	raw     rawConn // c's launches and answers, without entersyscall
	known   map[*shmBuffer]bool
	pending map[uint64]uint64
}

func (q *execQueue) launch(ls []Launch) {
	var failed []Completion
	defer func() {
		if len(failed) > 0 {
			q.done(failed)
		}
	}()
	q.mu.Lock()
	defer q.mu.Unlock()
	fail := func(err error, from int) {
		for _, x := range ls[from:] {
			failed = append(failed, Completion{Tag: x.Tag, Err: err})
		}
	}
	if q.closed {
		fail(ErrLauncherClosed, 0)
		return
	}
	if q.link == nil {
		c, err := net.Dial("unix", q.path)
		if err != nil {
			fail(fmt.Errorf("shm executor %s: %w (is it running?)", q.path, err), 0)
			return
		}
		uc := c.(*net.UnixConn)
		rc, err := uc.SyscallConn()
		if err != nil {
			uc.Close()
			fail(fmt.Errorf("shm executor %s: %w", q.path, err), 0)
			return
		}
		q.link = &execLink{c: uc, raw: rawConn{rc}, known: map[*shmBuffer]bool{}, pending: map[uint64]uint64{}}
		q.readers.Add(1)
		go q.read(q.link)
	}
	lk := q.link
	q.buf = q.buf[:0]
	for i, x := range ls {
		ib, ob, err := checkRun(x.Model, x.In, x.InLen, x.Out)
		if err != nil {
			failed = append(failed, Completion{Tag: x.Tag, Err: err})
			continue
		}
		for _, b := range []*shmBuffer{ib, ob} {
			if lk.known[b] {
				continue
			}
			// Buffers are introduced once, with their memfd: what is
			// queued goes first, so the stream stays in order.
			err := q.write(lk)
			if err == nil {
				if _, err = lk.c.Write([]byte{'B'}); err == nil {
					err = fdpass.Write(lk.c, executorFrame{Op: "buffer", ID: b.id, Size: len(b.mem)}, b.fd)
				}
			}
			if err != nil {
				// The reader fails what is pending on the link once it
				// sees the connection closed; the rest fail here.
				lk.c.Close()
				fail(fmt.Errorf("shm executor %s: %w", q.path, err), i)
				return
			}
			lk.known[b] = true
		}
		q.nextID++
		id := q.nextID
		lk.pending[id] = x.Tag
		q.buf = append(q.buf, 'L')
		q.buf = binary.BigEndian.AppendUint64(q.buf, id)
		q.buf = binary.BigEndian.AppendUint32(q.buf, ib.id)
		q.buf = binary.BigEndian.AppendUint32(q.buf, ob.id)
		q.buf = binary.BigEndian.AppendUint32(q.buf, uint32(x.InLen))
		q.buf = append(q.buf, uint8(len(x.Model.Name)))
		q.buf = append(q.buf, x.Model.Name...)
	}
	if err := q.write(lk); err != nil {
		lk.c.Close() // the reader fails the link's pending runs
	}
}

// write sends the launches queued in q.buf.
func (q *execQueue) write(lk *execLink) error {
	if len(q.buf) == 0 {
		return nil
	}
	err := lk.raw.write(q.buf)
	q.buf = q.buf[:0]
	return err
}

// read reports the executor's answers on lk until the connection ends,
// then fails the runs still pending on it.
func (q *execQueue) read(lk *execLink) {
	defer q.readers.Done()
	r := bufio.NewReaderSize(lk.raw, 16<<10)
	var batch []Completion
	var hdr [14]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			break
		}
		id, outLen := binary.BigEndian.Uint64(hdr[0:]), int(binary.BigEndian.Uint32(hdr[8:]))
		var runErr error
		if l := int(binary.BigEndian.Uint16(hdr[12:])); l > 0 {
			msg := make([]byte, l)
			if _, err := io.ReadFull(r, msg); err != nil {
				break
			}
			runErr, outLen = fmt.Errorf("shm executor: %s: %w", msg, model.ErrBadInput), 0
		}
		q.mu.Lock()
		tag, ok := lk.pending[id]
		delete(lk.pending, id)
		q.mu.Unlock()
		if !ok {
			break // not a run of ours: the stream is out of step
		}
		batch = append(batch, Completion{Tag: tag, OutLen: outLen, Err: runErr})
		if r.Buffered() == 0 {
			q.done(batch)
			batch = batch[:0]
		}
	}
	lk.c.Close()
	q.mu.Lock()
	if q.link == lk {
		q.link = nil
	}
	err := fmt.Errorf("shm executor %s: connection lost while the run was queued", q.path)
	if q.closed {
		err = ErrLauncherClosed
	}
	for id, tag := range lk.pending {
		batch = append(batch, Completion{Tag: tag, Err: err})
		delete(lk.pending, id)
	}
	q.mu.Unlock()
	if len(batch) > 0 {
		q.done(batch)
	}
}

func (q *execQueue) close() {
	q.mu.Lock()
	q.closed = true
	if q.link != nil {
		q.link.c.Close()
	}
	q.mu.Unlock()
	q.readers.Wait()
}

// rawConn reads and writes a non-blocking socket with raw system calls
// (no entersyscall: they never wait in the kernel), waiting in the
// runtime's poller as net.Conn does. A plain read or write, the first
// system call of a wake-up that found the process idle, would also wake
// the runtime's monitor thread (sysmon) from its deep sleep: a futex wake,
// and the monitor's futex wait and nanosleep, on every launch and every
// completion of a host that runs one request at a time (udp's recv says
// more). A Close of the connection wakes a waiting read or write with an
// error, as for net.Conn.
type rawConn struct{ rc syscall.RawConn }

func (r rawConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var errno unix.Errno
	err := r.rc.Read(func(fd uintptr) bool {
		for {
			m, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
			if e == unix.EINTR {
				continue
			}
			if e == unix.EAGAIN {
				return false
			}
			n, errno = int(m), e
			return true
		}
	})
	switch {
	case err != nil:
		return 0, err
	case errno != 0:
		return 0, errno
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// write writes all of p.
func (r rawConn) write(p []byte) error {
	var errno unix.Errno
	err := r.rc.Write(func(fd uintptr) bool {
		for len(p) > 0 {
			m, _, e := unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
			switch e {
			case 0:
				p = p[m:]
			case unix.EINTR:
			case unix.EAGAIN:
				return false
			default:
				errno = e
				return true
			}
		}
		return true
	})
	if err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}
