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
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return err
	}
	defer os.Remove(socket)
	// Mappings expose memory: only the owner (root) may connect.
	if err := os.Chmod(socket, 0o600); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "fmap-agent: serving regions from %s on %s\n", dir, socket)
	agent := &fmap.Agent{Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	return agent.Serve(ctx, ln, func(_ context.Context, r fmap.RegionRef) (fmap.Backend, error) {
		return openFile(filepath.Join(dir, strconv.FormatUint(r.ID, 10)))
	})
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
