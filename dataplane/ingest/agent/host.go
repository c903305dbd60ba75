package agent

import (
	"fmt"
	"net/netip"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/sched"
)

// host is one registration of the GPU host: its epoch, its buffers mapped
// here, and one scheduler per pool over its GPUs.
type host struct {
	epoch    uint64
	addr     netip.AddrPort
	socket   string
	lastSeen time.Time
	layout   ingest.Layout
	models   map[string]bool
	// version is the control protocol version the host said in its
	// register (0: version 1): doorbells go to it batched from 2 on.
	// Under the agent's lock.
	version uint16

	// maps[gpu][slot] are the slot buffers. Copies into and out of them
	// hold mapMu for reading; retiring the host takes it for writing
	// before unmapping, so no copy touches an unmapped buffer.
	mapMu sync.RWMutex
	maps  [][]slotMap
	gone  bool

	pools map[string]*pool
}

type slotMap struct {
	in, out devmem.Mapping
}

// pool is the scheduler of one pool's GPUs.
type pool struct {
	name   string
	disp   *sched.Dispatcher
	gpus   []int // host GPU index of each fleet GPU, in fleet order
	queued int   // requests waiting in disp
}

// newHost maps the handles of layout l and builds the pools' schedulers.
// On error every mapping made is closed and every handle consumed.
func newHost(cfg *Config, l ingest.Layout, hs []devmem.Handle, addr netip.AddrPort, socket string) (*host, error) {
	h := &host{epoch: l.Epoch, addr: addr, socket: socket, layout: l, models: map[string]bool{}, pools: map[string]*pool{}}
	for _, m := range l.Models {
		h.models[m] = true
	}
	next := 0
	var err error
	for _, g := range l.GPUs {
		var row []slotMap
		for range g.Slots {
			var sm slotMap
			if err == nil {
				sm.in, err = cfg.Importer.Import(hs[next])
			} else {
				closeHandle(hs[next])
			}
			if err == nil {
				sm.out, err = cfg.Importer.Import(hs[next+1])
			} else {
				closeHandle(hs[next+1])
			}
			next += 2
			if err != nil && sm.in != nil {
				sm.in.Close()
				sm.in = nil
			}
			row = append(row, sm)
		}
		h.maps = append(h.maps, row)
	}
	if err != nil {
		h.unmap()
		return nil, fmt.Errorf("map the host's buffers: %w", err)
	}
	for name, members := range cfg.Pools {
		p, err := newPool(cfg, name, members, l)
		if err != nil {
			h.unmap()
			return nil, err
		}
		h.pools[name] = p
	}
	return h, nil
}

func closeHandle(h devmem.Handle) {
	if h.FD >= 0 {
		unix.Close(h.FD)
	}
}

func newPool(cfg *Config, name string, members []int, l ingest.Layout) (*pool, error) {
	if members == nil {
		for _, g := range l.GPUs {
			members = append(members, g.Index)
		}
	}
	// Group the pool's GPUs by card: the scheduler's fleet lists GPUs
	// card by card.
	byCard := map[string][]int{}
	for _, gi := range members {
		if gi < 0 || gi >= len(l.GPUs) {
			return nil, fmt.Errorf("pool %s: GPU %d: the host registered %d GPUs", name, gi, len(l.GPUs))
		}
		g := l.GPUs[gi]
		if len(g.Slots) < mig.MemorySlices {
			return nil, fmt.Errorf("pool %s: GPU %d has %d slots; the scheduler needs one per MIG memory slice (%d)", name, gi, len(g.Slots), mig.MemorySlices)
		}
		byCard[g.Card] = append(byCard[g.Card], gi)
	}
	if len(byCard) == 0 {
		return nil, fmt.Errorf("pool %s has no GPUs", name)
	}
	cards := make([]string, 0, len(byCard))
	for c := range byCard {
		cards = append(cards, c)
	}
	sort.Strings(cards)
	p := &pool{name: name}
	var fleet []sched.Fleet
	for _, c := range cards {
		fleet = append(fleet, sched.Fleet{Card: c, Count: len(byCard[c])})
		p.gpus = append(p.gpus, byCard[c]...)
	}
	win := sched.Window{Nodes: cfg.PlanNodes}
	if cfg.PlanNodes < 0 {
		win = sched.Window{Requests: -1}
	}
	d, err := sched.NewDispatcher(sched.Config{Policy: cfg.Policy, Fleet: fleet, Reconfig: cfg.Reconfig, Window: win})
	if err != nil {
		return nil, fmt.Errorf("pool %s: %w", name, err)
	}
	p.disp = d
	return p, nil
}

// unmap closes every mapping once no copy uses them.
func (h *host) unmap() {
	h.mapMu.Lock()
	defer h.mapMu.Unlock()
	h.gone = true
	for _, row := range h.maps {
		for _, sm := range row {
			if sm.in != nil {
				sm.in.Close()
			}
			if sm.out != nil {
				sm.out.Close()
			}
		}
	}
	h.maps = nil
}

// write copies an input into a slot's input buffer: the DMA of
// Conspirator's path.
func (h *host) write(gpu, slot int, p []byte) error {
	h.mapMu.RLock()
	defer h.mapMu.RUnlock()
	if h.gone {
		return ingest.Errorf(ingest.StatusHostUnavailable, "the host agent re-registered while the input was written: send it again")
	}
	return h.maps[gpu][slot].in.WriteAt(p, 0)
}

// read copies a slot's output out of its output buffer.
func (h *host) read(gpu, slot int, p []byte) error {
	h.mapMu.RLock()
	defer h.mapMu.RUnlock()
	if h.gone {
		return ingest.Errorf(ingest.StatusHostUnavailable, "the host agent re-registered before the result was read: send the request again")
	}
	return h.maps[gpu][slot].out.ReadAt(p, 0)
}

func (h *host) slotIn(gpu int) int  { return h.layout.GPUs[gpu].Slots[0].InBytes }
func (h *host) slotOut(gpu int) int { return h.layout.GPUs[gpu].Slots[0].OutBytes }
