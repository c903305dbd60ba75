// Command fmap-agent is a host agent for manual use of far-memory mappings
// without a memory node: it serves regions that are files in a directory
// (region ID n is the file DIR/n, which must exist; its size is the
// region's) on a unix socket, until SIGINT or SIGTERM. Programs map them
// with fmap.Map(ctx, SOCKET, fmap.RegionRef{ID: n}, opts).
//
//	fmap-agent -socket /run/lovelock/fmap.sock -dir /var/lib/lovelock/regions
//
// lovelockd will run the real agent, with regions from the far-memory client.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/lovelock-dpu/lovelock/dataplane/farmem/fmap"
)

func main() {
	socket := flag.String("socket", "/run/lovelock/fmap.sock", "unix socket to serve mappings on")
	dir := flag.String("dir", ".", "directory whose file named N is region N")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *socket, *dir); err != nil {
		fmt.Fprintln(os.Stderr, "fmap-agent:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, socket, dir string) error {
	// A socket left by an agent that died is in the way; a live one is not
	// ours to take, so check by dialling first.
	if c, err := net.Dial("unix", socket); err == nil {
		c.Close()
		return fmt.Errorf("an agent already serves %s", socket)
	}
	os.Remove(socket)
	ln, err := listen(socket, nil)
	if err != nil {
		return err
	}
	defer os.Remove(socket)
	fmt.Fprintf(os.Stderr, "fmap-agent: serving regions from %s on %s\n", dir, socket)
	agent := &fmap.Agent{Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	return agent.Serve(ctx, ln, func(_ context.Context, r fmap.RegionRef) (fmap.Backend, error) {
		return openFile(filepath.Join(dir, strconv.FormatUint(r.ID, 10)))
	})
}

// listen listens on a unix socket at path that only its owner may connect
// to, from the start: mappings expose memory. The socket is bound in a new
// directory beside path that only the owner may enter (0700), made
// owner-only there, and then renamed to path, so it never is at path with
// wider permissions. (A chmod after binding at path left a window in which
// anyone could connect; a umask around the bind would change the whole
// process's, racing other goroutines' creates.) bound, when not nil, is
// called with the bound socket's path before the rename (tests).
func listen(path string, bound func(tmp string)) (*net.UnixListener, error) {
	dir, err := os.MkdirTemp(filepath.Dir(path), ".fmap-agent-")
	if err != nil {
		return nil, fmt.Errorf("listen on %s: a private directory for the bind: %w", path, err)
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	// The name it was bound to goes with dir; the caller removes path.
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("listen on %s: make the socket owner-only: %w", path, err)
	}
	if bound != nil {
		bound(tmp)
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		return nil, fmt.Errorf("listen on %s: move the socket into place: %w", path, err)
	}
	return ln, nil
}

// fileBackend is a region kept in a file.
type fileBackend struct {
	*os.File
	size int64
}

func openFile(path string) (*fileBackend, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no region file %s: create it with the region's size (truncate -s SIZE %s)", path, path)
	}
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &fileBackend{File: f, size: st.Size()}, nil
}

func (b *fileBackend) Size() int64 { return b.size }
