package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
)

func TestReorderArgs(t *testing.T) {
	app := App(&bytes.Buffer{}, &bytes.Buffer{})
	for _, c := range []struct{ in, want string }{
		{"lovelock iface attach p0 --hook tc-ingress", "lovelock iface attach --hook tc-ingress p0"},
		{"lovelock iface attach p0 --hook=tc-ingress --mode clsact", "lovelock iface attach --hook=tc-ingress --mode clsact p0"},
		{"lovelock --socket /s iface detach p0 --all", "lovelock --socket /s iface detach --all p0"},
		{"lovelock rule del web --help", "lovelock rule del --help web"},
		{"lovelock testbed exec host0 -- ping -c 1 x", "lovelock testbed exec host0 -- ping -c 1 x"},
		{"lovelock testbed exec host0 ping -c 1", "lovelock testbed exec host0 ping -c 1"},
		{"lovelock image inspect f.bfb -- --odd", "lovelock image inspect f.bfb -- --odd"},
		{"lovelock plan", "lovelock plan"},
	} {
		if got := strings.Join(reorderArgs(app, strings.Fields(c.in)), " "); got != c.want {
			t.Errorf("%s\n got %s\nwant %s", c.in, got, c.want)
		}
	}
}

// TestFlagsAfterArguments runs `iface attach IFACE --hook tc-ingress`, as
// the docs write it, against a fake daemon: the flag reaches the command.
func TestFlagsAfterArguments(t *testing.T) {
	svc := &fakeService{}
	sock := serveFake(t, svc)
	var out, errOut bytes.Buffer
	err := Run(context.Background(), App(&out, &errOut), []string{"lovelock", "--socket", sock, "iface", "attach", "p0", "--hook", "tc-ingress"})
	if err != nil {
		t.Fatalf("flags after the argument: %v", err)
	}
	if len(svc.attached) != 1 || svc.attached[0].Iface != "p0" || string(svc.attached[0].Hook) != "tc-ingress" {
		t.Errorf("attached %+v, want p0 tc-ingress", svc.attached)
	}
}

// TestUsageErrorsAreShort: a bad or missing flag is one line naming the
// command and its --help, not the whole help.
func TestUsageErrorsAreShort(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"rule", "add", "--name", "a", "--priority", "x", "--action", "drop"}, "lovelock rule add: invalid value \"x\" for flag -priority"},
		{[]string{"rule", "add", "--name", "a"}, "lovelock rule add: missing --action; see 'lovelock rule add --help'"},
		{[]string{"rule", "add"}, "lovelock rule add: missing --name, --action; see 'lovelock rule add --help'"},
		{[]string{"graph", "gen"}, "lovelock graph gen: missing --scale, --out; see 'lovelock graph gen --help'"},
		{[]string{"stats", "--frobnicate"}, "lovelock stats: flag provided but not defined: -frobnicate; see 'lovelock stats --help'"},
		{[]string{"--frobnicate"}, "flag provided but not defined: -frobnicate"},
	} {
		var out bytes.Buffer
		err := Run(context.Background(), App(&out, &out), append([]string{"lovelock"}, c.args...))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want %q", c.args, err, c.want)
		}
		if strings.Contains(out.String(), "USAGE:") || strings.Contains(out.String(), "Incorrect Usage") {
			t.Errorf("%v: printed the help:\n%s", c.args, out.String())
		}
	}
}

// TestErrorLine: lovelock's error line names lovelock once.
func TestErrorLine(t *testing.T) {
	for _, c := range []struct{ err, want string }{
		{"lovelock rules: unknown command \"aply\"; see 'lovelock rules --help'", "lovelock rules: unknown command \"aply\"; see 'lovelock rules --help'"},
		{"infer: --mtu 10: want 0", "lovelock: infer: --mtu 10: want 0"},
		{"lovelockd is not running", "lovelock: lovelockd is not running"},
	} {
		if got := ErrorLine(errors.New(c.err)); got != c.want {
			t.Errorf("ErrorLine(%q) = %q, want %q", c.err, got, c.want)
		}
	}
}

func TestExplainPermission(t *testing.T) {
	for _, err := range []error{
		&net.OpError{Op: "dial", Net: "unix", Err: &os.SyscallError{Syscall: "connect", Err: syscall.EACCES}},
		fmt.Errorf("interface p0: %w", syscall.EPERM),
		&fs.PathError{Op: "open", Path: "/sys/fs/bpf", Err: syscall.EACCES},
		fmt.Errorf("lovelockd API: root only"),
	} {
		got := explain(err, 1000)
		if !strings.Contains(got.Error(), err.Error()) || !strings.Contains(got.Error(), "this needs root") {
			t.Errorf("explain(%v) = %v", err, got)
		}
		if explain(err, 0) != err {
			t.Errorf("as root, %v was changed", err)
		}
	}
	if other := fmt.Errorf("no such rule"); explain(other, 1000) != other {
		t.Error("an unrelated error was changed")
	}
}

// TestCaptureReadTruncated: a frame cut inside its IP header prints the
// layer and the error, not "<nil>-><nil>".
func TestCaptureReadTruncated(t *testing.T) {
	f := []byte{2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 8, 0, 0x45, 0, 0, 28, 0, 0}
	var pc bytes.Buffer
	w := pcapgo.NewWriter(&pc)
	if err := w.WriteFileHeader(65536, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	if err := w.WritePacket(gopacket.CaptureInfo{Timestamp: time.Unix(0, 0), CaptureLength: len(f), Length: 42}, f); err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() + "/t.pcap"
	if err := os.WriteFile(path, pc.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := printPcap(&out, path); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); strings.Contains(s, "<nil>") || !strings.Contains(s, "Invalid ip4 header") || !strings.Contains(s, "captured 20 of 42 bytes") {
		t.Errorf("truncated frame printed as %q", s)
	}
}

// TestCaptureNotHere: an interface of another namespace points to
// `lovelock testbed exec`.
func TestCaptureNotHere(t *testing.T) {
	dir := t.TempDir()
	// ll-x-host0 is another testbed's node, not one called x-host0.
	for _, name := range []string{"ll-dpu0", "ll-x-host0"} {
		if err := os.WriteFile(dir+"/"+name, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := netnsDir
	netnsDir = dir
	defer func() { netnsDir = old }()
	var out bytes.Buffer
	err := Run(context.Background(), App(&out, &out), []string{"lovelock", "capture", "--iface", "no-such-p0", "-w", t.TempDir() + "/x.pcap"})
	if err == nil || !strings.Contains(err.Error(), "not in this network namespace") ||
		!strings.Contains(err.Error(), "lovelock testbed exec dpu0 -- lovelock capture --iface no-such-p0") ||
		strings.Contains(err.Error(), "x-host0") {
		t.Errorf("capture on a missing interface: %v", err)
	}
}
