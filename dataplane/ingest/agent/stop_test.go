package agent

import (
	"sync"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
)

// gatedImports is an importer that counts the mappings open and, once
// armed, holds the next Import until the test lets it go: a host's
// buffers that take long to map.
type gatedImports struct {
	devmem.ShmImporter
	entered, release, finished chan struct{}

	mu    sync.Mutex
	open  int
	armed bool
	held  bool
	want  int // imports to finish after arming before finished closes
}

func newGatedImports() *gatedImports {
	return &gatedImports{entered: make(chan struct{}), release: make(chan struct{}), finished: make(chan struct{})}
}

// arm holds the next Import, and closes finished once n imports ended.
func (g *gatedImports) arm(n int) {
	g.mu.Lock()
	g.armed, g.want = true, n
	g.mu.Unlock()
}

func (g *gatedImports) Import(h devmem.Handle) (devmem.Mapping, error) {
	g.mu.Lock()
	hold := g.armed && !g.held
	g.held = g.held || hold
	g.mu.Unlock()
	if hold {
		close(g.entered)
		<-g.release
	}
	m, err := g.ShmImporter.Import(h)
	g.mu.Lock()
	defer g.mu.Unlock()
	if err == nil {
		g.open++
		m = &countedMapping{Mapping: m, g: g}
	}
	if g.armed {
		if g.want--; g.want == 0 {
			close(g.finished)
		}
	}
	return m, err
}

func (g *gatedImports) openMappings() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open
}

type countedMapping struct {
	devmem.Mapping
	g      *gatedImports
	closed bool
}

func (m *countedMapping) Close() error {
	m.g.mu.Lock()
	if !m.closed {
		m.closed = true
		m.g.open--
	}
	m.g.mu.Unlock()
	return m.Mapping.Close()
}

// TestRegistrationAfterStop: a host registration whose buffers are still
// being mapped when the agent stops is not adopted after Run returned:
// Run waits for it, and every mapping is closed. Before, Run returned at
// once, and the registration then installed a host on the stopped agent,
// its buffers mapped for good and its requests rung on a host nobody
// listened to.
func TestRegistrationAfterStop(t *testing.T) {
	g := newGatedImports()
	r := newRig(t, rigOptions{tweak: func(c *Config) { c.Importer = g }})
	g.arm(2 * 8) // one GPU of 8 slots, an input and an output buffer each
	r.stopHost()
	r.startHost(0) // a new epoch: the DPU maps its buffers
	select {
	case <-g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the new host's buffers were never mapped")
	}
	r.cancel()
	stopped := make(chan struct{})
	go func() { r.stopAgent(); close(stopped) }()
	g.release <- struct{}{}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not stop")
	}
	select {
	case <-g.finished:
	case <-time.After(10 * time.Second):
		t.Fatal("the new host's buffers were not all mapped")
	}
	if n := g.openMappings(); n != 0 {
		t.Errorf("%d host buffers still mapped after Run returned, want 0", n)
	}
	if s := r.agent.Stats(); s.Host != nil {
		t.Errorf("host %s registered after Run returned", s.Host.Epoch)
	}
}
