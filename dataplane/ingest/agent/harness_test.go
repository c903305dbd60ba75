package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/hostagent"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/memnet"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

var (
	dpuClientAddr = netip.MustParseAddrPort("10.0.0.2:61440")
	dpuHostAddr   = netip.MustParseAddrPort("10.1.0.2:61440")
	hostAddr      = netip.MustParseAddrPort("10.1.0.1:61440")
)

// rig is a DPU agent and a GPU host agent on an in-process network, with
// shared-memory GPUs: the whole ingest path but the wires.
type rig struct {
	t      *testing.T
	net    *memnet.Network
	agent  *Agent
	socket string
	cancel context.CancelFunc
	done   chan error
	// cfg and agentTr are the DPU agent's, so that startAgent can start
	// another on the same addresses (a restarted DPU agent).
	cfg     Config
	agentTr []transport.Transport

	hostMu     sync.Mutex
	host       *hostagent.Agent
	hostCancel context.CancelFunc
	hostDone   chan error
	hostTr     transport.Transport
	gpus       int
	// hostModels are models the host runs beside the built-in ones.
	hostModels []*model.Model
}

type rigOptions struct {
	gpus    int
	tenants []TenantConfig
	pools   map[string][]int
	models  []ModelConfig
	slotIn  int
	faults  memnet.Faults
	tweak   func(*Config)
	// hostModels are models the host agent runs beside the built-in
	// ones (a test's own, e.g. one it can slow down).
	hostModels []*model.Model
}

func newRig(t *testing.T, o rigOptions) *rig {
	t.Helper()
	if o.gpus == 0 {
		o.gpus = 1
	}
	if o.models == nil {
		o.models = []ModelConfig{{Name: "checksum"}, {Name: "mlp"}}
	}
	r := &rig{t: t, net: memnet.New(memnet.Options{Seed: 1, MaxPayload: 8972, Faults: o.faults}), socket: filepath.Join(t.TempDir(), "ingest.sock"), gpus: o.gpus,
		hostModels: o.hostModels}
	// The host registers from hostAddr, naming a socket in the rig's
	// directory: what the agent is configured to hear.
	r.cfg = Config{Importer: devmem.ShmImporter{}, Models: o.models, Tenants: o.tenants, Pools: o.pools,
		HostPeer: netip.PrefixFrom(hostAddr.Addr(), 32), HostSocket: filepath.Dir(r.socket) + "/",
		ReassemblyTimeout: 300 * time.Millisecond, DoorbellTimeout: 100 * time.Millisecond}
	if o.tweak != nil {
		o.tweak(&r.cfg)
	}
	r.startAgent()
	t.Cleanup(r.stop)
	r.startHost(o.slotIn)
	r.waitRegistered()
	return r
}

// startAgent starts a DPU agent of r.cfg on the DPU's addresses.
func (r *rig) startAgent() {
	r.t.Helper()
	clients, err := r.net.Listen(dpuClientAddr)
	if err != nil {
		r.t.Fatal(err)
	}
	hostSide, err := r.net.Listen(dpuHostAddr)
	if err != nil {
		r.t.Fatal(err)
	}
	cfg := r.cfg
	cfg.Clients, cfg.Host = clients, hostSide
	r.agent, err = New(cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	r.agentTr = []transport.Transport{clients, hostSide}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan error, 1)
	go func() { r.done <- r.agent.Run(ctx) }()
}

// stopAgent stops the DPU agent and frees its addresses.
func (r *rig) stopAgent() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	if err := <-r.done; err != nil {
		r.t.Errorf("agent: %v", err)
	}
	r.cancel = nil
	for _, tr := range r.agentTr {
		tr.Close()
	}
	r.agentTr = nil
}

func (r *rig) startHost(slotIn int) {
	r.t.Helper()
	tr, err := r.net.Listen(hostAddr)
	if err != nil {
		r.t.Fatal(err)
	}
	var devs []devmem.Device
	var cards []string
	for i := range r.gpus {
		devs = append(devs, devmem.NewShm(devmem.Info{Index: i}))
		cards = append(cards, "H100-80GB")
	}
	ck, _ := model.Builtin("checksum")
	mlp, _ := model.Builtin("mlp")
	h, err := hostagent.New(hostagent.Config{Transport: tr, DPU: dpuHostAddr, Devices: devs, Cards: cards, HandleSocket: r.socket,
		Models: append([]*model.Model{ck, mlp}, r.hostModels...), SlotInput: slotIn, Heartbeat: 50 * time.Millisecond})
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	r.hostMu.Lock()
	r.host, r.hostCancel, r.hostDone, r.hostTr = h, cancel, done, tr
	r.hostMu.Unlock()
}

// stopHost stops the host agent as a crash would look to the DPU: it
// stops answering.
func (r *rig) stopHost() {
	r.hostMu.Lock()
	defer r.hostMu.Unlock()
	if r.hostCancel == nil {
		return
	}
	r.hostCancel()
	if err := <-r.hostDone; err != nil {
		r.t.Errorf("host agent: %v", err)
	}
	r.hostTr.Close()
	r.hostCancel = nil
}

func (r *rig) stop() {
	r.stopHost()
	r.stopAgent()
}

// waitRegistered waits until the DPU has mapped the current host epoch.
func (r *rig) waitRegistered() {
	r.t.Helper()
	r.hostMu.Lock()
	h := r.host
	r.hostMu.Unlock()
	want := fmt.Sprintf("%016x", h.Epoch())
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if s := r.agent.Stats(); s.Host != nil && s.Host.Epoch == want && h.Registered() {
			return
		}
	}
	r.t.Fatalf("host epoch %s never registered: %+v", want, r.agent.Stats())
}

// rawClient speaks the client protocol directly, so that tests control
// every datagram; the client package has its own tests.
type rawClient struct {
	t      *testing.T
	ep     *memnet.Endpoint
	tenant uint32
	ids    atomic.Uint64
}

func (r *rig) client(tenant uint32) *rawClient {
	r.t.Helper()
	ep, err := r.net.Listen(netip.AddrPortFrom(netip.MustParseAddr("10.0.0.100"), 0))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { ep.Close() })
	return &rawClient{t: r.t, ep: ep, tenant: tenant}
}

// fragments cuts an input into datagrams.
func (c *rawClient) fragments(id uint64, mdl string, input []byte, budget time.Duration) []transport.Packet {
	step := ingest.MaxFragment(c.ep.MaxPayload(), mdl)
	var pkts []transport.Packet
	for off := 0; off < len(input); off += step {
		in := ingest.Input{ID: id, Total: uint32(len(input)), Offset: uint32(off), BudgetUs: uint32(budget.Microseconds()), Model: mdl, Data: input[off:min(off+step, len(input))]}
		pkts = append(pkts, transport.Packet{Addr: dpuClientAddr, Data: ingest.AppendInput(nil, c.tenant, &in)})
	}
	return pkts
}

func (c *rawClient) send(pkts []transport.Packet) {
	for len(pkts) > 0 {
		n, err := c.ep.Send(pkts)
		if err != nil {
			c.t.Fatalf("send: %v", err)
		}
		pkts = pkts[n:]
	}
}

type answer struct {
	status ingest.Status
	text   string
	out    []byte
	gpu    int
}

// await reassembles the result of request id, resending pkts every
// resend until it is complete or timeout passes.
func (c *rawClient) await(id uint64, pkts []transport.Packet, resend, timeout time.Duration) (answer, error) {
	var out []byte
	var have ranges
	buf := make([]transport.Packet, 8)
	end := time.Now().Add(timeout)
	for time.Now().Before(end) {
		for i := range buf {
			buf[i].Data = make([]byte, 9000)
		}
		ctx, cancel := context.WithTimeout(context.Background(), resend)
		n, err := c.ep.Recv(ctx, buf)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			if pkts != nil {
				c.send(pkts)
			}
			continue
		}
		if err != nil {
			return answer{}, err
		}
		for _, p := range buf[:n] {
			h, payload, err := wire.Decode(p.Data)
			if err != nil || h.Type != wire.TypeIngestResult {
				return answer{}, fmt.Errorf("bad datagram from DPU: %v %v", h.Type, err)
			}
			f, err := ingest.DecodeResult(payload)
			if err != nil {
				return answer{}, err
			}
			if f.ID != id {
				continue
			}
			if f.Status != ingest.StatusOK {
				return answer{status: f.Status, text: f.Text}, nil
			}
			if out == nil {
				out = make([]byte, f.Total)
			}
			copy(out[f.Offset:], f.Data)
			if f.Total == 0 || (have.add(int(f.Offset), int(f.Offset)+len(f.Data)) && have.covers(len(out))) {
				return answer{out: out, gpu: int(f.GPU), text: f.Text}, nil
			}
		}
	}
	return answer{}, fmt.Errorf("request %d: no complete result in %v", id, timeout)
}

// infer sends one request and waits for its answer, retransmitting.
func (c *rawClient) infer(mdl string, input []byte, budget time.Duration) answer {
	c.t.Helper()
	id := c.ids.Add(1)
	pkts := c.fragments(id, mdl, input, budget)
	c.send(pkts)
	a, err := c.await(id, pkts, 200*time.Millisecond, 20*time.Second)
	if err != nil {
		c.t.Fatal(err)
	}
	return a
}

func appendF32(b []byte, f float32) []byte {
	return binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
}
