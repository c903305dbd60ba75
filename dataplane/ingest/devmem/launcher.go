package devmem

import (
	"errors"
	"sync"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
)

// Launch is one run handed to a Launcher: Device.Run's arguments and the
// caller's tag, which comes back with its Completion.
type Launch struct {
	Model *model.Model
	In    Buffer
	InLen int
	Out   Buffer
	Tag   uint64
}

// Completion is a finished Launch: its tag, the output's length, or the
// error Device.Run would have returned.
type Completion struct {
	Tag    uint64
	OutLen int
	Err    error
}

// Launcher queues runs on a device without waiting for them, as a host
// queues kernels on a stream and is told when they are done: Launch
// returns once the runs are handed to the device, and every run's
// Completion is reported exactly once to the function given to
// NewLauncher, several at once when they finish together. A host that
// launches this way spends no thread per run and wakes once per batch of
// completions instead of once per run.
//
// A device with a queue of its own (queuer: the shared-memory device with
// an executor) takes the runs on it; any other Device gets a goroutine per
// run that calls Run, which is what the caller would otherwise do.
type Launcher struct {
	q    launchQueue
	done func([]Completion)
	runs sync.WaitGroup // fallback runs
	mu   sync.Mutex
	shut bool
}

// launchQueue is a device's own queue of runs.
type launchQueue interface {
	launch(ls []Launch)
	close()
}

// queuer is a Device with a queue of its own.
type queuer interface {
	newQueue(done func([]Completion)) launchQueue
}

// ErrLauncherClosed completes runs launched after Close.
var ErrLauncherClosed = errors.New("launcher closed")

// NewLauncher returns a launcher for d that reports completions to done.
// done is called from the launcher's goroutines, and from Launch itself
// for runs that fail at once (arguments Run would refuse, a closed
// launcher, a device that cannot be reached): Launch's caller must not
// hold a lock that done takes. done must not keep the slice it is given.
func NewLauncher(d Device, done func([]Completion)) *Launcher {
	l := &Launcher{done: done}
	if q, ok := d.(queuer); ok {
		l.q = q.newQueue(done)
		if l.q != nil {
			return l
		}
	}
	l.q = &runQueue{dev: d, l: l}
	return l
}

// Launch hands runs to the device; it does not wait for them.
func (l *Launcher) Launch(ls ...Launch) {
	if len(ls) == 0 {
		return
	}
	l.mu.Lock()
	shut := l.shut
	l.mu.Unlock()
	if shut {
		cs := make([]Completion, len(ls))
		for i, x := range ls {
			cs[i] = Completion{Tag: x.Tag, Err: ErrLauncherClosed}
		}
		l.done(cs)
		return
	}
	l.q.launch(ls)
}

// Close stops the launcher: runs still queued complete with an error (or
// their result, if it comes first), and Close returns once every
// completion has been reported.
func (l *Launcher) Close() {
	l.mu.Lock()
	l.shut = true
	l.mu.Unlock()
	l.q.close()
	l.runs.Wait()
}

// runQueue is the fallback: a goroutine per run.
type runQueue struct {
	dev Device
	l   *Launcher
}

func (q *runQueue) launch(ls []Launch) {
	for _, x := range ls {
		q.l.runs.Add(1)
		go func() {
			defer q.l.runs.Done()
			n, err := q.dev.Run(x.Model, x.In, x.InLen, x.Out)
			q.l.done([]Completion{{Tag: x.Tag, OutLen: n, Err: err}})
		}()
	}
}

func (q *runQueue) close() {}
