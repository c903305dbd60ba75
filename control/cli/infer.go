package cli

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"time"

	ucli "github.com/urfave/cli/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lovelock-dpu/lovelock/control/testbed"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/agent"
	ingestclient "github.com/lovelock-dpu/lovelock/dataplane/ingest/client"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/kserve"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// defaultIngestDPU is where `lovelock infer` sends without --dpu: the
// testbed's dpu2 (the DPU of gpu0) on the Lovelock port.
func defaultIngestDPU() string {
	a, err := testbed.DefaultSpec().NodeAddr("dpu2")
	if err != nil {
		return ""
	}
	return netip.AddrPortFrom(a, wire.DefaultPort).String()
}

func inferCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "infer",
		Usage:     "send inference requests to a DPU's ingest agent: one input, or a load at a rate, size and deadline",
		ArgsUsage: " ",
		Description: "Sends inputs over the Lovelock ingest protocol (UDP) to the DPU in front of a GPU host and\n" +
			"waits for the results. With neither --count, --rate nor --duration it sends one request and\n" +
			"prints its output, where it ran and how long it took; otherwise it runs a load and prints\n" +
			"latency percentiles, throughput and deadline misses. --check compares every output with\n" +
			"the model's CPU reference (exactly for checksum, within float tolerance for mlp). The\n" +
			"command exits non-zero if any request failed or any output was wrong.\n\n" +
			"Inputs are --input FILE, or --size random bytes (the same seed gives the same bytes; for\n" +
			"mlp, float32 values in [-1, 1)).\n" +
			"Datagrams are sized for --mtu so that an AF_XDP agent never sees IP fragments.\n\n" +
			"Examples:\n" +
			"   lovelock infer --size 1MiB --check                           one request to the testbed's dpu2\n" +
			"   lovelock infer --dpu 10.77.0.12:61440 --model mlp --size 64KiB --check\n" +
			"   lovelock infer --count 1000 --concurrency 16 --size 4KiB      closed loop, 16 outstanding\n" +
			"   lovelock infer --rate 500 --duration 10s --deadline 20ms     open loop at 500 req/s\n" +
			"   lovelock infer --input tensor.bin --tenant 3 -o json\n\n" +
			"From the testbed's client node: lovelock testbed exec client -- lovelock infer --size 4KiB",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "grpc", Usage: "send one request through the DPU's KServe v2 gRPC front end at `ADDR:PORT` (ModelInfer) instead of the Lovelock protocol"},
			&ucli.StringFlag{Name: "dpu", Value: defaultIngestDPU(), Usage: "the `ADDR:PORT` of the DPU's ingest agent; the default is the testbed's dpu2"},
			&ucli.StringFlag{Name: "bind", Usage: "local `ADDR[:PORT]` to send from; unset: any address, an ephemeral port"},
			&ucli.UintFlag{Name: "tenant", Usage: "the tenant the requests belong to"},
			&ucli.StringFlag{Name: "model", Value: "checksum", Usage: "the model to run (built in: " + fmt.Sprint(model.BuiltinNames()) + ")"},
			&ucli.StringFlag{Name: "input", Usage: "send this `FILE`'s bytes"},
			&ucli.StringFlag{Name: "size", Usage: "send this many random bytes (a number, or with a unit: 4KiB, 1MiB)"},
			&ucli.Uint64Flag{Name: "seed", Value: 1, Usage: "seed of the --size input"},
			&ucli.DurationFlag{Name: "deadline", Usage: "each request's deadline (the DPU refuses requests it cannot start in time); 0: none"},
			&ucli.IntFlag{Name: "count", Usage: "requests to send (load)"},
			&ucli.Float64Flag{Name: "rate", Usage: "open loop: requests per second, at most --concurrency outstanding (load)"},
			&ucli.DurationFlag{Name: "duration", Usage: "send for this long (load)"},
			&ucli.IntFlag{Name: "concurrency", Usage: "closed loop: requests outstanding; open loop (--rate): the most outstanding", DefaultText: "1, or 1024 with --rate"},
			&ucli.DurationFlag{Name: "timeout", Value: ingestclient.DefaultTimeout, Usage: "initial retransmission timeout (doubles on each retransmission)"},
			&ucli.IntFlag{Name: "retries", Value: ingestclient.DefaultRetries, Usage: "retransmissions, and retries after overloaded or host-unavailable; 0: none"},
			&ucli.IntFlag{Name: "mtu", Value: 1500, Usage: "path MTU the datagrams must fit; 0: up to 64 KiB (IP fragments)"},
			&ucli.BoolFlag{Name: "check", Usage: "verify each output with the model's CPU reference"},
			outputFlag(),
		},
		Action: infer,
	}
}

// inferReport is what `lovelock infer` prints.
type inferReport struct {
	DPU    string `json:"dpu"`
	Model  string `json:"model"`
	Tenant uint32 `json:"tenant"`
	Size   int    `json:"size"`
	// Result and Error are the single request's.
	Result *inferResult `json:"result,omitempty"`
	Error  string       `json:"error,omitempty"`
	// Load is the load's report.
	Load *ingestclient.Report `json:"load,omitempty"`
	// Check is "ok", "wrong: ..." or "" without --check.
	Check  string             `json:"check,omitempty"`
	Client ingestclient.Stats `json:"client"`
}

type inferResult struct {
	Output  []byte        `json:"output"`
	GPU     int           `json:"gpu"`
	Slice   string        `json:"slice"`
	Queued  time.Duration `json:"queued_ns"`
	Device  time.Duration `json:"device_ns"`
	Latency time.Duration `json:"latency_ns"`
}

func infer(c *ucli.Context) error {
	if err := inferFlagsInRange(c); err != nil {
		return err
	}
	asJSON, err := wantJSON(c)
	if err != nil {
		return err
	}
	dpu, err := netip.ParseAddrPort(c.String("dpu"))
	if err != nil {
		return fmt.Errorf("--dpu %q: want ADDR:PORT, e.g. 10.77.0.12:%d", c.String("dpu"), wire.DefaultPort)
	}
	bind, err := inferBind(c.String("bind"), dpu)
	if err != nil {
		return err
	}
	name := c.String("model")
	maxPayload, err := inferMaxPayload(c.Int("mtu"), dpu, name)
	if err != nil {
		return err
	}
	input, err := inferInput(c, name)
	if err != nil {
		return err
	}
	load := c.IsSet("count") || c.IsSet("rate") || c.IsSet("duration")
	var check func(in, out []byte) error
	if c.Bool("check") {
		if check, err = ingestclient.Verify(name); err != nil {
			return fmt.Errorf("--check: %w", err)
		}
	}
	if addr := c.String("grpc"); addr != "" {
		if load {
			return errors.New("infer: --grpc sends one request; a load goes over the Lovelock protocol (drop --grpc)")
		}
		return inferGRPC(c, addr, name, input, check, asJSON)
	}

	tr, err := udp.Listen(bind, udp.Options{MaxPayload: maxPayload})
	if err != nil {
		return fmt.Errorf("infer: %w", err)
	}
	defer tr.Close()
	retries := c.Int("retries")
	if retries == 0 {
		retries = -1 // the flag's 0 means none; Options' 0 means the default
	}
	tenant, _ := uint32Flag(c, "tenant") // in range: inferFlagsInRange
	cl, err := ingestclient.New(tr, dpu, ingestclient.Options{Tenant: tenant, Timeout: c.Duration("timeout"), Retries: retries})
	if err != nil {
		return err
	}
	defer cl.Close()

	rep := inferReport{DPU: dpu.String(), Model: name, Tenant: tenant, Size: len(input)}
	var failure error
	if load {
		if c.Int("count") <= 0 && c.Duration("duration") <= 0 {
			return errors.New("infer: a load needs --count or --duration")
		}
		r, err := ingestclient.Load(c.Context, cl, ingestclient.LoadOptions{
			Model: name, Input: func(int) []byte { return input },
			Rate: c.Float64("rate"), Concurrency: c.Int("concurrency"), Count: c.Int("count"), Duration: c.Duration("duration"),
			Deadline: c.Duration("deadline"), Check: check,
		})
		if r == nil {
			return fmt.Errorf("infer: %w", err)
		}
		rep.Load = r
		switch {
		case err != nil:
			failure = fmt.Errorf("infer: load interrupted: %w", err)
		case r.Failures() > 0:
			failure = fmt.Errorf("infer: %d of %d requests failed (first: %s)", r.Failures(), r.Sent, r.FirstError)
		case r.Wrong > 0:
			failure = fmt.Errorf("infer: %d of %d outputs wrong (first: %s)", r.Wrong, r.OK, r.FirstWrong)
		case r.OK == 0:
			failure = fmt.Errorf("infer: no request completed (%d dropped)", r.Dropped)
		}
		if check != nil {
			rep.Check = loadCheck(r)
		}
	} else {
		t0 := time.Now()
		res, err := cl.Infer(c.Context, name, input, c.Duration("deadline"))
		lat := time.Since(t0)
		if err != nil {
			rep.Error = err.Error()
			failure = fmt.Errorf("infer: %w", inferExplain(err))
		} else {
			rep.Result = &inferResult{Output: res.Output, GPU: res.GPU, Slice: res.Slice, Queued: res.Queued, Device: res.Device, Latency: lat}
			if check != nil {
				rep.Check = "ok"
				if err := check(input, res.Output); err != nil {
					rep.Check = "wrong: " + err.Error()
					failure = fmt.Errorf("infer: output wrong: %w", err)
				}
			}
		}
	}
	rep.Client = cl.Stats()
	if asJSON {
		if err := writeJSON(c.App.Writer, rep); err != nil {
			return err
		}
	} else {
		printInfer(c.App.Writer, &rep)
	}
	return failure
}

// loadCheck is what --check says of a load: only the outputs that came
// back were checked.
func loadCheck(r *ingestclient.Report) string {
	switch {
	case r.Wrong > 0:
		return fmt.Sprintf("wrong: %d outputs (first: %s)", r.Wrong, r.FirstWrong)
	case r.OK == 0:
		return "not checked: no output came back"
	case r.Failures() > 0:
		return fmt.Sprintf("ok: the %d outputs that came back (%d of %d requests failed)", r.OK, r.Failures(), r.Sent)
	}
	return "ok"
}

// inferFlagsInRange refuses, before anything is read or sent, a number
// flag outside what it takes, naming the flag, its value and what it
// takes (--mtu: inferMaxPayload).
func inferFlagsInRange(c *ucli.Context) error {
	dur := func(flag string) (time.Duration, bool) { return c.Duration(flag), c.IsSet(flag) }
	if n := c.Int("count"); c.IsSet("count") && n < 1 {
		return fmt.Errorf("infer: --count %d: want 1 or more requests", n)
	}
	if d, set := dur("duration"); set && d <= 0 {
		return fmt.Errorf("infer: --duration %s: want a time > 0", d)
	}
	if r := c.Float64("rate"); c.IsSet("rate") && !(r > 0 && !math.IsInf(r, 1)) {
		return fmt.Errorf("infer: --rate %v: want requests per second, finite and > 0 (left out: a closed loop)", r)
	}
	if n := c.Int("concurrency"); n < 0 {
		return fmt.Errorf("infer: --concurrency %d: want 1 or more (left out: 1, or 1024 with --rate)", n)
	}
	if d, _ := dur("deadline"); d < 0 {
		return fmt.Errorf("infer: --deadline %s: want a time ≥ 0 (0: none)", d)
	}
	// 0 would be the client's default: the flag shows it instead.
	if d, _ := dur("timeout"); d <= 0 {
		return fmt.Errorf("infer: --timeout %s: want a time > 0", d)
	}
	if n := c.Int("retries"); n < 0 {
		return fmt.Errorf("infer: --retries %d: want 0 or more (0: none)", n)
	}
	if _, err := uint32Flag(c, "tenant"); err != nil {
		return fmt.Errorf("infer: %w", err)
	}
	return nil
}

// inferMaxPayload returns the datagram size for --mtu (0: the protocol's
// limit), refusing an MTU whose datagrams cannot carry a request for model
// to dpu or one past an IP packet's 65535 bytes.
func inferMaxPayload(mtu int, dpu netip.AddrPort, model string) (int, error) {
	if mtu == 0 {
		return 0, nil
	}
	v6 := dpu.Addr().Is6() && !dpu.Addr().Is4In6()
	// A datagram holds the Lovelock header and a result header and a
	// byte, or an input header, the model's name and the least fragment
	// the DPU takes (ingest.MaxFragment, ingest.MinFragment).
	need := wire.HeaderLen + max(ingest.ResultHeaderLen+1, ingest.InputHeaderLen+len(model)+ingest.MinFragment)
	least := need + mtu - udp.MaxPayloadForMTU(mtu, v6)
	if mtu < least || mtu > 65535 {
		return 0, fmt.Errorf("infer: --mtu %d: want 0 (datagrams up to 64 KiB, in IP fragments) or %d to 65535 (the path's MTU; "+
			"%d is the least whose datagrams carry a request for model %s)", mtu, least, least, model)
	}
	return udp.MaxPayloadForMTU(mtu, v6), nil
}

// inferExplain adds what to do to the errors a user meets first.
func inferExplain(err error) error {
	switch {
	case errors.Is(err, ingestclient.ErrTimeout):
		return fmt.Errorf("%w\nis the DPU's ingest agent running, and is --dpu its address? (lovelock services on the DPU)", err)
	case ingest.StatusOf(err) == ingest.StatusNotGranted:
		return fmt.Errorf("%w\nthe DPU's config grants models to tenants: check --tenant", err)
	}
	return err
}

func inferBind(v string, dpu netip.AddrPort) (netip.AddrPort, error) {
	if v == "" {
		if dpu.Addr().Is6() && !dpu.Addr().Is4In6() {
			return netip.AddrPortFrom(netip.IPv6Unspecified(), 0), nil
		}
		return netip.AddrPortFrom(netip.IPv4Unspecified(), 0), nil
	}
	if ap, err := netip.ParseAddrPort(v); err == nil {
		return ap, nil
	}
	a, err := netip.ParseAddr(v)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("--bind %q: want ADDR or ADDR:PORT", v)
	}
	return netip.AddrPortFrom(a, 0), nil
}

// inferInput reads --input or makes --size random bytes, and checks the
// size against a built-in model.
func inferInput(c *ucli.Context, name string) ([]byte, error) {
	var in []byte
	switch file, size := c.String("input"), c.String("size"); {
	case file != "" && size != "":
		return nil, errors.New("infer: give --input or --size, not both")
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--input: %w", err)
		}
		in = b
	case size != "":
		n, err := farmem.ParseSize(size)
		if err != nil || n <= 0 || n > 1<<32-1 {
			return nil, fmt.Errorf("--size %q: want a positive number of bytes below 4 GiB, e.g. 4096 or 1MiB", size)
		}
		in = make([]byte, n)
		rng := rand.New(rand.NewPCG(c.Uint64("seed"), 0))
		if name == "mlp" {
			// Rows of float32 in [-1, 1): random bytes would be NaNs
			// and infinities half the time, which no tolerance checks.
			for i := 0; i+4 <= len(in); i += 4 {
				binary.LittleEndian.PutUint32(in[i:], math.Float32bits(2*rng.Float32()-1))
			}
			break
		}
		for i := range in {
			in[i] = byte(rng.Uint32())
		}
	default:
		return nil, errors.New("infer: give an input: --input FILE or --size N (see 'lovelock infer --help')")
	}
	if m, err := model.Builtin(name); err == nil {
		if err := m.Check(len(in)); err != nil {
			return nil, fmt.Errorf("infer: %w", err)
		}
	}
	return in, nil
}

func printInfer(w io.Writer, r *inferReport) {
	fmt.Fprintf(w, "%s, model %s, tenant %d, %d-byte input\n", r.DPU, r.Model, r.Tenant, r.Size)
	st := r.Client
	if res := r.Result; res != nil {
		out := res.Output
		more := ""
		if len(out) > 32 {
			out, more = out[:32], fmt.Sprintf("... (%d bytes)", len(res.Output))
		}
		fmt.Fprintf(w, "output:  %x%s\n", out, more)
		if res.GPU >= 0 { // the gRPC front end does not say where it ran
			fmt.Fprintf(w, "ran on:  GPU %d, slice %s; queued %v on the DPU, %v on the device\n", res.GPU, dash(res.Slice), res.Queued, res.Device)
		}
		fmt.Fprintf(w, "latency: %v (%d retransmissions)\n", res.Latency.Round(time.Microsecond), st.Retransmissions)
	}
	if r.Error != "" {
		fmt.Fprintf(w, "error:   %s\n", r.Error)
	}
	if l := r.Load; l != nil {
		tw := newTable(w)
		fmt.Fprintln(tw, "SENT\tOK\tFAILED\tDROPPED\tDEADLINE MISSES\tWRONG\tREQ/S\tMB/S\tP50\tP90\tP99\tMAX\tRETRANSMITS")
		rd := func(d time.Duration) string {
			if l.OK == 0 {
				return "-" // no latency was measured: no request completed
			}
			return d.Round(time.Microsecond).String()
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\t%.0f\t%.1f\t%s\t%s\t%s\t%s\t%d\n", l.Sent, l.OK, l.Failures(), l.Dropped, l.DeadlineMisses, l.Wrong,
			l.Throughput, l.MBps, rd(l.Latency.P50), rd(l.Latency.P90), rd(l.Latency.P99), rd(l.Latency.Max), l.Retransmissions)
		_ = tw.Flush()
		for _, k := range slices.Sorted(maps.Keys(l.Failed)) {
			fmt.Fprintf(w, "failed %s: %d\n", k, l.Failed[k])
		}
		if l.FirstError != "" {
			fmt.Fprintf(w, "first error: %s\n", l.FirstError)
		}
		fmt.Fprintf(w, "elapsed %v\n", l.Elapsed.Round(time.Millisecond))
	}
	if r.Check != "" {
		fmt.Fprintf(w, "check:   %s\n", r.Check)
	}
	if st.Malformed+st.Stale+st.Foreign+st.Ignored > 0 {
		fmt.Fprintf(w, "datagrams ignored: %d malformed, %d stale, %d results from another address than the DPU's, %d other\n", st.Malformed, st.Stale, st.Foreign, st.Ignored)
	}
}

// inferGRPC sends one request through the KServe v2 front end, as a stock
// Triton or KServe client would.
func inferGRPC(c *ucli.Context, addr, name string, input []byte, check func(in, out []byte) error, asJSON bool) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(kserve.DefaultMaxRecvMsgSize), grpc.MaxCallRecvMsgSize(kserve.DefaultMaxRecvMsgSize)))
	if err != nil {
		return fmt.Errorf("infer: --grpc %s: %w", addr, err)
	}
	defer conn.Close()
	ctx := c.Context
	if d := c.Duration("deadline"); d > 0 {
		var cancel func()
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	tenant, _ := uint32Flag(c, "tenant") // in range: inferFlagsInRange
	rep := inferReport{DPU: addr, Model: name, Tenant: tenant, Size: len(input)}
	t0 := time.Now()
	out, err := kserve.Infer(ctx, conn, name, tenant, input, agent.ModelInfo(name))
	var failure error
	if err != nil {
		rep.Error = err.Error()
		failure = fmt.Errorf("infer: %w", inferExplain(err))
	} else {
		rep.Result = &inferResult{Output: out, GPU: -1, Latency: time.Since(t0)}
		if check != nil {
			rep.Check = "ok"
			if err := check(input, out); err != nil {
				rep.Check = "wrong: " + err.Error()
				failure = fmt.Errorf("infer: output wrong: %w", err)
			}
		}
	}
	if asJSON {
		if err := writeJSON(c.App.Writer, rep); err != nil {
			return err
		}
	} else {
		printInfer(c.App.Writer, &rep)
	}
	return failure
}
