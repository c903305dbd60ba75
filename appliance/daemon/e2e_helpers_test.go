package daemon_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/testbed"
	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
)

var (
	buildOnce sync.Once
	daemonBin string
	buildErr  error
)

// lovelockdBinary builds lovelockd once per test binary.
func lovelockdBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "lovelockd-e2e-")
		if err != nil {
			buildErr = err
			return
		}
		daemonBin = filepath.Join(dir, "lovelockd")
		out, err := exec.Command("go", "build", "-o", daemonBin, "github.com/lovelock-dpu/lovelock/appliance/cmd/lovelockd").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build lovelockd: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return daemonBin
}

// bed brings up a testbed with a prefix unique to this test and tears it
// down at the end.
func bed(t *testing.T) testbed.Spec {
	t.Helper()
	testenv.RequirePriv(t)
	spec := testbed.DefaultSpec()
	spec.Prefix = fmt.Sprintf("lle%d%s-", os.Getpid()%100000, t.Name()[4:min(len(t.Name()), 8)])
	ctx := context.Background()
	t.Cleanup(func() {
		if err := testbed.Down(ctx, spec); err != nil {
			t.Errorf("testbed down: %v", err)
		}
	})
	if err := testbed.Up(ctx, spec); err != nil {
		t.Fatal(err)
	}
	return spec
}

// daemonProc is a lovelockd process running inside a testbed node.
type daemonProc struct {
	t      *testing.T
	spec   testbed.Spec
	node   string
	pinDir string
	state  string
	args   []string
	socket string
	cmd    *exec.Cmd
	log    *os.File
}

// startDaemon runs lovelockd in node with pins on a private bpffs, a private
// state file and socket, and extra args.
func startDaemon(t *testing.T, spec testbed.Spec, node string, extra ...string) *daemonProc {
	t.Helper()
	dir := t.TempDir()
	pinDir := filepath.Join(testenv.BPFFS(t), "lovelock")
	d := &daemonProc{
		t: t, spec: spec, node: node, socket: filepath.Join(dir, "api.sock"), pinDir: pinDir, state: filepath.Join(dir, "state.json"),
		args: append([]string{
			"--config", filepath.Join(dir, "none.yaml"),
			"--pin-dir", pinDir,
			"--state", filepath.Join(dir, "state.json"),
			"--socket", filepath.Join(dir, "api.sock"),
			"--metrics", "off",
		}, extra...),
	}
	// An empty config file: the flags say everything.
	if err := os.WriteFile(filepath.Join(dir, "none.yaml"), []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "lovelockd.log"))
	if err != nil {
		t.Fatal(err)
	}
	d.log = log
	t.Cleanup(func() {
		d.stop(syscall.SIGTERM)
		out, _ := os.ReadFile(log.Name())
		// GOFLAGS=-race builds lovelockd with the race detector too.
		if bytes.Contains(out, []byte("WARNING: DATA RACE")) {
			t.Errorf("lovelockd in %s: data race", node)
		}
		if t.Failed() {
			t.Logf("lovelockd log:\n%s", out)
		}
	})
	d.start()
	return d
}

func (d *daemonProc) start() {
	d.t.Helper()
	d.cmd = exec.Command(lovelockdBinary(d.t), d.args...)
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	// Fork from a thread inside the node: the child inherits its netns
	// (and keeps this mount namespace, so the test's bpffs is visible).
	if err := d.spec.Run(d.node, d.cmd.Start); err != nil {
		d.t.Fatalf("start lovelockd in %s: %v", d.node, err)
	}
	d.waitReady()
}

func (d *daemonProc) waitReady() {
	d.t.Helper()
	cl := api.NewClient(d.socket)
	// A start that upgrades the data plane loads every program through
	// the verifier: about 0.1 s alone, 16-18 s seen on a 2-core machine at
	// load 7-9. This bounds a hang, it measures nothing.
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cl.Status(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("lovelockd in %s not ready: %v", d.node, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop signals the daemon and waits for it.
func (d *daemonProc) stop(sig syscall.Signal) {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	d.cmd.Process.Signal(sig)
	d.cmd.Wait()
	d.cmd = nil
}

func (d *daemonProc) client() *api.Client { return api.NewClient(d.socket) }

// udpCounter counts datagrams arriving on a UDP port inside a node.
type udpCounter struct {
	conn *net.UDPConn
	n    atomic.Int64
	done chan struct{}
}

func listenUDP(t *testing.T, spec testbed.Spec, node string, port int) *udpCounter {
	t.Helper()
	u := &udpCounter{done: make(chan struct{})}
	err := spec.Run(node, func() error {
		var err error
		u.conn, err = net.ListenUDP("udp4", &net.UDPAddr{Port: port})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// SetReadBuffer is capped at rmem_max (a few hundred datagrams): a
	// receiver stalled for tens of ms on a loaded machine would overflow
	// it and the test count a loss that lovelockd did not cause. Root
	// (these tests need it) may force a larger one.
	if err := forceReadBuffer(u.conn, 32<<20); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(u.done)
		buf := make([]byte, 2048)
		for {
			if _, _, err := u.conn.ReadFromUDP(buf); err != nil {
				return
			}
			u.n.Add(1)
		}
	}()
	t.Cleanup(func() { u.conn.Close(); <-u.done })
	return u
}

// dialUDP opens a UDP socket in node towards addr:port from source port sport
// (0: any).
func dialUDP(t *testing.T, spec testbed.Spec, node, addr string, sport, port int) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := spec.Run(node, func() error {
		var err error
		var laddr *net.UDPAddr
		if sport != 0 {
			laddr = &net.UDPAddr{Port: sport}
		}
		c, err = net.DialUDP("udp4", laddr, &net.UDPAddr{IP: net.ParseIP(addr), Port: port})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// frameCounter counts frames carrying UDP to dport seen by an AF_PACKET
// socket on an interface inside a node.
type frameCounter struct {
	fd   int
	n    atomic.Int64
	done chan struct{}
}

func countFrames(t *testing.T, spec testbed.Spec, node, iface string, dport uint16) *frameCounter {
	t.Helper()
	f := &frameCounter{done: make(chan struct{})}
	err := spec.Run(node, func() error {
		l, err := netlink.LinkByName(iface)
		if err != nil {
			return err
		}
		proto := int(htons(unix.ETH_P_ALL))
		f.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return err
		}
		unix.SetsockoptInt(f.fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
		unix.SetsockoptTimeval(f.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100000})
		return unix.Bind(f.fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: l.Attrs().Index})
	})
	if err != nil {
		t.Fatal(err)
	}
	var closed atomic.Bool
	go func() {
		defer close(f.done)
		buf := make([]byte, 2048)
		for !closed.Load() {
			n, _, err := unix.Recvfrom(f.fd, buf, 0)
			if err != nil {
				continue
			}
			if udpDport(buf[:n]) == dport {
				f.n.Add(1)
			}
		}
	}()
	t.Cleanup(func() { closed.Store(true); <-f.done; unix.Close(f.fd) })
	return f
}

// udpDport returns the UDP destination port of an untagged IPv4 frame, or 0.
func udpDport(f []byte) uint16 {
	if len(f) < 14+20+8 || binary.BigEndian.Uint16(f[12:]) != 0x0800 || f[23] != 17 {
		return 0
	}
	ihl := int(f[14]&0xf) * 4
	if len(f) < 14+ihl+8 {
		return 0
	}
	return binary.BigEndian.Uint16(f[14+ihl+2:])
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// passOnPeer attaches the xdp_pass program to iface in node: veth delivers
// XDP_REDIRECTed frames only to a peer that runs an XDP program. The
// testbed does so itself on the peers of DPU ports; then this keeps it.
func passOnPeer(t *testing.T, spec testbed.Spec, node, iface string) {
	t.Helper()
	s, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = spec.Run(node, func() error {
		l, err := netlink.LinkByName(iface)
		if err != nil {
			return err
		}
		if x := l.Attrs().Xdp; x != nil && x.Attached {
			// The testbed attached xdp_pass there already (docs/testbed.md).
			return nil
		}
		xl, err := link.AttachXDP(link.XDPOptions{Program: s.XDPPass, Interface: l.Attrs().Index})
		if err != nil {
			return err
		}
		t.Cleanup(func() { xl.Close() })
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// hostClients starts a messaging client "app" of cluster on host0 (agent
// dpu0) and on host1 (agent dpu1), closed when the test ends.
func hostClients(t *testing.T, spec testbed.Spec, cluster string) map[string]*messaging.Client {
	t.Helper()
	cfg, err := messaging.LoadConfig(cluster)
	if err != nil {
		t.Fatal(err)
	}
	clients := map[string]*messaging.Client{}
	for host, node := range map[string]string{"host0": "dpu0", "host1": "dpu1"} {
		err := spec.Run(host, func() error {
			c, err := messaging.NewClient(cfg, node, "app", messaging.ClientOptions{})
			clients[host] = c
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { clients[host].Close() })
	}
	return clients
}

// scrapeMetrics returns lovelockd's Prometheus text from addr on node.
func scrapeMetrics(t *testing.T, spec testbed.Spec, node, addr string) []byte {
	t.Helper()
	var metrics []byte
	err := spec.Run(node, func() error {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		fmt.Fprint(c, "GET /metrics HTTP/1.0\r\n\r\n")
		metrics, err = io.ReadAll(c)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return metrics
}

// forceReadBuffer sets c's receive buffer to n bytes past rmem_max
// (SO_RCVBUFFORCE, which needs CAP_NET_ADMIN).
func forceReadBuffer(c *net.UDPConn, n int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, n)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("SO_RCVBUFFORCE %d: %w", n, serr)
	}
	return nil
}
