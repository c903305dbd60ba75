package fmap

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/control/testenv"
)

const syncErrSize = 1 << 20

// TestSyncReportsWriteBackErrors makes the backend fail writes while a
// program has dirty chunks: its Sync must fail (and the chunks stay dirty),
// and once the backend works again a second Sync must write everything.
func TestSyncReportsWriteBackErrors(t *testing.T) {
	a := startAgent(t)
	be := a.add(1, NewMemBackend(syncErrSize))
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=syncerr", "FMAP_SOCK="+a.sock)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	expect := func(prefix string) string {
		t.Helper()
		for lines.Scan() {
			if strings.HasPrefix(lines.Text(), prefix) {
				return lines.Text()
			}
		}
		cmd.Wait()
		t.Fatalf("program ended before printing %s", prefix)
		return ""
	}

	expect("WRITTEN")
	be.failWrites.Store(true)
	io.WriteString(stdin, "go\n")
	l := expect("SYNC1")
	t.Log(l)
	if !strings.Contains(l, "injected write error") {
		t.Fatalf("Sync with a failing backend: %q, want the injected error", l)
	}
	be.failWrites.Store(false)
	io.WriteString(stdin, "go\n")
	t.Log(expect("SYNC2"))
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("program: %v", err)
	}
	got := make([]byte, syncErrSize)
	be.ReadAt(got, 0)
	for i, v := range got {
		if v != byte(i%251) {
			t.Fatalf("byte %d is %d after the second Sync, want %d", i, v, byte(i%251))
		}
	}
}

func helperSyncErr() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The whole region fits the buffer: nothing is evicted, so only Sync
	// writes back.
	m, err := Map(ctx, os.Getenv("FMAP_SOCK"), RegionRef{ID: 1}, Options{BufferBytes: syncErrSize})
	if err != nil {
		return err
	}
	b := m.Bytes()
	for i := range b {
		b[i] = byte(i % 251)
	}
	in := bufio.NewReader(os.Stdin)
	fmt.Println("WRITTEN")
	in.ReadString('\n')
	err = m.Sync(ctx)
	fmt.Printf("SYNC1 %v\n", err)
	if err == nil {
		return fmt.Errorf("Sync succeeded against a failing backend")
	}
	in.ReadString('\n')
	if err := m.Sync(ctx); err != nil {
		return fmt.Errorf("second Sync: %w", err)
	}
	fmt.Println("SYNC2 ok")
	return m.Close()
}

// slowSyncBackend takes syncDelay over its first Sync and fails every write
// from then on.
type slowSyncBackend struct {
	*MemBackend
	syncs atomic.Int32
}

const syncDelay = 300 * time.Millisecond

func (s *slowSyncBackend) Sync() error {
	if s.syncs.Add(1) == 1 {
		time.Sleep(syncDelay)
	}
	return nil
}

func (s *slowSyncBackend) WriteAt(p []byte, off int64) (int, error) {
	if s.syncs.Load() > 0 {
		return 0, fmt.Errorf("injected write error at %d", off)
	}
	return s.MemBackend.WriteAt(p, off)
}

// TestCloseAfterCancelledSync cancels a Sync while the agent is still in
// it, writes again, and closes: Close must get its own reply (the failed
// write-back), not the late reply of the cancelled Sync.
func TestCloseAfterCancelledSync(t *testing.T) {
	a := startAgent(t)
	a.setAdvisors(map[uint64]Backend{1: &slowSyncBackend{MemBackend: NewMemBackend(syncErrSize)}})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	out := runHelper(t, ctx, "cancelsync", "FMAP_SOCK="+a.sock)
	t.Log(out)
	if !strings.Contains(out, "CLOSE") || !strings.Contains(out, "injected write error") {
		t.Fatalf("Close after a cancelled Sync did not report the failed write-back:\n%s", out)
	}
}

func helperCancelSync() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := Map(ctx, os.Getenv("FMAP_SOCK"), RegionRef{ID: 1}, Options{BufferBytes: syncErrSize})
	if err != nil {
		return err
	}
	b := m.Bytes()
	b[0] = 1
	sctx, scancel := context.WithTimeout(ctx, syncDelay/6)
	err = m.Sync(sctx)
	scancel()
	fmt.Printf("SYNC %v\n", err)
	if err == nil {
		return fmt.Errorf("Sync returned before the backend's %v Sync", syncDelay)
	}
	b[0] = 2 // dirty again; its write-back fails
	err = m.Close()
	fmt.Printf("CLOSE %v\n", err)
	if err == nil {
		return fmt.Errorf("Close succeeded although the backend fails every write")
	}
	return nil
}

// TestCloseAfterTornReply cancels a Sync after part of its reply was read
// (a stand-in agent sends half a frame header): the connection is torn, so
// Close must not read it, must let the agent see the connection end (its
// cue to write back), wait for the agent to close it, and say that the
// write-back is unconfirmed.
func TestCloseAfterTornReply(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]*net.UnixConn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c.(*net.UnixConn)
	}
	prog, agent := conns[0], conns[1]
	agentSaw := make(chan error, 1)
	go func() {
		defer agent.Close()
		if _, _, err := readFrame(agent); err != nil {
			agentSaw <- err
			return
		}
		agent.Write([]byte{0, 0}) // half a reply header
		_, _, err := readFrame(agent)
		agentSaw <- err
	}()
	m := &Mapping{region: RegionRef{ID: 9}, conn: prog, uffd: -1, memfd: -1}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := m.Sync(ctx); err == nil {
		t.Fatal("Sync succeeded on half a reply")
	}
	err = m.Close()
	t.Log(err)
	if err == nil || !strings.Contains(err.Error(), "write-back unconfirmed") {
		t.Fatalf("Close after a torn reply: %v, want write-back unconfirmed", err)
	}
	if err := <-agentSaw; !errors.Is(err, io.EOF) {
		t.Errorf("the agent read %v after the torn reply, want the connection's end (EOF)", err)
	}
}

// TestCleanInstallOverPresentPage installs a chunk clean over a page that
// is already there, writable (the program puts it in the memfd itself,
// standing in for a writable install that failed part way, which left
// pages behind in a chunk recorded absent). A write to that page must
// still mark the chunk dirty, so that Sync writes it back.
func TestCleanInstallOverPresentPage(t *testing.T) {
	checkEExistWriteBack(t, "eexist", "the write to a page kept by a clean install")
}

// checkEExistWriteBack runs helper role (eexist or eexist-written) against
// a fresh agent and fails unless the byte at eexistAt reached the backend
// by the program's Sync; what names the write in the failure.
func checkEExistWriteBack(t *testing.T, role, what string) {
	t.Helper()
	a := startAgent(t)
	be := a.add(1, NewMemBackend(syncErrSize))
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	out := runHelper(t, ctx, role, "FMAP_SOCK="+a.sock)
	t.Log(out)
	got := make([]byte, 1)
	be.ReadAt(got, eexistAt)
	if got[0] != 0x55 {
		t.Fatalf("backend byte %d is %#x after Sync, want 0x55: %s was not written back", eexistAt, got[0], what)
	}
}

// TestCleanInstallOverWrittenPage: a page left behind in a chunk recorded
// absent (by a writable install that failed part way) may hold a write the
// agent never saw: a clean install that keeps it must still count the
// chunk dirty, so that Sync writes the page back instead of the chunk
// being dropped clean with the write. (Before, the chunk was installed
// clean: the page put in the memfd by the program, standing in for the
// write, never reached the backend.)
func TestCleanInstallOverWrittenPage(t *testing.T) {
	checkEExistWriteBack(t, "eexist-written", "a write in a page kept by a clean install")
}

func helperEExistWritten() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := Map(ctx, os.Getenv("FMAP_SOCK"), RegionRef{ID: 1}, Options{BufferBytes: syncErrSize})
	if err != nil {
		return err
	}
	page := make([]byte, 4096)
	page[eexistAt-DefaultChunkSize-4096] = 0x55
	if _, err := unix.Pwrite(m.memfd, page, DefaultChunkSize+4096); err != nil {
		return fmt.Errorf("put a written page in the memfd: %w", err)
	}
	readSink = m.Bytes()[DefaultChunkSize] // a read fault on page 0: chunk 1 installed clean around page 1
	if err := m.Sync(ctx); err != nil {
		return err
	}
	st, err := m.Stats(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("STATS %+v\n", st)
	return m.Close()
}

// readSink keeps the compiler from dropping a read made to fault.
var readSink byte

// eexistAt is the byte the eexist program writes: page 1 of chunk 1.
const eexistAt = DefaultChunkSize + 4096 + 7

func helperEExist() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := Map(ctx, os.Getenv("FMAP_SOCK"), RegionRef{ID: 1}, Options{BufferBytes: syncErrSize})
	if err != nil {
		return err
	}
	page := make([]byte, 4096)
	if _, err := unix.Pwrite(m.memfd, page, DefaultChunkSize+4096); err != nil {
		return fmt.Errorf("put a page in the memfd: %w", err)
	}
	b := m.Bytes()
	readSink = b[DefaultChunkSize] // a read fault on page 0: chunk 1 installed clean around page 1
	b[eexistAt] = 0x55
	if err := m.Sync(ctx); err != nil {
		return err
	}
	st, err := m.Stats(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("STATS %+v\n", st)
	return m.Close()
}

// TestEvictionCountsWithFailingWrites: with every write-back failing,
// evictions of dirty chunks fail and the faults are served over capacity;
// only the evictions that happened count as inline or background ones.
func TestEvictionCountsWithFailingWrites(t *testing.T) {
	a := startAgent(t)
	be := a.add(1, NewMemBackend(syncErrSize))
	be.failWrites.Store(true)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	t.Log(runHelper(t, ctx, "evictfail", "FMAP_SOCK="+a.sock))
}

// mapTwoChunks maps region 1 of the agent at FMAP_SOCK with a buffer of
// two chunks, so that writing a few chunks evicts.
func mapTwoChunks(ctx context.Context) (*Mapping, error) {
	return Map(ctx, os.Getenv("FMAP_SOCK"), RegionRef{ID: 1}, Options{BufferBytes: 2 * DefaultChunkSize})
}

// evictionsAddUp checks that only the evictions that happened count as
// inline or background ones.
func evictionsAddUp(st Stats) error {
	if st.Inline+st.Background != st.Evictions {
		return fmt.Errorf("%d inline + %d background evictions, but %d evictions", st.Inline, st.Background, st.Evictions)
	}
	return nil
}

func helperEvictFail() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const chunks = syncErrSize / DefaultChunkSize
	m, err := mapTwoChunks(ctx)
	if err != nil {
		return err
	}
	b := m.Bytes()
	// Dirty chunks first, whose evictions fail, then clean ones, whose
	// evictions work.
	for c := range chunks / 2 {
		b[c*DefaultChunkSize] = 1
	}
	for c := chunks / 2; c < chunks; c++ {
		readSink = b[c*DefaultChunkSize]
	}
	serr := m.Sync(ctx)
	st, err := m.Stats(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("STATS %+v\nSYNC %v\n", st, serr)
	if serr == nil || st.Evictions == 0 {
		return fmt.Errorf("want failed write-backs (Sync: %v) and some evictions (%d)", serr, st.Evictions)
	}
	if err := evictionsAddUp(st); err != nil {
		return err
	}
	m.Close() // fails: the backend takes no writes
	return nil
}

// TestWritesLostPoison: write-backs that can never land (ErrLost: the
// region was freed, or another writer got it after this one's lease
// lapsed) poison their chunks instead of keeping them dirty in the buffer
// for good: the program goes on within its buffer, a touch of such a chunk
// raises SIGBUS, and Sync and Close report the lost writes. Before, every
// such chunk stayed resident and dirty, the buffer filled past its
// capacity, and the chunks went on serving writes that were never kept.
func TestWritesLostPoison(t *testing.T) {
	a := startAgent(t)
	be := a.add(1, NewMemBackend(syncErrSize))
	be.writesLost.Store(true)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	t.Log(runHelper(t, ctx, "writeslost", "FMAP_SOCK="+a.sock))
	if n := be.writes.Load(); n != 0 {
		t.Errorf("%d writes reached the backend, want none", n)
	}
}

func helperWritesLost() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const chunks = syncErrSize / DefaultChunkSize
	m, err := mapTwoChunks(ctx)
	if err != nil {
		return err
	}
	b := m.Bytes()
	for c := range chunks {
		if _, ok := testenv.WriteByte(b, c*DefaultChunkSize, 1); !ok {
			return fmt.Errorf("chunk %d: SIGBUS on its first write", c)
		}
	}
	st, err := m.Stats(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("STATS %+v\n", st)
	if err := evictionsAddUp(st); err != nil {
		return err
	}
	if st.Poisoned < chunks-2 || st.Resident > st.Capacity {
		return fmt.Errorf("%d of %d chunks poisoned, %d resident of %d: want the chunks evicted poisoned and the buffer within its capacity",
			st.Poisoned, chunks, st.Resident, st.Capacity)
	}
	if _, _, ok := testenv.ReadByte(b, 0); ok {
		return errors.New("chunk 0, whose write-back was lost: read without SIGBUS")
	}
	serr := m.Sync(ctx)
	fmt.Printf("SYNC %v\n", serr)
	if serr == nil || !strings.Contains(serr.Error(), "can never be written back") {
		return fmt.Errorf("Sync: %v, want the lost writes reported", serr)
	}
	if cerr := m.Close(); cerr == nil {
		return errors.New("Close: nil, want the lost writes reported")
	}
	return nil
}

// noPoisonFeatures are this kernel's userfaultfd features without
// UFFD_FEATURE_POISON: an agent given them acts as on Linux 5.19–6.5,
// where UFFDIO_POISON fails with EINVAL.
func noPoisonFeatures() (uint64, error) {
	f, err := uffdFeatures()
	return f &^ featurePoison, err
}

// TestWritesLostNoPoison: as TestWritesLostPoison, on a kernel that cannot
// poison. A chunk whose write-back can never land then stays resident and
// dirty, its bytes readable, and Sync reports the lost write-back. Before,
// its eviction punched it out of the memfd, failed to poison it and kept
// it resident: the program's next touch of it faulted, was woken as
// spurious and faulted again, for ever.
func TestWritesLostNoPoison(t *testing.T) {
	a := startAgentOf(t, &Agent{features: noPoisonFeatures})
	be := a.add(1, NewMemBackend(syncErrSize))
	be.writesLost.Store(true)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	t.Log(runHelper(t, ctx, "writeslost-nopoison", "FMAP_SOCK="+a.sock))
	if n := be.writes.Load(); n != 0 {
		t.Errorf("%d writes reached the backend, want none", n)
	}
}

func helperWritesLostNoPoison() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := mapTwoChunks(ctx)
	if err != nil {
		return err
	}
	b := m.Bytes()
	const at, v = 7, 0x5a
	if _, ok := testenv.WriteByte(b, at, v); !ok {
		return errors.New("chunk 0: SIGBUS on its first write")
	}
	// Three more chunks through the two-chunk buffer: by the third one's
	// fault chunk 0 was chosen for eviction (by the cleaner or the fault),
	// and its write-back failed lost.
	for c := 1; c <= 3; c++ {
		if _, _, ok := testenv.ReadByte(b, c*DefaultChunkSize); !ok {
			return fmt.Errorf("chunk %d: SIGBUS on its first read", c)
		}
	}
	got, ok, err := readWithin(ctx, m, at)
	if err != nil {
		return fmt.Errorf("chunk 0, whose write-back was lost: %w", err)
	}
	if !ok || got != v {
		return fmt.Errorf("chunk 0, whose write-back was lost: byte %d reads %#x (SIGBUS: %v), want %#x", at, got, !ok, v)
	}
	st, err := m.Stats(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("STATS %+v\n", st)
	if st.Poisoned != 0 {
		return fmt.Errorf("%d chunks poisoned on a kernel that cannot poison", st.Poisoned)
	}
	serr := m.Sync(ctx)
	fmt.Printf("SYNC %v\n", serr)
	if serr == nil || !strings.Contains(serr.Error(), "write back chunk 0") || !strings.Contains(serr.Error(), "can never be written back") {
		return fmt.Errorf("Sync: %v, want chunk 0's lost write-back reported", serr)
	}
	cerr := m.Close()
	fmt.Printf("CLOSE %v\n", cerr)
	if cerr == nil {
		return errors.New("Close: nil, want the lost writes reported")
	}
	return nil
}

// readWithin reads byte at of m's bytes, as ReadByte does (ok false: it
// raised SIGBUS), and fails if the read still waits after 10 s, a bound
// no served fault comes near: the fault is never served.
func readWithin(ctx context.Context, m *Mapping, at int) (byte, bool, error) {
	type read struct {
		v  byte
		ok bool
	}
	got := make(chan read, 1)
	go func() {
		v, _, ok := testenv.ReadByte(m.Bytes(), at)
		got <- read{v, ok}
	}()
	select {
	case r := <-got:
		return r.v, r.ok, nil
	case <-time.After(10 * time.Second):
		sctx, scancel := context.WithTimeout(ctx, time.Second)
		defer scancel()
		st, err := m.Stats(sctx)
		return 0, false, fmt.Errorf("byte %d: its read still waits after 10 s (stats %+v, %v)", at, st, err)
	}
}
