package fmap

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// The tests run the host agent in the test process and each program in a
// child process: the test binary re-executed with FMAP_HELPER naming what
// the child does (TestMain runs it instead of the tests). That way the faults are served
// by another process, as in production.
const helperEnv = "FMAP_HELPER"

// countingBackend counts the backend traffic so tests can tell that chunks
// were really evicted and fetched again.
type countingBackend struct {
	*MemBackend
	reads, writes atomic.Int64
	failWrites    atomic.Bool  // inject write errors
	failReadAt    atomic.Int64 // 1 + an offset whose reads fail; 0 for none
	failReadSkip  atomic.Int64 // reads of that offset that still succeed first
	failLost      atomic.Bool  // those reads fail with ErrLost
	readsFailed   atomic.Int64 // reads failed so, each a failed attempt to serve a fault
	writesLost    atomic.Bool  // every write fails with ErrLost
	// writeGate, when set, holds every write until the channel closes.
	writeGate atomic.Pointer[chan struct{}]
}

func (c *countingBackend) ReadAt(p []byte, off int64) (int, error) {
	c.reads.Add(1)
	if bad := c.failReadAt.Load() - 1; bad >= off && bad < off+int64(len(p)) && c.failReadSkip.Add(-1) < 0 {
		c.readsFailed.Add(1)
		if c.failLost.Load() {
			return 0, fmt.Errorf("injected read error at %d: region freed: %w", bad, ErrLost)
		}
		return 0, fmt.Errorf("injected read error at %d", bad)
	}
	return c.MemBackend.ReadAt(p, off)
}

func (c *countingBackend) WriteAt(p []byte, off int64) (int, error) {
	if g := c.writeGate.Load(); g != nil {
		<-*g
	}
	if c.failWrites.Load() {
		return 0, fmt.Errorf("injected write error at %d", off)
	}
	if c.writesLost.Load() {
		return 0, fmt.Errorf("injected write error at %d: another writer holds the region: %w", off, ErrLost)
	}
	c.writes.Add(1)
	return c.MemBackend.WriteAt(p, off)
}

// testAgent is an agent serving regions from a table of backends.
type testAgent struct {
	sock string
	mu   sync.Mutex
	regs map[uint64]*countingBackend
	// advisors are served before regs (set with setAdvisors).
	advisors map[uint64]Backend
	log      *logLines // the agent's log lines
}

func startAgent(t testing.TB) *testAgent {
	t.Helper()
	return startAgentOf(t, &Agent{})
}

// startAgentOf starts agent, whose Logger it sets, as startAgent does.
func startAgentOf(t testing.TB, agent *Agent) *testAgent {
	t.Helper()
	testenv.RequirePriv(t)
	a := &testAgent{sock: filepath.Join(t.TempDir(), "agent.sock"), regs: map[uint64]*countingBackend{}, log: &logLines{}}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: a.sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	agent.Logger = slog.New(slog.NewTextHandler(tbWriter{t, a.log}, nil))
	go func() { done <- agent.Serve(ctx, ln, a.open) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return a
}

// tbWriter sends the agent's log lines to the test's log and keeps them.
type tbWriter struct {
	tb    testing.TB
	lines *logLines
}

func (w tbWriter) Write(p []byte) (int, error) {
	l := strings.TrimSuffix(string(p), "\n")
	w.tb.Log(l)
	w.lines.mu.Lock()
	w.lines.l = append(w.lines.l, l)
	w.lines.watch = slices.DeleteFunc(w.lines.watch, func(lw lineWatch) bool {
		if strings.Contains(l, lw.s) {
			close(lw.ch)
			return true
		}
		return false
	})
	w.lines.mu.Unlock()
	return len(p), nil
}

// logLines are the agent's log lines so far.
type logLines struct {
	mu    sync.Mutex
	l     []string
	watch []lineWatch
}

// lineWatch is a channel closed when a line containing s is logged.
type lineWatch struct {
	s  string
	ch chan struct{}
}

// logged returns a channel closed once a line containing s is logged (at
// once if one has been).
func (ll *logLines) logged(s string) <-chan struct{} {
	ll.mu.Lock()
	defer ll.mu.Unlock()
	ch := make(chan struct{})
	for _, l := range ll.l {
		if strings.Contains(l, s) {
			close(ch)
			return ch
		}
	}
	ll.watch = append(ll.watch, lineWatch{s, ch})
	return ch
}

// wait waits until a line containing s is logged and returns every line
// logged by then.
func (ll *logLines) wait(t testing.TB, s string) []string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ll.mu.Lock()
		lines := slices.Clone(ll.l)
		ll.mu.Unlock()
		for _, l := range lines {
			if strings.Contains(l, s) {
				return lines
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent logged no %q in 30 s", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (a *testAgent) add(id uint64, be *MemBackend) *countingBackend {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := &countingBackend{MemBackend: be}
	a.regs[id] = c
	return c
}

// setAdvisors sets the backends served before regs. It takes mu, as open
// does: a Map reaches open through a socket, which the race detector does
// not see as ordering the two.
func (a *testAgent) setAdvisors(m map[uint64]Backend) {
	a.mu.Lock()
	a.advisors = m
	a.mu.Unlock()
}

func (a *testAgent) open(_ context.Context, r RegionRef) (Backend, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if be, ok := a.advisors[r.ID]; ok {
		return be, nil
	}
	be, ok := a.regs[r.ID]
	if !ok {
		return nil, fmt.Errorf("no region %d", r.ID)
	}
	return be, nil
}

// runHelper runs the test binary as a program of role with env, and fails
// t with its output if it fails.
func runHelper(t testing.TB, ctx context.Context, role string, env ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.count=1", "-test.v")
	cmd.Env = append(append(os.Environ(), helperEnv+"="+role), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("program %s: %v (context: %v)\n%s", role, err, ctx.Err(), out)
	}
	return string(out)
}

// TestMain runs the program side of the tests instead of the tests when
// started by runHelper.
func TestMain(m *testing.M) {
	if role := os.Getenv(helperEnv); role != "" {
		if err := helperProcess(role); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// helperProcess runs the program side named by role.
func helperProcess(role string) error {
	var err error
	switch role {
	case "write", "write-noclose", "verify":
		err = helperData(role)
	case "storm":
		err = helperStorm()
	case "race":
		err = helperRace()
	case "syncerr":
		err = helperSyncErr()
	case "touch":
		err = helperTouch()
	case "fetchfail":
		err = helperFetchFail()
	case "readahead":
		err = helperReadAhead()
	case "cancelsync":
		err = helperCancelSync()
	case "evictfail":
		err = helperEvictFail()
	case "writeslost":
		err = helperWritesLost()
	case "writeslost-nopoison":
		err = helperWritesLostNoPoison()
	case "lost-after-eviction":
		err = helperLostAfterEviction()
	case "eexist":
		err = helperEExist()
	case "eexist-written":
		err = helperEExistWritten()
	case "exit-dirty":
		err = helperExitDirty()
	case "agentstop":
		err = helperAgentStop()
	case "dropped":
		err = helperDropped()
	case "ended-write":
		err = helperEndedWrite()
	case "ended-read":
		err = helperEndedRead()
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	return err
}

func envInt(name string) int64 {
	v, err := strconv.ParseInt(os.Getenv(name), 0, 64)
	if err != nil {
		panic(fmt.Sprintf("%s=%q: %v", name, os.Getenv(name), err))
	}
	return v
}

// dataCase describes an exact-data run; the agent and the programs derive
// the same initial contents and writes from it.
type dataCase struct {
	size   int64
	chunk  int
	buffer int64
	writes int
	seed   uint64
}

func (d dataCase) env() []string {
	return []string{
		"FMAP_SOCK_SIZE=" + strconv.FormatInt(d.size, 10),
		"FMAP_CHUNK=" + strconv.Itoa(d.chunk),
		"FMAP_BUFFER=" + strconv.FormatInt(d.buffer, 10),
		"FMAP_WRITES=" + strconv.Itoa(d.writes),
		"FMAP_SEED=" + strconv.FormatUint(d.seed, 10),
	}
}

func dataCaseFromEnv() dataCase {
	return dataCase{
		size:   envInt("FMAP_SOCK_SIZE"),
		chunk:  int(envInt("FMAP_CHUNK")),
		buffer: envInt("FMAP_BUFFER"),
		writes: int(envInt("FMAP_WRITES")),
		seed:   uint64(envInt("FMAP_SEED")),
	}
}

// initial is the region's contents before any program writes.
func (d dataCase) initial() []byte {
	b := make([]byte, d.size)
	var seed [32]byte
	seed[0] = byte(d.seed)
	rand.NewChaCha8(seed).Read(b)
	return b
}

// apply performs the case's random writes on b, in order.
func (d dataCase) apply(b []byte) {
	rng := rand.New(rand.NewPCG(d.seed, 0xfa11))
	for range d.writes {
		n := 1 + rng.IntN(3*d.chunk/2) // some writes straddle chunks
		off := rng.Int64N(d.size - int64(n) + 1)
		v := byte(rng.Uint32())
		for i := range n {
			b[off+int64(i)] = v + byte(i)
		}
	}
}

func (d dataCase) expected() []byte {
	b := d.initial()
	d.apply(b)
	return b
}

func firstDiff(a, b []byte) error {
	if len(a) != len(b) {
		return fmt.Errorf("length %d, want %d", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			return fmt.Errorf("byte %d (chunk offset %d) is %#x, want %#x", i, i%DefaultChunkSize, a[i], b[i])
		}
	}
	return nil
}

func helperData(role string) error {
	d := dataCaseFromEnv()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id := uint64(1)
	if v := os.Getenv("FMAP_REGION"); v != "" {
		id = uint64(envInt("FMAP_REGION"))
	}
	m, err := Map(ctx, os.Getenv("FMAP_SOCK"), RegionRef{ID: id, Name: "data"},
		Options{ChunkSize: d.chunk, BufferBytes: d.buffer})
	if err != nil {
		return err
	}
	b := m.Bytes()
	if int64(len(b)) != d.size {
		return fmt.Errorf("mapping has %d bytes, want %d", len(b), d.size)
	}
	want := d.expected()
	if role != "verify" {
		d.apply(b)
	}
	// Reading everything back through a buffer of 1/8 of the region means
	// most chunks were evicted and are fetched again here.
	if err := firstDiff(b, want); err != nil {
		return fmt.Errorf("%s: read back through the mapping: %w", role, err)
	}
	st, err := m.Stats(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("STATS %+v\n", st)
	if st.Resident > st.Capacity {
		return fmt.Errorf("%d chunks resident in a buffer of %d", st.Resident, st.Capacity)
	}
	if role != "verify" && (st.Evictions == 0 || st.Writebacks == 0 || st.Background == 0) {
		return fmt.Errorf("stats %+v: want evictions, write-backs and background evictions", st)
	}
	if role == "write-noclose" {
		return nil // exit with the mapping open: the agent must write back on its own
	}
	return m.Close()
}
