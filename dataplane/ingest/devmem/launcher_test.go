package devmem

import (
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
)

// startExecutor serves an executor on a socket in a temporary directory
// until the test ends (or stop is called).
func startExecutor(t *testing.T) (sock string, stop func()) {
	t.Helper()
	sock = filepath.Join(t.TempDir(), "exec.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var models []*model.Model
	for _, name := range model.BuiltinNames() {
		m, _ := model.Builtin(name)
		models = append(models, m)
	}
	done := make(chan error, 1)
	go func() { done <- ServeExecutor(ctx, ln, models) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(stop)
	return sock, stop
}

// collector gathers a launcher's completions by tag and fails the test on
// a tag reported twice.
type collector struct {
	t    *testing.T
	mu   sync.Mutex
	got  map[uint64]Completion
	all  chan struct{}
	want int
}

func newCollector(t *testing.T, want int) *collector {
	return &collector{t: t, got: map[uint64]Completion{}, all: make(chan struct{}), want: want}
}

func (c *collector) done(cs []Completion) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, x := range cs {
		if _, dup := c.got[x.Tag]; dup {
			c.t.Errorf("run %d completed twice", x.Tag)
		}
		c.got[x.Tag] = x
		if len(c.got) == c.want {
			close(c.all)
		}
	}
}

func (c *collector) wait() {
	c.t.Helper()
	select {
	case <-c.all:
	case <-time.After(10 * time.Second):
		c.mu.Lock()
		defer c.mu.Unlock()
		c.t.Fatalf("%d of %d runs completed", len(c.got), c.want)
	}
}

// TestLauncher: runs launched without waiting, from several goroutines and
// in batches, each complete once with the output Run would give, on an
// executor and in process; bad arguments fail at once; a closed launcher
// refuses.
func TestLauncher(t *testing.T) {
	sock, _ := startExecutor(t)
	ck, _ := model.Builtin("checksum")
	mlp, _ := model.Builtin("mlp")
	for name, d := range map[string]*Shm{"in process": NewShm(Info{}), "executor": NewShmWith(Info{}, ShmOptions{Executor: sock})} {
		t.Run(name, func(t *testing.T) {
			defer d.Close()
			const slots, rounds = 8, 40
			col := newCollector(t, slots*rounds+1)
			l := NewLauncher(d, col.done)
			inputs := map[uint64][]byte{}
			outs := map[uint64]Buffer{}
			var wg sync.WaitGroup
			for s := range slots {
				in, _ := d.Alloc(4096)
				out, _ := d.Alloc(64)
				var batch []Launch
				for r := range rounds {
					batch = append(batch, Launch{Model: ck, In: in, InLen: 100 + s, Out: out, Tag: uint64(s*rounds + r)})
				}
				p := bytes.Repeat([]byte{byte(s + 1)}, 100+s)
				in.WriteAt(p, 0)
				for _, x := range batch {
					inputs[x.Tag] = p
					outs[x.Tag] = out
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for len(batch) > 0 {
						k := min(len(batch), 1+s%5)
						l.Launch(batch[:k]...)
						batch = batch[k:]
					}
				}()
			}
			// An input mlp does not accept fails, and only that run.
			bad, _ := d.Alloc(100)
			l.Launch(Launch{Model: mlp, In: bad, InLen: 100, Out: bad, Tag: 1 << 40})
			wg.Wait()
			col.wait()
			for tag, c := range col.got {
				if tag == 1<<40 {
					if !errors.Is(c.Err, model.ErrBadInput) {
						t.Errorf("mlp on 100 bytes: %v, want ErrBadInput", c.Err)
					}
					continue
				}
				want := model.Checksum(inputs[tag])
				got := make([]byte, c.OutLen)
				outs[tag].ReadAt(got, 0)
				if c.Err != nil || !bytes.Equal(got, want[:]) {
					t.Fatalf("run %d: %x %v, want %x", tag, got, c.Err, want)
				}
			}
			l.Close()
			col2 := newCollector(t, 1)
			l2 := NewLauncher(d, col2.done)
			l2.Close()
			l2.Launch(Launch{Model: ck, In: bad, InLen: 10, Out: bad, Tag: 7})
			col2.wait()
			if !errors.Is(col2.got[7].Err, ErrLauncherClosed) {
				t.Errorf("launch after close: %v", col2.got[7].Err)
			}
		})
	}
}

// TestLauncherExecutorLost: runs queued on an executor that goes away
// fail, each once; the next launch dials again.
func TestLauncherExecutorLost(t *testing.T) {
	sock, stop := startExecutor(t)
	d := NewShmWith(Info{}, ShmOptions{Executor: sock})
	defer d.Close()
	ck, _ := model.Builtin("checksum")
	in, _ := d.Alloc(8 << 20)
	out, _ := d.Alloc(64)
	const n = 50
	col := newCollector(t, n)
	l := NewLauncher(d, col.done)
	defer l.Close()
	var batch []Launch
	for i := range n {
		batch = append(batch, Launch{Model: ck, In: in, InLen: 8 << 20, Out: out, Tag: uint64(i)})
	}
	l.Launch(batch...)
	stop()
	col.wait()
	failed := 0
	for _, c := range col.got {
		if c.Err != nil {
			failed++
		}
	}
	if failed == 0 {
		t.Error("no run failed with the executor gone")
	}
	t.Logf("%d of %d runs failed", failed, n)
	// Nothing listens now: the launch fails at once, with the reason.
	col2 := newCollector(t, 1)
	l2 := NewLauncher(d, col2.done)
	defer l2.Close()
	l2.Launch(Launch{Model: ck, In: in, InLen: 10, Out: out, Tag: 1})
	col2.wait()
	if err := col2.got[1].Err; err == nil {
		t.Error("launch with no executor succeeded")
	} else {
		t.Log(err)
	}
}
