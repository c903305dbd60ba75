package devmem

import (
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
)

func runChecksum(t *testing.T, d *Shm, in []byte) ([]byte, error) {
	t.Helper()
	ib, err := d.Alloc(len(in) + 10)
	if err != nil {
		t.Fatal(err)
	}
	ob, err := d.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	// The writer's side: import the exported input and write through it.
	h, err := ib.Export()
	if err != nil {
		t.Fatal(err)
	}
	m, err := ShmImporter{}.Import(h)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.WriteAt(in, 0); err != nil {
		t.Fatal(err)
	}
	ck, _ := model.Builtin("checksum")
	n, err := d.Run(ck, ib, len(in), ob)
	if err != nil {
		return nil, err
	}
	out := make([]byte, n)
	return out, ob.ReadAt(out, 0)
}

// TestShm: bytes written through an importer's mapping are where the
// model runs, in this process or on an executor; errors say why.
func TestShm(t *testing.T) {
	in := bytes.Repeat([]byte("lovelock"), 1000)
	want := model.Checksum(in)
	sock := filepath.Join(t.TempDir(), "exec.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ck, _ := model.Builtin("checksum")
	done := make(chan error, 1)
	go func() { done <- ServeExecutor(ctx, ln, []*model.Model{ck}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	for name, d := range map[string]*Shm{"in process": NewShm(Info{}), "executor": NewShmWith(Info{}, ShmOptions{Executor: sock})} {
		out, err := runChecksum(t, d, in)
		if err != nil || !bytes.Equal(out, want[:]) {
			t.Errorf("%s: %x %v, want %x", name, out, err, want)
		}
		mlp, _ := model.Builtin("mlp")
		b, _ := d.Alloc(100)
		if _, err := d.Run(mlp, b, 100, b); !errors.Is(err, model.ErrBadInput) {
			t.Errorf("%s: mlp on 100 bytes: %v, want ErrBadInput", name, err)
		}
		d.Close()
	}
	// An executor without the model says so.
	d := NewShmWith(Info{}, ShmOptions{Executor: sock})
	defer d.Close()
	b, _ := d.Alloc(256)
	mlp, _ := model.Builtin("mlp")
	if _, err := d.Run(mlp, b, 256, b); err == nil {
		t.Error("the executor ran a model it was not given")
	}
	if err := CheckRange(10, 5, 12); !errors.Is(err, ErrRange) {
		t.Errorf("CheckRange: %v", err)
	}
}
