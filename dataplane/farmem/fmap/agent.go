package fmap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Serve runs a host agent with default settings (no logging); see
// Agent.Serve.
func Serve(ctx context.Context, ln *net.UnixListener, open func(context.Context, RegionRef) (Backend, error)) error {
	return (&Agent{}).Serve(ctx, ln, open)
}

// Agent is the host agent: one per host node, serving the mappings of every
// program that connects to it.
type Agent struct {
	// Logger receives one line per mapping that ends, with its counters, and
	// the errors that end mappings. Nil discards them.
	Logger *slog.Logger

	// WriteBackWait bounds how long an open of a region waits for the
	// write-back of a mapping of it whose program ended without Close (0:
	// DefaultWriteBackWait). Past it, or if that write-back fails, the open
	// fails saying so.
	WriteBackWait time.Duration

	// features stands in for uffdFeatures in tests: without
	// UFFD_FEATURE_POISON the agent acts as on a kernel older than 6.6.
	features func() (uint64, error)
}

// DefaultWriteBackWait is Agent.WriteBackWait's default, as long as a
// fault's default FetchTimeout.
const DefaultWriteBackWait = time.Minute

// Serve runs the agent on ln until ctx ends: it accepts programs' mappings,
// opens each one's region with open, and serves its faults. ln must be a
// stream ("unix") listener; whoever can connect to it can have regions
// mapped, so restrict the socket's mode. Serve closes ln when it returns.
// At the end every mapping's dirty chunks are written back, and the
// mappings of programs still using them are poisoned (UFFDIO_POISON, Linux
// 6.6+): their next touch raises SIGBUS instead of blocking on a fault that
// nobody serves. An agent killed outright (SIGKILL) poisons nothing: its
// programs block on their next fault.
//
// An accept that fails for want of resources (EMFILE, ENFILE, ENOBUFS,
// ENOMEM) or for a connection aborted before it was accepted is retried
// after a short backoff (5 ms doubling to 1 s), with a warning at most
// every acceptLogEvery. Any other accept error ends Serve: it closes ln
// first, so that no program connects into a backlog nobody accepts from,
// ends every mapping as when ctx ends, and returns the error.
//
// If a Backend returned by open is an io.Closer, Serve closes it when its
// mapping ends; on the program's Close it does so before answering, and the
// Close's error includes the backend's.
//
// A program that ends without Close has its dirty chunks written back after
// its connection ends. An open of the same region that comes meanwhile, from
// any program, waits for that write-back (and the backend's close) before it
// opens the region, for at most WriteBackWait, so that it reads what the
// ended program wrote; if the write-back fails, or outlasts the wait, the
// open fails saying so.
func (a *Agent) Serve(ctx context.Context, ln *net.UnixListener, open func(context.Context, RegionRef) (Backend, error)) error {
	log := a.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// The mappings end with connCtx: when ctx ends, or when Serve returns
	// on an accept error.
	connCtx, endConns := context.WithCancel(ctx)
	reg := &mappings{byRegion: map[uint64][]*liveMapping{}, wait: a.WriteBackWait, log: log}
	if reg.wait <= 0 {
		reg.wait = DefaultWriteBackWait
	}
	var wg sync.WaitGroup
	defer func() {
		ln.Close()
		endConns()
		wg.Wait()
	}()
	stop := context.AfterFunc(ctx, func() { ln.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var backoff time.Duration
	var lastLog time.Time
	failed := 0 // accept errors since the last warning
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if !temporaryAccept(err) {
				return fmt.Errorf("fmap agent: accept: %w", err)
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			if failed++; time.Since(lastLog) >= acceptLogEvery {
				log.Warn("fmap agent: accept failed; retrying", "err", err, "retry_in", backoff, "failures", failed)
				lastLog, failed = time.Now(), 0
			}
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil
			}
			continue
		}
		backoff = 0
		wg.Go(func() {
			// A mapping that fails ends only that program's connection; the
			// program sees the error in its Map, Sync or Close.
			pid := peerPID(c)
			region, st, err := serveConn(connCtx, c, open, a.features, reg, pid)
			if err != nil {
				log.Warn("fmap mapping ended with an error", "pid", pid, "region", region.String(), "err", err)
			}
			if st != nil {
				log.Info("fmap mapping ended", "pid", pid, "region", region.String(), "stats", *st)
			}
		})
	}
}

// acceptLogEvery bounds how often Serve logs accept errors it retries.
const acceptLogEvery = 10 * time.Second

// temporaryAccept reports whether an accept error may clear by itself:
// descriptors or buffers run out (another mapping's end frees them), or a
// program gave up on its connection before it was accepted.
func temporaryAccept(err error) bool {
	for _, e := range []error{unix.EMFILE, unix.ENFILE, unix.ENOBUFS, unix.ENOMEM, unix.ECONNABORTED} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// peerPID names the program on the other end of c, for logs.
func peerPID(c *net.UnixConn) int32 {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	var pid int32
	rc.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = cred.Pid
		}
	})
	return pid
}

// serveConn runs one program's mapping from handshake to close.
// It returns the region and, once the mapping was attached, its final
// counters.
func serveConn(ctx context.Context, c *net.UnixConn, open func(context.Context, RegionRef) (Backend, error), features func() (uint64, error), reg *mappings, pid int32) (RegionRef, *Stats, error) {
	var region RegionRef
	var h *handler
	err := serveMapping(ctx, c, open, features, reg, pid, &region, &h)
	if h == nil {
		return region, nil, err
	}
	st := h.snapshot()
	return region, &st, err
}

func serveMapping(ctx context.Context, c *net.UnixConn, open func(context.Context, RegionRef) (Backend, error), features func() (uint64, error), reg *mappings, pid int32, regionOut *RegionRef, hOut **handler) (err error) {
	defer c.Close()
	stopConn := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stopConn()

	req, fds, err := readFrame(c)
	closeAll(fds)
	if errors.Is(err, io.EOF) {
		return nil // closed before asking anything: a probe of the socket, not a mapping
	}
	if err != nil {
		return err
	}
	if req.Op != opOpen || req.Region == nil {
		return reply(c, fmt.Errorf("fmap agent: want an open request first, got %q", req.Op))
	}
	region := *req.Region
	*regionOut = region
	// A mapping of the region whose program is gone may still be writing
	// its last writes back: open after it, or read the bytes it replaces.
	if err := reg.waitEnded(ctx, region); err != nil {
		return reply(c, fmt.Errorf("fmap agent: open %s: %w", region, err))
	}
	lm := reg.add(region.ID, c, pid)
	// lost is what an ended program's mapping failed to write back (or to
	// release); opens that waited for it get it. This defer runs after the
	// backend's close below, so they open after the release.
	var lost error
	defer func() { reg.remove(region.ID, lm, lost) }()
	be, err := open(ctx, region)
	if err != nil {
		return reply(c, fmt.Errorf("fmap agent: open %s: %w", region, err))
	}
	// The backend is closed (for a far-memory region: its writer lease
	// released) before Close is answered, so that the program may map the
	// region writable again at once, and a failing release is reported to
	// it; on every other end, its error joins the mapping's.
	backendOpen := true
	closeBackend := func() error {
		if !backendOpen {
			return nil
		}
		backendOpen = false
		if cl, ok := be.(io.Closer); ok {
			if err := cl.Close(); err != nil {
				return fmt.Errorf("fmap agent: close %s: %w", region, err)
			}
		}
		return nil
	}
	defer func() {
		cerr := closeBackend()
		if lm.ended.Load() {
			lost = errors.Join(lost, cerr)
		}
		err = errors.Join(err, cerr)
	}()
	var opts Options
	if req.Options != nil {
		opts = *req.Options
	}
	r, err := opts.resolve(be.Size())
	if err != nil {
		return reply(c, err)
	}
	if err := writeFrame(c, frame{Size: be.Size()}); err != nil {
		return err
	}

	req, fds, err = readFrame(c)
	if err != nil {
		return err
	}
	if req.Op != opAttach || len(fds) != 2 {
		closeAll(fds)
		return reply(c, fmt.Errorf("fmap agent: want attach with a userfaultfd and a memfd, got %q with %d descriptors", req.Op, len(fds)))
	}
	uffd, memfd := fds[0], fds[1]
	defer unix.Close(memfd)
	unix.CloseOnExec(uffd)
	unix.CloseOnExec(memfd)
	if err := unix.SetNonblock(uffd, true); err != nil {
		unix.Close(uffd)
		return reply(c, fmt.Errorf("fmap agent: userfaultfd: set non-blocking: %w", err))
	}
	// os.NewFile puts a non-blocking descriptor in the runtime's poller, so
	// the fault loop waits in epoll, not in a thread stuck in read(2), and a
	// read deadline stops it.
	uf := os.NewFile(uintptr(uffd), "userfaultfd")
	defer uf.Close()
	if req.Len != uint64(r.mapLen) {
		return reply(c, fmt.Errorf("fmap agent: program mapped %d bytes, region needs %d", req.Len, r.mapLen))
	}
	h := newHandler(region, be, r, uffd, memfd, req.Addr)
	h.noPoison = poisonSupport(features)
	*hOut = h

	hctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	faultErr := make(chan error, 1)
	wg.Go(func() { faultErr <- h.faultLoop(hctx, uf) })
	wg.Go(func() { h.cleaner(hctx) })
	stopHandler := func() {
		cancel()
		wg.Wait()
	}
	defer stopHandler()
	if err := writeFrame(c, frame{}); err != nil {
		// The program is gone before it could touch anything it wrote.
		return err
	}

	for {
		req, fds, err := readFrame(c)
		closeAll(fds)
		if err != nil {
			// Opens of the region from here on wait for this write-back.
			lm.ended.Store(true)
			if ctx.Err() != nil && !errors.Is(err, io.EOF) {
				// The agent stops while the program still maps the
				// region: write its dirty chunks back with the faults no
				// longer served (a write from here on waits), then make
				// its pages raise SIGBUS, since nobody will serve them.
				stopHandler()
				lost = h.flush(true)
				return errors.Join(lost, h.retire())
			}
			// The program exited without Close: its memfd is still
			// readable here, so write its dirty chunks back.
			ferr := h.flush(true)
			lost = ferr
			if errors.Is(err, io.EOF) {
				return ferr
			}
			return errors.Join(err, ferr)
		}
		switch req.Op {
		case opSync:
			// A failed write-back leaves its chunks dirty for the next try;
			// the mapping goes on.
			if err := respond(c, h.flush(false)); err != nil {
				return err
			}
		case opStats:
			st := h.snapshot()
			if err := writeFrame(c, frame{Stats: &st}); err != nil {
				return err
			}
		case opAdvise:
			// The backend's advice call (a round trip to the DPU agent)
			// runs here, beside the fault loop, never inside it.
			res, err := advise(be, req.Advice)
			f := frame{Result: &res}
			if err != nil {
				f = frame{Err: err.Error()}
			}
			if err := writeFrame(c, f); err != nil {
				return err
			}
		case opClose:
			// The program uses its bytes no more: stop serving them, then
			// release the backend before answering.
			ferr := h.flush(true)
			stopHandler()
			return reply(c, errors.Join(ferr, closeBackend()))
		default:
			if err := respond(c, fmt.Errorf("fmap agent: unknown request %q", req.Op)); err != nil {
				return err
			}
		}
		select {
		case err := <-faultErr:
			if err != nil {
				return err
			}
		default:
		}
	}
}

// reply sends err (or success) to the program and returns err: for the
// handshake, where an error ends the connection.
func reply(c *net.UnixConn, err error) error {
	return errors.Join(err, respond(c, err))
}

// respond sends err (or success) to the program; it returns only the error
// of sending.
func respond(c *net.UnixConn, err error) error {
	f := frame{}
	if err != nil {
		f.Err = err.Error()
	}
	return writeFrame(c, f)
}

// mappings are the agent's mappings by region, so that an open of a region
// can wait for the write-back of a mapping of it whose program ended
// without Close.
type mappings struct {
	wait time.Duration
	log  *slog.Logger

	mu       sync.Mutex
	byRegion map[uint64][]*liveMapping // by RegionRef.ID
}

// liveMapping is one connection's mapping of a region, from its open to the
// end of its write-back and its backend's close.
type liveMapping struct {
	c     *net.UnixConn
	pid   int32
	ended atomic.Bool   // the agent saw the connection end: it writes back
	done  chan struct{} // closed once written back and the backend closed
	lost  error         // the write-back's or the close's error; read after done
}

func (r *mappings) add(id uint64, c *net.UnixConn, pid int32) *liveMapping {
	lm := &liveMapping{c: c, pid: pid, done: make(chan struct{})}
	r.mu.Lock()
	r.byRegion[id] = append(r.byRegion[id], lm)
	r.mu.Unlock()
	return lm
}

// remove drops lm, whose write-back and close failed with lost (nil if
// they did not), and releases the opens waiting for it.
func (r *mappings) remove(id uint64, lm *liveMapping, lost error) {
	r.mu.Lock()
	l := r.byRegion[id]
	for i := range l {
		if l[i] == lm {
			l = append(l[:i], l[i+1:]...)
			break
		}
	}
	if len(l) == 0 {
		delete(r.byRegion, id)
	} else {
		r.byRegion[id] = l
	}
	r.mu.Unlock()
	lm.lost = lost
	close(lm.done)
}

// waitEnded waits for the mappings of region whose programs have ended
// (their connection closed, whether or not the agent has read that yet) to
// be written back. It fails if one's write-back failed, or lasts past
// r.wait.
func (r *mappings) waitEnded(ctx context.Context, region RegionRef) error {
	var ended []*liveMapping
	r.mu.Lock()
	for _, lm := range r.byRegion[region.ID] {
		// A mapping still listed has not closed its connection yet, so
		// the hang-up check reads a live descriptor.
		if lm.ended.Load() || hungUp(lm.c) {
			ended = append(ended, lm)
		}
	}
	r.mu.Unlock()
	if len(ended) == 0 {
		return nil
	}
	r.log.Info("fmap agent: open waits for the write-back of a mapping that ended without Close",
		"region", region.String(), "pid", ended[0].pid, "mappings", len(ended))
	t := time.NewTimer(r.wait)
	defer t.Stop()
	var errs []error
	for _, lm := range ended {
		select {
		case <-lm.done:
			if lm.lost != nil {
				errs = append(errs, fmt.Errorf("the write-back of the mapping of pid %d, which ended without Close, failed, "+
					"so the region lacks some of its writes (the host agent's log has the chunks): %w", lm.pid, lm.lost))
			}
		case <-t.C:
			return fmt.Errorf("the mapping of pid %d, which ended without Close, is still writing back after %s; "+
				"map the region again later, or see the host agent's log for why its write-back is slow", lm.pid, r.wait)
		case <-ctx.Done():
			return fmt.Errorf("waiting for the write-back of the mapping of pid %d, which ended without Close: %w", lm.pid, ctx.Err())
		}
	}
	return errors.Join(errs...)
}

// hungUp reports whether the program on c's other end has closed or shut
// down its side: it has ended, and will send nothing more. A descriptor it
// cannot check counts as hung up, which costs only a wait.
func hungUp(c *net.UnixConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return true
	}
	hup := true
	rc.Control(func(fd uintptr) {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, err := unix.Poll(p, 0); err == nil {
			hup = n > 0 && p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP) != 0
		}
	})
	return hup
}
