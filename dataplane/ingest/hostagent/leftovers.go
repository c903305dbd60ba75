package hostagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
)

// bufferFiles names the agent's memfd buffers by file, for the scan. A
// CUDA buffer is no file a process maps (cuda-ipc handles are no
// descriptor at all; a cuda-fd handle is a descriptor the driver makes
// anew for each export, and its mappings are the GPU's): no scan covers
// it.
func (a *Agent) bufferFiles() (map[fileID]string, error) {
	files := map[fileID]string{}
	for gi, g := range a.gpus {
		if g.dev.Info().Kind != devmem.KindShm {
			continue
		}
		for si := range g.slots {
			for k, b := range []devmem.Buffer{g.slots[si].in, g.slots[si].out} {
				h, err := b.Export()
				if err != nil {
					return nil, err
				}
				id, err := fileIDOf(h.FD)
				unix.Close(h.FD)
				if err != nil {
					return nil, fmt.Errorf("GPU %d slot %d: fstat memfd: %w", gi, si, err)
				}
				files[id] = fmt.Sprintf("GPU %d slot %d %s", gi, si, [2]string{"input", "output"}[k])
			}
		}
	}
	return files, nil
}

// addSharer remembers a process the handle socket gave the buffers to
// (the DPU agent, which maps them all), so that no scan takes it for a
// worker's leftover; it keeps a pidfd of it, so that a process given the
// same pid later is not taken for it. Processes gone since are forgotten.
func (a *Agent) addSharer(pid int32) {
	if pid <= 0 || int(pid) == os.Getpid() {
		return
	}
	a.sharerMu.Lock()
	defer a.sharerMu.Unlock()
	for p, fd := range a.sharers {
		if !alive(fd) {
			unix.Close(fd)
			delete(a.sharers, p)
		}
	}
	if _, ok := a.sharers[int(pid)]; ok {
		return
	}
	fd, err := a.cfg.pidfdOpen(int(pid), 0)
	if err != nil {
		a.cfg.Logger.Warn("the handle socket's peer cannot be told from a worker's leftovers (no pidfd): a worker lost mid-run may have it killed", "pid", pid, "err", err)
		return
	}
	a.sharers[int(pid)] = fd
}

func (a *Agent) closeSharers() {
	a.sharerMu.Lock()
	defer a.sharerMu.Unlock()
	for p, fd := range a.sharers {
		unix.Close(fd)
		delete(a.sharers, p)
	}
}

// alive reports whether the process of pidfd has not ended.
func alive(pidfd int) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil && n == 0
	}
}

// trusted returns what holds the buffers by right: the processes that
// fetched them through the handle socket, and the attached workers (by
// process, whose descendants are theirs: a worker's multiprocessing
// pool), with the open files they were given. A worker closed (timed out,
// disconnected, lost mid-run or between runs) is no longer one.
func (a *Agent) trusted() (sharers, workers map[int]bool, healthy []*worker) {
	sharers, workers = map[int]bool{}, map[int]bool{}
	a.sharerMu.Lock()
	for p, fd := range a.sharers {
		if alive(fd) {
			sharers[p] = true
		}
	}
	a.sharerMu.Unlock()
	a.mu.Lock()
	for _, w := range a.conns {
		if w != nil && !w.isClosed() && w.alive() && int(w.pid) != os.Getpid() {
			workers[int(w.pid)] = true
			healthy = append(healthy, w)
		}
	}
	a.mu.Unlock()
	return sharers, workers, healthy
}

// healthyHolds reports whether every descriptor of the buffers pid holds
// is an open file an attached worker was given (pid holds at least one):
// a process a healthy worker left holding them, a daemon it double-forked,
// reparented out of its tree, which no other worker's loss may kill. A
// process that only maps the buffers (it closed every descriptor) cannot
// be told from a lost worker's: the kernel shows no mapping's open file.
// lovelock_ingest's mmaps keep a descriptor each.
func (a *Agent) healthyHolds(pid int, healthy []*worker) bool {
	fds := a.scanner.fdsHeld(pid)
	for _, h := range fds {
		if !slices.ContainsFunc(healthy, func(w *worker) bool { return w.ownsFile(h.id, pid, h.fd) }) {
			return false
		}
	}
	return len(fds) > 0
}

// leftovers scans for the processes that hold one of the agent's buffers
// and have no right to: all but the agent's own process, the handle
// socket's peers (the DPU agent), the attached workers and their
// descendants, and the processes whose descriptors of the buffers are all
// attached workers' (healthyHolds). A lost worker's daemon, reparented
// away from it, is a leftover; a healthy worker's is one only if it
// holds no descriptor of the buffers.
func (a *Agent) leftovers() ([]holder, error) {
	a.scanMu.Lock()
	defer a.scanMu.Unlock()
	hs, err := a.scanner.scan()
	if err != nil || len(hs) == 0 {
		return nil, err
	}
	// After the scan: a worker attaching now is known before it is given
	// the buffers (serveWorker), so it cannot be seen holding them
	// before it is trusted.
	sharers, workers, healthy := a.trusted()
	out := hs[:0]
	for _, h := range hs {
		if sharers[h.pid] {
			continue
		}
		mine := false
		for p, depth := h.pid, 0; p > 1 && depth < 256; depth++ {
			if workers[p] {
				mine = true
				break
			}
			_, pp, err := procStat(a.scanner.proc, p)
			if err != nil {
				break
			}
			p = pp
		}
		if !mine && !a.healthyHolds(h.pid, healthy) {
			out = append(out, h)
		}
	}
	return out, nil
}

// stillHolds looks at one process again.
func (a *Agent) stillHolds(pid int) bool {
	a.scanMu.Lock()
	defer a.scanMu.Unlock()
	_, ok := a.scanner.holds(pid)
	return ok
}

// sweepRetry is how long a sweep waits before it scans again after a
// scan it could not finish (no /proc) or a leftover it could not open.
const sweepRetry = time.Second

// sweep kills the worker's leftovers: once the process of a worker lost
// mid-run (reap) is gone, the processes still holding the slot buffers
// that have no right to (leftovers), and it returns true once a scan
// finds none, false if ctx ends first. Each is killed (SIGKILL) through a
// pidfd opened after the scan and checked to still hold a buffer, so that
// a pid given to another process meanwhile is never hit; then the sweep
// waits for them to end and scans again, since a leftover may have passed
// a descriptor on. One the agent may not kill (another user's process:
// EPERM) is waited for, with a warning naming it: the slot stays taken
// while it lives. The scan looks for every buffer of the agent, not only
// the slot's: a worker is given them all, and a leftover holding any of
// them may be the one to write late.
func (a *Agent) sweep(ctx context.Context, log *slog.Logger) bool {
	if a.scanner == nil {
		return true
	}
	warned := map[int]bool{}
	scanWarned := false
	for {
		hs, err := a.leftovers()
		if err != nil {
			if !scanWarned {
				log.Warn("cannot look for processes a worker lost mid-run left holding the slot buffers; the slot stays taken until a scan succeeds", "err", err)
				scanWarned = true
			}
			if !sleepCtx(ctx, sweepRetry) {
				return false
			}
			continue
		}
		log.Debug("looked for a lost worker's leftovers", "leftovers", len(hs), "processes", a.scanner.procs, "descriptors", a.scanner.descriptors,
			"map_lines", a.scanner.mapLines, "unreadable", a.scanner.unreadable, "took", a.scanner.took)
		if len(hs) == 0 {
			return true
		}
		var fds []int
		retry := false
		for _, h := range hs {
			comm, _, _ := procStat(a.scanner.proc, h.pid)
			l := log.With("holder_pid", h.pid, "holder", comm, "how", h.how)
			fd, err := a.cfg.pidfdOpen(h.pid, 0)
			if errors.Is(err, unix.ESRCH) {
				continue
			}
			if err != nil {
				// Without a pidfd no kill is safe from hitting
				// another process given the pid: scan again later.
				if !warned[h.pid] {
					l.Warn("a process left by a worker lost mid-run still holds the slot buffers and cannot be killed (no pidfd); its slot stays taken while it lives: kill it", "err", err)
					warned[h.pid] = true
				}
				retry = true
				continue
			}
			if !a.stillHolds(h.pid) {
				unix.Close(fd)
				continue
			}
			switch err := a.cfg.signal(fd, unix.SIGKILL); {
			case err == nil:
				a.stats.leftoversKilled.Add(1)
				l.Warn("killed a process left by a worker lost mid-run: it still held the slot buffers")
			case errors.Is(err, unix.ESRCH):
			default:
				if !warned[h.pid] {
					l.Warn("a process left by a worker lost mid-run still holds the slot buffers and could not be killed (another user's process?); its slot stays taken while it lives: kill it", "err", err)
					warned[h.pid] = true
				}
			}
			fds = append(fds, fd)
		}
		ok := waitGone(ctx, fds)
		for _, fd := range fds {
			unix.Close(fd)
		}
		if !ok || (retry && !sleepCtx(ctx, sweepRetry)) {
			return false
		}
	}
}

// waitGone waits until every process of pidfds has ended (true), or ctx
// ends (false).
func waitGone(ctx context.Context, pidfds []int) bool {
	fds := make([]unix.PollFd, len(pidfds))
	for i, fd := range pidfds {
		fds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	}
	for len(fds) > 0 {
		n, err := unix.Poll(fds, int(reapPoll/time.Millisecond))
		if n > 0 {
			fds = slices.DeleteFunc(fds, func(p unix.PollFd) bool { return p.Revents != 0 })
			for i := range fds {
				fds[i].Revents = 0
			}
		}
		if ctx.Err() != nil {
			return false
		}
		if err != nil && !errors.Is(err, unix.EINTR) && !sleepCtx(ctx, reapPoll) {
			return false
		}
	}
	return true
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
