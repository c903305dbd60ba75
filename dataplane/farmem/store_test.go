package farmem

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// reopen closes srv's state and opens a new server on dir, as a restart
// of the memory node's process does.
func reopen(t *testing.T, srv *Server, dir string) (*Server, error) {
	t.Helper()
	srv.Close()
	srv.st.close()
	s, err := NewServer(ServerOptions{Config: testConfig(), StateDir: dir, Capacity: 64 << 20, Transport: listen(t, loopback)})
	if err == nil {
		t.Cleanup(func() { s.Close(); s.st.close() })
	}
	return s, err
}

func listedIDs(srv *Server) []uint32 {
	var ids []uint32
	for _, ri := range srv.List(0) {
		ids = append(ids, ri.ID)
	}
	return ids
}

// TestMetaRenamedNotSynced: a metadata write whose rename took effect but
// whose directory fsync failed is what a restarted process reads, so the
// create or free it records stands: the answer agrees with the restart, and
// the memory node starts. Before, the create was answered ErrIO and its
// backing file removed while regions.json listed it, and the next start
// failed on the missing file; the free was answered ErrIO and the region
// kept, and the restart dropped it.
func TestMetaRenamedNotSynced(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   func(srv *Server, fail func()) (uint32, error) // the region it makes or frees
		want bool                                           // that region listed after the restart
	}{
		{"create", func(srv *Server, fail func()) (uint32, error) {
			fail()
			ri, err := srv.Create(7, 4096, true, "")
			return ri.ID, err
		}, true},
		{"free", func(srv *Server, fail func()) (uint32, error) {
			ri, err := srv.Create(7, 4096, true, "")
			if err != nil {
				return 0, err
			}
			fail()
			return ri.ID, srv.Free(7, ri.ID)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			srv := newLimitedServer(t, dir, 0)
			if _, err := srv.Create(7, 8192, true, ""); err != nil {
				t.Fatal(err)
			}
			id, err := tc.op(srv, func() { srv.st.syncDir = func(string) error { return errors.New("injected EIO") } })
			if err != nil {
				t.Fatalf("%s whose directory fsync failed after the rename: %v, want it to stand", tc.name, err)
			}
			if got := slices.Contains(listedIDs(srv), id); got != tc.want {
				t.Errorf("before the restart region %d listed: %v, want %v", id, got, tc.want)
			}
			srv2, err := reopen(t, srv, dir)
			if err != nil {
				t.Fatalf("restart: %v", err)
			}
			if got := slices.Contains(listedIDs(srv2), id); got != tc.want {
				t.Errorf("after the restart region %d listed: %v, want %v", id, got, tc.want)
			}
			for _, ri := range srv2.List(0) {
				r, err := srv2.st.get(0, ri.ID)
				if err == nil {
					err = r.readAt(make([]byte, 16), ri.Size-16)
				}
				if err != nil {
					t.Errorf("region %d listed after the restart but cannot be read: %v", ri.ID, err)
				}
			}
		})
	}
}

// TestOrphansRemovedAtStart: a crash between a free's metadata write and
// the removal of the backing file, or during a create (a long preload)
// while another create's metadata write moved next_id past it, leaves a
// backing file that no region owns and whose ID is never handed out again;
// a crash inside a metadata write leaves its temporary file. A start
// removes them, and keeps every listed region's file. Before, they stayed
// for good, their blocks (reserved by fallocate) out of the capacity's
// count, so creates that the capacity had room for failed on a full disk.
func TestOrphansRemovedAtStart(t *testing.T) {
	dir := t.TempDir()
	srv := newLimitedServer(t, dir, 0)
	var ids []uint32
	for range 3 {
		ri, err := srv.Create(7, 8192, true, "")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, ri.ID)
	}
	freed := regionFile(dir, ids[0])
	content, err := os.ReadFile(freed)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Free(7, ids[0]); err != nil {
		t.Fatal(err)
	}
	// The crashes' leftovers: the freed region's file (the free wrote the
	// metadata, not yet removed the file), a create's file below next_id,
	// and a metadata write's temporary file.
	created := regionFile(dir, ids[2]+7)
	srv.st.mu.Lock()
	srv.st.nextID = ids[2] + 8
	err = srv.st.saveMeta()
	srv.st.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, metaName+".tmp123456")
	for _, p := range []string{freed, created, tmp} {
		if err := os.WriteFile(p, content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	other := filepath.Join(dir, "notes.txt") // not the server's: kept
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	srv2, err := reopen(t, srv, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{freed, created, tmp} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after the start: %v, want it removed", filepath.Base(p), err)
		}
	}
	for _, p := range []string{regionFile(dir, ids[1]), regionFile(dir, ids[2]), other} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s after the start: %v, want it kept", filepath.Base(p), err)
		}
	}
	if got := listedIDs(srv2); !slices.Equal(got, ids[1:]) {
		t.Errorf("after the start the server lists %v, want %v", got, ids[1:])
	}
}

// TestCapacityLoweredAtRestart: a restart with a capacity below the bytes
// of the regions held loads them all, and refuses creates saying that
// nothing is free. Before, the refusal said 2^64 less the excess bytes
// were free.
func TestCapacityLoweredAtRestart(t *testing.T) {
	dir := t.TempDir()
	srv := newLimitedServer(t, dir, 0)
	for range 3 {
		if _, err := srv.Create(7, 8<<20, true, ""); err != nil {
			t.Fatal(err)
		}
	}
	srv.Close()
	srv.st.close()
	srv2, err := NewServer(ServerOptions{Config: testConfig(), StateDir: dir, Capacity: 16 << 20, Transport: listen(t, loopback)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv2.Close(); srv2.st.close() })
	if st := srv2.Stats(); st.Regions != 3 || st.Used != 24<<20 || st.Capacity != 16<<20 {
		t.Errorf("stats after the restart: %d regions, %d of %d bytes used; want 3, %d of %d", st.Regions, st.Used, st.Capacity, 24<<20, 16<<20)
	}
	_, err = srv2.Create(7, 4096, true, "")
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), fmt.Sprintf("4096 bytes asked, 0 of %d free", 16<<20)) {
		t.Errorf("create over a lowered capacity: %v, want ErrNoSpace saying 0 bytes are free", err)
	}
}

// TestFreeRacesIO: a read, write or sync that found its region before a
// free and reaches the backing file after it (lovelockd's API frees off
// the server's loop) is answered as the region being unknown, as it would
// be a moment later. Before, it was answered ErrIO ("file already
// closed"), counted as an I/O error of the node, and a DPU or mapping took
// it for a write-back to retry rather than a region gone.
func TestFreeRacesIO(t *testing.T) {
	for _, tc := range []struct {
		name string
		do   func(r *region) error
	}{
		{"read", func(r *region) error { return r.readAt(make([]byte, 16), 0) }},
		{"write", func(r *region) error { return r.writeAt(make([]byte, 16), 0) }},
		{"sync", func(r *region) error { return r.sync() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newLimitedServer(t, t.TempDir(), 0)
			t.Cleanup(func() { srv.Close(); srv.st.close() })
			ri, err := srv.Create(7, 4096, true, "")
			if err != nil {
				t.Fatal(err)
			}
			r, err := srv.st.get(7, ri.ID)
			if err != nil {
				t.Fatal(err)
			}
			if err := srv.Free(7, ri.ID); err != nil {
				t.Fatal(err)
			}
			if err := tc.do(r); !errors.Is(err, ErrUnknownRegion) || errors.Is(err, ErrIO) {
				t.Errorf("%s of a region freed since it was found: %v, want ErrUnknownRegion", tc.name, err)
			}
		})
	}
}

// TestPreloadFIFO: a preload from a named pipe is refused as not a regular
// file. Before, opening it waited for a writer for ever: the create never
// answered, its repeats waited on it, and Run, which waits for preloads,
// never returned.
func TestPreloadFIFO(t *testing.T) {
	srv := newLimitedServer(t, t.TempDir(), 0)
	t.Cleanup(func() { srv.Close(); srv.st.close() })
	fifo := filepath.Join(t.TempDir(), "pipe")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := srv.Create(7, 0, false, fifo)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("preload from a named pipe: %v, want ErrBadRequest, not a regular file", err)
		}
	case <-time.After(30 * time.Second): // a guard against the hang, not a timing
		// Open the pipe's other end, so that the create goes on and ends.
		if w, err := os.OpenFile(fifo, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
			w.Close()
		}
		<-done
		t.Fatal("preload from a named pipe: the create did not return")
	}
}

// TestMissingBackingFile: a start whose regions.json lists a region whose
// backing file is gone (removed by hand: no crash leaves that) refuses, as
// serving without it would lose the region's acknowledged writes silently,
// and says which file and what to do. Before, it said only that the open
// failed.
func TestMissingBackingFile(t *testing.T) {
	dir := t.TempDir()
	srv := newLimitedServer(t, dir, 0)
	ri, err := srv.Create(7, 4096, true, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(regionFile(dir, ri.ID)); err != nil {
		t.Fatal(err)
	}
	_, err = reopen(t, srv, dir)
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("start without region %d's backing file: %v, want it refused", ri.ID, err)
	}
	for _, want := range []string{regionFile(dir, ri.ID), metaName, "restore"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
}

// TestShortBackingFile: a start that finds a listed region's backing file
// shorter than the region refuses, naming the file and what to do, as for
// a missing one; before, it served the region, and every read of the
// missing tail failed with an I/O error for ever.
func TestShortBackingFile(t *testing.T) {
	dir := t.TempDir()
	srv := newLimitedServer(t, dir, 0)
	ri, err := srv.Create(7, 8192, true, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(regionFile(dir, ri.ID), 1000); err != nil {
		t.Fatal(err)
	}
	_, err = reopen(t, srv, dir)
	if err == nil {
		t.Fatalf("start with region %d's backing file cut to 1000 bytes of 8192 succeeded, want it refused", ri.ID)
	}
	for _, want := range []string{regionFile(dir, ri.ID), "1000 bytes", metaName, "restore"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
}

// TestCreateAfterStop: a create on a memory node whose Run returned (its
// backing files closed) is refused as unavailable and leaves no file;
// before, it made a region whose backing file nobody would close, listed
// in the metadata of a server that no longer serves it.
func TestCreateAfterStop(t *testing.T) {
	dir := t.TempDir()
	srv, r := startServer(t, dir, listen(t, loopback))
	r.stop()
	_, err := srv.Create(7, 4096, true, "")
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "stopped") {
		t.Fatalf("create after the server stopped: %v, want it refused as unavailable", err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "region-*")); len(m) != 0 {
		t.Errorf("backing files left: %v", m)
	}
}

// TestStatsSnapshot frees regions, all of one size, while Stats is read:
// every snapshot's used bytes are its regions' sizes. (Before, Stats read
// the used bytes and listed the regions under two locks: a free in between
// made them disagree.)
func TestStatsSnapshot(t *testing.T) {
	srv, _ := startServer(t, t.TempDir(), listen(t, loopback))
	const n, size = 200, 4096
	ids := make([]uint32, 0, n)
	for range n {
		ri, err := srv.Create(3, size, true, "")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, ri.ID)
	}
	freed := make(chan error, 1)
	go func() {
		for _, id := range ids {
			if err := srv.Free(0, id); err != nil {
				freed <- err
				return
			}
		}
		freed <- nil
	}()
	for snaps := 0; ; snaps++ {
		st := srv.Stats()
		if st.Used != uint64(st.Regions)*size {
			t.Fatalf("snapshot %d: %d bytes used with %d regions of %d bytes listed", snaps, st.Used, st.Regions, size)
		}
		if st.Regions == 0 {
			t.Logf("%d snapshots", snaps)
			break
		}
	}
	if err := <-freed; err != nil {
		t.Fatal(err)
	}
}
