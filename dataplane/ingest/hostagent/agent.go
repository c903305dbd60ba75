// Package hostagent is the GPU host's side of accelerator ingest: it
// allocates each GPU's slot buffers (an input and an output buffer per MIG
// memory slice), registers them with its DPU (control type 0x22, buffer
// handles over a unix socket), and when the DPU rings a slot's doorbell it
// launches the model on the bytes the DPU wrote there and tells the DPU the
// output is ready. It never touches the input bytes itself: that is
// Conspirator's point, and what bench-ingest measures.
package hostagent

import (
	"container/heap"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// Agent is a GPU host's ingest agent.
type Agent struct {
	cfg    Config
	epoch  uint64
	gpus   []*gpu
	models map[string]*model.Model
	// ext are the external models, served by workers (workers.go).
	ext map[string]*extModel

	mu sync.Mutex
	// done remembers recent completions by request, so a doorbell rung
	// again (its completion was lost) is answered without running the
	// model twice; running holds the requests being run now.
	done    map[uint64]answer
	doneLog doneHeap
	running map[uint64]bool
	// runTime is each model's run time as the DPU estimates it (the
	// average of the times this agent reported), for how long its
	// answers are kept.
	runTime map[string]time.Duration
	// launched are the built-in models' runs handed to a GPU's launcher,
	// by request.
	launched map[uint64]launched
	// conns are the worker socket's connections; the worker once
	// attached.
	conns map[*net.UnixConn]*worker

	// lastAck is when the DPU last acknowledged the current epoch, in ns
	// since created (monotonic; 0: never, or it refused since): the agent
	// is registered only while acks keep coming, since the DPU may stop
	// without a word.
	created time.Time
	lastAck atomic.Int64
	// dpuVersion is the control protocol version the DPU said in its
	// register-ack: batches go to it only from 2 on.
	dpuVersion atomic.Uint32
	stats      counters
	// runs are the models running now; Run waits for them before it
	// frees the buffers they use.
	runs sync.WaitGroup

	// scanner finds the processes a worker killed for overrunning its
	// run left holding the buffers (leftovers.go); nil when no buffer is a
	// memfd. scanMu keeps scans one at a time.
	scanMu  sync.Mutex
	scanner *procScanner
	// sharers are the processes the handle socket gave the buffers to
	// (the DPU agent), by pid, each with a pidfd.
	sharerMu sync.Mutex
	sharers  map[int]int
}

type gpu struct {
	index int
	dev   devmem.Device
	card  string
	slots []slot
	// launcher takes the built-in models' runs without a round trip
	// each (set while Run runs).
	launcher *devmem.Launcher
}

// launched is a run on a GPU's launcher.
type launched struct {
	c     ingest.Ctrl
	start time.Time
	s     *slot
}

type slot struct {
	in, out devmem.Buffer
	busy    atomic.Bool
}

// answer is a finished request's completion, kept for a doorbell rung
// again.
type answer struct {
	reply ingest.Ctrl
	at    time.Time
}

// doneEntry is a remembered answer's place in the order they expire.
type doneEntry struct {
	request uint64
	at      time.Time // the answer's, to tell it from a later one
	expires time.Time
}

// doneHeap is the remembered answers, soonest to expire first: a slow
// run's answer is kept longer than the fast ones after it.
type doneHeap []doneEntry

func (h doneHeap) Len() int           { return len(h) }
func (h doneHeap) Less(i, j int) bool { return h[i].expires.Before(h[j].expires) }
func (h doneHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *doneHeap) Push(x any)        { *h = append(*h, x.(doneEntry)) }
func (h *doneHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// rememberFor is the least time the agent keeps a finished request's
// answer for a doorbell rung again (its completion lost). It is tied to
// the DPU agent's re-ring window (dataplane/ingest/agent, timers.go): the
// DPU rings again when no completion came within max(DoorbellTimeout,
// twice the model's estimated run time) of its last ring, until it has
// rung DoorbellRetries times after the last ring the host answered (a
// "running" answer starts the count again), 250 ms and 8 by default: 2 s
// after the run ends for a fast model. 30 s covers that; raise it with the
// DPU's timeouts.
const rememberFor = 30 * time.Second

// rememberRuns is how many run times an answer is kept, of the run's own
// time or the DPU's estimate for its model if longer (Agent.runTime): the
// DPU's window after a run ends is DoorbellRetries (8) re-rings twice its
// estimate apart, 16 run times; 32 leaves that estimate room to be twice
// the agent's, as it is when the DPU's configured estimate is high, or
// slower runs of the model finish while it rings.
const rememberRuns = 32

// rememberMax (cfg.rememberMax unless a test lowers it) bounds the answers
// kept, whatever their age: one is about 200 bytes (an ingest.Ctrl with a
// short text, its map entry and its log entry), so at most about 50 MiB.
// Only doorbells that ran a model, found its slot busy, or released a
// given-up request unrun (one per request the DPU gave up on) take one: the
// agent reaches the bound only above rememberMax/rememberFor (8738) runs a
// second for rememberFor, and then forgets the soonest to expire first.
const rememberMax = 1 << 18

// New allocates every slot buffer and returns the agent, with a new epoch.
func New(cfg Config) (*Agent, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, created: time.Now(), models: map[string]*model.Model{}, ext: map[string]*extModel{}, done: map[uint64]answer{}, running: map[uint64]bool{}, runTime: map[string]time.Duration{},
		launched: map[uint64]launched{}, conns: map[*net.UnixConn]*worker{}, sharers: map[int]int{}}
	for _, m := range cfg.Models {
		a.models[m.Name] = m
		if m.External {
			a.ext[m.Name] = &extModel{m: m, workers: map[*worker]bool{}, wake: make(chan struct{})}
		}
	}
	var e [8]byte
	if _, err := rand.Read(e[:]); err != nil {
		return nil, fmt.Errorf("host agent: epoch: %w", err)
	}
	a.epoch = binary.BigEndian.Uint64(e[:]) | 1 // never 0
	for i, d := range cfg.Devices {
		g := &gpu{index: i, dev: d, card: cfg.card(i)}
		for s := 0; s < cfg.Slots; s++ {
			in, err := d.Alloc(cfg.SlotInput)
			if err != nil {
				a.free()
				return nil, fmt.Errorf("host agent: GPU %d slot %d: input buffer of %d bytes: %w", i, s, cfg.SlotInput, err)
			}
			out, err := d.Alloc(cfg.SlotOutput)
			if err != nil {
				in.Free()
				a.free()
				return nil, fmt.Errorf("host agent: GPU %d slot %d: output buffer of %d bytes: %w", i, s, cfg.SlotOutput, err)
			}
			g.slots = append(g.slots, slot{in: in, out: out})
		}
		a.gpus = append(a.gpus, g)
	}
	if len(a.ext) > 0 {
		files, err := a.bufferFiles()
		if err != nil {
			a.free()
			return nil, fmt.Errorf("host agent: %w", err)
		}
		if len(files) > 0 {
			a.scanner = newProcScanner(files)
		}
	}
	return a, nil
}

func (a *Agent) free() {
	for _, g := range a.gpus {
		for i := range g.slots {
			g.slots[i].in.Free()
			g.slots[i].out.Free()
		}
	}
}

// Epoch is this agent's registration: it changes with every start, and
// the DPU drops every mapping of an older one.
func (a *Agent) Epoch() uint64 { return a.epoch }

// ackWindow is how many heartbeats may go unacknowledged before the agent
// counts itself unregistered: the DPU answers each one, so losing a
// couple is loss, losing more is a DPU that is gone.
const ackWindow = 3

// Registered reports whether the DPU has acknowledged the current epoch
// within the last ackWindow heartbeats.
func (a *Agent) Registered() bool {
	ago, ok := a.lastAckAgo()
	return ok && ago <= ackWindow*a.cfg.Heartbeat
}

// lastAckAgo returns how long ago the DPU last acknowledged the current
// epoch, and false if it never did (or refused it since).
func (a *Agent) lastAckAgo() (time.Duration, bool) {
	at := a.lastAck.Load()
	if at == 0 {
		return 0, false
	}
	return time.Since(a.created) - time.Duration(at), true
}

// Run registers with the DPU, serves handles, workers and doorbells until
// ctx ends, then disconnects the workers and frees the buffers. The
// transport is the caller's to close.
func (a *Agent) Run(ctx context.Context) error {
	defer a.free()
	defer a.closeSharers()
	ln, err := listenHandles(a.cfg.HandleSocket)
	if err != nil {
		return err
	}
	var wln *net.UnixListener
	if len(a.ext) > 0 {
		if wln, err = listenUnix(a.cfg.WorkerSocket, "worker"); err != nil {
			ln.Close()
			return err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, g := range a.gpus {
		g.launcher = devmem.NewLauncher(g.dev, func(cs []devmem.Completion) { a.completed(ctx, cs) })
	}
	if a.cfg.Ready != nil {
		a.cfg.Ready()
	}
	var wg sync.WaitGroup
	if wln != nil {
		wg.Add(1)
		go func() { defer wg.Done(); a.serveWorkers(ctx, wln, &wg) }()
	}
	wg.Add(3)
	go func() { defer wg.Done(); a.serveHandles(ctx, ln) }()
	go func() { defer wg.Done(); a.heartbeat(ctx) }()
	var runErr error
	go func() {
		defer wg.Done()
		runErr = a.receive(ctx)
		cancel()
	}()
	<-ctx.Done()
	ln.Close()
	if wln != nil {
		wln.Close()
	}
	a.closeWorkers()
	wg.Wait()
	// Nothing launches now: the launchers report what they still hold.
	for _, g := range a.gpus {
		g.launcher.Close()
	}
	a.runs.Wait()
	if runErr != nil && !errors.Is(runErr, context.Canceled) {
		return runErr
	}
	return nil
}

func (a *Agent) heartbeat(ctx context.Context) {
	t := time.NewTicker(a.cfg.Heartbeat)
	defer t.Stop()
	registered := false
	for {
		a.send(ingest.Ctrl{Op: ingest.OpRegister, Epoch: a.epoch, Length: uint32(len(a.gpus)), Version: ingest.CtrlVersion, Text: a.cfg.HandleSocket})
		a.stats.registers.Add(1)
		// No ack arrives to say the DPU is gone: the heartbeat notices.
		was := registered
		if registered = a.Registered(); was && !registered {
			ago, _ := a.lastAckAgo()
			a.cfg.Logger.Warn("the DPU stopped acknowledging this host: no requests reach it; is the DPU's lovelockd running?", "dpu", a.cfg.DPU, "last_ack", ago.Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// send sends one message to the DPU.
func (a *Agent) send(c ingest.Ctrl) { a.sendCtrls([]ingest.Ctrl{c}) }

// sendCtrls sends messages to the DPU in one system call: as few batches
// as hold them to a DPU that speaks version 2, one datagram each to an
// older one.
func (a *Agent) sendCtrls(cs []ingest.Ctrl) {
	batch := a.dpuVersion.Load() >= 2
	var one [1]transport.Packet
	pkts := one[:0]
	for rest := cs; len(rest) > 0; {
		b, n := ingest.AppendCtrls(make([]byte, 0, 64+48*len(rest)), rest, a.cfg.Transport.MaxPayload(), batch)
		pkts = append(pkts, transport.Packet{Addr: a.cfg.DPU, Data: b})
		rest = rest[n:]
	}
	for len(pkts) > 0 {
		n, err := a.cfg.Transport.Send(pkts)
		if err == nil {
			return
		}
		a.stats.sendErrors.Add(1)
		a.cfg.Logger.Debug("send to DPU", "datagrams", len(pkts), "err", err)
		if errors.Is(err, transport.ErrClosed) {
			return
		}
		pkts = pkts[n+1:]
	}
}

// rx is what one receive's datagrams ask for: answers to send and runs to
// launch, each in one go once every datagram is read.
type rx struct {
	msgs     []ingest.Ctrl
	replies  []ingest.Ctrl
	launches [][]devmem.Launch // by GPU
}

func (a *Agent) receive(ctx context.Context) error {
	pkts := make([]transport.Packet, 16)
	for i := range pkts {
		pkts[i].Data = make([]byte, a.cfg.Transport.MaxPayload())
	}
	b := &rx{launches: make([][]devmem.Launch, len(a.gpus))}
	for {
		for i := range pkts {
			pkts[i].Data = pkts[i].Data[:cap(pkts[i].Data)]
		}
		n, err := a.cfg.Transport.Recv(ctx, pkts)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("host agent: receive from DPU: %w", err)
		}
		a.stats.receives.Add(1)
		for _, p := range pkts[:n] {
			a.handle(ctx, p.Addr, p.Data, b)
		}
		for i, ls := range b.launches {
			if len(ls) > 0 {
				a.gpus[i].launcher.Launch(ls...)
				clear(ls)
				b.launches[i] = ls[:0]
			}
		}
		if len(b.replies) > 0 {
			a.sendCtrls(b.replies)
			clear(b.replies)
			b.replies = b.replies[:0]
		}
	}
}

func (a *Agent) handle(ctx context.Context, from netip.AddrPort, d []byte, b *rx) {
	var err error
	b.msgs, err = decode(d, b.msgs[:0])
	if err != nil {
		a.stats.malformed.Add(1)
		a.cfg.Logger.Debug("malformed control datagram", "from", from, "err", err)
		return
	}
	for _, c := range b.msgs {
		a.handleOne(ctx, from, c, b)
	}
}

func (a *Agent) handleOne(ctx context.Context, from netip.AddrPort, c ingest.Ctrl, b *rx) {
	switch c.Op {
	case ingest.OpRegisterAck:
		if c.Epoch != a.epoch {
			a.stats.stale.Add(1)
			return
		}
		a.dpuVersion.Store(uint32(c.Version))
		if c.Status != ingest.StatusOK {
			a.lastAck.Store(0)
			a.cfg.Logger.Warn("DPU refused registration", "err", c.Text)
			return
		}
		was := a.Registered()
		a.lastAck.Store(max(1, int64(time.Since(a.created))))
		if !was {
			a.cfg.Logger.Info("registered with DPU", "dpu", from, "epoch", fmt.Sprintf("%016x", a.epoch))
		}
	case ingest.OpDoorbell:
		a.doorbell(ctx, c, b)
	default:
		a.stats.malformed.Add(1)
	}
}

// doorbell starts one request, or answers again for one already run. A
// built-in model's run joins b's launches, and an answer b's replies; an
// external model's run goes to a worker in a goroutine of its own.
func (a *Agent) doorbell(ctx context.Context, c ingest.Ctrl, b *rx) {
	a.stats.doorbells.Add(1)
	if c.Epoch != a.epoch {
		// The DPU rang an old registration's slot: the buffers are gone.
		a.stats.stale.Add(1)
		b.replies = append(b.replies, ingest.Ctrl{Op: ingest.OpComplete, Epoch: c.Epoch, Request: c.Request, Status: ingest.StatusHostUnavailable,
			Text: "the host agent restarted since this slot was registered: send the request again"})
		return
	}
	start := a.cfg.now()
	a.mu.Lock()
	a.forgetLocked(start)
	if done, ok := a.done[c.Request]; ok {
		a.mu.Unlock()
		a.stats.repeats.Add(1)
		b.replies = append(b.replies, done.reply)
		return
	}
	if a.running[c.Request] {
		a.mu.Unlock()
		a.stats.repeats.Add(1)
		b.replies = append(b.replies, ingest.Ctrl{Op: ingest.OpRunning, Epoch: a.epoch, Request: c.Request, GPU: c.GPU, Slot: c.Slot})
		return
	}
	if c.Flags&ingest.FlagGivenUp != 0 {
		// The DPU answered this request's caller and rings only to free
		// its slot. With no record of it (its first ring was lost, or its
		// answer expired) a run now would write output nobody reads, on
		// a slot the DPU is about to give to another request.
		b.replies = append(b.replies, a.releasedLocked(c, start))
		a.mu.Unlock()
		return
	}
	g, s, m, err := a.check(c)
	if err != nil {
		// A refusal that ran nothing is the same whenever the doorbell
		// comes (the layout and models do not change while the agent
		// runs), so it takes no remembered answer: a flood of them must
		// not push out the answers of runs. A busy slot is remembered:
		// asked again once the slot is free, the doorbell would run.
		keep := ingest.StatusOf(err) == ingest.StatusOverloaded
		b.replies = append(b.replies, a.finishLocked(c, start, 0, err, keep))
		a.mu.Unlock()
		return
	}
	a.running[c.Request] = true
	a.runs.Add(1)
	if !m.External {
		a.launched[c.Request] = launched{c: c, start: start, s: s}
		a.mu.Unlock()
		b.launches[g.index] = append(b.launches[g.index], devmem.Launch{Model: m, In: s.in, InLen: int(c.Length), Out: s.out, Tag: c.Request})
		return
	}
	a.mu.Unlock()
	go func() {
		defer a.runs.Done()
		n, gone, err := a.runExternal(ctx, m, c, s)
		if gone == nil {
			s.busy.Store(false)
		} else {
			a.holdSlot(ctx, s, gone)
		}
		a.mu.Lock()
		reply := a.finishLocked(c, start, n, err, true)
		a.mu.Unlock()
		if ctx.Err() == nil {
			a.send(reply)
		}
	}()
}

// reapWait is how long a request whose worker was lost mid-run (overran
// the run timeout, went away, broke the protocol) waits for the worker's
// process and its leftovers to end before it is answered: the slot is
// freed first when they end by then, so that the DPU's next request on it
// is not refused as slot-busy.
const reapWait = 2 * time.Second

// holdSlot keeps s taken until gone is closed (the process of a worker
// lost mid-run, and those it left holding the slot buffers, which may
// still write into s's buffers, have ended): doorbells for s are refused as overloaded (retryable) meanwhile.
// It waits up to reapWait for that, then leaves the freeing to a
// goroutine that stops with the agent.
func (a *Agent) holdSlot(ctx context.Context, s *slot, gone <-chan struct{}) {
	t := time.NewTimer(reapWait)
	defer t.Stop()
	select {
	case <-gone:
		s.busy.Store(false)
		return
	case <-t.C:
	case <-ctx.Done():
		return
	}
	a.runs.Add(1)
	go func() {
		defer a.runs.Done()
		select {
		case <-gone:
			s.busy.Store(false)
		case <-ctx.Done():
		}
	}()
}

// completed takes a launcher's finished runs and answers them all in one
// send.
func (a *Agent) completed(ctx context.Context, cs []devmem.Completion) {
	replies := make([]ingest.Ctrl, 0, len(cs))
	a.mu.Lock()
	for _, x := range cs {
		l, ok := a.launched[x.Tag]
		if !ok {
			continue
		}
		delete(a.launched, x.Tag)
		l.s.busy.Store(false)
		err := x.Err
		if err != nil {
			if errors.Is(err, model.ErrBadInput) {
				err = ingest.Errorf(ingest.StatusBadRequest, "%v", err)
			} else {
				err = ingest.Errorf(ingest.StatusModelFailed, "model %s on GPU %d: %v", l.c.Text, l.c.GPU, err)
			}
		}
		replies = append(replies, a.finishLocked(l.c, l.start, x.OutLen, err, true))
		a.runs.Done()
	}
	a.mu.Unlock()
	if ctx.Err() == nil && len(replies) > 0 {
		a.stats.completionSends.Add(1)
		a.sendCtrls(replies)
	}
}

// finishLocked counts a finished run, remembers its answer for a doorbell
// rung again if keep, and returns it. An answer is forgotten once older
// than rememberFor or rememberRuns times its model's run time, whichever
// is longer, or beyond rememberMax of them (the soonest to expire first).
func (a *Agent) finishLocked(c ingest.Ctrl, start time.Time, outLen int, err error, keep bool) ingest.Ctrl {
	now := a.cfg.now()
	took := now.Sub(start)
	reply := ingest.Ctrl{Op: ingest.OpComplete, Epoch: a.epoch, Request: c.Request, GPU: c.GPU, Slot: c.Slot,
		Length: uint32(outLen), DeviceUs: uint32(took.Microseconds())}
	if err != nil {
		reply.Status, reply.Text, reply.Length = ingest.StatusOf(err), err.Error(), 0
		a.stats.failed.Add(1)
	} else {
		a.stats.completed.Add(1)
		a.stats.bytesIn.Add(uint64(c.Length))
		a.stats.bytesOut.Add(uint64(outLen))
	}
	a.stats.deviceNs.Add(uint64(took))
	delete(a.running, c.Request)
	if keep {
		est := took
		if _, ok := a.models[c.Text]; ok {
			// The DPU's estimate, as it averages the times it hears of
			// completed runs (dataplane/ingest/agent: (7*old + new)/8): a
			// fast run of a slow model is rung again as long as the slow
			// ones. A failed run does not move it.
			old, seen := a.runTime[c.Text]
			switch {
			case seen && err == nil:
				est = (7*old + took) / 8
			case seen:
				est = old
			}
			if err == nil {
				a.runTime[c.Text] = est
			}
		}
		a.done[c.Request] = answer{reply: reply, at: now}
		heap.Push(&a.doneLog, doneEntry{request: c.Request, at: now, expires: now.Add(max(rememberFor, rememberRuns*max(took, est)))})
	}
	a.forgetLocked(now)
	return reply
}

// releasedLocked answers a given-up doorbell the agent has no record of:
// nothing runs. The answer is remembered like a run's, so that the
// request's first ring, should it come late, is answered with it and not
// run either.
func (a *Agent) releasedLocked(c ingest.Ctrl, now time.Time) ingest.Ctrl {
	a.stats.releasedUnrun.Add(1)
	reply := ingest.Ctrl{Op: ingest.OpComplete, Status: ingest.StatusReleased, Epoch: a.epoch, Request: c.Request, GPU: c.GPU, Slot: c.Slot,
		Text: "the host has no record of this given-up request and ran nothing for it"}
	a.done[c.Request] = answer{reply: reply, at: now}
	heap.Push(&a.doneLog, doneEntry{request: c.Request, at: now, expires: now.Add(rememberFor)})
	a.forgetLocked(now)
	return reply
}

// forgetLocked forgets the answers expired by now, and the soonest to
// expire beyond the cfg.rememberMax kept.
func (a *Agent) forgetLocked(now time.Time) {
	for len(a.doneLog) > 0 && (len(a.doneLog) > a.cfg.rememberMax || now.After(a.doneLog[0].expires)) {
		e := heap.Pop(&a.doneLog).(doneEntry)
		// The request may have finished again since (its answer was
		// forgotten): only its own entry goes.
		if d, ok := a.done[e.request]; ok && d.at.Equal(e.at) {
			delete(a.done, e.request)
		}
	}
}

// check checks a doorbell against what was registered and takes its
// slot.
func (a *Agent) check(c ingest.Ctrl) (*gpu, *slot, *model.Model, error) {
	if int(c.GPU) >= len(a.gpus) || int(c.Slot) >= len(a.gpus[c.GPU].slots) {
		return nil, nil, nil, ingest.Errorf(ingest.StatusBadRequest, "doorbell for GPU %d slot %d: this host registered %d GPUs of %d slots", c.GPU, c.Slot, len(a.gpus), a.cfg.Slots)
	}
	m, ok := a.models[c.Text]
	if !ok {
		return nil, nil, nil, ingest.Errorf(ingest.StatusUnknownModel, "the host runs no model %q", c.Text)
	}
	g := a.gpus[c.GPU]
	s := &g.slots[c.Slot]
	if int(c.Length) > s.in.Size() {
		return nil, nil, nil, ingest.Errorf(ingest.StatusTooLarge, "input of %d bytes in a %d-byte slot", c.Length, s.in.Size())
	}
	if !s.busy.CompareAndSwap(false, true) {
		// The DPU's scheduler gives a slot to one request at a time; two
		// at once means it gave up on a request the host still runs.
		return nil, nil, nil, ingest.Errorf(ingest.StatusOverloaded, "GPU %d slot %d is still running an earlier request: retry", c.GPU, c.Slot)
	}
	return g, s, m, nil
}

// decode appends a control datagram's messages (one, or a batch's) to dst.
func decode(b []byte, dst []ingest.Ctrl) ([]ingest.Ctrl, error) {
	h, payload, err := wire.Decode(b)
	if err != nil {
		return dst, err
	}
	if h.Type != wire.TypeIngestCtrl {
		return dst, fmt.Errorf("%w: a %s datagram on the control socket", ingest.ErrMalformed, h.Type)
	}
	return ingest.DecodeCtrls(payload, dst)
}

// Layout returns what the agent registers.
func (a *Agent) Layout() ingest.Layout {
	l := ingest.Layout{Epoch: a.epoch}
	for _, g := range a.gpus {
		info := g.dev.Info()
		gl := ingest.GPULayout{Index: g.index, Kind: string(info.Kind), Name: info.Name, UUID: info.UUID, Card: g.card}
		for s := range g.slots {
			gl.Slots = append(gl.Slots, ingest.SlotLayout{Slot: s, InBytes: g.slots[s].in.Size(), OutBytes: g.slots[s].out.Size()})
		}
		l.GPUs = append(l.GPUs, gl)
	}
	for name := range a.models {
		l.Models = append(l.Models, name)
	}
	return l
}
