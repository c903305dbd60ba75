package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
	"github.com/lovelock-dpu/lovelock/dataplane/wire/wirelayer"
)

// lovelockFrame builds an Ethernet/IPv4/UDP frame carrying a Lovelock ping.
func lovelockFrame(t *testing.T, seq uint32) []byte {
	t.Helper()
	eth := &layers.Ethernet{SrcMAC: []byte{2, 0, 0, 0, 0, 1}, DstMAC: []byte{2, 0, 0, 0, 0, 2}, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: []byte{10, 0, 0, 1}, DstIP: []byte{10, 0, 0, 2}}
	udp := &layers.UDP{SrcPort: 40000, DstPort: layers.UDPPort(wire.DefaultPort)}
	udp.SetNetworkLayerForChecksum(ip)
	ll := &wirelayer.Lovelock{Header: wire.Header{Version: wire.Version, Type: wire.TypePing, Tenant: 4, Seq: seq}}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, ip, udp, ll, gopacket.Payload("hi")); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestCaptureRoundTrip captures real frames off a veth into a pcap file and
// reads it back with the Lovelock layer decoded.
func TestCaptureRoundTrip(t *testing.T) {
	ns := testenv.NewNetNS(t)
	pcap := t.TempDir() + "/out.pcap"
	var out bytes.Buffer
	aIndex, _ := testenv.VethPair(t, testenv.VethEnd{NS: ns, Name: "a"}, testenv.VethEnd{NS: ns, Name: "b"})
	testenv.InNetNS(t, ns, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		// Keep sending until the capture has what it needs: it opens its
		// socket only once the command runs.
		frame := lovelockFrame(t, 1)
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: aIndex, Halen: 6})
			}
		}()
		app := App(&out, &out)
		return app.Run([]string{"lovelock", "capture", "--iface", "b", "-c", "5", "--timeout", "10s", "-w", pcap})
	})
	if !strings.Contains(out.String(), "captured 5 frames") {
		t.Fatalf("capture output: %q", out.String())
	}
	out.Reset()
	if err := App(&out, &out).Run([]string{"lovelock", "capture", "-r", pcap}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	n := 0
	for _, l := range lines {
		if strings.Contains(l, "Lovelock v1 ping") && strings.Contains(l, "tenant=4") {
			n++
		}
	}
	// IPv6 router solicitations and the like may be captured too.
	if n == 0 {
		t.Errorf("no decoded Lovelock frames in:\n%s", out.String())
	}
}

func TestCaptureUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"capture"}, "give --iface and --write"},
		{[]string{"capture", "-r", "x.pcap", "--iface", "b"}, "takes no --iface"},
		{[]string{"capture", "--iface", "b", "-w", "x", "-c", "0"}, "--count 0"},
		// Before, a negative timeout meant no limit at all.
		{[]string{"capture", "--iface", "b", "-w", "x", "--timeout", "-1s"}, "--timeout -1s"},
		{[]string{"capture", "-r", "/nonexistent.pcap"}, "no such file"},
	} {
		var out bytes.Buffer
		err := App(&out, &out).Run(append([]string{"lovelock"}, tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want it to mention %q", tc.args, err, tc.want)
		}
	}
}
