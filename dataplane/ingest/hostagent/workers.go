package hostagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/internal/fdpass"
)

// The worker protocol: how a user's own process (a "worker", e.g. Python
// through dataplane/ingest/python/lovelock_ingest.py) serves an external
// model. Frames are package fdpass's (a 4-byte big-endian length, JSON,
// descriptors by SCM_RIGHTS) on the agent's worker socket.
//
//	worker → agent  WorkerAttach   {op: attach, version, model}
//	agent → worker  WorkerAttached {op: attached, version, model, row_bytes, epoch, gpus}
//	                + one descriptor per slot buffer, in layout order (each
//	                slot's input, then its output) for memfd and cuda-fd
//	                handles; cuda-ipc handles ride in gpus[].slots[].in_ipc
//	                and out_ipc (64 bytes, base64 in JSON); or {err} and close
//	then, for each doorbell of the model:
//	agent → worker  WorkerRun      {op: run, request, gpu, slot, len, out_len}
//	worker → agent  WorkerDone     {op: done, request, len} or {op: done, request, err}
//
// The worker reads len input bytes at the start of the slot's input buffer
// and writes its output at the start of the slot's output buffer; len in
// done must equal out_len, the output size the model was configured with
// for this input. A worker gets one run at a time: several workers may
// attach to one model, and the agent gives each request to an idle one. A
// worker lost in the middle of a run (it overran the run timeout, exited
// or closed its socket, or answered out of turn) is disconnected and its
// process killed if it still lives (SIGKILL through a pidfd), then the
// processes it left holding the slot buffers (leftovers.go), and the slot
// goes to no other request until they are all gone: a closed socket does
// not stop them writing late output into the slot they have mapped. A
// worker that leaves between runs has vouched with done for every output
// it wrote, and is let go.
//
// Workers are trusted code: a worker's mapping of the buffers cannot be
// revoked, which is why the socket is 0600 and the peer's user is checked.
const WorkerProtocol = 1

// WorkerAttach is a worker's first frame.
type WorkerAttach struct {
	Op      string `json:"op"` // "attach"
	Version int    `json:"version"`
	Model   string `json:"model"`
}

// WorkerAttached answers WorkerAttach.
type WorkerAttached struct {
	Op       string `json:"op"` // "attached"
	Version  int    `json:"version"`
	Model    string `json:"model,omitempty"`
	RowBytes int    `json:"row_bytes,omitempty"`
	// Epoch is the host agent's registration; the buffers live as long as
	// it does, and the connection closes when the agent stops.
	Epoch uint64             `json:"epoch,omitempty"`
	GPUs  []ingest.GPULayout `json:"gpus,omitempty"`
	Err   string             `json:"err,omitempty"`
}

// WorkerRun asks a worker to run its model on one slot.
type WorkerRun struct {
	Op      string `json:"op"` // "run"
	Request uint64 `json:"request"`
	GPU     int    `json:"gpu"`
	Slot    int    `json:"slot"`
	Len     int    `json:"len"`
	OutLen  int    `json:"out_len"`
}

// WorkerDone is a worker's answer to WorkerRun.
type WorkerDone struct {
	Op      string `json:"op"` // "done"
	Request uint64 `json:"request"`
	Len     int    `json:"len"`
	Err     string `json:"err,omitempty"`
}

// extModel is an external model and the workers attached to it.
type extModel struct {
	m *model.Model

	mu      sync.Mutex
	workers map[*worker]bool
	idle    []*worker
	// wake is closed, and replaced, whenever a worker attaches, detaches
	// or becomes idle.
	wake chan struct{}
}

type worker struct {
	conn *net.UnixConn
	pid  int32
	// pidfd is the worker's process, opened at attach so that a kill
	// never reaches another process given the same pid (-1: none, for
	// pidErr); closed once the worker is detached.
	pidMu  sync.Mutex
	pidfd  int
	pidErr error
	// files are the agent's copies of the memfd buffers' open files this
	// worker was given, by buffer: each worker gets files of its own
	// (opened anew, not dup'ed), so that a process holding a descriptor
	// of one is known for the worker's, by kcmp, wherever it was
	// reparented (leftovers.go). Closed once the worker is detached.
	filesMu sync.Mutex
	files   map[fileID]int
	// done carries the worker's answers from its reader goroutine.
	done   chan WorkerDone
	closed chan struct{}
	once   sync.Once
	why    error // set before closed is closed
}

func (w *worker) close(why error) {
	w.once.Do(func() {
		w.why = why
		close(w.closed)
		w.conn.Close()
	})
}

// openPidfd opens the worker's process by the pid SO_PEERCRED gave.
func (w *worker) openPidfd(open func(pid, flags int) (int, error)) {
	w.pidfd = -1
	if w.pid <= 0 {
		w.pidErr = errors.New("the agent cannot see the worker's process (another PID namespace?)")
		return
	}
	fd, err := open(int(w.pid), 0)
	if err != nil {
		w.pidErr = fmt.Errorf("pidfd_open: %w", err)
		return
	}
	w.pidfd = fd
}

// dupPidfd returns a descriptor of the worker's process of the caller's
// own, or why there is none.
func (w *worker) dupPidfd() (int, error) {
	w.pidMu.Lock()
	defer w.pidMu.Unlock()
	if w.pidfd < 0 {
		if w.pidErr == nil {
			return -1, errors.New("the worker was detached")
		}
		return -1, w.pidErr
	}
	fd, err := unix.FcntlInt(uintptr(w.pidfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("dup pidfd: %w", err)
	}
	return fd, nil
}

// alive reports whether the worker's process has not ended, as far as
// the agent can tell (without a pidfd: while its pid is known).
func (w *worker) alive() bool {
	w.pidMu.Lock()
	defer w.pidMu.Unlock()
	if w.pidfd < 0 {
		return w.pidErr != nil && w.pid > 0
	}
	return alive(w.pidfd)
}

// ownsFile reports whether pid's descriptor fd is one of the open files
// of buffer id that w was given.
func (w *worker) ownsFile(id fileID, pid, fd int) bool {
	w.filesMu.Lock()
	defer w.filesMu.Unlock()
	mine, ok := w.files[id]
	return ok && kcmp(os.Getpid(), pid, kcmpFile, mine, fd) == 0
}

func (w *worker) closeFiles() {
	w.filesMu.Lock()
	defer w.filesMu.Unlock()
	for id, fd := range w.files {
		unix.Close(fd)
		delete(w.files, id)
	}
}

func (w *worker) closePidfd() {
	w.pidMu.Lock()
	defer w.pidMu.Unlock()
	if w.pidfd >= 0 {
		unix.Close(w.pidfd)
		w.pidfd = -1
	}
}

func (w *worker) isClosed() bool {
	select {
	case <-w.closed:
		return true
	default:
		return false
	}
}

func (e *extModel) signalLocked() {
	close(e.wake)
	e.wake = make(chan struct{})
}

func (e *extModel) attach(w *worker) {
	e.mu.Lock()
	e.workers[w] = true
	e.idle = append(e.idle, w)
	e.signalLocked()
	e.mu.Unlock()
}

func (e *extModel) detach(w *worker) {
	e.mu.Lock()
	delete(e.workers, w)
	e.idle = slices.DeleteFunc(e.idle, func(x *worker) bool { return x == w })
	e.signalLocked()
	e.mu.Unlock()
}

func (e *extModel) release(w *worker) {
	e.mu.Lock()
	// A worker closed during its run is detached by its reader
	// goroutine, maybe not yet: it must not become idle meanwhile.
	if e.workers[w] && !w.isClosed() {
		e.idle = append(e.idle, w)
		e.signalLocked()
	}
	e.mu.Unlock()
}

func (e *extModel) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.workers)
}

// errNoWorker is returned by acquire when no worker is attached.
var errNoWorker = errors.New("no worker attached")

// acquire returns an idle worker. With none attached it waits up to
// attachWait for one to attach; with all busy, up to busyWait, then fails
// as overloaded: the workers are fine, only too few for the load.
func (e *extModel) acquire(ctx context.Context, attachWait, busyWait time.Duration) (*worker, error) {
	start := time.Now()
	for {
		e.mu.Lock()
		if n := len(e.idle); n > 0 {
			w := e.idle[n-1]
			e.idle = e.idle[:n-1]
			e.mu.Unlock()
			return w, nil
		}
		n := len(e.workers)
		wait := busyWait
		if n == 0 {
			wait = attachWait
		}
		wake := e.wake
		e.mu.Unlock()
		left := wait - time.Since(start)
		if left <= 0 {
			if n == 0 {
				return nil, errNoWorker
			}
			who := fmt.Sprintf("all %d workers", n)
			if n == 1 {
				who = "the one worker"
			}
			return nil, ingest.Errorf(ingest.StatusOverloaded, "%s of model %s stayed busy for %v: retry, or attach more workers", who, e.m.Name, busyWait)
		}
		t := time.NewTimer(left)
		select {
		case <-wake:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
		t.Stop()
	}
}

// serveWorkers accepts workers until the listener closes.
func (a *Agent) serveWorkers(ctx context.Context, ln *net.UnixListener, wg *sync.WaitGroup) {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() == nil {
				a.cfg.Logger.Warn("worker socket", "err", err)
			}
			return
		}
		a.mu.Lock()
		if ctx.Err() != nil {
			a.mu.Unlock()
			c.Close()
			return
		}
		// Tracked from the start, so that shutdown also ends a worker
		// still attaching.
		a.conns[c] = nil
		a.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				a.mu.Lock()
				delete(a.conns, c)
				a.mu.Unlock()
				c.Close()
			}()
			a.serveWorker(c)
		}()
	}
}

// serveWorker attaches one worker and reads its answers until it leaves.
func (a *Agent) serveWorker(c *net.UnixConn) {
	cred, err := peerCred(c)
	if err != nil {
		a.refuseWorker(c, err)
		return
	}
	allowed := a.cfg.AllowUIDs
	if len(allowed) == 0 {
		allowed = []uint32{0, uint32(os.Getuid())}
	}
	if !slices.Contains(allowed, cred.Uid) {
		a.refuseWorker(c, fmt.Errorf("user %d may not attach workers to this host's GPU buffers (allowed: %v)", cred.Uid, allowed))
		return
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var req WorkerAttach
	fds, err := fdpass.Read(c, &req)
	if err != nil {
		a.refuseWorker(c, fmt.Errorf("read attach request: %w", err))
		return
	}
	fdpass.CloseAll(fds)
	c.SetReadDeadline(time.Time{})
	e, err := a.externalModel(req)
	if err != nil {
		a.refuseWorker(c, err)
		return
	}
	w := &worker{conn: c, pid: cred.Pid, done: make(chan WorkerDone), closed: make(chan struct{})}
	w.openPidfd(a.cfg.pidfdOpen)
	defer w.closePidfd()
	defer w.closeFiles()
	// Known before it has the buffers, so that no scan for a killed
	// worker's leftovers takes it for one (leftovers.go).
	a.mu.Lock()
	a.conns[c] = w
	a.mu.Unlock()
	if err := a.sendAttached(c, e.m, w); err != nil {
		a.refuseWorker(c, err)
		return
	}
	e.attach(w)
	a.stats.workerAttaches.Add(1)
	a.cfg.Logger.Info("worker attached", "model", e.m.Name, "pid", w.pid)
	defer func() {
		e.detach(w)
		a.cfg.Logger.Info("worker detached", "model", e.m.Name, "pid", w.pid, "why", w.why)
	}()
	for {
		var d WorkerDone
		fds, err := fdpass.Read(c, &d)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("the worker closed its connection")
			}
			w.close(err)
			return
		}
		fdpass.CloseAll(fds)
		select {
		case w.done <- d:
		case <-w.closed:
			return
		}
	}
}

func (a *Agent) refuseWorker(c *net.UnixConn, err error) {
	a.stats.workerRefused.Add(1)
	a.cfg.Logger.Warn("worker refused", "err", err)
	c.SetWriteDeadline(time.Now().Add(time.Second))
	fdpass.Write(c, WorkerAttached{Op: "attached", Version: WorkerProtocol, Err: err.Error()})
}

func (a *Agent) externalModel(req WorkerAttach) (*extModel, error) {
	if req.Op != "attach" {
		return nil, fmt.Errorf("first frame is %q: want attach", req.Op)
	}
	if req.Version != WorkerProtocol {
		return nil, fmt.Errorf("worker protocol version %d: this host agent speaks %d (update lovelock_ingest.py from the same release)", req.Version, WorkerProtocol)
	}
	if e, ok := a.ext[req.Model]; ok {
		return e, nil
	}
	var names []string
	for n := range a.ext {
		names = append(names, n)
	}
	slices.Sort(names)
	if _, ok := a.models[req.Model]; ok {
		return nil, fmt.Errorf("model %s is built in, not served by a worker (external models: %v)", req.Model, names)
	}
	return nil, fmt.Errorf("this host agent has no external model %q (external models: %v; add it to ingest_host's external_models)", req.Model, names)
}

// sendAttached sends the slot layout and one descriptor per buffer to w.
// A memfd buffer goes as an open file of w's own, which the agent keeps
// (w.files), so that w's holders can be told from another worker's.
func (a *Agent) sendAttached(c *net.UnixConn, m *model.Model, w *worker) error {
	l := a.Layout()
	var fds []int
	files := map[fileID]int{}
	kept := map[int]bool{} // w's once in w.files
	defer func() {
		for _, fd := range fds {
			if !kept[fd] {
				unix.Close(fd)
			}
		}
	}()
	for gi, g := range a.gpus {
		for si := range g.slots {
			for k, b := range []devmem.Buffer{g.slots[si].in, g.slots[si].out} {
				h, err := b.Export()
				if err != nil {
					return fmt.Errorf("export GPU %d slot %d: %w", gi, si, err)
				}
				l.GPUs[gi].HandleKind = string(h.Kind)
				switch {
				case h.FD >= 0 && h.Kind == devmem.HandleMemfd && a.scanner != nil:
					fd, id, err := reopen(h.FD)
					if err != nil {
						// w's holders then cannot be told from a lost
						// worker's: a scan kills a daemon of w's.
						a.cfg.Logger.Debug("reopen memfd for a worker", "gpu", gi, "slot", si, "err", err)
						fds = append(fds, h.FD)
						continue
					}
					unix.Close(h.FD)
					fds = append(fds, fd)
					files[id] = fd
				case h.FD >= 0:
					fds = append(fds, h.FD)
				case k == 0:
					l.GPUs[gi].Slots[si].InIPC = h.IPC
				default:
					l.GPUs[gi].Slots[si].OutIPC = h.IPC
				}
			}
		}
	}
	if len(fds) > fdpass.MaxFDs {
		return fmt.Errorf("%d slot buffers: more than the %d descriptors one frame carries (use fewer GPUs or slots)", len(fds), fdpass.MaxFDs)
	}
	// Kept before w has them, so that no scan sees w's file unknown.
	w.filesMu.Lock()
	w.files = files
	w.filesMu.Unlock()
	for _, fd := range files {
		kept[fd] = true
	}
	c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	defer c.SetWriteDeadline(time.Time{})
	return fdpass.Write(c, WorkerAttached{Op: "attached", Version: WorkerProtocol, Model: m.Name, RowBytes: m.Multiple, Epoch: a.epoch, GPUs: l.GPUs}, fds...)
}

// reopen opens the memfd fd anew, through /proc: a new open file of the
// same memory, which kcmp tells from every other.
func reopen(fd int) (int, fileID, error) {
	nfd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(fd), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fileID{}, fmt.Errorf("reopen memfd: %w", err)
	}
	id, err := fileIDOf(nfd)
	if err != nil {
		unix.Close(nfd)
		return -1, fileID{}, fmt.Errorf("fstat memfd: %w", err)
	}
	return nfd, id, nil
}

// runExternal hands one request to a worker of an external model and
// waits for its answer. gone is not nil when the worker was lost with the
// run in its hands (it overran the run timeout, went away, or broke the
// protocol): it is closed once the worker's process and the processes it
// left holding the slot buffers are gone (reap), and until then the slot
// must stay taken.
func (a *Agent) runExternal(ctx context.Context, m *model.Model, c ingest.Ctrl, s *slot) (n int, gone <-chan struct{}, err error) {
	defer func() {
		if err != nil {
			a.stats.externalFailed.Add(1)
		} else {
			a.stats.externalRuns.Add(1)
		}
	}()
	inLen := int(c.Length)
	if err := m.Check(inLen); err != nil {
		return 0, nil, ingest.Errorf(ingest.StatusBadRequest, "%v", err)
	}
	outLen := m.OutputSize(inLen)
	if outLen < 0 || outLen > s.out.Size() {
		return 0, nil, ingest.Errorf(ingest.StatusTooLarge, "model %s: an input of %d bytes makes %d bytes of output, more than the %d-byte output buffer", m.Name, inLen, outLen, s.out.Size())
	}
	e := a.ext[m.Name]
	w, err := e.acquire(ctx, a.cfg.WorkerWait, a.cfg.RunTimeout)
	if errors.Is(err, errNoWorker) {
		return 0, nil, ingest.Errorf(ingest.StatusModelFailed, "no worker serves model %s on this GPU host: start one there, e.g. in Python: for req in lovelock_ingest.serve(%q, socket=%q): ... (docs/ingest.md, \"Your own model (Python)\")", m.Name, m.Name, a.cfg.WorkerSocket)
	}
	if ingest.StatusOf(err) == ingest.StatusOverloaded {
		return 0, nil, err // busy workers: retryable, not the model's failure
	}
	if err != nil {
		return 0, nil, ingest.Errorf(ingest.StatusModelFailed, "model %s: %v", m.Name, err)
	}
	defer e.release(w)
	// The run's own descriptor of the worker's process: the worker's
	// reader closes the worker's once it has detached it, which it may
	// do, when the worker goes away, before this run sees it gone.
	pidfd, perr := w.dupPidfd()
	defer func() {
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
	}()
	// lost disconnects a worker that has the run, and reaps it: it may
	// still write into the slot, and so may what it left behind.
	lost := func(why error) <-chan struct{} {
		w.close(why)
		a.stats.workerLost.Add(1)
		gone := a.reap(ctx, w, pidfd, perr, why, m.Name, c)
		pidfd = -1 // reap's now
		return gone
	}
	run := WorkerRun{Op: "run", Request: c.Request, GPU: int(c.GPU), Slot: int(c.Slot), Len: inLen, OutLen: outLen}
	w.conn.SetWriteDeadline(time.Now().Add(a.cfg.RunTimeout))
	if err := fdpass.Write(w.conn, run); err != nil {
		// The worker never got the run (fdpass sends a frame in one
		// message; a torn one is no run it can read), and answered done
		// for every run before: nothing of it writes into the slot by
		// right now, as after a detach between runs.
		w.close(fmt.Errorf("send run: %w", err))
		a.stats.workerLost.Add(1)
		return 0, nil, ingest.Errorf(ingest.StatusModelFailed, "model %s: the worker (pid %d) is gone: %v", m.Name, w.pid, err)
	}
	t := time.NewTimer(a.cfg.RunTimeout)
	defer t.Stop()
	select {
	case d := <-w.done:
		switch {
		case d.Op != "done" || d.Request != c.Request:
			// Not done with this run: it may be writing it still.
			return 0, lost(fmt.Errorf("protocol: answered %q for request %d while running %d", d.Op, d.Request, c.Request)), ingest.Errorf(ingest.StatusModelFailed, "model %s: the worker (pid %d) answered %q for request %d, not done for %d: disconnected and killed it", m.Name, w.pid, d.Op, d.Request, c.Request)
		case d.Err != "":
			return 0, nil, ingest.Errorf(ingest.StatusModelFailed, "model %s (worker pid %d): %s", m.Name, w.pid, d.Err)
		case d.Len != outLen:
			return 0, nil, ingest.Errorf(ingest.StatusModelFailed, "model %s (worker pid %d) returned %d bytes of output: for an input of %d bytes it must return %d (its configured output size)", m.Name, w.pid, d.Len, inLen, outLen)
		}
		return d.Len, nil, nil
	case <-w.closed:
		if ctx.Err() != nil {
			// closeWorkers: the buffers go with the agent.
			return 0, nil, ingest.Errorf(ingest.StatusHostUnavailable, "the host agent is stopping")
		}
		// The worker exited or closed its socket with the run in its
		// hands: whatever it wrote is no output it vouched for, and a
		// child it forked, or its own process still alive, may write
		// later, over the next request's output.
		return 0, lost(w.why), ingest.Errorf(ingest.StatusModelFailed, "model %s: the worker (pid %d) disconnected while running this request (%v): start it again", m.Name, w.pid, w.why)
	case <-t.C:
		// Closing the socket does not stop the worker writing into the
		// slot it still has mapped: the slot stays taken until its
		// process is gone.
		return 0, lost(fmt.Errorf("run timeout: no answer for request %d in %v", c.Request, a.cfg.RunTimeout)), ingest.Errorf(ingest.StatusModelFailed, "model %s: the worker (pid %d) did not answer within %v; it was disconnected and killed: start it again", m.Name, w.pid, a.cfg.RunTimeout)
	case <-ctx.Done():
		return 0, nil, ingest.Errorf(ingest.StatusHostUnavailable, "the host agent is stopping")
	}
}

// reapPoll is how often a wait for a worker's process to end looks at the
// agent's context.
const reapPoll = 100 * time.Millisecond

// reap kills the process of a worker lost mid-run (why: it overran the
// run timeout, went away, broke the protocol), which may still write into
// the slot it has mapped if it lives, then the processes it left holding
// the slot buffers (sweep: a child it forked, a daemon, a subprocess given
// a descriptor), and returns a channel closed once they are all gone
// (never, if ctx ends first). It kills the worker through pidfd, its
// process opened at attach (the worker is no child of the agent's:
// nothing to wait4), and waits for pidfd to turn readable (at once, for a
// worker that exited); reap owns pidfd. When it cannot kill the process
// (another user's; no pidfd, for perr) it only waits for the process to
// end, with a warning: the slot stays taken as long as the process lives.
// The scan of /proc runs here, off the receive loop.
func (a *Agent) reap(ctx context.Context, w *worker, pidfd int, perr, why error, name string, c ingest.Ctrl) <-chan struct{} {
	gone := make(chan struct{})
	log := a.cfg.Logger.With("model", name, "pid", w.pid, "gpu", c.GPU, "slot", c.Slot, "request", c.Request, "why", why)
	if pidfd < 0 && w.pid <= 0 {
		log.Warn("a worker lost mid-run cannot be killed, and its slot stays taken until the host agent restarts: stop the worker, then restart the host agent", "err", perr)
		return gone
	}
	a.runs.Add(1)
	go func() {
		defer a.runs.Done()
		if !a.killWorker(ctx, w, pidfd, perr, log) || !a.sweep(ctx, log) {
			return
		}
		close(gone)
	}()
	return gone
}

// killWorker kills a worker's process and returns true once it is gone,
// false if ctx ends first. It owns pidfd. A worker in the agent's own
// process (a test's stand-in) is left alone.
func (a *Agent) killWorker(ctx context.Context, w *worker, pidfd int, perr error, log *slog.Logger) bool {
	if int(w.pid) == os.Getpid() {
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
		return true
	}
	if pidfd < 0 {
		log.Warn("a worker lost mid-run cannot be killed; its slot stays taken while the process lives: kill the worker process", "err", perr)
		// Without a pidfd, look for the process by its number.
		for unix.Kill(int(w.pid), 0) != unix.ESRCH {
			if !sleepCtx(ctx, reapPoll) {
				return false
			}
		}
		return true
	}
	defer unix.Close(pidfd)
	if err := a.cfg.signal(pidfd, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		log.Warn("a worker lost mid-run could not be killed (another user's process?); its slot stays taken while the process lives: kill the worker process", "err", err)
	}
	return waitGone(ctx, []int{pidfd})
}

// closeWorkers disconnects every worker, attached or attaching; Run calls
// it once ctx is done.
func (a *Agent) closeWorkers() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for c, w := range a.conns {
		if w != nil {
			w.close(errors.New("the host agent stopped"))
		}
		c.Close()
	}
}

func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if cerr != nil {
		return nil, fmt.Errorf("peer credentials: %w", cerr)
	}
	return cred, nil
}
