package cuda

import (
	"runtime"
	"sync"
)

// thread runs closures on one goroutine locked to its OS thread: the CUDA
// driver keeps the current context per OS thread, and Go moves goroutines
// between threads, so every driver call of one context goes through here.
type thread struct {
	calls chan func()
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
}

// startThread starts the thread and runs init on it (which makes a context
// current); fini runs on it after stop. If init fails the goroutine exits
// still locked, so the runtime discards the OS thread with whatever state
// init left on it.
func startThread(init func() error, fini func()) (*thread, error) {
	t := &thread{calls: make(chan func()), stop: make(chan struct{}), done: make(chan struct{})}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := init(); err != nil {
			errc <- err
			return
		}
		errc <- nil
		defer close(t.done)
		for {
			select {
			case f := <-t.calls:
				f()
			case <-t.stop:
				fini()
				return
			}
		}
	}()
	if err := <-errc; err != nil {
		return nil, err
	}
	return t, nil
}

// do runs f on the thread and returns its error, or ErrClosed once the
// thread has stopped.
func (t *thread) do(f func() error) error {
	var err error
	ran := make(chan struct{})
	select {
	case t.calls <- func() { err = f(); close(ran) }:
	case <-t.stop:
		return ErrClosed
	}
	<-ran
	return err
}

// close stops the thread after the closure in progress, runs fini and
// waits for it. Later calls of do return ErrClosed.
func (t *thread) close() {
	t.once.Do(func() { close(t.stop) })
	<-t.done
}
