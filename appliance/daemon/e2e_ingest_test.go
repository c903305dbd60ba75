package daemon_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/agent"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/client"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/hostagent"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/kserve"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
)

// TestIngest: accelerator ingest on the testbed: lovelockd runs the ingest
// agent on dpu2 (AF_XDP on p0, gRPC front end) and the GPU host agent on
// gpu0 (a shared-memory GPU); a client in the client node sends inputs of
// every size over the Lovelock protocol and gRPC and gets exact results;
// gpu0's lovelockd restarts and the DPU maps its new buffers.
func TestIngest(t *testing.T) {
	spec := bed(t)
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// lovelockd's API socket is in a directory of its own here, so the
	// host's handle socket is named (the default is that directory).
	dpu := startDaemon(t, spec, "dpu2", "--xdp", "p0", "--config", file("dpu2.yaml", fmt.Sprintf(`
ingest:
  listen: "10.77.0.12:61440"
  host_listen: "10.77.12.2:61441"
  host_socket: %q
  grpc: "10.77.0.12:8001"
  transport: xdp
  interfaces: [p0]
  models: [{name: checksum}, {name: mlp}]
  tenants: [{id: 1, models: [checksum, mlp]}]
`, filepath.Join(dir, "ingest.sock"))))
	host := startDaemon(t, spec, "gpu0", "--config", file("gpu0.yaml", fmt.Sprintf(`
ingest_host:
  listen: "10.77.12.1:61441"
  dpu: "10.77.12.2:61441"
  gpus: [{card: H100-80GB}]
  socket: %q
  models: [checksum, mlp]
`, filepath.Join(dir, "ingest.sock"))))
	registered := func(epoch string) bool {
		var st agent.Stats
		return dpu.client().ServiceStats(context.Background(), "ingest", &st) == nil && st.Host != nil && (epoch == "" || st.Host.Epoch != epoch)
	}
	eventually(t, "gpu0 registered with dpu2", func() bool { return registered("") })
	svcs, err := dpu.client().Services(context.Background())
	if err != nil || len(svcs) != 1 || svcs[0].State != api.ServiceRunning || !strings.Contains(svcs[0].Binding, "AF_XDP on p0") {
		t.Fatalf("dpu2's services %+v, %v: want ingest running on AF_XDP on p0", svcs, err)
	}

	var tr *udp.Conn
	if err := spec.Run("client", func() (err error) {
		tr, err = udp.Listen(netip.MustParseAddrPort("10.77.0.30:0"), udp.Options{MaxPayload: udp.MaxPayloadForMTU(1500, false)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	cl, err := client.New(tr, netip.MustParseAddrPort("10.77.0.12:61440"), client.Options{Tenant: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rng := rand.New(rand.NewPCG(1, 2))
	input := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	check := func(what string) {
		t.Helper()
		for _, n := range []int{1, 1472, 100000, 3 << 20} {
			in := input(n)
			res, err := cl.Infer(ctx, "checksum", in, 0)
			if want := model.Checksum(in); err != nil || !bytes.Equal(res.Output, want[:]) {
				t.Fatalf("%s: checksum of %d bytes: %v", what, n, err)
			}
		}
	}
	check("first")

	// The MLP over gRPC, dialled from the client node.
	conn, err := grpc.NewClient("10.77.0.12:8001", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (c net.Conn, err error) {
			err = spec.Run("client", func() (err error) { c, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr); return })
			return
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	x := input(64 * model.MLPIn * 4)
	for i := 0; i < len(x); i += 4 { // finite floats in [-1, 1)
		copy(x[i:], f32(rng.Float32()*2-1))
	}
	out, err := kserve.Infer(ctx, conn, "mlp", 1, x, agent.ModelInfo("mlp"))
	m, _ := model.Builtin("mlp")
	want := make([]byte, m.OutputSize(len(x)))
	m.Reference(x, want)
	if err != nil || !bytes.Equal(out, want) {
		t.Fatalf("mlp over gRPC: %v", err)
	}
	if _, err := kserve.Infer(ctx, conn, "mlp", 2, x, agent.ModelInfo("mlp")); ingest.StatusOf(err) != ingest.StatusNotGranted {
		t.Errorf("tenant 2 over gRPC: %v, want not-granted", err)
	}

	// gpu0's lovelockd restarts: a new epoch, new buffers.
	var before agent.Stats
	if err := dpu.client().ServiceStats(ctx, "ingest", &before); err != nil {
		t.Fatal(err)
	}
	host.stop(syscall.SIGTERM)
	host.start()
	eventually(t, "gpu0's new epoch registered", func() bool { return registered(before.Host.Epoch) })
	check("after gpu0 restarted")

	var st agent.Stats
	if err := dpu.client().ServiceStats(ctx, "ingest", &st); err != nil {
		t.Fatal(err)
	}
	if st.Completed < 9 || st.Registrations != 2 || st.InFlight != 0 {
		t.Errorf("dpu2's agent: %d completed, %d registrations, %d in flight", st.Completed, st.Registrations, st.InFlight)
	}
	var hs hostagent.Stats
	if err := host.client().ServiceStats(ctx, "ingest_host", &hs); err != nil || hs.Completed < 4 || !hs.Registered {
		t.Errorf("gpu0's host agent after restart: %+v, %v", hs, err)
	}
}

func f32(f float32) []byte {
	var b [4]byte
	u := math.Float32bits(f)
	b[0], b[1], b[2], b[3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
	return b[:]
}
