package fmap

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// closingBackend is a region whose Close (the far-memory client's release
// of the writer lease) takes a round trip and may fail.
type closingBackend struct {
	*MemBackend
	closed  atomic.Bool
	failErr error
}

func (b *closingBackend) Close() error {
	time.Sleep(200 * time.Millisecond) // a release round trip to a slow DPU agent
	b.closed.Store(true)
	return b.failErr
}

// TestCloseReleasesBackend: a program's Close returns only after the agent
// has closed the mapping's backend (released the writer lease), so that a
// writable Map right after it is not refused as a second writer, and a
// release that fails is reported by Close. (Before, the agent answered
// Close first and closed the backend afterwards, its error unseen.)
func TestCloseReleasesBackend(t *testing.T) {
	a := startAgent(t)
	ok := &closingBackend{MemBackend: NewMemBackend(1 << 20)}
	bad := &closingBackend{MemBackend: NewMemBackend(1 << 20), failErr: errors.New("release lease: injected failure")}
	a.setAdvisors(map[uint64]Backend{1: ok, 2: bad})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	// The program maps without touching the bytes: no fault is served in
	// this process.
	m, err := Map(ctx, a.sock, RegionRef{ID: 1}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !ok.closed.Load() {
		t.Fatal("Close returned before the agent closed the backend (released the writer lease)")
	}

	m, err = Map(ctx, a.sock, RegionRef{ID: 2}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = m.Close()
	if err == nil || !strings.Contains(err.Error(), "injected failure") {
		t.Fatalf("Close with a failing release: %v, want the release's error", err)
	}
	if !bad.closed.Load() {
		t.Fatal("Close returned before the agent closed the backend")
	}
}

// TestAcceptErrors: an accept that fails for want of descriptors (EMFILE)
// is retried, so a program that connects meanwhile, and one that maps
// after, get their mappings while another mapping lives; an accept error
// no retry fixes (the listener closed under the agent) makes Serve close
// the listener, end the live mappings and return the error, for
// lovelockd's supervisor to report and restart. (Before, Serve stopped
// accepting on the first error and then waited for every live mapping to
// end: new programs hung in the backlog, and Serve did not return.)
func TestAcceptErrors(t *testing.T) {
	t.Run("temporary", func(t *testing.T) {
		a := startAgent(t)
		a.add(1, NewMemBackend(1<<20))
		a.add(2, NewMemBackend(1<<20))
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		m, err := Map(ctx, a.sock, RegionRef{ID: 1}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()

		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		var old unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
			t.Fatal(err)
		}
		// No descriptor above fd can be had: the agent's accept fails
		// with EMFILE, and the connection waits in the backlog.
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: uint64(fd + 1), Max: old.Max}); err != nil {
			t.Fatal(err)
		}
		defer unix.Setrlimit(unix.RLIMIT_NOFILE, &old) // should the test end early
		if err := unix.Connect(fd, &unix.SockaddrUnix{Name: a.sock}); err != nil {
			t.Fatal(err)
		}
		// The limit stays low until the agent has met it (not for a time
		// that a loaded machine may outlast).
		a.log.wait(t, "too many open files")
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
			t.Fatal(err)
		}

		mctx, mcancel := context.WithTimeout(ctx, 5*time.Second)
		defer mcancel()
		m2, err := Map(mctx, a.sock, RegionRef{ID: 2}, Options{})
		if err != nil {
			t.Fatalf("Map after a failed accept: %v", err)
		}
		if err := m2.Close(); err != nil {
			t.Fatal(err)
		}
		a.log.wait(t, "too many open files")
	})

	t.Run("fatal", func(t *testing.T) {
		testenv.RequirePriv(t)
		sock := filepath.Join(t.TempDir(), "agent.sock")
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		agent := &Agent{Logger: slog.New(slog.NewTextHandler(tbWriter{t, &logLines{}}, nil))}
		go func() {
			done <- agent.Serve(t.Context(), ln, func(context.Context, RegionRef) (Backend, error) { return NewMemBackend(1 << 20), nil })
		}()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		m, err := Map(ctx, sock, RegionRef{ID: 1}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		ln.Close() // Accept fails with net.ErrClosed: nothing to retry
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "accept") {
				t.Fatalf("Serve returned %v, want the accept error", err)
			}
			t.Logf("Serve: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("Serve did not return after a fatal accept error while a mapping lived")
		}
		// The agent ended the mapping: the program's Close cannot reach it.
		if err := m.Close(); err == nil {
			t.Fatal("Close of a mapping the agent ended succeeded")
		}
	})
}

const (
	stopSize  = 1 << 20
	stopChunk = 64 << 10
)

// TestAgentStopPoisons stops the host agent while a program maps a region
// with a clean chunk (0) and a dirty one (1) resident. The agent writes
// chunk 1 back, then poisons the whole mapping, so that the program's next
// touches raise SIGBUS at once instead of blocking forever on a fault
// nobody reads: a read of an absent chunk, a read and a write of the clean
// chunk (write-protected before), and a read of the dirty chunk; and a
// thread blocked in a fault whose fetch the agent was retrying (chunk 7)
// gets SIGBUS too. (Before, each of them blocked until the program was
// killed.)
func TestAgentStopPoisons(t *testing.T) {
	testenv.RequirePriv(t)
	if f, err := uffdFeatures(); err == nil && f&featurePoison == 0 {
		t.Fatalf("this kernel's userfaultfd lacks UFFD_FEATURE_POISON (features %#x): the test needs Linux 6.6 or later", f)
	}
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	be := &countingBackend{MemBackend: NewMemBackend(stopSize)}
	be.failReadAt.Store(1 + 7*stopChunk) // chunk 7's fetch fails, and is retried for good
	actx, stopAgent := context.WithCancel(t.Context())
	defer stopAgent()
	done := make(chan error, 1)
	logs := &logLines{}
	agent := &Agent{Logger: slog.New(slog.NewTextHandler(tbWriter{t, logs}, nil))}
	go func() {
		done <- agent.Serve(actx, ln, func(context.Context, RegionRef) (Backend, error) { return be, nil })
	}()

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=agentstop", "FMAP_SOCK="+sock)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	var out []string
	for lines.Scan() {
		out = append(out, lines.Text())
		if lines.Text() == "READY" {
			break
		}
	}

	stopAgent()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return 10 s after its context ended")
	}
	got := make([]byte, stopChunk)
	be.ReadAt(got, stopChunk)
	for i, v := range got {
		if v != 0xd1 {
			t.Fatalf("byte %d of dirty chunk 1 is %#x in the backend after the agent stopped, want 0xd1", stopChunk+i, v)
		}
	}

	io.WriteString(stdin, "go\n")
	for lines.Scan() {
		out = append(out, lines.Text())
	}
	err = cmd.Wait()
	all := strings.Join(out, "\n")
	t.Log(all)
	if err != nil {
		t.Fatalf("program: %v (a touch blocked until the program was killed?)", err)
	}
	for _, w := range []string{"BLOCKED sigbus", "ABSENT sigbus", "CLEAN sigbus", "CLEANWRITE sigbus", "DIRTY sigbus"} {
		if !strings.Contains(all, w) {
			t.Errorf("program printed no %q", w)
		}
	}
}

// helperAgentStop maps region 1, reads chunk 0 and writes chunk 1, says
// READY, and once told (the agent has stopped meanwhile) touches the
// mapping, printing for each touch whether it raised SIGBUS, and how long
// it took.
func helperAgentStop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := Map(ctx, os.Getenv("FMAP_SOCK"), RegionRef{ID: 1},
		Options{ChunkSize: stopChunk, BufferBytes: stopSize, FetchTimeout: -1})
	if err != nil {
		return err
	}
	b := m.Bytes()
	fmt.Println("CHUNK0", b[100]) // chunk 0: resident, clean, write-protected
	for i := stopChunk; i < 2*stopChunk; i++ {
		b[i] = 0xd1 // chunk 1: resident, dirty
	}
	base := uintptr(unsafe.Pointer(&b[0]))
	blocked := make(chan string, 1)
	go func() {
		_, fault, ok := testenv.ReadByte(b, 7*stopChunk+3)
		switch {
		case ok:
			blocked <- "BLOCKED read"
		case fault != base+7*stopChunk+3:
			blocked <- fmt.Sprintf("BLOCKED SIGBUS at offset %d, want %d", fault-base, 7*stopChunk+3)
		default:
			blocked <- "BLOCKED sigbus"
		}
	}()
	time.Sleep(200 * time.Millisecond) // the goroutine's fault is being retried
	fmt.Println("READY")
	bufio.NewReader(os.Stdin).ReadString('\n')
	select {
	case s := <-blocked:
		fmt.Println(s)
	case <-time.After(5 * time.Second):
		return fmt.Errorf("the fault blocked when the agent stopped is still blocked 5 s later")
	}
	for _, tc := range []struct {
		name  string
		i     int
		write bool
	}{
		{"ABSENT", 5*stopChunk + 7, false},
		{"CLEAN", 200, false},
		{"CLEANWRITE", 300, true},
		{"DIRTY", stopChunk + 9, false},
	} {
		start := time.Now()
		var fault uintptr
		var ok bool
		if tc.write {
			fault, ok = testenv.WriteByte(b, tc.i, 1)
		} else {
			_, fault, ok = testenv.ReadByte(b, tc.i)
		}
		if ok {
			fmt.Printf("%s read or wrote\n", tc.name)
			continue
		}
		if fault != base+uintptr(tc.i) {
			return fmt.Errorf("%s: SIGBUS at offset %d, want %d", tc.name, fault-base, tc.i)
		}
		if d := time.Since(start); d > 5*time.Second {
			return fmt.Errorf("%s: SIGBUS after %v", tc.name, d)
		}
		fmt.Printf("%s sigbus after %v\n", tc.name, time.Since(start).Round(time.Microsecond))
	}
	fmt.Printf("CLOSE %v\n", m.Close()) // the agent is gone: an error
	return nil
}

// TestMapOptions maps with options a program may send, right or wrong: a
// wrong one fails that Map with an error that names it, and the agent, one
// per node, goes on serving the next Map. (Before, a chunk size of 2^50
// passed, and the agent's fetchers crashed it allocating their buffers; a
// buffer of math.MaxInt64 bytes overflowed its rounding to chunks and got
// two.)
func TestMapOptions(t *testing.T) {
	a := startAgent(t)
	const size = 1 << 20
	a.add(1, NewMemBackend(size))
	cases := []struct {
		name    string
		o       Options
		wantErr string // "" for success
		cap     int    // the buffer's chunks, on success
	}{
		{name: "defaults", o: Options{}, cap: 6},
		{name: "chunk of 2^50 bytes", o: Options{ChunkSize: 1 << 50}, wantErr: "chunk size"},
		{name: "chunk above the largest", o: Options{ChunkSize: 2 * maxChunkSize}, wantErr: "chunk size"},
		{name: "largest chunk, larger than the region", o: Options{ChunkSize: maxChunkSize}, cap: 1},
		{name: "buffer of every byte there is", o: Options{BufferBytes: math.MaxInt64}, cap: 16},
		// Refused before it is sent, naming the field and its range
		// (before: "json: unsupported value: NaN").
		{name: "load factor NaN", o: Options{LoadFactor: math.NaN()}, wantErr: "Options.LoadFactor NaN: want a value in (0, 1]"},
		{name: "load factor 2", o: Options{LoadFactor: 2}, wantErr: "Options.LoadFactor 2: want a value in (0, 1]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			// The mapping's bytes are not touched: no fault is served in
			// this process.
			m, err := Map(ctx, a.sock, RegionRef{ID: 1}, tc.o)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					if err == nil {
						m.Close()
					}
					t.Fatalf("Map with %+v: %v, want an error about the %s", tc.o, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Map with %+v: %v", tc.o, err)
			}
			defer m.Close()
			st, err := m.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Capacity != tc.cap {
				t.Errorf("Map with %+v: a buffer of %d chunks, want %d", tc.o, st.Capacity, tc.cap)
			}
		})
	}
}
