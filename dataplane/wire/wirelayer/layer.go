// Package wirelayer is the gopacket layer of the Lovelock header
// (dataplane/wire owns the format; this package only adapts it to gopacket).
// It is a package of its own so that only programs that build or decode
// packets with gopacket (lovelock's capture and testbed traffic, tests) link
// gopacket: lovelockd imports dataplane/wire and carries none of it.
//
// Importing it registers nothing. Register (or RegisterPort) makes gopacket
// decode Lovelock headers; serializing a Lovelock layer and decoding one with
// a DecodingLayerParser need no registration.
package wirelayer

import (
	"sync"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// layerTypeNumber is LayerType's number: "LL" in ASCII, outside gopacket's
// reserved 0-999 and its shared application range 1000-1999.
const layerTypeNumber = 0x4c4c

// LayerType is the gopacket layer type of the Lovelock header. Its number is
// fixed; gopacket learns its name and decoder, and UDP to wire.DefaultPort
// decodes as it, once Register has run.
const LayerType = gopacket.LayerType(layerTypeNumber)

var registerOnce sync.Once

// Register registers LayerType with gopacket (its name and its decoder) and
// makes UDP to or from wire.DefaultPort decode as Lovelock. Programs that
// decode captures call it (lovelock capture, tests); importing the package
// changes no gopacket table, and no other package's use of the layer number
// can collide with ours at start-up. It may be called more than once;
// gopacket keeps its tables in unsynchronised global maps, so call it during
// start-up, before any goroutine decodes packets.
func Register() {
	registerOnce.Do(func() {
		gopacket.RegisterLayerType(layerTypeNumber, gopacket.LayerTypeMetadata{
			Name:    "Lovelock",
			Decoder: gopacket.DecodeFunc(decodeLovelock),
		})
		layers.RegisterUDPPortLayerType(layers.UDPPort(wire.DefaultPort), LayerType)
	})
}

// RegisterPort makes gopacket decode UDP packets to or from port as Lovelock
// (gopacket's UDP decoder looks at the destination port first, then the
// source port), registering the layer first (Register). Call it for a
// configured port other than wire.DefaultPort, during start-up, as Register.
func RegisterPort(port uint16) {
	Register()
	layers.RegisterUDPPortLayerType(layers.UDPPort(port), LayerType)
}

// Lovelock is the Lovelock header as a gopacket layer. It is a Layer, a
// DecodingLayer and a SerializableLayer; its payload is the service payload,
// which decodes as gopacket.LayerTypePayload.
type Lovelock struct {
	layers.BaseLayer
	wire.Header
}

var (
	_ gopacket.Layer             = (*Lovelock)(nil)
	_ gopacket.DecodingLayer     = (*Lovelock)(nil)
	_ gopacket.SerializableLayer = (*Lovelock)(nil)
)

// LayerType returns LayerType.
func (l *Lovelock) LayerType() gopacket.LayerType { return LayerType }

// CanDecode returns LayerType.
func (l *Lovelock) CanDecode() gopacket.LayerClass { return LayerType }

// NextLayerType returns gopacket.LayerTypePayload: the service payload is
// opaque to this layer.
func (l *Lovelock) NextLayerType() gopacket.LayerType { return gopacket.LayerTypePayload }

// DecodeFromBytes decodes data, the UDP payload, with wire.Decode: a header
// that Decode rejects is an error here too, so a capture shows why a packet
// is malformed. A payload cut short by the capture length fails
// wire.ErrBadLength; df is told the packet is truncated when data is shorter
// than a header.
func (l *Lovelock) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	h, payload, err := wire.Decode(data)
	if err != nil {
		if wire.StatusOf(err) == wire.StatusTruncated {
			df.SetTruncated()
		}
		return err
	}
	l.Header = h
	l.BaseLayer = layers.BaseLayer{Contents: data[:wire.HeaderLen], Payload: payload}
	return nil
}

// SerializeTo prepends the header to the bytes already in b. With
// opts.FixLengths, Length is set to the length of those bytes first (and
// stays set in l); otherwise l.Length is written as is, which lets tests
// build packets with a wrong length.
func (l *Lovelock) SerializeTo(b gopacket.SerializeBuffer, opts gopacket.SerializeOptions) error {
	payloadLen := len(b.Bytes())
	dst, err := b.PrependBytes(wire.HeaderLen)
	if err != nil {
		return err
	}
	if opts.FixLengths {
		l.Length = uint32(payloadLen)
	}
	l.Header.Put(dst)
	return nil
}

func decodeLovelock(data []byte, p gopacket.PacketBuilder) error {
	l := &Lovelock{}
	if err := l.DecodeFromBytes(data, p); err != nil {
		return err
	}
	p.AddLayer(l)
	return p.NextDecoder(l.NextLayerType())
}
