package hostagent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/internal/fdpass"
)

// listenHandles opens the handle socket, replacing a stale one left by a
// crashed agent, readable by its owner only.
func listenHandles(path string) (*net.UnixListener, error) {
	return listenUnix(path, "handle")
}

// listenUnix opens a unix socket readable by its owner only, replacing a
// stale one left by a crashed agent.
func listenUnix(path, what string) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("host agent: %s socket directory: %w", what, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("host agent: remove stale %s socket: %w", what, err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("host agent: listen on %s socket %s: %w", what, path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("host agent: %s socket permissions: %w", what, err)
	}
	return ln, nil
}

// serveHandles answers layout requests: the layout of the current epoch
// and one descriptor per buffer. Only the allowed users get them: a
// buffer's handle is write access to a slice of the GPU.
func (a *Agent) serveHandles(ctx context.Context, ln *net.UnixListener) {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() == nil {
				a.cfg.Logger.Warn("handle socket", "err", err)
			}
			return
		}
		go func() {
			defer c.Close()
			if err := a.serveHandle(c); err != nil {
				a.cfg.Logger.Warn("handle request failed", "err", err)
			}
		}()
	}
}

func (a *Agent) serveHandle(c *net.UnixConn) error {
	cred, err := peerCred(c)
	if err != nil {
		return err
	}
	uid := cred.Uid
	var req ingest.LayoutRequest
	fds, err := fdpass.Read(c, &req)
	if err != nil {
		return fmt.Errorf("read layout request: %w", err)
	}
	fdpass.CloseAll(fds)
	allowed := a.cfg.AllowUIDs
	if len(allowed) == 0 {
		allowed = []uint32{0, uint32(os.Getuid())}
	}
	if !slices.Contains(allowed, uid) {
		a.stats.handleRefused.Add(1)
		return fdpass.Write(c, ingest.Layout{Err: fmt.Sprintf("user %d may not map this host's GPU buffers (allowed: %v)", uid, allowed)})
	}
	if req.Epoch != a.epoch {
		a.stats.handleRefused.Add(1)
		return fdpass.Write(c, ingest.Layout{Epoch: a.epoch, Err: fmt.Sprintf("epoch %016x is stale: the host agent registered %016x since; use the new one", req.Epoch, a.epoch)})
	}
	l := a.Layout()
	var handles []devmem.Handle
	defer func() {
		for _, h := range handles {
			if h.FD >= 0 {
				unix.Close(h.FD)
			}
		}
	}()
	var fds2 []int
	for gi, g := range a.gpus {
		for si := range g.slots {
			for k, b := range []devmem.Buffer{g.slots[si].in, g.slots[si].out} {
				h, err := b.Export()
				if err != nil {
					return fdpass.Write(c, ingest.Layout{Epoch: a.epoch, Err: fmt.Sprintf("export GPU %d slot %d: %v", gi, si, err)})
				}
				handles = append(handles, h)
				l.GPUs[gi].HandleKind = string(h.Kind)
				if h.FD >= 0 {
					fds2 = append(fds2, h.FD)
				} else if k == 0 {
					l.GPUs[gi].Slots[si].InIPC = h.IPC
				} else {
					l.GPUs[gi].Slots[si].OutIPC = h.IPC
				}
			}
		}
	}
	// Known before it has the buffers: it maps them all, and is no
	// worker's leftover (leftovers.go).
	a.addSharer(cred.Pid)
	if err := fdpass.Write(c, l, fds2...); err != nil {
		return fmt.Errorf("send layout: %w", err)
	}
	a.stats.handlesServed.Add(1)
	return nil
}

// FetchLayout asks the host agent at path for the layout of epoch and the
// buffers' handles, in Layout order (each slot's input, then output). The
// DPU agent calls it when a host registers a new epoch.
func FetchLayout(ctx context.Context, path string, epoch uint64) (ingest.Layout, []devmem.Handle, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return ingest.Layout{}, nil, fmt.Errorf("connect to the host agent's handle socket %s: %w", path, err)
	}
	c := conn.(*net.UnixConn)
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if err := fdpass.Write(c, ingest.LayoutRequest{Epoch: epoch}); err != nil {
		return ingest.Layout{}, nil, fmt.Errorf("ask for layout: %w", err)
	}
	var l ingest.Layout
	fds, err := fdpass.Read(c, &l)
	if err != nil {
		return ingest.Layout{}, nil, fmt.Errorf("read layout: %w", err)
	}
	if l.Err != "" {
		fdpass.CloseAll(fds)
		return l, nil, fmt.Errorf("host agent: %s", l.Err)
	}
	var hs []devmem.Handle
	next := 0
	for _, g := range l.GPUs {
		for _, s := range g.Slots {
			for k, size := range []int{s.InBytes, s.OutBytes} {
				h := devmem.Handle{Kind: devmem.HandleKind(g.HandleKind), Size: size, Device: g.Index, UUID: g.UUID, FD: -1}
				if h.Kind == devmem.HandleCUDAIPC {
					h.IPC = s.InIPC
					if k == 1 {
						h.IPC = s.OutIPC
					}
				} else {
					if next >= len(fds) {
						fdpass.CloseAll(fds)
						return l, nil, fmt.Errorf("host agent sent %d descriptors for more buffers", len(fds))
					}
					h.FD = fds[next]
					next++
				}
				hs = append(hs, h)
			}
		}
	}
	if next != len(fds) {
		fdpass.CloseAll(fds[next:])
	}
	return l, hs, nil
}
