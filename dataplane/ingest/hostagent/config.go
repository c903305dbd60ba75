package hostagent

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/mig"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
)

// Config sets up a host agent.
type Config struct {
	// Transport is the agent's control socket towards its DPU (kernel
	// UDP on the host's interface to the DPU).
	Transport transport.Transport
	// DPU is the DPU ingest agent's control address.
	DPU netip.AddrPort
	// Devices are the GPUs to register, in index order.
	Devices []devmem.Device
	// Cards give the MIG card model of each device whose Info has none
	// (the shared-memory device, or a GPU the driver names oddly); an
	// empty entry keeps Info().Card.
	Cards []string
	// SlotInput and SlotOutput are the sizes of each slot's input and
	// output buffers. Defaults 8 MiB and 1 MiB.
	SlotInput, SlotOutput int
	// Slots is the number of slots per GPU, one per MIG memory slice
	// (default mig.MemorySlices, 8): work placed on an instance that
	// starts at memory slice s uses slot s.
	Slots int
	// HandleSocket is the unix socket the DPU fetches buffer handles
	// from.
	HandleSocket string
	// AllowUIDs are the users whose processes may fetch handles or attach
	// workers (checked with SO_PEERCRED). Default: root and the agent's
	// own user.
	AllowUIDs []uint32
	// Models are the models the host runs: built-in ones, and external
	// ones (model.NewExternal) that a user's worker process serves.
	Models []*model.Model
	// WorkerSocket is the unix socket workers attach to, to serve the
	// external models (workers.go has the protocol); required when a
	// model is external.
	WorkerSocket string
	// RunTimeout bounds one run of an external model, and a request's
	// wait for a busy worker (default 30 s). A worker that overruns it
	// is disconnected and its process killed, with the processes it left
	// holding the slot buffers; its slot stays taken until they are all
	// gone.
	RunTimeout time.Duration
	// WorkerWait is how long a request for an external model with no
	// worker attached waits for one to attach (default 0: it fails at
	// once, as model-failed, saying how to start the worker).
	WorkerWait time.Duration
	// Heartbeat is how often the agent registers (default 500 ms); the
	// DPU treats a host it has not heard from for a few heartbeats as
	// gone.
	Heartbeat time.Duration
	Logger    *slog.Logger
	// Ready, if set, is called once by Run when its sockets are open and
	// it is about to serve (lovelockd reports the host agent running only
	// then).
	Ready func()

	// signal sends a signal through a pidfd (default
	// unix.PidfdSendSignal); tests send it from a thread without
	// CAP_KILL, to meet the kernel's EPERM.
	signal func(pidfd int, sig unix.Signal) error
	// pidfdOpen opens a process's pidfd (default unix.PidfdOpen); tests
	// fail it, as a kernel without pidfds would.
	pidfdOpen func(pid, flags int) (int, error)
	// now reads the clock for runs' times and remembered answers'
	// expiry (default time.Now); tests move it on their own.
	now func() time.Time
	// rememberMax bounds the answers remembered (default rememberMax);
	// tests lower it.
	rememberMax int
}

func (c *Config) defaults() error {
	if c.Transport == nil {
		return errors.New("host agent: no transport: give the control socket towards the DPU")
	}
	if !c.DPU.IsValid() {
		return errors.New("host agent: no DPU address: give the DPU ingest agent's control address (ADDR:PORT)")
	}
	if len(c.Devices) == 0 {
		return errors.New("host agent: no devices: configure at least one GPU (or a shared-memory device)")
	}
	if c.HandleSocket == "" {
		return errors.New("host agent: no handle socket path")
	}
	if len(c.Models) == 0 {
		return errors.New("host agent: no models: give at least one (built in: checksum, mlp)")
	}
	seen := map[string]bool{}
	external := 0
	for i, m := range c.Models {
		switch {
		case m == nil || m.Name == "":
			return fmt.Errorf("host agent: model %d has no name", i)
		case seen[m.Name]:
			return fmt.Errorf("host agent: model %s given twice", m.Name)
		case m.External && (m.Multiple < 1 || m.OutputSize == nil):
			return fmt.Errorf("host agent: external model %s: want a row size of at least 1 byte and an output size", m.Name)
		case !m.External && m.Reference == nil:
			return fmt.Errorf("host agent: model %s has no implementation and is not external", m.Name)
		}
		seen[m.Name] = true
		if m.External {
			external++
		}
	}
	if external > 0 && c.WorkerSocket == "" {
		return errors.New("host agent: external models need a worker socket: give WorkerSocket, the unix socket their workers attach to")
	}
	if c.WorkerSocket != "" && c.WorkerSocket == c.HandleSocket {
		return fmt.Errorf("host agent: worker socket %s is also the handle socket: give each its own path", c.WorkerSocket)
	}
	if c.RunTimeout == 0 {
		c.RunTimeout = 30 * time.Second
	}
	if c.RunTimeout < 0 || c.WorkerWait < 0 {
		return fmt.Errorf("host agent: run timeout %v, worker wait %v: want positive durations", c.RunTimeout, c.WorkerWait)
	}
	if c.SlotInput == 0 {
		c.SlotInput = 8 << 20
	}
	if c.SlotOutput == 0 {
		c.SlotOutput = 1 << 20
	}
	if c.SlotInput < 0 || c.SlotOutput < 0 {
		return fmt.Errorf("host agent: slot sizes %d/%d: want positive sizes", c.SlotInput, c.SlotOutput)
	}
	if c.Slots == 0 {
		c.Slots = mig.MemorySlices
	}
	if c.Slots < 1 || c.Slots > mig.MemorySlices {
		return fmt.Errorf("host agent: %d slots per GPU: want 1..%d (one per MIG memory slice)", c.Slots, mig.MemorySlices)
	}
	if len(c.Devices) > 255 {
		return fmt.Errorf("host agent: %d devices: at most 255", len(c.Devices))
	}
	for i, d := range c.Devices {
		card := d.Info().Card
		if i < len(c.Cards) && c.Cards[i] != "" {
			card = c.Cards[i]
		}
		if card == "" {
			return fmt.Errorf("host agent: device %d (%s): unknown MIG card: name it in the config (one of %v)", i, d.Info().Name, cardNames())
		}
		if _, err := mig.CardByName(card); err != nil {
			return fmt.Errorf("host agent: device %d: %w", i, err)
		}
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = 500 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.pidfdOpen == nil {
		c.pidfdOpen = unix.PidfdOpen
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.rememberMax == 0 {
		c.rememberMax = rememberMax
	}
	if c.signal == nil {
		c.signal = func(pidfd int, sig unix.Signal) error { return unix.PidfdSendSignal(pidfd, sig, nil, 0) }
	}
	return nil
}

func cardNames() []string {
	var out []string
	for _, c := range mig.Cards() {
		out = append(out, c.Name)
	}
	return out
}

func (c *Config) card(i int) string {
	if i < len(c.Cards) && c.Cards[i] != "" {
		return c.Cards[i]
	}
	return c.Devices[i].Info().Card
}
