package wire

import (
	"bytes"
	"errors"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// isSentinel reports whether err wraps one of the package's sentinels.
func isSentinel(err error) bool {
	for _, s := range []error{ErrShortBuffer, ErrBadVersion, ErrBadLength, ErrUnknownType, ErrNotLovelock} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// TestParseFrame holds the Go frame parser to the verdicts parse.h gives the
// fixtures; cside_test.go runs the same fixtures through the C parser.
func TestParseFrame(t *testing.T) {
	for _, c := range frameCases() {
		t.Run(c.name, func(t *testing.T) {
			h, off, err := ParseFrame(c.frame, c.port)
			if got := StatusOf(err); got != c.want {
				t.Fatalf("status %v (%v), want %v", got, err, c.want)
			}
			if err != nil {
				if !isSentinel(err) {
					t.Errorf("error %v wraps no sentinel", err)
				}
				return
			}
			if off != c.off {
				t.Errorf("offset %d, want %d", off, c.off)
			}
			if got := h.append(nil); !bytes.Equal(got, c.frame[off:off+HeaderLen]) {
				t.Errorf("header re-encodes as % x, frame has % x", got, c.frame[off:off+HeaderLen])
			}
		})
	}
}

// BenchmarkParseFrame measures the Go frame parser against a baseline in the
// same run: gopacket's DecodingLayerParser over the same frame, which decodes
// every layer's fields and so does more work.
func BenchmarkParseFrame(b *testing.B) {
	o := udpOpts()
	o.vlan = true
	frame, _ := buildFrame(o, llBytes(TypeBundle, 0, 256))
	b.Run("wire", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := ParseFrame(frame, DefaultPort); err != nil {
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
