package wirelayer

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// serialize builds Ethernet [/802.1Q] / IPv4 or IPv6 / UDP / Lovelock /
// payload with gopacket.
func serialize(t testing.TB, vlan, ipv6 bool, dport uint16, ll *Lovelock, payload []byte, opts gopacket.SerializeOptions) []byte {
	t.Helper()
	eth := &layers.Ethernet{
		SrcMAC:       net.HardwareAddr{2, 0, 0, 0, 0, 1},
		DstMAC:       net.HardwareAddr{2, 0, 0, 0, 0, 2},
		EthernetType: layers.EthernetTypeIPv4,
	}
	udp := &layers.UDP{SrcPort: 40000, DstPort: layers.UDPPort(dport)}
	var ls []gopacket.SerializableLayer
	ls = append(ls, eth)
	l3 := layers.EthernetTypeIPv4
	if ipv6 {
		l3 = layers.EthernetTypeIPv6
	}
	if vlan {
		eth.EthernetType = layers.EthernetTypeDot1Q
		ls = append(ls, &layers.Dot1Q{VLANIdentifier: 100, Type: l3})
	} else {
		eth.EthernetType = l3
	}
	if ipv6 {
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP,
			SrcIP: net.ParseIP("fd00::1"), DstIP: net.ParseIP("fd00::2")}
		if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
			t.Fatal(err)
		}
		ls = append(ls, ip)
	} else {
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP,
			SrcIP: net.IPv4(10, 0, 0, 1), DstIP: net.IPv4(10, 0, 0, 2),
			Options: []layers.IPv4Option{{OptionType: 1}, {OptionType: 1}, {OptionType: 1}, {OptionType: 1}}}
		if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
			t.Fatal(err)
		}
		ls = append(ls, ip)
	}
	ls = append(ls, udp, ll, gopacket.Payload(payload))
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, opts, ls...); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestLayerRoundTrip(t *testing.T) {
	Register()
	payload := []byte("far memory page, or part of one")
	for _, tc := range []struct {
		name       string
		vlan, ipv6 bool
	}{
		{"ipv4", false, false},
		{"ipv6", false, true},
		{"vlan-ipv4", true, false},
		{"vlan-ipv6", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := wire.Header{Version: wire.Version, Type: wire.TypeMemReply, Flags: wire.FlagMore | 0x0400,
				Tenant: 77, Src: 3, Dst: 4, Seq: 0xfffffffe}
			ll := &Lovelock{Header: want}
			frame := serialize(t, tc.vlan, tc.ipv6, wire.DefaultPort, ll, payload,
				gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true})
			want.Length = uint32(len(payload))
			if ll.Length != want.Length {
				t.Errorf("FixLengths left Length %d, want %d", ll.Length, want.Length)
			}

			pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
			if el := pkt.ErrorLayer(); el != nil {
				t.Fatalf("decode error: %v", el.Error())
			}
			got, ok := pkt.Layer(LayerType).(*Lovelock)
			if !ok {
				t.Fatalf("no Lovelock layer in %v", pkt)
			}
			if got.Header != want {
				t.Errorf("header %+v, want %+v", got.Header, want)
			}
			if !bytes.Equal(got.LayerPayload(), payload) {
				t.Errorf("payload %q, want %q", got.LayerPayload(), payload)
			}
			if app := pkt.ApplicationLayer(); app == nil || !bytes.Equal(app.Payload(), payload) {
				t.Errorf("application layer %v, want payload %q", app, payload)
			}
			if tc.vlan && pkt.Layer(layers.LayerTypeDot1Q) == nil {
				t.Error("no 802.1Q layer")
			}

			// The same frame through the Go frame parser, and through a
			// DecodingLayerParser with no allocation per layer.
			fr, err := wire.ParseFrame(frame, wire.DefaultPort)
			if err != nil || fr.Header != want || !bytes.Equal(frame[fr.Offset+wire.HeaderLen:], payload) {
				t.Errorf("ParseFrame = %+v, %v", fr, err)
			}
			wantFlow := wire.Flow{Family: 4, Proto: 17, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"),
				Sport: 40000, Dport: wire.DefaultPort, Type: want.Type, Tenant: want.Tenant, Rank: want.Dst}
			if tc.ipv6 {
				wantFlow.Family, wantFlow.Src, wantFlow.Dst = 6, netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
			}
			if fr.Flow != wantFlow {
				t.Errorf("ParseFrame flow %+v, want %+v", fr.Flow, wantFlow)
			}
			var (
				eth  layers.Ethernet
				dot  layers.Dot1Q
				ip4  layers.IPv4
				ip6  layers.IPv6
				udp  layers.UDP
				lovl Lovelock
				pl   gopacket.Payload
			)
			p := gopacket.NewDecodingLayerParser(layers.LayerTypeEthernet, &eth, &dot, &ip4, &ip6, &udp, &lovl, &pl)
			var decoded []gopacket.LayerType
			if err := p.DecodeLayers(frame, &decoded); err != nil {
				t.Fatalf("DecodeLayers: %v (decoded %v)", err, decoded)
			}
			if decoded[len(decoded)-2] != LayerType || lovl.Header != want {
				t.Errorf("DecodingLayerParser: %v, %+v", decoded, lovl.Header)
			}
		})
	}
}

func TestLayerMalformed(t *testing.T) {
	Register()
	// Without FixLengths, SerializeTo writes Length as it is.
	ll := &Lovelock{Header: wire.Header{Version: wire.Version, Type: wire.TypePing, Length: 1}}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{}, ll, gopacket.Payload("xy")); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, wire.HeaderLen)
	ll.Header.Put(want)
	if !bytes.Equal(buf.Bytes()[:wire.HeaderLen], want) || ll.Length != 1 {
		t.Fatalf("SerializeTo without FixLengths: % x, Length %d", buf.Bytes(), ll.Length)
	}

	ll = &Lovelock{Header: wire.Header{Version: wire.Version, Type: wire.TypePing}}
	frame := serialize(t, false, false, wire.DefaultPort, ll, []byte("xy"), gopacket.SerializeOptions{FixLengths: true})
	fr, err := wire.ParseFrame(frame, wire.DefaultPort)
	if err != nil {
		t.Fatal(err)
	}
	frame[fr.Offset+wire.OffsetLength+3] = 1 // claims 1 payload byte, has 2
	pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	el := pkt.ErrorLayer()
	if el == nil || !errors.Is(el.Error(), wire.ErrBadLength) {
		t.Fatalf("error layer %v, want one wrapping ErrBadLength", el)
	}
	if pkt.Layer(LayerType) != nil {
		t.Error("malformed header decoded as a Lovelock layer")
	}

	var l Lovelock
	df := &feedback{}
	if err := l.DecodeFromBytes(make([]byte, 10), df); !errors.Is(err, wire.ErrShortBuffer) || !df.truncated {
		t.Errorf("short buffer: err %v, truncated %v", err, df.truncated)
	}
}

type feedback struct{ truncated bool }

func (f *feedback) SetTruncated() { f.truncated = true }

func TestRegisterPort(t *testing.T) {
	const port = 61441
	payload := []byte{1, 2, 3}
	frame := serialize(t, false, false, port, &Lovelock{Header: wire.Header{Version: wire.Version, Type: wire.TypePong}},
		payload, gopacket.SerializeOptions{FixLengths: true})
	if pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default); pkt.Layer(LayerType) != nil {
		t.Fatalf("port %d decodes as Lovelock before RegisterPort", port)
	}
	RegisterPort(port)
	pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	l, ok := pkt.Layer(LayerType).(*Lovelock)
	if !ok || l.Type != wire.TypePong || !bytes.Equal(l.Payload, payload) {
		t.Fatalf("after RegisterPort(%d): %v", port, pkt)
	}
}

func TestLayerTypeRegistered(t *testing.T) {
	Register()
	Register() // a second call is harmless (gopacket panics on a second registration of a number)
	if LayerType.String() != "Lovelock" {
		t.Errorf("LayerType = %q", LayerType.String())
	}
	if got := layers.UDPPort(wire.DefaultPort).LayerType(); got != LayerType {
		t.Errorf("UDP port %d decodes as %v", wire.DefaultPort, got)
	}
}

// TestLayerNotRegisteredOnImport: a program that imports wire but never
// calls RegisterLayer (lovelockd) leaves gopacket's tables alone. It runs
// in a fresh process, since this one's tests register the layer.
func TestLayerNotRegisteredOnImport(t *testing.T) {
	if os.Getenv("WIRE_UNREGISTERED_CHILD") == "1" {
		if name := LayerType.String(); name == "Lovelock" {
			t.Fatalf("layer type %d is registered as %q at start-up", layerTypeNumber, name)
		}
		if got := layers.UDPPort(wire.DefaultPort).LayerType(); got == LayerType {
			t.Fatalf("UDP port %d decodes as Lovelock at start-up", wire.DefaultPort)
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestLayerNotRegisteredOnImport$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "WIRE_UNREGISTERED_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("--- PASS: TestLayerNotRegisteredOnImport")) {
		t.Fatalf("child ran no check:\n%s", out)
	}
}

// FuzzLayer: the layer decodes exactly what wire.Decode accepts, to the same
// header, payload and contents, and fails with the same status otherwise.
// The seed corpus (testdata/fuzz/FuzzLayer) is wire's FuzzDecode corpus.
func FuzzLayer(f *testing.F) {
	f.Add(wire.Header{Version: wire.Version, Type: wire.TypeBundle, Flags: wire.FlagAckReq}.AppendTo(nil, []byte{1, 2, 3}))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, payload, err := wire.Decode(b)
		var l Lovelock
		lerr := l.DecodeFromBytes(b, &feedback{})
		if wire.StatusOf(lerr) != wire.StatusOf(err) {
			t.Fatalf("Decode: %v; Lovelock.DecodeFromBytes: %v", err, lerr)
		}
		if err != nil {
			return
		}
		if l.Header != h || !bytes.Equal(l.LayerPayload(), payload) || !bytes.Equal(l.LayerContents(), b[:wire.HeaderLen]) {
			t.Fatalf("layer decoded %+v, Decode %+v", l.Header, h)
		}
	})
}

// BenchmarkParseFrame measures wire.ParseFrame against a baseline in the
// same run: gopacket's DecodingLayerParser over the same frame (802.1Q,
// IPv4, UDP, a Lovelock header and 256 payload bytes), which decodes every
// layer's fields and so does more work.
func BenchmarkParseFrame(b *testing.B) {
	frame := serialize(b, true, false, wire.DefaultPort, &Lovelock{Header: wire.Header{Version: wire.Version, Type: wire.TypeBundle}},
		make([]byte, 256), gopacket.SerializeOptions{FixLengths: true})
	b.Run("wire", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := wire.ParseFrame(frame, wire.DefaultPort); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("baseline=gopacket.DecodingLayerParser", func(b *testing.B) {
		var (
			eth  layers.Ethernet
			dot  layers.Dot1Q
			ip4  layers.IPv4
			ip6  layers.IPv6
			udp  layers.UDP
			lovl Lovelock
			pl   gopacket.Payload
		)
		p := gopacket.NewDecodingLayerParser(layers.LayerTypeEthernet, &eth, &dot, &ip4, &ip6, &udp, &lovl, &pl)
		decoded := make([]gopacket.LayerType, 0, 8)
		b.ReportAllocs()
		for b.Loop() {
			if err := p.DecodeLayers(frame, &decoded); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestNotInLovelockd: the daemon, which imports dataplane/wire and never
// decodes captures, links neither this package nor gopacket (about 6 MB of
// its binary when wire held the layer).
func TestNotInLovelockd(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/lovelock-dpu/lovelock/appliance/cmd/lovelockd").Output()
	if err != nil {
		t.Fatalf("go list -deps lovelockd: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/lovelock-dpu/lovelock/dataplane/wire") {
		t.Fatalf("lovelockd does not import dataplane/wire any more; this test guards nothing: %v", deps)
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "github.com/gopacket/") || strings.HasSuffix(d, "/wirelayer") {
			t.Errorf("lovelockd links %s", d)
		}
	}
}
