package fmap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/dataplane/internal/fdpass"
)

// ErrClosed is returned by Sync and Close on a closed Mapping.
var ErrClosed = errors.New("fmap: mapping closed")

// Mapping is a region mapped into this process. Its bytes fault in from the
// host agent on first touch; this process runs no code to serve the faults.
type Mapping struct {
	region RegionRef
	mem    []byte // the whole mmap'd range
	size   int64

	mu    sync.Mutex // serialises requests on conn
	conn  *net.UnixConn
	uffd  int
	memfd int
	// keep duplicates conn's descriptor (0: none). A program may drop its
	// Mapping and go on using Bytes until it exits; the GC then finalizes
	// conn and closes its descriptor, which the agent would take for the
	// program's exit: it would stop serving the faults, and the next touch
	// would block for ever. This copy, which no finalizer closes, keeps the
	// connection open until Close or the program's exit.
	keep   int
	closed bool
	broken error // why conn can no longer carry Sync, Stats or Advise (Close still goes through)
	// What cancelled requests left on conn, for Close: replies still to
	// come, and whether a cancel cut a frame in the middle (then no reply
	// on conn can be read any more).
	pending int
	torn    bool
}

// Map maps region through the host agent listening on agentSocket. The
// returned Mapping's Bytes are usable at once; the agent fetches each chunk
// when it is first touched. ctx bounds the setup only.
//
// The agent must be a separate process (one per host node), never a
// goroutine of this one: a goroutine that faults sleeps in the kernel while
// holding its P, and a handler in the same process can deadlock against a
// stop-the-world GC that waits for that P.
func Map(ctx context.Context, agentSocket string, region RegionRef, opts Options) (*Mapping, error) {
	if err := opts.check(); err != nil {
		return nil, fmt.Errorf("fmap: %s: %w", region, err)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", agentSocket)
	if err != nil {
		return nil, fmt.Errorf("fmap: %s: dial host agent %s: %w (is the agent running?)", region, agentSocket, err)
	}
	conn := c.(*net.UnixConn)
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	m, err := attach(conn, region, opts)
	if !stop() && err == nil {
		// Cancelled just as the setup finished: the mapping works, but
		// the caller asked to give up.
		m.Close()
		err = ctx.Err()
	}
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return nil, fmt.Errorf("fmap: %s: %w", region, err)
	}
	conn.SetDeadline(time.Time{})
	return m, nil
}

func attach(conn *net.UnixConn, region RegionRef, opts Options) (*Mapping, error) {
	resp, err := call(conn, frame{Op: opOpen, Region: &region, Options: &opts})
	if err != nil {
		return nil, err
	}
	r, err := opts.resolve(resp.Size)
	if err != nil {
		return nil, err
	}
	features, err := uffdFeatures()
	if err != nil {
		return nil, err
	}
	const need = featureMissingShmem | featureWPHugetlbfsShmem
	if features&need != need {
		return nil, fmt.Errorf("userfaultfd: kernel lacks missing or write-protect faults on shmem "+
			"(features %#x, need %#x): use Linux 5.19 or later", features, uint64(need))
	}

	m := &Mapping{region: region, size: resp.Size, conn: conn, uffd: -1, memfd: -1}
	ok := false
	defer func() {
		if !ok {
			m.release()
		}
	}()
	if m.keep, err = dupConn(conn); err != nil {
		return nil, err
	}
	name := "fmap"
	if region.Name != "" {
		name += ":" + region.Name
	}
	if m.memfd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC); err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(m.memfd, int64(r.mapLen)); err != nil {
		return nil, fmt.Errorf("size memfd to %d bytes: %w", r.mapLen, err)
	}
	if m.mem, err = unix.Mmap(m.memfd, 0, r.mapLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", r.mapLen, err)
	}
	// A child forked by this process (os/exec) must not inherit a range whose
	// faults nobody serves for it.
	if err := unix.Madvise(m.mem, unix.MADV_DONTFORK); err != nil {
		return nil, fmt.Errorf("madvise(MADV_DONTFORK): %w", err)
	}
	if m.uffd, _, err = openUffd(); err != nil {
		return nil, err
	}
	// Poisoning (6.6+) lets the agent end a fault it cannot serve with
	// SIGBUS (Options.FetchTimeout); without it such a fault waits.
	if err := uffdEnable(m.uffd, featureWPHugetlbfsShmem|features&featurePoison); err != nil {
		return nil, err
	}
	addr := uintptr(unsafe.Pointer(&m.mem[0]))
	ioctls, err := uffdRegister(m.uffd, addr, uintptr(r.mapLen), registerModeMissing|registerModeWP)
	if err != nil {
		return nil, err
	}
	const wantIoctls = 1<<nrCopy | 1<<nrWake | 1<<nrWriteProtect
	if ioctls&wantIoctls != wantIoctls {
		return nil, fmt.Errorf("userfaultfd: range allows ioctls %#x, need UFFDIO_COPY, UFFDIO_WAKE and UFFDIO_WRITEPROTECT", ioctls)
	}
	// From here on, touching m.mem blocks until the agent serves it.
	if _, err := call(conn, frame{Op: opAttach, Addr: uint64(addr), Len: uint64(r.mapLen)}, m.uffd, m.memfd); err != nil {
		return nil, err
	}
	ok = true
	return m, nil
}

// Bytes returns the mapped region, Size bytes long. It stays valid until
// Close; touching it after Close faults (SIGSEGV).
func (m *Mapping) Bytes() []byte { return m.mem[:m.size:m.size] }

// Size reports the region's size in bytes.
func (m *Mapping) Size() int64 { return m.size }

// Sync writes every dirty chunk back to the region and makes it durable.
// Writes that race with Sync may or may not be included. If ctx ends
// first, the agent still finishes the write-back, but the mapping takes
// no more requests but Close.
func (m *Mapping) Sync(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, err := m.roundTrip(ctx, frame{Op: opSync})
	return err
}

// Stats returns the host agent's counters for this mapping.
func (m *Mapping) Stats(ctx context.Context) (Stats, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	resp, err := m.roundTrip(ctx, frame{Op: opStats})
	if err != nil {
		return Stats{}, err
	}
	if resp.Stats == nil {
		return Stats{}, fmt.Errorf("fmap: %s: stats: the agent sent none", m.region)
	}
	return *resp.Stats, nil
}

// roundTrip sends req and reads its reply, giving up when ctx ends; m.mu
// must be held. A request given up on leaves conn for Close only, and notes
// what it left there: a reply still to come, or a frame cut in the middle.
func (m *Mapping) roundTrip(ctx context.Context, req frame) (frame, error) {
	if m.closed {
		return frame{}, ErrClosed
	}
	if m.broken != nil {
		return frame{}, fmt.Errorf("fmap: %s: %s: %w; Close the mapping", m.region, req.Op, m.broken)
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		m.conn.SetDeadline(time.Unix(1, 0))
		close(fired)
	})
	var resp frame
	var rerr error
	werr := writeFrame(m.conn, req)
	if werr == nil {
		var fds []int
		resp, fds, rerr = readFrame(m.conn)
		closeAll(fds)
	}
	if !stop() {
		// The deadline fired; wait for it to be set, so that Close's reset
		// comes after it.
		<-fired
		switch {
		case errors.Is(werr, fdpass.ErrTorn) || errors.Is(rerr, fdpass.ErrTorn):
			m.torn = true
		case werr == nil && rerr != nil:
			m.pending++ // sent, and no byte of its reply read
		}
		m.broken = fmt.Errorf("an earlier %s was cancelled (%w)", req.Op, ctx.Err())
		return frame{}, fmt.Errorf("fmap: %s: %s: %w", m.region, req.Op, ctx.Err())
	}
	if werr != nil {
		return frame{}, fmt.Errorf("fmap: %s: send %s: %w", m.region, req.Op, werr)
	}
	if rerr != nil {
		return frame{}, fmt.Errorf("fmap: %s: %s: read reply: %w", m.region, req.Op, rerr)
	}
	if resp.Err != "" {
		return frame{}, fmt.Errorf("fmap: %s: %s: %s", m.region, req.Op, resp.Err)
	}
	return resp, nil
}

// Close writes every dirty chunk back, makes it durable, and unmaps the
// region. Nothing may use Bytes during or after Close. The mapping is
// released even when the write-back fails; the error says so.
func (m *Mapping) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.closed = true
	if m.broken != nil {
		m.conn.SetDeadline(time.Time{})
	}
	var err error
	if m.torn {
		err = m.abandon()
	} else {
		err = m.skipPending()
		if err == nil {
			_, err = call(m.conn, frame{Op: opClose})
		}
	}
	if rerr := m.release(); err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("fmap: %s: close: %w", m.region, err)
	}
	return nil
}

// skipPending reads and drops the replies of requests that were cancelled
// after they were sent, so that Close reads its own reply, not a stale one
// (which would let it release the mapping before the agent's write-back).
func (m *Mapping) skipPending() error {
	for ; m.pending > 0; m.pending-- {
		_, fds, err := readFrame(m.conn)
		closeAll(fds)
		if err != nil {
			return fmt.Errorf("read the reply to a cancelled request: %w", err)
		}
	}
	return nil
}

// abandon ends a connection that a cancelled request left mid-frame, where
// no reply can be read: it shuts the sending side, which makes the agent
// write the dirty chunks back as for a program that exited, and waits for
// the agent to close its side, so that the memory stays mapped until that
// write-back has ended.
func (m *Mapping) abandon() error {
	if err := m.conn.CloseWrite(); err != nil {
		return fmt.Errorf("write-back unconfirmed: end the connection to the host agent: %w", err)
	}
	io.Copy(io.Discard, m.conn)
	return errors.New("write-back unconfirmed: an earlier request was cancelled in the middle of a frame, " +
		"so no reply can be read; the host agent wrote the dirty chunks back when the connection ended, " +
		"and its log says whether that failed")
}

// dupConn duplicates c's descriptor, close-on-exec, numbered 3 or more so
// that 0 can mean none.
func dupConn(c *net.UnixConn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("duplicate the connection to the host agent: %w", err)
	}
	var fd int
	var derr error
	if err := rc.Control(func(f uintptr) { fd, derr = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 3) }); err != nil {
		return 0, fmt.Errorf("duplicate the connection to the host agent: %w", err)
	}
	if derr != nil {
		return 0, fmt.Errorf("duplicate the connection to the host agent: %w (out of descriptors? raise RLIMIT_NOFILE)", derr)
	}
	return fd, nil
}

func (m *Mapping) release() error {
	var errs []error
	if m.keep > 0 {
		errs = append(errs, unix.Close(m.keep))
		m.keep = 0
	}
	if m.mem != nil {
		errs = append(errs, unix.Munmap(m.mem))
		m.mem = nil
	}
	if m.uffd >= 0 {
		errs = append(errs, unix.Close(m.uffd))
		m.uffd = -1
	}
	if m.memfd >= 0 {
		errs = append(errs, unix.Close(m.memfd))
		m.memfd = -1
	}
	errs = append(errs, m.conn.Close())
	return errors.Join(errs...)
}
